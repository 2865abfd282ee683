"""The recorder turns bus events into stored runs, in batches during the run; a run whose data
could not all be stored is never left ``completed``."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import pytest

from app.bus import Bus, Event
from app.config import RunConfig
from app.events import (
    EngineReady,
    LevelFinished,
    LevelStarted,
    LogLine,
    PhaseChanged,
    Progress,
    RequestDone,
    RunFinished,
    RunStarted,
)
from app.load.metrics import LevelSummary, RequestRecord
from app.recording import RunRecorder
from app.store import RunStore
from engine_adapters.base import Phase
from engine_adapters.config import Features


def _start(bus: Bus, run_id: str = "r1") -> None:
    bus.emit(RunStarted(run_id=run_id, name="demo run", tags=["cpu", "demo"],
                        config=RunConfig(name="demo run", features=Features(prefix_caching=True)),
                        engine_kind="vllm", model="tunebench:demo", argv=["python", "-m", "x"],
                        env={"VLLM_API_KEY": "secret-value", "VLLM_CPU_KVCACHE_SPACE": "1"},
                        engine_version="0.32.0", hardware={"cpu_model": "x86"}, started_wall_s=time.time()))


def _request(bus: Bus, i: int, level: int = 0, error: str | None = None, run_id: str = "r1") -> None:
    rec = RequestRecord(level=level, index=i, scheduled_s=0.0, start_s=0.0, start_wall_s=time.time(), queue_ms=0.1,
                        ttft_ms=10.0 + i, itl_ms=[12.0] * 7, e2e_ms=100.0 + i, input_tokens=16, output_tokens=8,
                        ok=error is None, error=error, error_kind=None if error is None else "http")
    bus.emit(RequestDone(run_id=run_id, record=rec))


def _finish(bus: Bus, status: str = "completed", reason: str | None = None, run_id: str = "r1",
            **summary: float) -> None:
    bus.emit(RunFinished(run_id=run_id, status=status, reason=reason, ended_wall_s=time.time(),  # type: ignore[arg-type]
                         summary=summary))


@pytest.fixture()
def store(store_at: str) -> RunStore:
    with RunStore(store_at) as s:
        yield s


def test_full_run_is_recorded(store: RunStore) -> None:
    bus = Bus()
    recorder = RunRecorder(bus, store)
    _start(bus)
    bus.emit(PhaseChanged(run_id="r1", phase=Phase.LOADING_WEIGHTS, detail="Loading safetensors"))
    bus.emit(LogLine(run_id="r1", line="INFO non-default args: {'model': 'x'}"))
    bus.emit(EngineReady(run_id="r1", base_url="http://127.0.0.1:1234", startup_s=41.5,
                         kv_cache={"kv_cache_tokens": 43000.0}))
    bus.emit(LevelStarted(run_id="r1", index=0, label="c=2", mode="closed", concurrency=2, started_wall_s=time.time()))
    for i in range(5):
        _request(bus, i)
    _request(bus, 99, error="HTTP 500")
    bus.sample("host", {"cpu_util_pct": 50.0, "memory_used_bytes": 1e9})
    bus.emit(Progress(run_id="r1", level=0, requests_done=6, errors=1, requests_in_flight=0, output_tokens=48,
                      elapsed_s=1.0, output_tok_per_s=300.0))
    bus.emit(LevelFinished(run_id="r1", index=0, label="c=2", summary=LevelSummary(output_tok_per_s=321.0)))
    _finish(bus, output_tok_per_s=321.0, goodput_rps=2.0)
    recorder.close()
    assert not recorder.errors and not recorder.unstored
    run = store.get_run(recorder.run_id)
    assert (run.uid, run.name, run.status, run.tags) == ("r1", "demo run", "completed", ["cpu", "demo"])
    assert run.env["VLLM_API_KEY"] == "***" and run.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert run.engine_info["startup_s"] == 41.5 and run.endpoint == "http://127.0.0.1:1234"
    assert run.n_requests == 6 and run.n_samples == 2 and run.n_log_lines == 1  # host + the client's progress
    assert run.levels[0].label == "c=2" and run.levels[0].params["concurrency"] == 2
    assert run.levels[0].summary["output_tok_per_s"] == 321.0
    assert run.summary["goodput_rps"] == 2.0
    assert run.metrics["requests_failed"] == 1 and run.metrics["requests_total"] == 6
    assert run.metrics["ttft_ms_p50"] == pytest.approx(12.0)
    assert [e["kind"] for e in run.events] == ["phase", "engine_ready"]
    assert store.log_lines(run.id) == ["INFO non-default args: {'model': 'x'}"]
    records = store.request_records(run.id)
    assert records[0]["itl_ms"] == [12.0] * 7 and records[0]["extra"]["index"] == 0
    assert records[-1]["error"] == "HTTP 500"


def test_batches_are_written_during_the_run(store: RunStore) -> None:
    """Samples reach the database in batches while the run is still going, not only at its end."""
    bus = Bus()
    recorder = RunRecorder(bus, store, flush_interval_s=0.5)
    _start(bus)
    for i in range(3):
        bus.sample("host", {"cpu_util_pct": float(i)})
        _request(bus, i)
    deadline = time.monotonic() + 10.0  # flushes every 0.5 s; the slack is for a loaded machine
    seen = 0
    while time.monotonic() < deadline and seen < 3:
        time.sleep(0.05)
        if recorder.run_id is not None:
            seen = store.get_run(recorder.run_id).n_samples
    assert seen == 3
    assert store.get_run(recorder.run_id).status == "running"  # written before close(), mid-run
    recorder.close()
    assert store.get_run(recorder.run_id).status == "interrupted"  # closed without run_finished


def test_engine_death_keeps_partial_data(store: RunStore) -> None:
    bus = Bus()
    recorder = RunRecorder(bus, store)
    _start(bus)
    _request(bus, 0)
    _finish(bus, "failed", "the engine exited: The GPU ran out of memory")
    recorder.close()
    run = store.get_run(recorder.run_id)
    assert run.status == "failed" and "ran out of memory" in (run.reason or "")
    assert run.n_requests == 1


def test_events_before_a_run_and_a_store_error_are_harmless(store: RunStore,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    bus = Bus()
    recorder = RunRecorder(bus, store)
    bus.sample("host", {"cpu_util_pct": 1.0})  # no run yet: not recorded anywhere
    _request(bus, 0)

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("no such level")

    monkeypatch.setattr(store, "finish_level", refuse)
    _start(bus)
    _request(bus, 1)
    bus.emit(LevelFinished(run_id="r1", index=3, label="x", summary=LevelSummary()))  # reported, recording goes on
    _finish(bus)
    recorder.close()
    run = store.get_run(recorder.run_id)
    assert run.status == "completed" and run.n_requests == 1 and run.n_samples == 0
    assert len(recorder.errors) == 1 and "level_finished" in recorder.errors[0]


def test_two_runs_in_a_row_and_duplicate_ids(store: RunStore) -> None:
    bus = Bus()
    recorder = RunRecorder(bus, store)
    _start(bus, "same")
    _finish(bus, run_id="same")
    _start(bus, "same")  # a runner that reuses an id must not lose the second run
    _request(bus, 1, run_id="same")
    _finish(bus, "cancelled", "stopped by the user", run_id="same")
    recorder.close()
    assert len(recorder.recorded) == 2
    runs = store.list_runs()
    assert sorted(r.status for r in runs) == ["cancelled", "completed"]


def test_engine_log_from_before_the_run_is_kept(store: RunStore) -> None:
    """The GUI warms its engine before the runner publishes run_started."""
    bus = Bus()
    recorder = RunRecorder(bus, store)
    bus.emit(PhaseChanged(phase=Phase.LOADING_WEIGHTS, detail="Loading safetensors"))
    bus.emit(LogLine(line="INFO warming up"))
    _start(bus)
    bus.emit(LogLine(run_id="r1", line="INFO serving"))
    _finish(bus)
    bus.emit(LogLine(line="after the run: belongs to no run yet"))
    recorder.close()
    run = store.get_run(recorder.run_id)
    assert store.log_lines(run.id) == ["INFO warming up", "INFO serving"]
    assert [e["kind"] for e in run.events] == ["phase"]


def test_a_failed_write_is_retried_not_lost(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = Bus()
    recorder = RunRecorder(bus, store)
    real = store.write_batch
    failures = {"left": 2}

    def flaky(*args: object, **kwargs: object) -> None:
        if failures["left"] and kwargs.get("requests"):
            failures["left"] -= 1
            raise RuntimeError("database is locked")
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "write_batch", flaky)
    _start(bus)
    _request(bus, 0)
    recorder.flush()
    _request(bus, 1)
    recorder.flush()
    _request(bus, 2)
    _finish(bus)
    recorder.close()
    assert failures["left"] == 0 and "retrying" in recorder.errors[0]
    assert len(recorder.errors) == 1  # the same failure twice is reported once
    run = store.get_run(recorder.run_id)
    assert run.n_requests == 3 and run.status == "completed" and not recorder.unstored


def _start_on_a_full_disk(store: RunStore, monkeypatch: pytest.MonkeyPatch, failing: str) -> tuple[Bus, RunRecorder]:
    """A run started on a recorder whose store's ``failing`` method meets a full disk."""
    bus = Bus()
    recorder = RunRecorder(bus, store)

    def full(*_args: object, **_kwargs: object) -> NoReturn:
        raise OSError(28, "database or disk is full")

    monkeypatch.setattr(store, failing, full)
    _start(bus)
    return bus, recorder


def test_a_run_whose_data_could_not_be_stored_is_not_completed(store: RunStore,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk: every batch fails. The run ends ``failed`` in the store, with the count, and
    check_stored carries the verdict to the runner's result (and so to the exit code)."""
    bus, recorder = _start_on_a_full_disk(store, monkeypatch, "write_batch")
    for i in range(4):
        _request(bus, i)
    _finish(bus)
    recorder.close()
    run = store.get_run(recorder.run_id)
    assert run.status == "failed" and "4 items of the run could not be stored" in (run.reason or "")
    assert "disk is full" in (run.reason or "")
    result = SimpleNamespace(run_id="r1", status="completed", reason=None)
    assert recorder.check_stored(result) and result.status == "failed" and "could not be stored" in result.reason
    cancelled = SimpleNamespace(run_id="r1", status="cancelled", reason="stopped by the user")
    recorder.check_stored(cancelled)  # stays cancelled; the loss is added to its reason
    assert cancelled.status == "cancelled" and "could not be stored" in cancelled.reason
    other = SimpleNamespace(run_id="another", status="completed", reason=None)
    assert recorder.check_stored(other) is None and other.status == "completed"


def test_a_run_that_could_not_be_created_is_reported(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    bus, recorder = _start_on_a_full_disk(store, monkeypatch, "create_run")
    _request(bus, 0)
    _finish(bus)
    recorder.close()
    assert store.list_runs() == [] and recorder.recorded == []
    result = SimpleNamespace(run_id="r1", status="completed", reason=None)
    assert recorder.check_stored(result) and result.status == "failed"
    assert "could not be stored" in result.reason and "disk is full" in result.reason


def test_items_a_slow_recorder_dropped_are_counted_on_the_run(store: RunStore) -> None:
    bus = Bus()
    recorder = RunRecorder(bus, store, maxlen=50)
    _start(bus)
    recorder.flush()  # the run exists before the flood (a flood can push out any oldest item)
    for i in range(20_000):  # far faster than a 50-item mailbox is drained
        bus.sample("host", {"cpu_util_pct": float(i)})
    _finish(bus)
    recorder.close()
    run = store.get_run(recorder.run_id)
    assert run.dropped_items > 0 and run.n_samples + run.dropped_items <= 20_000
    assert run.status != "completed"  # dropped data: the stored run is incomplete


def test_requests_sent_as_rows_by_a_trial_on_a_cluster_are_stored_as_the_same_records(store: RunStore,
                                                                                      tmp_path: Path) -> None:
    """A trial's worker turns its RequestDone events into RequestsDone rows (app.fleet.trial.as_rows),
    in order with the rest; the recorder stores those exactly as the records they came from."""
    from app.events import RequestsDone
    from app.fleet.trial import as_rows

    scratch = Bus()
    sub = scratch.subscribe()
    _start(scratch)
    for i in range(4):
        _request(scratch, i)
    scratch.emit(LogLine(run_id="r1", line="between"))
    _request(scratch, 4, error="HTTP 500")
    _finish(scratch)
    sent = sub.drain()
    packed = as_rows(sent)
    kinds = [item.payload.kind for item in packed if isinstance(item, Event)]
    assert kinds == ["run_started", "requests", "log", "requests", "run_finished"]  # one event per stretch, in order
    assert [len(item.payload.rows) for item in packed if isinstance(item, Event)
            and isinstance(item.payload, RequestsDone)] == [4, 1]
    stored = []
    for items, target in ((sent, store), (packed, RunStore(tmp_path / "rows.db"))):
        bus = Bus()
        recorder = RunRecorder(bus, target)
        for item in items:
            bus.publish(item)
        recorder.close()
        assert not recorder.errors and recorder.run_id is not None
        stored.append([{k: v for k, v in r.items() if k != "id"} for r in target.request_records(recorder.run_id)])
    assert stored[0] == stored[1] and len(stored[0]) == 5
