"""``tunebench tune PROFILE --slo 'ttft_ms<=500,tpot_ms<=50' [--space SPACE.toml] [--budget 30m |
--trials N] [--strategy grid|bayes] [--resume [TUNE]]``: the best engine configuration under an
SLO (``app.tuner``), with a line per trial and the trials table, the pick and what bound it.
``tunebench tunes [list|show|report|export|import]``: tunes read back from the run store.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

import pydantic_core

from app.bus import Bus, Event
from app.cli.argtypes import bounded_int
from app.cli.foreground import open_recorder, run_in_foreground
from app.cli.run_cmds import _Console
from app.cli.terminal import safe
from app.errors import UserError
from app.events import EngineReady, LevelStarted, LogLine, PhaseChanged, Progress, RunFinished
from app.export.files import STDOUT, check_target
from app.export.tune_report import COLUMNS, pick_text, state_summary, trial_table
from app.profiles import ProfileError, load_profile, resolve_profile
from app.tuner.state import TuneState
from engine_adapters.secrets import mask_obj

EXIT_FAILED, EXIT_CANCELLED = 1, 130
SCRIPT_FORMATS = ("bash", "docker", "compose", "k8s")
SUFFIXES = {"bash": ".sh", "docker": ".docker.sh", "compose": ".compose.yaml", "k8s": ".k8s.yaml"}
_DURATION_RE = re.compile(r"^(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?$")


def parse_duration_s(text: str) -> float:
    """``30m``, ``2h``, ``1h30m``, ``90s`` -> seconds (a unit is required: ``30`` is ambiguous)."""
    match = _DURATION_RE.match(text.strip().lower())
    if not text.strip() or match is None or not any(match.groupdict().values()):
        raise UserError(f"--budget {text!r}: give a duration with a unit, like 30m, 2h, 1h30m or 90s")
    seconds = sum(float(v) * k for v, k in ((match["h"], 3600), (match["m"], 60), (match["s"], 1)) if v)
    if seconds <= 0:
        raise UserError(f"--budget {text!r}: must be more than zero")
    return seconds


def format_table(state: TuneState) -> str:
    rows = trial_table(state)
    shown = [c for c in COLUMNS if c != "note"]
    cells = [list(shown)] + [[safe(r[c]) for c in shown] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(shown))]
    numeric = {"tok/s per GPU", "tok/s per user", "TTFT p99 ms", "TPOT p99 ms", "run", "#"}
    lines = ["  ".join(c.rjust(w) if shown[i] in numeric else c.ljust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in rows:
        if r["note"]:
            lines.append(safe(f"#{r['#']}: {r['note']}"))
    for c in state.candidates:
        if c.status == "pruned":
            lines.append(safe(f"not launched: {c.label}: {c.reason}"))
    lines += [safe(f"note: {n}") for n in state.notes]
    return "\n".join(lines)


class _TuneConsole(_Console):
    """The run console (phases, the live progress line), with the tune's own lines unindented."""

    def handle(self, ev: Event) -> None:
        p = ev.payload
        if isinstance(p, LogLine) and p.line.startswith("tunebench: tune"):
            self._line(safe(p.line.removeprefix("tunebench: ")))
            return
        if isinstance(p, LogLine) and p.line.startswith("tunebench: campaign"):
            return  # the tune says which trial runs
        super().handle(ev)


def _profile(name: str) -> tuple[Any, str]:
    try:
        path = resolve_profile(name)
        return load_profile(path), path.stem
    except ProfileError as exc:
        raise UserError(str(exc)) from None


def _write_json(doc: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(pydantic_core.to_json(mask_obj(doc), indent=1, inf_nan_mode="null"))
        tmp.replace(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot write the result: {exc.strerror}") from None


def _slo(args: argparse.Namespace, space_raw: dict[str, Any] | None, config: Any) -> str:
    slo = args.slo or (space_raw or {}).get("slo") or config.load.slo
    if not slo:
        raise UserError("a tune needs an SLO: --slo 'ttft_ms<=500,tpot_ms<=50' (or slo = ... in the space file, "
                        "or load.slo in the profile)")
    return str(slo)


def _print_plan(state: TuneState, out: TextIO) -> None:
    space = state.space
    print(safe(f"{state.name}: {len(state.candidates)} engine configuration(s); SLO {state.slo} at "
               f"{state.percentile}"), file=out)
    for name, values in (space.get("knobs") or {}).items():
        print(safe(f"  {name}: {', '.join(map(str, values))}  ({space.get('sources', {}).get(name, '')})"), file=out)
    load = space.get("load") or {}
    print(safe(f"  load ({load.get('kind')}): {', '.join(f'{v:g}' for v in load.get('values', []))}  "
               f"({space.get('sources', {}).get('load', '')})"), file=out)
    for c in state.candidates:
        print(safe(f"{c.index + 1}. {c.label}: " + (f"not launched: {c.reason}" if c.status == "pruned" else
                                                     "ready")), file=out)
    for note in state.notes:
        print(safe(f"note: {note}"), file=out)


def cmd_tune(args: argparse.Namespace) -> int:
    from app.tuner.run import Tuner
    from app.tuner.space import build_space, read_space_file

    if args.resume is not None:
        ignored = [flag for flag, value in (("--strategy", args.strategy), ("--slo", args.slo), ("--space", args.space),
                                            ("--percentile", args.percentile)) if value]
        if ignored:
            print(f"tunebench: {', '.join(ignored)} ignored with --resume: the tune goes on with its own",
                  file=sys.stderr)
    budget_s = parse_duration_s(args.budget) if args.budget else None
    json_path = Path(args.json) if args.json else None
    if json_path is not None and not json_path.parent.exists():
        raise UserError(f"{json_path}: its folder does not exist")
    config, stem = _profile(args.profile)
    bus = Bus()
    if args.dry_run:
        space_raw = read_space_file(args.space) if args.space else None
        hardware = _target_hardware(args.gpu, config) if args.gpu else _hardware()
        space = build_space(config, hardware, space_raw, source=args.space or "search space")
        if args.percentile:
            space.percentile = args.percentile
        tuner = Tuner(config, bus, slo=_slo(args, space_raw, config), space=space, strategy=args.strategy or "grid",
                      profile=stem, plan_gpu=args.gpu, discover_flags=not args.gpu, hardware=hardware)
        planned = tuner.plan()
        _print_plan(planned, sys.stdout)
        if json_path is not None:
            _write_json({"plan": planned.model_dump(mode="json")}, json_path)
        return 0 if any(c.status != "pruned" for c in planned.candidates) else EXIT_FAILED
    if args.no_store and args.resume is not None:
        raise UserError("--resume reads the tune from the run database: it cannot go with --no-store")
    recorder = open_recorder(bus, args)
    sub = bus.subscribe(kinds=(PhaseChanged, LogLine, EngineReady, LevelStarted, Progress, RunFinished))
    try:
        if args.resume is not None:
            from app.tuner.stored import resumable

            assert recorder is not None
            stored = resumable(recorder.store, args.resume or None, stem)
            tuner = Tuner.resume(stored, bus, max_candidates=args.trials, budget_s=budget_s, recorder=recorder,
                                 telemetry=not args.no_telemetry)
            done = sum(1 for t in stored.trials if t.get("status") in ("passed", "failed", "infeasible", "error"))
            print(safe(f"resuming tune {stored.id} ({stored.status}): {done} completed trial(s) kept"))
        else:
            space_raw = read_space_file(args.space) if args.space else None
            space = build_space(config, _hardware(), space_raw, source=args.space or "search space")
            if args.percentile:
                space.percentile = args.percentile
            tuner = Tuner(config, bus, slo=_slo(args, space_raw, config), space=space,
                          strategy=args.strategy or "grid", max_candidates=args.trials, budget_s=budget_s,
                          repeats=args.repeats, profile=stem, recorder=recorder, telemetry=not args.no_telemetry,
                          seed=args.seed)
    except BaseException:
        if recorder is not None:
            recorder.close()
        raise
    cancel = threading.Event()

    console = _TuneConsole(sys.stdout, args.verbose)
    state: TuneState = run_in_foreground(lambda: tuner.run(cancel), sub, console.handle, cancel, name="tunebench-tune",
                                         recorder=recorder,
                                         cancel_note="stopping requests and the engine; --resume goes on later")
    print()
    print(format_table(state))
    print()
    print(safe(pick_text(state)))
    if json_path is not None:
        _write_json({"tune": state.model_dump(mode="json")}, json_path)
        print(f"result written to {json_path}")
    if recorder is not None:
        for problem in recorder.errors:
            print(safe(f"tunebench: store: {problem}"), file=sys.stderr)
        print(safe(f"stored as tune {state.tune_id} (tunebench tunes show {state.tune_id}; tunebench tunes report "
                   f"{state.tune_id} -o tune.html; tunebench tunes export {state.tune_id} --format bash -o pick.sh)"))
    if state.status == "cancelled":
        print(safe(f"tunebench: tune cancelled: tunebench tune {args.profile} --resume {state.tune_id} goes on"),
              file=sys.stderr)
        return EXIT_CANCELLED
    if state.status != "completed" or state.pick is None:
        print(safe(f"tunebench: tune {state.status}" + (f": {state.reason}" if state.reason else "")), file=sys.stderr)
        return EXIT_FAILED
    return 0


def _hardware() -> Any:
    from engine_adapters.hardware import probe_hardware

    return probe_hardware()


def _target_hardware(gpu: str, config: Any) -> Any:
    from app.ladder.run import target_hardware

    f = config.features
    return target_hardware(gpu, f.gpu_count)


# --- stored tunes -------------------------------------------------------------------------------

def _open(args: argparse.Namespace) -> Any:
    from app.cli.store_cmds import open_store

    return open_store(args)


def cmd_tunes_list(args: argparse.Namespace) -> int:
    from datetime import datetime

    from app.tuner.stored import list_states

    with _open(args) as store:
        states = list_states(store)
    if args.json:
        print(pydantic_core.to_json([s.model_dump(mode="json") for s in states], indent=2,
                                    inf_nan_mode="null").decode())
        return 0
    if not states:
        print("no stored tunes (tunebench tune PROFILE --slo ... runs one)")
        return 0
    for st in states:
        n = state_summary(st)
        when = datetime.fromtimestamp(st.started_wall_s).strftime("%Y-%m-%d %H:%M") if st.started_wall_s else "-"
        pick = f"pick: {st.pick.label} @ {st.pick.load_label}" if st.pick else "no pick"
        print(safe(f"{st.tune_id}  {when}  {st.status:<11}  {n['trials']} trials ({n['passed']} met the SLO), "
                   f"{n['candidates']} configurations  SLO {st.slo}  {pick}  {st.name}"))
    return 0


def _load(args: argparse.Namespace) -> TuneState:
    from app.tuner.stored import load_tune

    with _open(args) as store:
        return load_tune(store, args.tune)


def cmd_tunes_show(args: argparse.Namespace) -> int:
    state = _load(args)
    if args.json:
        print(pydantic_core.to_json(state.model_dump(mode="json"), indent=2, inf_nan_mode="null").decode())
        return 0
    print(safe(f"tune {state.tune_id}: {state.name} ({state.status}" + (f": {state.reason}" if state.reason else "")
               + f"); SLO {state.slo} at {state.percentile}; {state.strategy} search"))
    print(format_table(state))
    print()
    print(safe(pick_text(state)))
    return 0


def cmd_tunes_report(args: argparse.Namespace) -> int:
    from app.export import save
    from app.export.tune_report import render_tune_report

    if args.output not in (STDOUT, "-"):
        check_target(Path(args.output))
    text = render_tune_report(_load(args), title=args.title)
    if args.output in (STDOUT, "-"):
        sys.stdout.write(text)
    else:
        save(text, "html", args.output)
        print(safe(f"wrote {args.output}"), file=sys.stderr)
    return 0


def cmd_tunes_export(args: argparse.Namespace) -> int:
    from app.export import save
    from app.export.tune_report import pick_launch_script

    state = _load(args)
    formats = SCRIPT_FORMATS if args.format == "all" else (args.format,)
    if args.format == "all":
        if args.output in (STDOUT, "-"):
            raise UserError("--format all writes four files: give -o a folder")
        folder = Path(args.output)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{folder}: cannot create the folder: {exc.strerror}") from None
        texts = {fmt: pick_launch_script(state, fmt) for fmt in formats}
        for fmt, text in texts.items():
            path = folder / f"pick{SUFFIXES[fmt]}"
            save(text, fmt, path)
            print(safe(f"wrote {path}"), file=sys.stderr)
        return 0
    text = pick_launch_script(state, args.format)
    if args.output in (STDOUT, "-"):
        sys.stdout.write(text)
    else:
        check_target(Path(args.output))
        save(text, args.format, args.output)
        print(safe(f"wrote {args.output} (the pick of tune {state.tune_id}, as {args.format})"), file=sys.stderr)
    return 0


def cmd_tunes_import(args: argparse.Namespace) -> int:
    from app.export.sweep_import import import_into_tune
    from app.tuner.stored import load_tune

    with _open(args) as store:
        tune_id = load_tune(store, args.tune).tune_id
        n = import_into_tune(store, tune_id, args.file, args.label)
    print(safe(f"imported {n} point(s) from {args.file} into tune {tune_id} (drawn on its chart; tunebench tunes "
               f"report {tune_id} -o tune.html)"))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", metavar="PATH", default=None,
                    help="run database (default: $TUNEBENCH_DB or runs.db in the user data directory)")
    tune = sub.add_parser("tune", parents=[db],
                          help="find the engine configuration that yields the most output tok/s per GPU while meeting "
                               "an SLO: a goodput search per configuration, a Pareto chart, the pick exported")
    tune.add_argument("profile", help="profile file or shipped profile name (e.g. cpu-demo)")
    tune.add_argument("--slo", help="e.g. 'ttft_ms<=500,tpot_ms<=50' (metrics: ttft_ms, tpot_ms, e2e_ms, queue_ms); "
                                    "default: the space file's or the profile's load.slo")
    tune.add_argument("--space", metavar="SPACE.toml",
                      help="knobs and load range to search (default: from the profile and this machine)")
    budget = tune.add_mutually_exclusive_group()
    budget.add_argument("--budget", metavar="DURATION", help="stop starting trials after this long (30m, 2h, 1h30m)")
    budget.add_argument("--trials", type=bounded_int(1, 100_000), metavar="N",
                        help="at most N engine configurations (each searched over the load range)")
    tune.add_argument("--strategy", choices=("grid", "bayes"), default=None,
                      help="grid: every configuration; bayes: optuna's constraint-aware TPE picks the next "
                           "(default grid)")
    tune.add_argument("--resume", nargs="?", const="", default=None, metavar="TUNE",
                      help="go on with a stopped or crashed tune (default: this profile's newest unfinished one); "
                           "completed trials are kept")
    tune.add_argument("--repeats", type=bounded_int(0, 1000), default=0, metavar="N",
                      help="confirm the pick by N reruns (at least 2) with its 95%% confidence interval")
    tune.add_argument("--percentile", choices=("p50", "p90", "p95", "p99"),
                      help="the SLO holds at this percentile of each metric (default p99)")
    tune.add_argument("--seed", type=bounded_int(0, 2**32 - 1), default=0, help="bayes: the sampler's seed")
    tune.add_argument("--dry-run", action="store_true",
                      help="list the configurations and the ones the checks and the memory plan prune; launch nothing")
    tune.add_argument("--gpu", metavar="NAME", help="with --dry-run: plan for this GPU (e.g. H100)")
    tune.add_argument("--json", metavar="FILE", help="write the tune (trials, pick) as JSON")
    tune.add_argument("--no-telemetry", action="store_true", help="do not sample GPU/host/engine telemetry")
    tune.add_argument("--no-store", action="store_true", help="do not record anything (no resume)")
    tune.add_argument("-v", "--verbose", action="store_true", help="print the engine log")
    tune.set_defaults(handler=cmd_tune)

    tunes = sub.add_parser("tunes", help="stored tunes: list, show, report, export the pick, import other tools' points")
    tsub = tunes.add_subparsers(dest="tunes_command", metavar="ACTION")
    tunes.set_defaults(handler=cmd_tunes_list, db=None, json=False)
    ls = tsub.add_parser("list", parents=[db], help="stored tunes, newest first")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(handler=cmd_tunes_list)
    show = tsub.add_parser("show", parents=[db], help="one tune's trials, pick and what bound it")
    show.add_argument("tune", help="tune id (or a unique start)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=cmd_tunes_show)
    rep = tsub.add_parser("report", parents=[db], help="the tune's HTML report (Pareto chart, trials, pick)")
    rep.add_argument("tune")
    rep.add_argument("-o", "--output", metavar="FILE", required=True, help="HTML file ('-': standard output)")
    rep.add_argument("--title", help="the report's title")
    rep.set_defaults(handler=cmd_tunes_report)
    exp = tsub.add_parser("export", parents=[db], help="the pick's launch script (bash, docker, compose, k8s, or all)")
    exp.add_argument("tune")
    exp.add_argument("--format", "-f", choices=(*SCRIPT_FORMATS, "all"), default="bash")
    exp.add_argument("-o", "--output", metavar="PATH", default=STDOUT,
                     help="file ('-' or none: standard output); with --format all, a folder")
    exp.set_defaults(handler=cmd_tunes_export)
    imp = tsub.add_parser("import", parents=[db],
                          help="draw a vllm bench sweep result (summary.csv, summary.json, run=N.json or its folder) "
                               "or an AIConfigurator Pareto CSV on a tune's chart")
    imp.add_argument("tune")
    imp.add_argument("file")
    imp.add_argument("--label", help="a name for the imported points")
    imp.set_defaults(handler=cmd_tunes_import)
