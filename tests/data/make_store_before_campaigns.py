"""Makes ``store-before-campaigns.db`` and ``store-before-campaigns.expected.json``: a run database
as the code before the campaigns tables wrote it, and what that code shows of it, so a migration to
one stored form of campaigns can be checked against both (see docs/campaigns-plan.md).

The database holds, made by the real recorder from the stand-in runners of ``tests/fakes``:
a four-step ladder, a ladder whose FP8 KV step was skipped and whose steps ran twice, a grid tune
with its pick, a tune cancelled half-way (resumable), a ``run --repeat 3`` set and a plain run.

Run it from a checkout of the commit it is made with (the file records which), e.g.
``git worktree add /tmp/old a3c0fed && cd /tmp/old && PYTHONPATH=. .venv/bin/python
tests/data/make_store_before_campaigns.py OUT_DIR``; ``PYTHONPATH`` must point at that checkout.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

STEM = "store-before-campaigns"


def _known_machine() -> Any:
    """A CPU with AVX-512 and a 10 GB/s memory bus, whatever this machine is (the planner and the
    checks would measure and probe it otherwise)."""
    import app.engines as engines_mod
    import app.ladder.run as ladder_run
    import app.planner.host as host
    import app.planner.plan as plan
    import app.tuner.run as tuner_run
    from engine_adapters.hardware import HardwareInfo

    avx512 = HardwareInfo(cpu_model="Test CPU", cpu_count_logical=2, cpu_flags=["avx2", "avx512f"],
                          ram_total_bytes=2**34)
    host.host_bandwidth_bytes_per_s = lambda refresh=False: (1e10, "test")  # type: ignore[assignment]
    for module in (engines_mod, ladder_run, plan, tuner_run):
        module.probe_hardware = lambda: avx512  # type: ignore[attr-defined]
    return avx512


def _cli(*argv: str) -> Any:
    from app.cli import main

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        code = main(list(argv))
    if code != 0:
        raise SystemExit(f"tunebench {' '.join(argv)}: exit {code}")
    return json.loads(out.getvalue())


def make(out_dir: Path) -> None:
    from app.bus import Bus
    from app.campaign import Campaign, Step
    from app.ladder.run import Ladder
    from app.profiles import load_profile, resolve_profile
    from app.recording import RunRecorder
    from app.store import RunStore
    from app.tuner.run import Tuner
    from app.tuner.space import build_space
    from engine_adapters.hardware import HardwareInfo
    from tests.fakes.ladder import FakeEngines, FakeLadderRunner, Script
    from tests.fakes.tuner import FakeTuneRunner

    avx512 = _known_machine()
    avx2_only = HardwareInfo(cpu_model="Test CPU", cpu_count_logical=2, cpu_flags=["avx2"], ram_total_bytes=2**34)
    db = out_dir / f"{STEM}.db"
    db.unlink(missing_ok=True)
    FakeLadderRunner.scripts = {"baseline": Script(400, 1.2), "batching": Script(1600, 12.0),
                                "FP8 KV": Script(1500, 12.0), "prefix": Script(2000, 13.0),
                                "repeated": Script(900, 6.0), "plain": Script(700, 4.0)}
    ladder_config = load_profile(resolve_profile("cpu-ladder"))
    demo = load_profile(resolve_profile("cpu-demo"))
    with RunStore(db) as store:
        def recorded(work: Any) -> Any:
            bus = Bus()
            recorder = RunRecorder(bus, store)
            try:
                return work(bus, recorder)
            finally:
                recorder.close()

        ladders = [recorded(lambda bus, rec: Ladder(
            ladder_config, bus, profile="cpu-ladder", engines=FakeEngines(), recorder=rec,
            runner_factory=FakeLadderRunner, hardware=avx512, discover_flags=False).run())]
        spec = ladder_config.ladder.model_copy(update={"repeats": 2})  # type: ignore[union-attr]
        ladders.append(recorded(lambda bus, rec: Ladder(
            ladder_config, bus, spec=spec, profile="cpu-ladder", engines=FakeEngines(), recorder=rec,
            runner_factory=FakeLadderRunner, hardware=avx2_only, discover_flags=False).run()))
        space = build_space(demo, avx512, {"knobs": {"max_num_seqs": [2, 8], "prefix_caching": [False, True]},
                                           "load": {"concurrency": [2, 8, 16]}})
        slo = "ttft_ms<=400,tpot_ms<=60"
        FakeTuneRunner.reset()
        tunes = [recorded(lambda bus, rec: Tuner(
            demo, bus, slo=slo, space=space, profile="cpu-demo", engines=FakeEngines(), recorder=rec,
            runner_factory=FakeTuneRunner, hardware=avx512, discover_flags=False).run())]
        cancel = threading.Event()
        FakeTuneRunner.reset()
        FakeTuneRunner.hook = lambda cfg: (cancel.set() or None) if len(FakeTuneRunner.calls) >= 3 else None
        tunes.append(recorded(lambda bus, rec: Tuner(
            demo, bus, slo=slo, space=space, profile="cpu-demo", engines=FakeEngines(), recorder=rec,
            runner_factory=FakeTuneRunner, hardware=avx512, discover_flags=False).run(cancel)))
        FakeTuneRunner.reset()
        repeated = demo.model_copy(update={"name": "repeated"})
        recorded(lambda bus, rec: Campaign([Step("repeated", repeated, 3)], bus, engines=FakeEngines(), recorder=rec,
                                           runner_factory=FakeLadderRunner).run())
        plain = demo.model_copy(update={"name": "plain"})
        recorded(lambda bus, rec: Campaign([Step("plain", plain, 1)], bus, engines=FakeEngines(), recorder=rec,
                                           runner_factory=FakeLadderRunner).run())
        runs = store.list_runs()
    repeat_ids = sorted(r.id for r in runs if r.name.startswith("repeated"))
    expected = {
        "made_with_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                           check=False).stdout.strip() or "unknown",
        "runs": len(runs),
        "ladders": {s.ladder_id: _cli("ladders", "show", s.ladder_id, "--db", str(db), "--json") for s in ladders},
        "tunes": {t.tune_id: _cli("tunes", "show", t.tune_id, "--db", str(db), "--json") for t in tunes},
        "repeat_set": {"runs": repeat_ids,
                       "compare": _cli("compare", *map(str, repeat_ids), "--db", str(db), "--json", "--no-series")},
    }
    (out_dir / f"{STEM}.expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"{db}: {len(runs)} runs, ladders {', '.join(expected['ladders'])}, tunes {', '.join(expected['tunes'])}, "
          f"repeat set {repeat_ids}")


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
