"""The quality probe's cost in a ladder step's wall time, on the CPU demo (a real engine): a
two-step ladder of the profile (default cpu-ladder, vLLM's CPU build on the demo model), its
baseline step and an 8-bit KV cache step (the profile's workload and load), both probed as a ladder probes them ([quality] defaults: 8 prompts x
16 tokens, the demo's whole vocabulary). For each step, the probe's wall time over the rest of
the step (the engine start the step made, then its run: warm-up and load), measured in the same
run; the share of the run alone (the probe is a fixed few seconds, the demo's load is short) is
printed beside it.

Target: the probe adds at most ``TARGET_RATIO`` to a step's wall time. Exits non-zero on a miss.
Starts engines (a minute or two); run it alone:

    flock /tmp/tunebench-engine.lock .venv/bin/python benchmarks/quality.py [--profile NAME]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.bus import Bus  # noqa: E402
from app.ladder.run import Ladder  # noqa: E402
from app.ladder.spec import LadderSpec, LadderStepSpec  # noqa: E402
from app.profiles import load_profile_file, resolve_profile  # noqa: E402
from app.recording import RunRecorder  # noqa: E402
from app.store import RunStore  # noqa: E402
from engine_adapters.runtimes import MANAGED_RUNTIMES, demo_model_dir  # noqa: E402

TARGET_RATIO = 0.15
EIGHT_BIT_KV = {"llamacpp": "q8_0", "vllm": "fp8"}
"""Each engine's 8-bit KV cache: the precision step a ladder probes."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="cpu-ladder")
    args = parser.parse_args()
    profile = load_profile_file(resolve_profile(args.profile))
    config = profile.run
    runtime = MANAGED_RUNTIMES.get(config.engine.runtime.managed or "")
    if runtime is None or not runtime.is_installed() or not (demo_model_dir() / ".tunebench-complete.json").exists():
        print(f"quality: the {args.profile} engine or the demo model is missing (make engine): not measured")
        return 1
    steps = [profile.ladder.steps[0] if profile.ladder is not None else LadderStepSpec(name="baseline"),
             LadderStepSpec(name="+ 8-bit KV cache", features={"kv_cache_dtype": EIGHT_BIT_KV[config.engine.kind]})]
    spec = (profile.ladder or LadderSpec(steps=steps)).model_copy(update={"steps": steps})
    bus = Bus()
    with tempfile.TemporaryDirectory() as tmp, RunStore(Path(tmp) / "runs.db") as store:
        recorder = RunRecorder(bus, store)
        try:
            state = Ladder(config, bus, spec=spec, profile=args.profile, recorder=recorder).run()
        finally:
            recorder.close()
        runs = {row.name: store.get_run(row.run_ids[0]) for row in state.rows if row.run_ids}
    ratios: dict[str, float] = {}
    for row in state.rows:
        run = runs.get(row.name)
        quality = (run.quality if run is not None else None) or {}
        probe_s, run_s = quality.get("wall_s"), run.duration_s if run is not None else None
        if not quality.get("measured") or probe_s is None or not run_s:
            print(f"  {row.name}: {row.status}, no probe measured ({quality.get('error') or row.reason or 'no run'})")
            continue
        # The step's wall time: the engine start it made (none on a reused engine), then its run
        # (warm-up, the load, the probe).
        start_s = 0.0 if row.engine_reused else row.startup_s or 0.0
        rest_s = start_s + run_s - probe_s
        ratios[row.name] = probe_s / rest_s
        print(f"  {row.name}: step {start_s + run_s:.1f} s (engine start {start_s:.1f} s, run {run_s:.1f} s), of which "
              f"the probe {probe_s:.1f} s ({quality.get('prompts')} prompts x {quality.get('output_tokens')} tokens, "
              f"batch {quality.get('batch')}): it adds {ratios[row.name]:.1%} to the rest of the step "
              f"({(probe_s / (run_s - probe_s)):.0%} of the run without its engine start)")
    checks = {
        "both steps probed": len(ratios) == 2,
        f"the probe adds at most {TARGET_RATIO:.0%} to a step": bool(ratios) and max(ratios.values()) <= TARGET_RATIO,
    }
    for name, ok in checks.items():
        print(f"  {name}: {'meets' if ok else 'MISSES'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
