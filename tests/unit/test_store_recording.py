"""The recorder turns bus events into stored runs, in batches during the run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.bus import Bus
from app.recording import RunRecorder
from db.store import RunStore


def _start(bus: Bus, run_id: str = "r1", **extra: object) -> None:
    bus.event("run_started", {"run_id": run_id, "name": "demo run", "tags": ["cpu", "demo"],
                              "config": {"name": "demo run", "features": {"prefix_caching": True}},
                              "engine_kind": "vllm", "model": "tunebench:demo", "argv": ["python", "-m", "x"],
                              "env": {"VLLM_API_KEY": "secret-value", "VLLM_CPU_KVCACHE_SPACE": "1"},
                              "engine_version": "0.32.0", "hardware": {"cpu_model": "x86"},
                              "endpoint": None, **extra})


def _request(bus: Bus, i: int, level: int = 0, error: str | None = None) -> None:
    bus.event("request", {"level": level, "start_wall": time.time(), "ttft_ms": 10.0 + i, "e2e_ms": 100.0 + i,
                          "input_tokens": 16, "output_tokens": 8, "itl_ms": [12.0] * 7, "error": error,
                          "prompt_id": i})


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    with RunStore(tmp_path / "runs.db") as s:
        yield s


def test_full_run_is_recorded(store: RunStore) -> None:
    bus = Bus()
    recorder = RunRecorder(bus, store)
    _start(bus)
    bus.event("phase", {"phase": "loading weights", "detail": "Loading safetensors"})
    bus.event("log", {"line": "INFO non-default args: {'model': 'x'}"})
    bus.event("engine_ready", {"base_url": "http://127.0.0.1:1234", "startup_s": 41.5,
                               "kv_cache": {"kv_cache_tokens": 43000.0}, "feature_checks": []})
    bus.event("level_started", {"index": 0, "label": "c=2", "concurrency": 2})
    for i in range(5):
        _request(bus, i)
    _request(bus, 99, error="HTTP 500")
    bus.sample("host", {"cpu_util_pct": 50.0, "memory_used_bytes": 1e9})
    bus.sample("client", {"output_tok_per_s": 300.0})
    bus.event("level_finished", {"index": 0, "summary": {"output_tok_per_s": 321.0}})
    bus.event("run_finished", {"run_id": "r1", "status": "completed", "reason": None,
                               "summary": {"output_tok_per_s": 321.0, "goodput_rps": 2.0}})
    recorder.close()
    assert not recorder.errors
    run = store.get_run(recorder.run_id)
    assert (run.uid, run.name, run.status, run.tags) == ("r1", "demo run", "completed", ["cpu", "demo"])
    assert run.env["VLLM_API_KEY"] == "***" and run.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert run.engine_info["startup_s"] == 41.5 and run.endpoint == "http://127.0.0.1:1234"
    assert run.n_requests == 6 and run.n_samples == 2 and run.n_log_lines == 1
    assert run.levels[0].label == "c=2" and run.levels[0].params == {"concurrency": 2}
    assert run.levels[0].summary == {"output_tok_per_s": 321.0}
    assert run.summary["goodput_rps"] == 2.0
    assert run.metrics["requests_failed"] == 1 and run.metrics["requests_total"] == 6
    assert run.metrics["ttft_ms_p50"] == pytest.approx(12.0)
    assert [e["kind"] for e in run.events] == ["phase", "engine_ready"]
    assert store.log_lines(run.id) == ["INFO non-default args: {'model': 'x'}"]
    records = store.request_records(run.id)
    assert records[0]["itl_ms"] == [12.0] * 7 and records[0]["extra"] == {"prompt_id": 0}
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
    bus.event("run_finished", {"run_id": "r1", "status": "failed",
                               "reason": "the engine exited: The GPU ran out of memory", "summary": {}})
    recorder.close()
    run = store.get_run(recorder.run_id)
    assert run.status == "failed" and "ran out of memory" in (run.reason or "")
    assert run.n_requests == 1


def test_events_before_a_run_and_bad_payloads_are_harmless(store: RunStore) -> None:
    bus = Bus()
    recorder = RunRecorder(bus, store)
    bus.sample("host", {"cpu_util_pct": 1.0})  # no run yet: not recorded anywhere
    bus.event("request", {"ttft_ms": 1.0})
    _start(bus)
    bus.event("request", {"ttft_ms": "not a number", "e2e_ms": None, "itl_ms": [], "level": "zero"})
    bus.event("level_finished", {"index": "x"})  # bad index: reported, recording goes on
    bus.event("run_finished", {"status": "completed"})
    recorder.close()
    run = store.get_run(recorder.run_id)
    assert run.status == "completed" and run.n_requests == 1 and run.n_samples == 0
    assert len(recorder.errors) == 1 and "level_finished" in recorder.errors[0]


def test_two_runs_in_a_row_and_duplicate_ids(store: RunStore) -> None:
    bus = Bus()
    recorder = RunRecorder(bus, store)
    _start(bus, "same")
    bus.event("run_finished", {"status": "completed"})
    _start(bus, "same")  # a runner that reuses an id must not lose the second run
    _request(bus, 1)
    bus.event("run_finished", {"status": "cancelled", "reason": "stopped by the user"})
    recorder.close()
    assert len(recorder.recorded) == 2
    runs = store.list_runs()
    assert sorted(r.status for r in runs) == ["cancelled", "completed"]


def test_engine_log_from_before_the_run_is_kept(store: RunStore) -> None:
    """The GUI warms its engine before the runner publishes run_started."""
    bus = Bus()
    recorder = RunRecorder(bus, store)
    bus.event("phase", {"phase": "loading weights", "detail": "Loading safetensors"})
    bus.event("log", {"line": "INFO warming up"})
    _start(bus)
    bus.event("log", {"line": "INFO serving"})
    bus.event("run_finished", {"status": "completed"})
    bus.event("log", {"line": "after the run: belongs to no run yet"})
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
    bus.event("run_finished", {"status": "completed"})
    recorder.close()
    assert failures["left"] == 0 and len(recorder.errors) == 2 and "retrying" in recorder.errors[0]
    assert store.get_run(recorder.run_id).n_requests == 3


def test_items_a_slow_recorder_dropped_are_counted_on_the_run(store: RunStore) -> None:
    bus = Bus()
    recorder = RunRecorder(bus, store, maxlen=50)
    _start(bus)
    recorder.flush()  # the run exists before the flood (a flood can push out any oldest item)
    for i in range(20_000):  # far faster than a 50-item mailbox is drained
        bus.sample("host", {"cpu_util_pct": float(i)})
    bus.event("run_finished", {"status": "completed"})
    recorder.close()
    run = store.get_run(recorder.run_id)
    assert run.dropped_items > 0 and run.n_samples + run.dropped_items <= 20_000
