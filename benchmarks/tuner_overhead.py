"""The tuner's own overhead between trials, against an engine start (target: at most 5% of one).

A tune over a grid of engine configurations and loads runs with stand-in engines and runs
(``tests.fakes.tuner``: no engine, no load) but everything else real: the planner and the checks
that prune, the campaign, the recorder writing every run to a SQLite store, the trial state
written before and after each trial, optuna's sampler for ``bayes``. Whatever the wall time is
beyond the stand-ins' own time is the tuner's overhead; per trial, it is what a user waits
between two trials on top of the measurement itself. An engine start is what it is compared with:
the fastest start seen here is about 35 s (vLLM CPU, the demo model; a GPU engine takes longer).

    .venv/bin/python benchmarks/tuner_overhead.py [--engine-start-s 35] [--candidates 8] [--loads 5]

Exits 1 when the overhead per trial is above the target.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import repo_path  # noqa: F401 (the repository importable)

from app.bus import Bus
from app.profiles import load_profile, resolve_profile
from app.recording import RunRecorder
from app.store import RunStore
from app.tuner.run import Tuner
from app.tuner.space import build_space
from engine_adapters.hardware import probe_hardware
from tests.fakes.tuner import FakeEngines, FakeTuneRunner

TARGET_FRACTION = 0.05
ENGINE_START_S = 35.0


class Timed:
    """Wall time spent inside the stand-ins (what a real tune spends measuring and starting)."""

    def __init__(self) -> None:
        self.inside_s = 0.0
        self.lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self.lock:
            self.inside_s += seconds


def tune_once(strategy: str, candidates: int, loads: int, folder: Path) -> tuple[float, float, float, int]:
    """(wall s, stand-in s, s waiting for the recorder to write each run, trials) of one tune."""
    timed, flushing = Timed(), Timed()

    class Runner(FakeTuneRunner):
        def run(self, cancel: threading.Event | None = None) -> Any:
            start = time.perf_counter()
            try:
                return super().run(cancel)
            finally:
                timed.add(time.perf_counter() - start)

    class Engines(FakeEngines):
        def engine_for(self, config: Any, bus: Bus, cancel: threading.Event) -> Any:
            start = time.perf_counter()
            try:
                return super().engine_for(config, bus, cancel)
            finally:
                timed.add(time.perf_counter() - start)

    FakeTuneRunner.reset()
    config = load_profile(resolve_profile("cpu-demo"))
    seqs = [2 ** i for i in range(candidates)]
    raw = {"knobs": {"max_num_seqs": seqs}, "load": {"concurrency": [2 ** i for i in range(loads)]}}
    # An SLO every load meets: each configuration runs every load (the most trials per engine).
    slo = "ttft_ms<=1000000,tpot_ms<=1000000"
    hardware = probe_hardware()
    with RunStore(folder / f"{strategy}.db") as store:
        bus = Bus()
        recorder = RunRecorder(bus, store)
        flush = recorder.flush

        def timed_flush(timeout_s: float = 10.0) -> None:
            start = time.perf_counter()
            flush(timeout_s)
            flushing.add(time.perf_counter() - start)

        recorder.flush = timed_flush  # type: ignore[method-assign]
        try:
            space = build_space(config, hardware, raw)
            start = time.perf_counter()
            tuner = Tuner(config, bus, slo=slo, space=space, strategy=strategy, profile="cpu-demo",
                          recorder=recorder, engines=Engines(), runner_factory=Runner, hardware=hardware,
                          discover_flags=False, max_candidates=candidates)
            state = tuner.run()
            wall = time.perf_counter() - start
        finally:
            recorder.close()
    assert state.status == "completed", state.reason
    return wall, timed.inside_s, flushing.inside_s, len(state.measured)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-start-s", type=float, default=ENGINE_START_S,
                        help="the engine start to compare with (default: 35 s, the fastest vLLM CPU start seen here)")
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in ("grid", "bayes"):
            wall, inside, flushed, trials = tune_once(strategy, args.candidates, args.loads, Path(tmp))
            per_trial = (wall - inside) / max(1, trials)
            fraction = per_trial / args.engine_start_s
            verdict = "ok" if fraction <= TARGET_FRACTION else "MISS"
            ok &= fraction <= TARGET_FRACTION
            print(f"{strategy}: {trials} trials on {args.candidates} engine configurations in {wall:.2f} s, "
                  f"{inside:.2f} s of it in the stand-in engines and runs; the tuner's overhead "
                  f"{per_trial * 1000:.0f} ms per trial (of which {flushed / max(1, trials) * 1000:.0f} ms waiting for "
                  f"the recorder to write the run) = {fraction:.2%} of a {args.engine_start_s:.0f} s engine start "
                  f"(target <= {TARGET_FRACTION:.0%}): {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
