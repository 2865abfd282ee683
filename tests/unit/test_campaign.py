"""The campaign runner: repeats with the engine kept while its flags stay the same, each run
tagged as one set, the set's mean and 95% CI stored; ``tunebench run --repeat N`` end to end
against the fake server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import app.campaign as campaign_mod
from app.analysis.compare import compare_runs
from app.bus import Bus
from app.campaign import Campaign, EngineKeeper, Step, repeat_lines
from app.cli import main
from app.config import RunConfig
from app.events import LogLine
from app.load.metrics import LevelSummary, Stats
from app.runner import LevelResult, RunResult
from app.store import RunStore
from app.workload import LoadConfig
from engine_adapters.config import DisaggregationConfig, Features
from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer
from tests.small_profile import write_small_profile


class FakeEngine:
    def __init__(self, key: str) -> None:
        self.key, self.stopped, self.base_url = key, False, "http://127.0.0.1:1"

    def is_running(self) -> bool:
        return not self.stopped

    def wait_ready(self, cancel: threading.Event | None = None) -> None:
        return None

    def stop(self) -> None:
        self.stopped = True


class FakeRunner:
    """Stands in for app.runner.Runner: one level whose throughput follows a script."""

    calls: list[dict[str, Any]] = []
    tok_s: Iterator[float] = iter(())

    def __init__(self, config: RunConfig, bus: Bus, **kwargs: Any) -> None:
        self.config, self.kwargs = config, kwargs
        FakeRunner.calls.append({"config": config, **kwargs})

    def run(self, cancel: threading.Event | None = None) -> RunResult:
        tok = next(FakeRunner.tok_s)
        summary = LevelSummary(requests=8, completed=8, duration_s=1.0, output_tok_per_s=tok,
                               request_throughput_rps=8.0, ttft_ms=Stats(count=8, mean=50.0, median=50.0))
        return RunResult(run_id=f"r{len(FakeRunner.calls)}", name=self.config.name, config=self.config,
                         started_wall_s=0.0, levels=[LevelResult(index=0, label="c1", mode="closed",
                                                                 started_wall_s=0.0, summary=summary)])


@pytest.fixture(autouse=True)
def _fresh_fake_runner() -> None:
    FakeRunner.calls = []


def test_repeats_reuse_the_engine_tag_one_set_and_aggregate() -> None:
    launched: list[str] = []

    class Engines:
        def engine_for(self, config: RunConfig, bus: Bus, cancel: threading.Event) -> Any:
            launched.append(config.engine.model_dump_json() + config.features.model_dump_json())
            return "the-engine"

    FakeRunner.tok_s = iter([900.0, 1000.0, 1100.0])
    config = RunConfig(name="demo", tags=["mine"])
    result = Campaign([Step("demo", config, 3)], Bus(), engines=Engines(), runner_factory=FakeRunner,
                      campaign_id="c0ffee").run()
    assert result.status == "completed" and len(result.runs) == 3
    names = [c["config"].name for c in FakeRunner.calls]
    assert names == ["demo (repeat 1/3)", "demo (repeat 2/3)", "demo (repeat 3/3)"]
    assert all(c["config"].tags == ["mine", "campaign:c0ffee", "repeat:c0ffee-0"] for c in FakeRunner.calls)
    assert all(c["engine"] == "the-engine" for c in FakeRunner.calls) and len(set(launched)) == 1
    agg = result.steps[0].aggregate["output_tok_per_s"]
    assert agg.n == 3 and agg.mean == pytest.approx(1000.0)
    assert agg.half_width == pytest.approx(4.302653 * 100.0 / 3 ** 0.5, rel=1e-5)
    assert repeat_lines(result.steps[0])[0].startswith("Output throughput: 1,000")


def test_engine_keeper_relaunches_only_when_engine_flags_change(monkeypatch: pytest.MonkeyPatch) -> None:
    engines: list[FakeEngine] = []

    def fake_launch(config: RunConfig, **_kw: Any) -> FakeEngine:
        engines.append(FakeEngine(config.features.model_dump_json()))
        return engines[-1]

    monkeypatch.setattr(campaign_mod, "launch_engine", fake_launch)
    keeper = EngineKeeper()
    cancel = threading.Event()
    a = keeper.engine_for(RunConfig(load=LoadConfig(concurrency=1)), Bus(), cancel)
    b = keeper.engine_for(RunConfig(load=LoadConfig(concurrency=16)), Bus(), cancel)  # load only: reused
    assert a is b and keeper.launches == 1
    c = keeper.engine_for(RunConfig(features=Features(prefix_caching=False)), Bus(), cancel)
    assert c is not a and a.stopped and keeper.launches == 2  # type: ignore[attr-defined]
    keeper.close()
    assert c.stopped  # type: ignore[attr-defined]


def test_engine_keeper_hands_a_p_d_group_to_its_run_and_stops_the_kept_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A P/D group is launched by its run (engine None), never by the keeper, which would refuse it:
    a ladder's last step or the GUI's kept engine followed by a P/D run."""
    engines: list[FakeEngine] = []

    def fake_launch(config: RunConfig, **_kw: Any) -> FakeEngine:
        engines.append(FakeEngine(config.features.model_dump_json()))
        return engines[-1]

    monkeypatch.setattr(campaign_mod, "launch_engine", fake_launch)
    keeper, bus, cancel = EngineKeeper(), Bus(), threading.Event()
    notes = bus.subscribe()
    kept = keeper.engine_for(RunConfig(), bus, cancel)
    pd = RunConfig(features=Features(disaggregation=DisaggregationConfig(connector="nixl")))
    assert keeper.engine_for(pd, bus, cancel) is None
    assert kept.stopped and keeper.engine is None and keeper.launches == 1  # type: ignore[attr-defined]
    assert any("P/D group" in item.payload.line for item in notes.drain() if isinstance(item.payload, LogLine))


def test_a_failed_repeat_ends_the_step_with_its_reason() -> None:
    class Failing(FakeRunner):
        def run(self, cancel: threading.Event | None = None) -> RunResult:
            result = super().run(cancel)
            result.status, result.reason = "failed", "the engine exited"
            return result

    FakeRunner.tok_s = iter([1.0, 2.0, 3.0])
    result = Campaign([Step("x", RunConfig(name="x"), 3)], Bus(), endpoint="http://127.0.0.1:1",
                      runner_factory=Failing).run()
    assert result.status == "failed" and result.reason == "the engine exited" and len(result.runs) == 1


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeBehaviour(delay_s=0.003, api_key="k1")) as srv:
        yield srv


def test_cli_repeat_stores_a_set_with_its_confidence_interval(server: FakeOpenAIServer, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    profile = write_small_profile(tmp_path / "p.toml", "rep", 6, 6, "concurrency = 2")
    db = tmp_path / "runs.db"
    out = tmp_path / "r.json"
    code = main(["run", str(profile), "--endpoint", server.base_url, "--api-key", "k1", "--no-telemetry",
                 "--db", str(db), "--repeat", "3", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert text.count("repeat 1 of 3") == 1 and "(95% CI, 3 runs)" in text
    data = json.loads(out.read_text())
    step = data["steps"][0]
    assert len(step["runs"]) == 3 and step["aggregate"]["output_tok_per_s"]["n"] == 3
    with RunStore(db) as store:
        runs = [store.get_run(i) for i in step["stored_ids"]]
        assert [r.name for r in runs] == ["rep (repeat 1/3)", "rep (repeat 2/3)", "rep (repeat 3/3)"]
        assert all(step["repeat_tag"] in r.tags for r in runs)
        stored = runs[0].summary["repeat"]["figures"]["output_tok_per_s"]
        values = [r.metrics["output_tok_per_s"] for r in runs]
        assert stored["mean"] == pytest.approx(sum(values) / 3) and stored["ci_low"] < stored["mean"] < stored["ci_high"]
        # a single run against the set: the set is one column (mean of 3)
        single = store.create_run(name="single", started_at=1.9e9, config={"name": "single"})
        store.write_batch(single, requests=[{"level": 0, "start_wall": 1.9e9 + i, "ttft_ms": 5.0, "e2e_ms": 9.0,
                                             "output_tokens": 6, "itl_ms": [1.0] * 5} for i in range(3)])
        store.finish_run(single, "completed")
        c = compare_runs(store, [single, runs[1].id], series=False)
    assert c.members[1] == step["stored_ids"]


def test_a_replaced_kept_engine_stops_without_speaking_into_the_next_run() -> None:
    """Its shutdown lines (vLLM's workers print EngineDeadError tracebacks as they are torn down)
    and its stopping phases must not land in the next run's log and phase bar."""
    from app.campaign import EngineKeeper

    heard: list[str] = []

    class Stopping:
        def __init__(self) -> None:
            self.on_log = heard.append
            self.on_phase = lambda phase, detail: heard.append(f"phase {phase}")

        def stop(self) -> str:
            for callback, arg in ((self.on_log, "EngineDeadError: the engine died"), (self.on_phase, "stopping")):
                if callback is not None:
                    callback(arg) if callback is heard.append else callback(arg, "")  # type: ignore[operator]
            return "SIGINT"

    keeper = EngineKeeper()
    keeper._engine, keeper._key = Stopping(), "old"  # type: ignore[assignment]
    assert keeper.close() == "SIGINT"
    assert heard == []
    assert keeper.engine is None
