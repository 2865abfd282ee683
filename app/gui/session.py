"""One run as the GUI does it, in a worker thread: record it to the store, optionally keep the
engine warm between runs (a start costs about a minute), and run the headless Runner.

No engine logic here: launching is ``app.engines.launch_engine``, running is ``app.runner.Runner``,
recording is ``app.recording``. The only decision made here is whether a kept engine still
matches the configuration (same engine and features), otherwise it is stopped and relaunched.
"""

from __future__ import annotations

import threading

from app.bus import Bus
from app.config import RunConfig
from app.engines import launch_engine
from app.errors import EngineFailed
from app.events import LogLine, PhaseChanged
from app.recording import record_to_default_store
from app.runner import Runner, RunResult
from engine_adapters.base import Phase
from engine_adapters.launcher import EngineProcess, EngineStartError


def engine_key(config: RunConfig) -> str:
    """Two configurations can share a running engine when engine and features are equal."""
    return config.engine.model_dump_json() + config.features.model_dump_json()


class EngineSession:
    """Owns at most one warm engine; thread-safe (runs and shutdown come from workers)."""

    def __init__(self) -> None:
        self._engine: EngineProcess | None = None
        self._key: str | None = None
        self._lock = threading.Lock()

    @property
    def engine(self) -> EngineProcess | None:
        engine = self._engine
        return engine if engine is not None and engine.is_running() else None

    def run(self, config: RunConfig, bus: Bus, cancel: threading.Event, *, keep_engine: bool,
            db_path: str | None = None) -> RunResult:
        """Blocking: the whole run, recorded. Raises UserError/EngineFailed with a plain message."""
        recorder = record_to_default_store(bus, db_path)
        try:
            engine = self._warm(config, bus, cancel) if keep_engine else None
            if not keep_engine:
                self.shutdown()
            # The load client runs in processes of its own (app.load.procs), never in this
            # thread: here it would share the interpreter lock with Qt and report late timings.
            result = Runner(config, bus, engine=engine).run(cancel)
        finally:
            recorder.close()
        recorder.check_stored(result)  # a run whose data could not be stored is not "completed"
        return result

    def engine_for(self, config: RunConfig, bus: Bus, cancel: threading.Event) -> EngineProcess:
        """The kept engine for ``config``, relaunched when its flags differ (``app.campaign.EngineSource``:
        the GUI's repeats keep it between runs and after)."""
        return self._warm(config, bus, cancel)

    def _warm(self, config: RunConfig, bus: Bus, cancel: threading.Event) -> EngineProcess:
        with self._lock:
            key = engine_key(config)
            if self._engine is not None and self._engine.is_running() and self._key == key:
                bus.emit(LogLine(line=f"tunebench: reusing the running engine at {self._engine.base_url}"))
                return self._engine
            self._stop_locked()

            def on_phase(phase: Phase, detail: str) -> None:
                bus.emit(PhaseChanged(phase=phase, detail=detail))

            def on_log(line: str) -> None:
                bus.emit(LogLine(line=line))

            engine = launch_engine(config, on_log=on_log, on_phase=on_phase)
            try:
                engine.wait_ready(cancel=cancel)
            except EngineStartError as exc:
                engine.stop()
                raise EngineFailed(str(exc.diagnosis or exc)) from None
            except BaseException:
                engine.stop()
                raise
            self._engine, self._key = engine, key
            return engine

    def _stop_locked(self) -> str | None:
        engine, self._engine, self._key = self._engine, None, None
        return engine.stop() if engine is not None else None

    def shutdown(self) -> str | None:
        """Stop the kept engine (blocking; call from a worker)."""
        with self._lock:
            return self._stop_locked()
