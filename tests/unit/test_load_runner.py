"""The Runner's event contract and failure handling, and `tunebench run`, against a fake server
(the real engine is exercised in tests/e2e/test_load_e2e.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.bus import Bus, Event, Item
from app.cli import main
from app.config import RunConfig
from app.load.fakeserver import FakeBehaviour, FakeOpenAIServer
from app.runner import Runner, RunResult, mask_env
from app.workload import LengthSpec, LoadConfig, WorkloadConfig


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeBehaviour(delay_s=0.003, api_key="k1")) as srv:
        yield srv


def config(**load: object) -> RunConfig:
    return RunConfig(name="unit", workload=WorkloadConfig(num_requests=6, input_len=LengthSpec(mean=16),
                                                          output_len=LengthSpec(mean=12)),
                     load=LoadConfig(**load))  # type: ignore[arg-type]


def events(bus_items: list[object]) -> list[Event]:
    return [i for i in bus_items if isinstance(i, Event)]


def test_event_order_and_result(server: FakeOpenAIServer) -> None:
    bus = Bus()
    sub = bus.subscribe()
    runner = Runner(config(pattern="sweep", levels=[1, 2], slo="ttft_ms<=1000", warmup_requests=2), bus,
                    endpoint=server.base_url, api_key="k1", telemetry=False)
    result = runner.run()
    assert result.status == "completed", result.reason
    evs = events(sub.drain())
    kinds = [e.kind for e in evs]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert kinds.index("engine_ready") < kinds.index("level_started")
    assert kinds.count("level_started") == kinds.count("level_finished") == 2
    assert kinds.count("request") == 12  # warm-up requests are not published
    assert all(e.payload["run_id"] == runner.run_id for e in evs)
    started = evs[0].payload
    assert started["endpoint"] == server.base_url and started["argv"] is None and started["config"]["name"] == "unit"
    first_level = kinds.index("level_started")
    assert all(k != "request" for k in kinds[:first_level])
    finished = evs[-1].payload
    assert finished["status"] == "completed" and len(finished["summary"]["levels"]) == 2
    req = next(e.payload for e in evs if e.kind == "request")
    assert {"ttft_ms", "itl_ms", "e2e_ms", "output_tokens", "error", "level", "queue_ms"} <= set(req)
    # The result: two levels, the fake's generation counter matches the client's count exactly.
    assert [lv.summary.completed for lv in result.levels] == [6, 6]
    assert all(lv.summary.tokens_match_engine for lv in result.levels)
    assert result.levels[0].summary.goodput_rps is not None and result.model == "fake-model"
    assert any("warm-up: 2 requests" in n for n in result.notes)
    assert RunResult.model_validate_json(result.model_dump_json()) == result


def test_unreachable_endpoint_fails_with_reason_and_keeps_records() -> None:
    bus = Bus()
    sub = bus.subscribe(kinds=["run_finished", "request"])
    result = Runner(config(concurrency=2), bus, endpoint="http://127.0.0.1:9", telemetry=False).run()
    assert result.status == "failed" and "cannot connect" in (result.reason or "")
    assert result.levels and result.levels[0].summary.errors >= 5
    evs = events(sub.drain())
    assert evs[-1].kind == "run_finished" and evs[-1].payload["status"] == "failed"


def test_bad_dataset_fails_cleanly(server: FakeOpenAIServer, tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{\"not\": \"sharegpt\"}")
    cfg = config()
    cfg.workload = WorkloadConfig(kind="sharegpt", dataset_path=str(bad))
    result = Runner(cfg, Bus(), endpoint=server.base_url, api_key="k1", telemetry=False).run()
    assert result.status == "failed" and "not a ShareGPT JSON file" in (result.reason or "")


class _CancelAfterRequests(Bus):
    """Sets ``cancel`` when the ``n``-th completed request is published: the cancel lands
    mid-level however slow the machine is (a timer armed before ``run`` can fire before the
    level starts)."""

    def __init__(self, cancel: threading.Event, n: int) -> None:
        super().__init__()
        self.cancel, self.n, self.completed = cancel, n, 0

    def publish(self, item: Item) -> None:
        super().publish(item)
        if isinstance(item, Event) and item.kind == "request" and item.payload.get("ok"):
            self.completed += 1
            if self.completed >= self.n:
                self.cancel.set()


def test_cancel_mid_level() -> None:
    cfg = config(concurrency=2)
    cfg.workload.num_requests = 200
    cfg.workload.output_len = LengthSpec(mean=20)
    cancel = threading.Event()
    bus = _CancelAfterRequests(cancel, n=3)
    with FakeOpenAIServer(FakeBehaviour(mode="slow", delay_s=0.005)) as slow:
        result = Runner(cfg, bus, endpoint=slow.base_url, telemetry=False).run(cancel)
    assert cancel.is_set() and bus.completed >= 3
    assert result.status == "cancelled", result.reason
    summary = result.levels[0].summary
    assert 0 < summary.completed < 200 and 1 <= summary.cancelled <= 2  # cut mid-stream, kept


def test_workers_split_a_level_over_processes() -> None:
    """Two client processes share a level; each record reaches the bus (and so the store) as it
    completes, not in a burst at the level's end."""
    cfg = config(concurrency=4, workers=2)
    cfg.workload.num_requests = 24
    bus = Bus()
    sub = bus.subscribe(kinds=["request", "level_finished"])
    with FakeOpenAIServer(FakeBehaviour(mode="slow", delay_s=0.01)) as slow:  # ~0.12 s a request
        result = Runner(cfg, bus, endpoint=slow.base_url, telemetry=False).run()
    assert result.status == "completed", result.reason
    recs = result.levels[0].requests
    assert len(recs) == 24 and all(r.ok for r in recs) and sorted(r.index for r in recs) == list(range(24))
    assert result.levels[0].summary.tokens_match_engine
    events = [e for e in sub.drain() if isinstance(e, Event)]
    published = [e for e in events if e.kind == "request"]
    finished = next(e for e in events if e.kind == "level_finished")
    assert sorted(e.payload["index"] for e in published) == list(range(24))
    assert all(e.t_mono < finished.t_mono for e in published)
    # 6 rounds of ~0.12 s requests per worker: streamed records span most of the level
    assert published[-1].t_mono - published[0].t_mono > 0.2, [round(e.t_mono - published[0].t_mono, 3) for e in published]


def test_mask_env() -> None:
    assert mask_env({"VLLM_API_KEY": "x", "HF_TOKEN": "y", "VLLM_CPU_KVCACHE_SPACE": "1"}) == {
        "VLLM_API_KEY": "***", "HF_TOKEN": "***", "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_cli_run_writes_json_and_prints_table(server: FakeOpenAIServer, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text('name = "cli"\n[workload]\nnum_requests = 4\n[workload.output_len]\nmean = 5\n'
                       '[load]\nconcurrency = 2\n')
    out = tmp_path / "r.json"
    code = main(["run", str(profile), "--endpoint", server.base_url, "--api-key", "k1", "--json", str(out),
                 "--no-telemetry", "--db", str(tmp_path / "runs.db")])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "concurrency 2" in text and "out tok/s" in text and "engine 20: equal" in text
    data = json.loads(out.read_text())
    assert data["status"] == "completed" and len(data["levels"][0]["requests"]) == 4
    # ... and the run is in the database, under the runner's id, with its requests.
    assert "stored as run" in text
    from db.store import RunStore

    with RunStore(tmp_path / "runs.db") as store:
        run = store.get_run(data["run_id"])
        assert run.status == "completed"
        assert len(store.request_records(data["run_id"])) == 4


def test_cli_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text('[load]\nslo = "fast please"\n')
    assert main(["run", str(profile), "--endpoint", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not like" in err and "Traceback" not in err
    assert main(["run", "no-such-profile.toml"]) == 2
    good = tmp_path / "g.toml"
    good.write_text("name = 'x'\n")
    assert main(["run", str(good), "--json", str(tmp_path / "missing" / "r.json")]) == 2
    assert "folder does not exist" in capsys.readouterr().err


def test_the_profile_example_in_docs_is_valid(repo_root: Path) -> None:
    import re
    import tomllib

    text = (repo_root / "docs" / "metrics.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", text, re.S)
    config = RunConfig.model_validate(tomllib.loads(block))
    assert config.workload.kind == "shared_prefix" and config.load.levels == [1, 4, 16, 64]
