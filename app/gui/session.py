"""One run as the GUI does it, in a worker thread: record it to the store, optionally keep the
engine warm between runs (a start costs about a minute), and run the headless Runner.

No engine logic here: keeping an engine is ``app.campaign.EngineKeeper`` (relaunched when engine
or features differ), running is ``app.runner.Runner``, recording is ``app.recording``.
"""

from __future__ import annotations

import threading

from app.bus import Bus
from app.campaign import EngineKeeper
from app.config import RunConfig
from app.load.datasets import read_inputs
from app.recording import record_to_default_store
from app.runner import Runner, RunResult
from engine_adapters.launcher import EngineProcess


class EngineSession:
    """Owns at most one warm engine (an ``app.campaign.EngineKeeper``, so the GUI and campaigns
    decide reuse the same way); thread-safe (runs and shutdown come from workers)."""

    def __init__(self) -> None:
        self._keeper = EngineKeeper()
        self._lock = threading.Lock()

    @property
    def engine(self) -> EngineProcess | None:
        return self._keeper.engine

    def run(self, config: RunConfig, bus: Bus, cancel: threading.Event, *, keep_engine: bool,
            db_path: str | None = None) -> RunResult:
        """Blocking: the whole run, recorded. Raises UserError/EngineFailed with a plain message."""
        read_inputs(config.workload)  # a tokenizer that does not load, a bad trace: refused before an engine starts
        recorder = record_to_default_store(bus, db_path)
        try:
            engine = self.engine_for(config, bus, cancel) if keep_engine else None
            if not keep_engine:
                self.shutdown()
            # The load client runs in processes of its own (app.load.procs), never in this
            # thread: here it would share the interpreter lock with Qt and report late timings.
            result = Runner(config, bus, engine=engine).run(cancel)
        finally:
            recorder.close()
        recorder.check_stored(result)  # a run whose data could not be stored is not "completed"
        return result

    def engine_for(self, config: RunConfig, bus: Bus, cancel: threading.Event) -> EngineProcess | None:
        """The kept engine for ``config``, relaunched when its flags differ (``app.campaign.EngineSource``:
        the GUI's repeats keep it between runs and after); None for a P/D group, which its run launches."""
        with self._lock:
            return self._keeper.engine_for(config, bus, cancel)

    def shutdown(self) -> str | None:
        """Stop the kept engine (blocking; call from a worker)."""
        with self._lock:
            return self._keeper.close()
