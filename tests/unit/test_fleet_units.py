"""The fleet's pieces that need no cluster: what a trial asks Ray for, which address is used,
how a node with other code is told apart, and the CLI's refusals before anything connects. The
fleet itself runs on a real cluster in tests/fleet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.fleet import cluster
from app.fleet.cluster import NodeReport, NodeView, cluster_address
from app.fleet.pools import bundle_index
from app.fleet.trial import smallest, spread_fits, trial_bundles, trial_resources
from app.profiles import load_profile_file
from engine_adapters.config import DisaggregationConfig

REPO = Path(__file__).resolve().parents[2]


def test_without_a_cluster_nothing_of_ray_is_imported() -> None:
    code = ("import sys; from app.cli import build_parser; build_parser(); import app.campaign, app.ladder.run, "
            "app.tuner.run, app.cli.fleet_cmds; assert 'ray' not in sys.modules, 'ray imported'; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_trial_asks_for_its_gpus_on_one_node_or_its_cores_and_the_clients() -> None:
    gpu = load_profile_file(REPO / "profiles" / "llama-70b-tp4.toml").run
    assert trial_resources(gpu) == {"GPU": float(gpu.features.gpu_count), "CPU": 1.0}
    assert gpu.features.gpu_count == 4
    cpu = load_profile_file(REPO / "profiles" / "llamacpp-cpu-demo.toml").run
    assert trial_resources(cpu) == {"CPU": 2.0}
    pd = load_profile_file(REPO / "profiles" / "cpu-pd-demo.toml").run  # a prefill and a decode engine
    assert pd.features.engine_count == 2 and trial_resources(pd) == {"CPU": 3.0}


def test_a_spread_p_d_trial_asks_for_a_bundle_per_pool_engine_each_named_by_its_seat() -> None:
    pd = load_profile_file(REPO / "profiles" / "cpu-pd-demo.toml").run
    d = pd.features.disaggregation.model_copy(update={"placement": "spread", "prefill_instances": 2,
                                                       "decode_instances": 3})
    spread = pd.model_copy(update={"features": pd.features.model_copy(update={"disaggregation": d})})
    bundles = trial_bundles(spread)  # the first decode engine's core and the client's, then one core each
    assert bundles == [{"CPU": 2.0}, {"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}]
    assert trial_resources(spread) == bundles[0] and trial_bundles(pd) == [trial_resources(pd)]
    seats = [bundle_index(role, i, spread.features) for role in ("prefill", "decode")
             for i in range(spread.features.pool_instances(role))]  # type: ignore[arg-type]
    assert sorted(seats) == list(range(len(bundles))) and bundle_index("decode", 0, spread.features) == 0
    gpu = load_profile_file(REPO / "profiles" / "llama-70b-tp4.toml").run
    gpu_d = DisaggregationConfig(connector="nixl", placement="spread", prefill_instances=1, decode_instances=1,
                                 prefill_tensor_parallel_size=2, decode_tensor_parallel_size=4)
    gpu = gpu.model_copy(update={"features": gpu.features.model_copy(update={"disaggregation": gpu_d})})
    assert trial_bundles(gpu) == [{"GPU": 4.0, "CPU": 1.0}, {"GPU": 2.0}]


def test_a_spread_trial_fits_only_where_each_bundle_has_a_node_of_its_own() -> None:
    two_cores, one_core = {"CPU": 2.0}, {"CPU": 1.0}
    assert spread_fits([two_cores, two_cores], [two_cores, one_core])
    assert not spread_fits([two_cores], [two_cores, one_core])  # one node: the pools cannot part
    assert not spread_fits([one_core, one_core], [two_cores, one_core])  # no node holds the first bundle
    # a first choice that blocks another bundle is undone (a matching, not a greedy pass)
    assert spread_fits([{"CPU": 2.0}, {"CPU": 1.0}], [{"CPU": 1.0}, {"CPU": 2.0}])
    assert not spread_fits([two_cores, two_cores], [one_core, one_core, one_core])
    # the preflight checks every node that can hold one of the bundles
    assert smallest([{"GPU": 4.0, "CPU": 1.0}, {"GPU": 2.0}]) == {"GPU": 2.0, "CPU": 0.0}
    assert smallest([two_cores]) == two_cores


def test_the_address_is_the_given_one_then_ray_address_then_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address(None) == "auto"
    assert cluster_address("10.0.0.1:6379") == "10.0.0.1:6379"
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert cluster_address(None) == "ray://head:10001"
    assert cluster_address("auto") == "ray://head:10001"  # as ray.init reads it
    assert cluster_address("other:6379") == "other:6379"


def _view(node_id: str, tunebench: str, python: str = "3.11.7") -> NodeView:
    import ray

    return NodeView(node_id=node_id, address="10.0.0.2", alive=True, total={"CPU": 8.0}, free={"CPU": 8.0},
                    report=NodeReport(node_id=node_id, hostname="gpu-7", tunebench=tunebench, python=python,
                                      ray=ray.__version__))


def test_a_node_with_other_code_or_python_is_a_mismatch_in_one_line_each() -> None:
    here = cluster.code_version()
    same, other = _view("a" * 56, here), _view("b" * 56, "0.0.9+0123456789", python="3.12.1")
    assert cluster.mismatches([same], here) == []
    lines = cluster.mismatches([same, other], here)
    assert lines == [f"node gpu-7/bbbbbbbb: tunebench 0.0.9+0123456789, the driver runs {here}",
                     f"node gpu-7/bbbbbbbb: Python 3.12.1, the driver runs {sys.version.split()[0]}"]
    silent = NodeView(node_id="c" * 56, address="10.0.0.3", alive=True, total={}, free={})
    assert cluster.mismatches([silent], here) == ["node 10.0.0.3/cccccccc: did not report (is tunebench installed "
                                                  "there?)"]


def test_the_code_version_is_the_package_version_and_a_digest_of_the_sources() -> None:
    version = cluster.code_version()
    assert version.startswith("0.") and "+" in version and len(version.split("+")[1]) == 10


@pytest.mark.parametrize(("args", "message"), [
    (["--parallel", "2"], "--parallel needs --cluster"),
    (["--skip-bad-nodes"], "--skip-bad-nodes and --trial-resource need --cluster"),
    (["--cluster", "127.0.0.1:1", "--trial-resource", "=2"], "--trial-resource =2: give NAME or NAME=AMOUNT"),
    (["--cluster", "127.0.0.1:1", "--trial-resource", "gpu_a=x"], "--trial-resource gpu_a=x: the amount must be"),
    (["--cluster", "127.0.0.1:1", "--endpoint", "http://127.0.0.1:9/v1"], "give --client-nodes K"),
    (["--client-nodes", "2", "--endpoint", "http://127.0.0.1:9/v1"], "--client-nodes needs --cluster"),
    (["--cluster", "127.0.0.1:1", "--client-nodes", "2"], "give --endpoint URL"),
])
def test_cluster_options_are_refused_before_anything_connects(args: list[str], message: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "llamacpp-cpu-demo", "--no-store", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def _host(node_id: str, gpus: list[str], cpu: str = "EPYC 9654") -> NodeView:
    report = NodeReport(node_id=node_id, hostname=f"host-{node_id}", tunebench="x", python="3.11", ray="2",
                        gpu_models=gpus, cpu_model=cpu)
    return NodeView(node_id=node_id, address="10.0.0.1", alive=True, total={}, free={}, report=report)


def test_trials_keep_to_the_nodes_of_one_hardware_model_so_repeats_compare_fairly() -> None:
    from app.fleet.choice import same_hardware

    h100 = [_host("a", ["NVIDIA H100 80GB HBM3"] * 8), _host("b", ["NVIDIA H100 80GB HBM3"] * 8)]
    a100 = [_host("c", ["NVIDIA A100-SXM4-80GB"] * 8)]
    chosen, line = same_hardware([*a100, *h100])
    assert [v.node_id for v in chosen] == ["a", "b"]  # the model most nodes have
    assert line is not None and "trials run on the 2 with NVIDIA H100 80GB HBM3" in line
    assert "left out: 1 with NVIDIA A100-SXM4-80GB" in line
    same, none = same_hardware(h100)
    assert same == h100 and none is None
    cpus, mixed_cpus = same_hardware([_host("d", [], "Xeon 8480"), _host("e", [], "EPYC 9654")])
    assert len(cpus) == 1 and mixed_cpus is not None and "CPU Xeon 8480" in mixed_cpus  # CPU engines: the CPU counts
