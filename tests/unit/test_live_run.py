"""A live run folded from the bus's own events, headless: what each kind leaves in the state and
which subscribers hear of it, in the order a run publishes them (``app.events``)."""

from __future__ import annotations

from app.bus import Bus
from app.config import RunConfig
from app.events import (
    CLIENT_SOURCE,
    CampaignUpdated,
    EngineReady,
    Event,
    LevelFinished,
    LevelStarted,
    LogLine,
    Notice,
    PhaseChanged,
    Progress,
    RunFinished,
    RunStarted,
    Sample,
    TelemetrySupport,
)
from app.ladder.state import LadderState
from app.live_run import LiveRun, features_text, load_text
from app.load.metrics import LevelSummary, SteadyWindow
from engine_adapters.base import Phase


def test_a_run_folds_into_its_phase_levels_progress_and_outcome() -> None:
    bus = Bus()
    sub = bus.subscribe()
    live = LiveRun()
    config = RunConfig()
    live.begin(config)
    heard: list[str] = []
    live.started.connect(lambda e: heard.append("started"))
    live.phase_changed.connect(lambda e: heard.append(f"phase {e.phase.value}"))
    live.engine_ready.connect(lambda e: heard.append("ready"))
    live.level_started.connect(lambda e: heard.append(f"level {e.index}"))
    live.progressed.connect(lambda e: heard.append(f"progress {e.requests_done}"))
    live.level_finished.connect(lambda e: heard.append(f"done {e.index}"))
    live.finished.connect(lambda e: heard.append(f"finished {e.status}"))
    logged: list[list[str]] = []
    live.logged.connect(logged.append)

    bus.emit(RunStarted(run_id="r1", name="a", config=config, engine_kind="vllm", model="m", started_wall_s=100.0))
    bus.emit(PhaseChanged(run_id="r1", phase=Phase.LOADING_WEIGHTS, detail="shard 1/2"))
    bus.emit(LogLine(run_id="r1", line="INFO loading"))
    bus.sample("host", {"cpu_pct": 50.0})
    assert [s.source for s in live.fold(sub.drain())] == ["host"]
    assert live.phase is not None and live.phase.detail == "shard 1/2"
    assert live.run is not None and live.run.name == "a"
    assert logged == [["INFO loading"]] and list(live.log_tail) == ["INFO loading"]

    bus.emit(EngineReady(run_id="r1", base_url="http://127.0.0.1:8000", startup_s=12.5))
    bus.emit(LevelStarted(run_id="r1", index=0, label="c=4", mode="closed", concurrency=4, started_wall_s=110.0))
    bus.emit(Progress(run_id="r1", level=0, requests_done=3, errors=0, requests_in_flight=4, output_tokens=300,
                      elapsed_s=1.0, output_tok_per_s=300.0, ttft_ms_p50=20.0))
    bus.sample("engine", {"generation_tok_per_s": 310.0})
    samples = live.fold(sub.drain())
    assert [s.source for s in samples] == [CLIENT_SOURCE, "engine"]
    assert live.latest[(CLIENT_SOURCE, "output_tok_per_s")] == 300.0
    assert live.latest[("engine", "generation_tok_per_s")] == 310.0
    assert live.ready is not None and live.ready.startup_s == 12.5
    assert live.level is not None and live.level.label == "c=4" and live.progress is not None

    steady = SteadyWindow(start_s=2.0, end_s=8.0, rule="test")
    summary = LevelSummary(requests=10, completed=10, duration_s=10.0, output_tok_per_s=300.0, steady=steady)
    bus.emit(LevelFinished(run_id="r1", index=0, label="c=4", summary=summary))
    bus.emit(RunFinished(run_id="r1", status="completed", ended_wall_s=130.0))
    live.fold(sub.drain())
    assert [lv.label for lv in live.levels] == ["c=4"]
    assert live.steady_window_s(live.levels[0], t0_wall_s=105.0) == (7.0, 13.0)
    assert live.outcome is not None and live.outcome.status == "completed"
    assert heard == ["started", "phase loading weights", "ready", "level 0", "progress 3", "done 0",
                     "finished completed"]
    assert live.config is config


def test_samples_from_before_the_engine_was_ready_in_the_same_drain_are_not_plotted() -> None:
    live = LiveRun()
    early = Sample("host", 1.0, 1.0, {"cpu_pct": 1.0})
    ready = Event(2.0, 2.0, EngineReady(run_id="r", base_url="http://x"))
    late = Sample("host", 3.0, 3.0, {"cpu_pct": 2.0})
    assert live.fold([early, ready, late]) == [late]


def test_telemetry_support_notices_and_gpu_samples_say_what_this_machine_has() -> None:
    live = LiveRun()
    changes: list[TelemetrySupport | None] = []
    live.support_changed.connect(changes.append)
    notices: list[str] = []
    live.noticed.connect(lambda n: notices.append(n.message))
    live.apply(Event(0.0, 0.0, TelemetrySupport(source="gpu", available=False, state="no NVIDIA GPU")))
    assert not live.has_gpu and "gpu" in live.support
    live.fold([Sample("gpu0", 1.0, 1.0, {"gpu_util_pct": 5.0})])
    assert live.has_gpu and changes[-1] is None and len(changes) == 2
    live.apply(Event(1.0, 1.0, Notice(source="engine", message="endpoint unreachable")))
    assert notices == ["endpoint unreachable"] == live.notices
    live.clear()  # a new run: the machine's facts stay
    assert live.has_gpu and live.notices == [] and live.latest == {}


def test_a_level_that_flagged_client_figures_is_remembered_and_campaign_events_are_not_the_live_runs() -> None:
    live = LiveRun()
    summary = LevelSummary(requests=10, completed=10, duration_s=10.0, output_tok_per_s=300.0)
    live.apply(Event(0.0, 0.0, LevelFinished(run_id="r", index=0, label="x", summary=summary)))
    assert live.flagged == summary.unreliable()
    state = LadderState.model_construct(campaign="ladder")
    live.apply(Event(0.0, 0.0, CampaignUpdated.model_construct(state=state)))
    assert len(live.levels) == 1


def test_a_configuration_in_words() -> None:
    config = RunConfig()
    assert config.engine.model in load_text(config)
    assert features_text(config).startswith("Features: ")
