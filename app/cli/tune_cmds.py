"""``tunebench tune PROFILE --slo 'ttft_ms<=500,tpot_ms<=50' [--space SPACE.toml] [--budget 30m |
--trials N] [--strategy grid|bayes] [--resume [TUNE]]``: the best engine configuration under an
SLO (``app.tuner``), with a line per trial and the trials table, the pick and what bound it.
``tunebench tunes [list|show|report|export|import]``: tunes read back from the run store.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from app.bus import Bus, Event
from app.cli import campaign_cmds as shared
from app.cli.argtypes import add_price_argument, add_run_options, bounded_int, db_parent
from app.cli.fleet_cmds import add_cluster_options, cluster_options, open_fleet
from app.cli.run_cmds import _Console
from app.cli.terminal import safe
from app.errors import UserError
from app.events import LogLine
from app.export.files import STDOUT
from app.export.tune_report import COLUMNS, COST_COLUMNS, cost_note, pick_text, state_summary, trial_table
from app.tuner.state import TuneState

if TYPE_CHECKING:
    from app.cost import RunCost

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


def format_table(state: TuneState, costs: Mapping[int, RunCost] | None = None) -> str:
    """The trials table; with ``costs`` (``app.cost.trial_costs``), its cost columns and what they
    were priced at, else without them."""
    rows = trial_table(state, costs)
    shown = [c for c in COLUMNS if c != "note" and (costs is not None or c not in COST_COLUMNS)]
    cells = [list(shown)] + [[safe(r[c]) for c in shown] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(shown))]
    numeric = {"tok/s per GPU", "tok/s per user", "TTFT p99 ms", "TPOT p99 ms", "run", "#", *COST_COLUMNS}
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
    if costs is not None:
        lines.append(safe(cost_note(costs) + " (lower is better)"))
    return "\n".join(lines)


def _costs(args: argparse.Namespace, state: TuneState, store: Any) -> dict[int, RunCost]:
    from app.cost import price_table, trial_costs

    return trial_costs(store, state, price_table(getattr(args, "price", None) or ()))


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
    from app.cost import price_table

    price_table(args.price or ())  # a bad --price is refused before anything is launched
    budget_s = parse_duration_s(args.budget) if args.budget else None
    json_path = shared.json_target(args.json)
    profile, stem = shared.load_profile_arg(args.profile)
    config = profile.run
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
            shared.write_json({"plan": planned.model_dump(mode="json")}, json_path)
        return 0 if any(c.status != "pruned" for c in planned.candidates) else shared.EXIT_FAILED
    shared.check_resume_stores(args, "tune")
    where = open_fleet(args, config)

    def build(recorder: Any, follow: Any) -> Any:
        on_cluster: dict[str, Any] = {"fleet": where.fleet, "max_parallel": where.parallel, "on_slot_bus": follow} \
            if where.fleet is not None else {}
        if args.resume is not None:
            from app.tuner.stored import resumable

            assert recorder is not None
            stored = resumable(recorder.store, args.resume or None, stem)
            tuner = Tuner.resume(stored, bus, max_candidates=args.trials, budget_s=budget_s, recorder=recorder,
                                 telemetry=not args.no_telemetry, **on_cluster)
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
                          seed=args.seed, **on_cluster)
        tuner.state.cluster = cluster_options(args, where)  # where it runs now: what `tunebench resume` reuses
        return tuner

    console = _TuneConsole(sys.stdout, args.verbose)
    state: TuneState
    _tuner, state, recorder = shared.run_campaign(bus, args, build, console.handle, name="tunebench-tune",
                                           cancel_note="stopping requests and the engine; --resume goes on later")
    print()
    store = getattr(recorder, "store", None)
    print(format_table(state, _costs(args, state, store) if store is not None else None))
    print()
    print(safe(pick_text(state)))
    if json_path is not None:
        shared.write_json({"tune": state.model_dump(mode="json")}, json_path, announce=True)
    shared.report_stored(recorder, f"stored as tune {state.tune_id} (tunebench tunes show {state.tune_id}; "
                                   f"tunebench tunes report {state.tune_id} -o tune.html; "
                                   f"tunebench tunes export {state.tune_id} --format bash -o pick.sh)")
    return shared.exit_code("tune", state.status, state.reason, ok=state.pick is not None,
                     cancelled_note=f"tunebench: tune cancelled: tunebench tune {args.profile} --resume "
                                    f"{state.tune_id} goes on")


def _hardware() -> Any:
    from engine_adapters.hardware import probe_hardware

    return probe_hardware()


def _target_hardware(gpu: str, config: Any) -> Any:
    from app.ladder.run import target_hardware

    f = config.features
    return target_hardware(gpu, f.gpu_count)


# --- stored tunes -------------------------------------------------------------------------------

def cmd_tunes_list(args: argparse.Namespace) -> int:
    from app.tuner.stored import list_states

    states = shared.with_store(args, list_states)

    def line(st: TuneState) -> str:
        n = state_summary(st)
        when = shared.when_text(st.started_wall_s) if st.started_wall_s else "-"
        pick = f"pick: {st.pick.label} @ {st.pick.load_label}" if st.pick else "no pick"
        return (f"{st.tune_id}  {when}  {st.status:<11}  {n['trials']} trials ({n['passed']} met the SLO), "
                f"{n['candidates']} configurations  SLO {st.slo}  {pick}  {st.name}")

    return shared.print_list(states, as_json=args.json, dump=lambda s: s.model_dump(mode="json"),
                             empty="no stored tunes (tunebench tune PROFILE --slo ... runs one)", line=line)


def _load(args: argparse.Namespace) -> TuneState:
    from app.tuner.stored import load_tune

    return shared.with_store(args, lambda store: load_tune(store, args.tune))


def _load_priced(args: argparse.Namespace) -> tuple[TuneState, dict[int, RunCost]]:
    """The tune and its trials' costs at ``--price`` (checked before the store is opened)."""
    from app.cost import price_table
    from app.tuner.stored import load_tune

    price_table(args.price or ())

    def read(store: Any) -> tuple[TuneState, dict[int, RunCost]]:
        state = load_tune(store, args.tune)
        return state, _costs(args, state, store)

    return shared.with_store(args, read)


def cmd_tunes_show(args: argparse.Namespace) -> int:
    state, costs = _load_priced(args)
    if args.json:
        doc = state.model_dump(mode="json")
        for trial in doc["trials"]:
            cost = costs.get(trial["index"])
            trial["cost"] = cost.to_dict() if cost is not None else None
        return shared.print_json(doc)
    print(safe(f"tune {state.tune_id}: {state.name} ({state.status}" + (f": {state.reason}" if state.reason else "")
               + f"); SLO {state.slo} at {state.percentile}; {state.strategy} search"))
    print(format_table(state, costs))
    print()
    print(safe(pick_text(state)))
    return 0


def cmd_tunes_report(args: argparse.Namespace) -> int:
    from app.export.tune_report import render_tune_report

    shared.check_output(args.output)
    state, costs = _load_priced(args)
    return shared.write_output(render_tune_report(state, title=args.title, costs=costs), "html", args.output)


def cmd_tunes_export(args: argparse.Namespace) -> int:
    from app.export import save
    from app.export.tune_report import pick_launch_script

    state = _load(args)
    formats = shared.SCRIPT_FORMATS if args.format == "all" else (args.format,)
    if args.format == "all":
        if shared.to_stdout(args.output):
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
    shared.check_output(args.output)
    return shared.write_output(text, args.format, args.output,
                        f"wrote {args.output} (the pick of tune {state.tune_id}, as {args.format})")


def cmd_tunes_import(args: argparse.Namespace) -> int:
    from app.export.sweep_import import import_into_tune
    from app.tuner.stored import load_tune

    def read(store: Any) -> tuple[str, int]:
        tune_id = load_tune(store, args.tune).tune_id
        return tune_id, import_into_tune(store, tune_id, args.file, args.label)

    tune_id, n = shared.with_store(args, read)
    print(safe(f"imported {n} point(s) from {args.file} into tune {tune_id} (drawn on its chart; tunebench tunes "
               f"report {tune_id} -o tune.html)"))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    db = db_parent()
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
    add_run_options(tune, store_help="do not record anything (no resume)")
    add_price_argument(tune)
    add_cluster_options(tune)
    tune.set_defaults(handler=cmd_tune)

    tunes = sub.add_parser("tunes", help="stored tunes: list, show, report, export the pick, import other tools' points")
    tsub = tunes.add_subparsers(dest="tunes_command", metavar="ACTION")
    tunes.set_defaults(handler=cmd_tunes_list, db=None, json=False)
    shared.add_list_show(tsub, [db], "tune", list_handler=cmd_tunes_list, show_handler=cmd_tunes_show,
                  show_help="one tune's trials, pick and what bound it", show_target_help="tune id (or a unique start)")
    shared.add_report(tsub, [db], "tune", handler=cmd_tunes_report,
                      help="the tune's HTML report (Pareto chart, trials, pick)")
    for action in ("show", "report"):
        add_price_argument(tsub.choices[action])
    exp = tsub.add_parser("export", parents=[db], help="the pick's launch script (bash, docker, compose, k8s, or all)")
    exp.add_argument("tune")
    exp.add_argument("--format", "-f", choices=(*shared.SCRIPT_FORMATS, "all"), default="bash")
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
