"""A store call that hangs past the recorder's wait (a server that stopped answering): the run is
not reported stored, so the CLI says what may be missing instead of "stored as run N"."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.bus import Bus
from app.config import RunConfig
from app.events import RequestDone, RunFinished, RunStarted
from app.load.metrics import RequestRecord
from app.recording import RunRecorder
from app.store import RunStore
from engine_adapters.config import Features


def test_a_store_call_still_hanging_when_the_recording_ends_is_not_reported_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path / "r.db")
    bus = Bus()
    recorder = RunRecorder(bus, store)
    answer = threading.Event()
    hanging = threading.Event()
    finish_run = store.finish_run

    def hangs(*args: object, **kwargs: object) -> object:
        hanging.set()
        answer.wait(60)
        return finish_run(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "finish_run", hangs)
    bus.emit(RunStarted(run_id="r1", name="run", tags=[], config=RunConfig(name="run", features=Features()),
                        engine_kind="vllm", model="tunebench:demo", argv=[], env={}, engine_version="0",
                        hardware={}, started_wall_s=time.time()))
    bus.emit(RequestDone(run_id="r1", record=RequestRecord(
        level=0, index=0, scheduled_s=0.0, start_s=0.0, start_wall_s=time.time(), queue_ms=0.1, ttft_ms=10.0,
        itl_ms=[12.0], e2e_ms=100.0, input_tokens=16, output_tokens=2, ok=True)))
    bus.emit(RunFinished(run_id="r1", status="completed", reason=None, ended_wall_s=time.time(), summary={}))
    assert hanging.wait(30), "the run's end never reached the store"
    try:
        recorder.close(timeout_s=0.5)
        result = SimpleNamespace(run_id="r1", status="completed", reason=None)
        assert recorder.check_stored(result) is not None
        assert result.status == "failed" and "did not answer within 0.5 s" in result.reason
    finally:
        answer.set()
        recorder.close()
        store.close()
