"""The capacity answer in the k8s export (``tunebench export --format k8s --users N --slo S``):
the Deployment's replicas are the plan's, hand-computed here, with the reasoning as comment
lines that cannot break or inject into the manifest; without the options nothing changes; every
wrong combination is one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from app.export import Sizing, Target, export
from app.export.capacity import plan_for
from app.store import RunStore
from tests.fuzz.hostile import Outcome, cli
from tests.unit.test_cost_capacity import GPU_ENGINE, _store_run

H100 = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)]
HOSTILE = 'evil\nreplicas: 99\n# spec: {x: "y"} - $(id)'
SLO = "ttft_ms<=500"


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "export-capacity.db"
    with RunStore(path) as store:
        _store_run(store, "tp4 sweep", {"engine": GPU_ENGINE, "features": {"tensor_parallel_size": 4},
                                        "load": {"pattern": "sweep", "levels": [8, 16, 32], "slo": SLO}},
                   [(8, 800.0, 200.0), (16, 1440.0, 400.0), (32, 2000.0, 900.0)], hardware={"gpus": H100})
        _store_run(store, "dp2", {"engine": GPU_ENGINE, "features": {"data_parallel_size": 2}},
                   [(4, 600.0, 150.0), (8, 1000.0, 300.0)],
                   hardware={"gpus": [{"index": i, "name": "NVIDIA H200"} for i in range(2)]})
        _store_run(store, HOSTILE, {"engine": GPU_ENGINE}, [(4, 400.0, 100.0)], hardware={"gpus": H100})
    return path


def k8s(db: Path, run: str, *argv: str) -> Outcome:
    return cli("export", "--db", str(db), run, "--format", "k8s", *argv).check()


def deployment(text: str) -> dict:
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    return docs[0]


def without_date(text: str) -> str:
    return re.sub(r" on \d{4}-\d\d-\d\d \d\d:\d\d UTC", "", text, count=1)


def test_replicas_are_the_plans_hand_computed(db: Path) -> None:
    out = k8s(db, "tp4 sweep", "--users", "1000", "--slo", SLO)
    assert out.code == 0, out
    # Level 2 misses (900 ms > 500), level 1 (16 in flight) meets it: ceil(1,000 x 1.3 / 16) = ceil(81.25) = 82.
    assert deployment(out.out)["spec"]["replicas"] == 82
    with RunStore(db) as store:
        assert plan_for(store.get_run(1), Sizing(SLO, users=1000)).replicas == 82
    head = out.out.split("  replicas: 82\n")[0]
    for line in ["  # replicas sized by tunebench capacity on run 1 (tp4 sweep)",
                 "  # SLO: TTFT p99 <= 500 ms, at most 1% of requests failed; sized on level 1 (concurrency 16)",
                 "  # one replica (4 GPUs of NVIDIA H100 80GB HBM3) at the SLO: 16 concurrent users",
                 "  # for 1,000 concurrent users with 30% headroom: 82 replicas = 328 GPUs on 41 nodes of 8 GPUs",
                 # 328 GPUs x 24 h x 2.49 $/h = 19,601.28 a day; x 30 days.
                 "  # running: $19,601.28 a day, $588,038.40 a month (30 days) at 2.49 $/GPU-h (default price, "
                 "as of 2026-12)",
                 "  # note: extrapolation from concurrency 16"]:
        assert line in head, line


def test_headroom_price_and_tokens_per_day_are_capacitys(db: Path) -> None:
    # 1e9 tokens a day = 11,574.07 tok/s x 1.2 / 1,440 per replica = 9.65 -> 10 replicas = 40 GPUs.
    out = k8s(db, "1", "--tokens-per-day", "1e9", "--slo", SLO, "--headroom", "0.2", "--price", "H100=2.00")
    doc = deployment(out.out)
    assert doc["spec"]["replicas"] == 10
    assert "# for 1,000,000,000 output tokens a day with 20% headroom: 10 replicas = 40 GPUs" in out.out
    assert "$1,920.00 a day" in out.out and "(your price)" in out.out  # 40 x 24 x 2.00


def test_data_parallel_replicas_are_packed_into_pods(db: Path) -> None:
    # 8 in flight over DP 2 = 4 users a replica; ceil(10 / 4) = 3 engine replicas; a pod runs 2: 2 pods.
    out = k8s(db, "dp2", "--users", "10", "--slo", SLO, "--headroom", "0")
    doc = deployment(out.out)
    assert doc["spec"]["replicas"] == 2
    assert doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "3 replicas = 3 GPUs on 2 nodes of 2 GPUs; 2 pods of 2 data-parallel replicas (4 GPUs in all)" in out.out


def test_a_hostile_run_name_cannot_inject_yaml(db: Path) -> None:
    out = k8s(db, "3", "--users", "3", "--slo", SLO, "--headroom", "0")  # ceil(3 / 4) = 1
    assert out.code == 0, out
    doc = deployment(out.out)
    assert doc["spec"]["replicas"] == 1 and set(doc["spec"]) == {"replicas", "selector", "template"}
    assert re.fullmatch(r"[a-z0-9-]+", doc["metadata"]["name"])
    comments = [line for line in out.out.splitlines() if "sized by tunebench" in line]
    assert comments == ['  # replicas sized by tunebench capacity on run 3 '
                        '(evil\\nreplicas: 99\\n# spec: {x: \\"y\\"} - $(id))']
    assert "\nreplicas: 99" not in out.out


def test_without_the_options_the_manifest_is_unchanged(db: Path) -> None:
    plain = k8s(db, "1").out
    assert "spec:\n  replicas: 1\n  selector:" in plain and "sized by" not in plain
    with RunStore(db) as store:
        assert without_date(plain) == without_date(export(Target(runs=[1]), "k8s", store=store))
    sized = k8s(db, "1", "--users", "10", "--slo", SLO).out  # 13 / 16 -> 1 replica, with the comment
    unsized = re.sub(r"\n  # [^\n]*(?=\n)", "", sized)
    assert without_date(unsized) == without_date(plain)
    assert deployment(sized)["spec"]["replicas"] == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--format", "bash", "--users", "10", "--slo", SLO], "need --format k8s, not --format bash"),
    (["--format", "json", "--headroom", "0.1"], "need --format k8s, not --format json"),
    (["--format", "k8s", "--users", "10"], "pass --slo too"),
    (["--format", "k8s", "--tokens-per-day", "1e9"], "pass --slo too"),
    (["--format", "k8s", "--slo", SLO], "--users N"),
    (["--format", "k8s", "--users", "10", "--slo", "ttft_ms<=100"], "is not reachable with this configuration"),
    (["--format", "k8s", "--users", "0", "--slo", SLO], "expected a whole number from 1"),
    (["--format", "k8s", "--users", "10", "--slo", SLO, "--price", "H100=abc"], "is not a number"),
])
def test_wrong_combinations_are_one_line(db: Path, tmp_path: Path, argv: list[str], message: str) -> None:
    target = tmp_path / "out.yaml"
    out = cli("export", "--db", str(db), "1", "-o", str(target), *argv).check()
    assert out.code == 2 and message in out.err and len(out.err.strip().splitlines()) == 1, out
    assert not target.exists()


def test_a_profile_has_no_levels_to_size_on(db: Path) -> None:
    out = cli("export", "--db", str(db), "cpu-demo", "--format", "k8s", "--users", "10", "--slo", SLO).check()
    assert out.code == 2 and "is a profile, which has no results" in out.err, out
    assert len(out.err.strip().splitlines()) == 1


def test_the_library_default_needs_no_sizing(db: Path) -> None:
    # The GUI's export dialog calls export() without sizing: one replica, as before.
    with RunStore(db) as store:
        assert deployment(export(Target(runs=[1]), "k8s", store=store))["spec"]["replicas"] == 1
