"""``tunebench ladder PROFILE [--json FILE]``: the acceleration ladder with a live line per step and
a final table; ``--dry-run`` checks and plans every step without launching; ``--export FILE``
writes a step's launch script. ``tunebench ladders [list|show|compare|report|export]``: ladders
read back from the run store.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from app.bus import Bus, Event
from app.cli import campaign_cmds as shared
from app.cli.argtypes import (
    add_good_slo_argument,
    add_price_argument,
    add_run_options,
    bounded_int,
    db_parent,
    json_parent,
)
from app.cli.fleet_cmds import add_cluster_options, cluster_options, open_fleet
from app.cli.run_cmds import _Console
from app.cli.terminal import safe
from app.cost import (
    CostFigure,
    RunCost,
    comparison_slo,
    good_slo_of,
    price_table,
    step_costs,
    step_slo_whose,
    usd_text,
)
from app.errors import UserError
from app.events import CampaignUpdated
from app.export.files import STDOUT
from app.ladder.spec import ladder_of
from app.ladder.state import LadderState, StepRow, factor_text, limit_text
from app.quality.probe import quality_cell

if TYPE_CHECKING:
    pass


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def step_line(row: StepRow, total: int) -> str:
    """One line per step as it ends (the CLI's live line per step)."""
    head = f"step {row.index + 1}/{total} '{row.name}'"
    if row.status == "skipped":
        return f"{head}: skipped: {row.reason}"
    if row.status != "completed" or row.output_tok_per_s is None:
        return f"{head}: {row.status}" + (f": {row.reason}" if row.reason else "")
    parts = [f"{_num(row.output_tok_per_s)} output tok/s"]
    if row.factor_previous is not None:
        parts.append(f"{factor_text(row.factor_baseline)} vs baseline, {factor_text(row.factor_previous)} vs previous"
                     + (" (a LOSS)" if row.loss else ""))
    else:
        parts.append("the baseline")
    parts.append(f"total {_num(row.total_tok_per_s)} tok/s")
    if row.ttft_ms is not None:
        parts.append(f"{row.ttft_label} {_num(row.ttft_ms, 1)} ms")
    if row.itl_ms is not None:
        parts.append(f"{row.itl_label} {_num(row.itl_ms, 2)} ms")
    parts.append(limit_text(row))
    parts.append(f"features {row.verification}" if row.verification != "none" else "no features to verify")
    parts.append("engine reused" if row.engine_reused else "engine launched")
    return f"{head}: " + ", ".join(parts)


def _check_pricing(args: argparse.Namespace) -> None:
    """A bad ``--price`` or ``--slo`` is refused before the store is opened (and before anything
    runs): ``_stored_step_costs`` leaves out what it cannot price, it never fails."""
    price_table(getattr(args, "price", None) or ())
    comparison_slo((), getattr(args, "slo", None))


def _stored_step_costs(args: argparse.Namespace, state: LadderState) -> dict[int, RunCost] | None:
    """``step_costs`` from the store of ``--db`` (good output under ``--slo`` when given); None (no
    cost column) when nothing was stored or the store cannot be read: a cost never fails the ladder."""
    prices = price_table(getattr(args, "price", None) or ())
    slo = getattr(args, "slo", None)
    if not state.run_ids or getattr(args, "no_store", False):
        return None
    try:
        return shared.with_store(args, lambda store: step_costs(store, state, prices, slo))
    except UserError:  # the store's errors arrive as UserError (open_store)
        return None


def ladder_json(state: LadderState, costs: Mapping[int, RunCost] | None) -> dict[str, Any]:
    """The ladder as JSON, each step with its ``cost`` (``RunCost.to_dict``: $ per 1M output and
    total tokens, the price and its source; null when the step did not run or was not stored)."""
    data = state.model_dump(mode="json")
    for row in data.get("rows", []):
        cost = (costs or {}).get(row.get("index"))
        row["cost"] = cost.to_dict() if cost is not None else None
    return data


def _cost_cell(figure: CostFigure | None) -> str:
    return "-" if figure is None else usd_text(figure.usd) if figure.usd is not None else "n/a"


def _cost_cells(costs: Mapping[int, RunCost] | None, index: int, good: bool) -> tuple[str, ...]:
    if costs is None:
        return ()
    cost = costs.get(index)
    return (_cost_cell(cost.output if cost else None),) + (
        (_cost_cell(cost.good_output if cost else None),) if good else ())




def quality_legend(state: LadderState) -> str:
    """What the quality column says, and against which step, with the probe's cost."""
    baseline = next((r for r in state.rows if r.quality and (r.quality.get("reference") or {}).get("kind") == "self"),
                    None)
    probe_s = sum((r.quality or {}).get("wall_s") or 0.0 for r in state.rows)
    against = f"step {baseline.index + 1}" if baseline is not None else "the baseline"
    return (f"quality: tokens identical to {against}'s before the first divergence, and mean KL divergence (nats; "
            "'+': a lower bound, top-k logprobs); '= ref' is the reference against itself (its noise floor); "
            f"'~noise': within it. Probes ran apart from the timed load, {probe_s:.1f} s in all")


def format_ladder_table(state: LadderState, costs: Mapping[int, RunCost] | None = None,
                        slo_whose: str | None = None) -> str:
    """The final table: one row per step, then the notes (losses, skips, flags, the reference);
    with ``costs`` (``step_costs``), a $ per 1M output tokens column and its price, and a $ per 1M
    good output tokens column where their good output was counted under an SLO (``slo_whose``)."""
    good_slo = good_slo_of((costs or {}).values())
    cost_header = (("$/1M out",) if costs is not None else ()) + (("$/1M good",) if good_slo else ())
    with_quality = any(r.quality for r in state.rows)
    quality_header = ("quality",) if with_quality else ()
    header = ("step", "status", "out tok/s", "x base", "x prev", "total tok/s", "x base", "x prev", "TTFT ms",
              "ITL ms", "limit", "engine", "verified") + quality_header + cost_header
    rows: list[tuple[str, ...]] = [header]
    for r in state.rows:
        engine = "-" if r.engine_reused is None else "reused" if r.engine_reused else "launched"
        previous = ("LOSS " if r.loss else "") + factor_text(r.factor_previous)
        rows.append((f"{r.index + 1}. {r.name}", r.status, _num(r.output_tok_per_s),
                     factor_text(r.factor_baseline) or "-", previous or "-", _num(r.total_tok_per_s), factor_text(r.total_factor_baseline) or "-",
                     factor_text(r.total_factor_previous) or "-", _num(r.ttft_ms, 1), _num(r.itl_ms, 2),
                     limit_text(r).replace(" of limit", ""), engine, r.verification if r.ran else "-")
                    + ((quality_cell(r.quality),) if with_quality else ()) + _cost_cells(costs, r.index, bool(good_slo)))
    cells = [[safe(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if 1 < i < 10 or i >= 13 else c.ljust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"workload: {state.workload}"] if state.workload else []
    if state.unfair:
        notes.insert(0, f"WARNING: {state.unfair}: a step's factor may be the machine's, not the feature's")
    for r in state.rows:
        where = f"{r.index + 1}. {r.name}"
        if r.reason and (r.status in ("skipped", "failed", "cancelled", "interrupted") or r.built_on is not None):
            notes.append(f"{where}: {r.status}: {r.reason}")
        if r.loss:
            notes.append(f"{where}: slower than the previous step ({factor_text(r.factor_previous)}): a loss, "
                         "shown as measured")
        if r.ceiling_note and r.ceiling_tok_per_s:
            notes.append(f"{where}: {r.ceiling_note}")
        for check in r.checks:
            if check.status == "not active":
                notes.append(f"{where}: {check.feature} = {check.requested}: NOT ACTIVE ({check.evidence})")
        if r.reference_tok_per_s is not None:
            notes.append(f"{where}: {r.reference_label}: {_num(r.reference_tok_per_s)} tok/s")
        if r.quality and r.quality.get("error"):
            notes.append(f"{where}: quality n/a: {r.quality['error']}")
    if with_quality:
        notes.append(quality_legend(state))
    if len({r.gpus for r in state.rows if r.ran}) > 1:  # steps on different GPU counts: per GPU too
        notes.append("per GPU: " + "; ".join(
            f"{r.index + 1}. {r.gpus} GPU{'s' * (r.gpus != 1)}, {_num(r.output_tok_per_s_per_gpu)} out tok/s per GPU"
            + (f" ({factor_text(r.per_gpu_factor_baseline)} vs baseline)" if r.per_gpu_factor_baseline else "")
            for r in state.rows if r.ran and r.gpus))
    if any(r.ceiling_tok_per_s for r in state.rows):
        notes.append(f"limit: output tok/s against the decode ceiling at the batch the engine ran"
                     f"{' (' + state.planned_for + ')' if state.planned_for else ''}")
    if costs:
        priced = list(costs.values())
        shown = [c.price_text() for c in priced if c.price is not None]
        if shown:
            notes.append("$/1M out: per 1M output tokens at the step's throughput, "
                         + "; ".join(dict.fromkeys(shown)))
        notes += [f"{r.index + 1}. {r.name}: cost n/a ({c.reason})" for r in state.rows
                  if (c := costs.get(r.index)) is not None and c.reason]
        if good_slo:
            notes.append(f"$/1M good: per 1M output tokens of the requests that met {slo_whose or step_slo_whose()} '{good_slo}'")
            notes += [f"{r.index + 1}. {r.name}: good-output cost n/a ({g.reason})" for r in state.rows
                      if (c := costs.get(r.index)) is not None and not c.reason
                      and (g := c.good_output) is not None and g.reason]
    lines += [safe(n) for n in notes]
    return "\n".join(lines)


def format_plan(state: LadderState) -> str:
    """``--dry-run``: each step's change, engine action, planned ceiling, reference, and whether it can run."""
    lines = [safe(f"{state.name}: {len(state.rows)} steps; {state.workload}"),
             safe(f"ceilings planned for {state.planned_for}")]
    if state.reference:
        lines.append(safe(f"reference figures: {state.reference}"))
    for r in state.rows:
        engine = "launch" if r.index == 0 else "relaunch" if r.engine_restart else "reuse the engine"
        ready = f"skipped: {r.reason}" if r.status == "skipped" else "ready"
        ceiling = f"ceiling {_num(r.ceiling_tok_per_s)} tok/s at a batch of {_num(r.ceiling_batch)}" \
            if r.ceiling_tok_per_s else (r.ceiling_note or "no ceiling")
        ref = f"; reference {_num(r.reference_tok_per_s)} tok/s" if r.reference_tok_per_s is not None else ""
        lines.append(safe(f"{r.index + 1}. {r.name}: {r.change}; {engine}; {ceiling}{ref}: {ready}"))
    return "\n".join(lines)


class _LadderConsole(_Console):
    """The run console (phases, feature checks, the live progress line) plus a line per step."""

    def __init__(self, out: TextIO, verbose: bool) -> None:
        super().__init__(out, verbose)
        self._seen: dict[int, str] = {}

    def handle(self, ev: Event) -> None:
        p = ev.payload
        if not isinstance(p, CampaignUpdated):
            super().handle(ev)
            return
        state = p.state
        if not isinstance(state, LadderState):
            return
        if not self._seen:
            self._line(safe(f"{state.name}: {len(state.rows)} steps; {state.workload}"))
        for row in state.rows:
            if self._seen.get(row.index) == row.status:
                continue
            self._seen[row.index] = row.status
            if row.status == "running":
                how = "launching the engine" if row.engine_restart else "reusing the engine"
                self._line(safe(f"== step {row.index + 1}/{len(state.rows)} '{row.name}': {row.change} ({how})"))
            elif row.status != "pending":
                self._line(safe(step_line(row, len(state.rows))))


def _step_index(state: LadderState, step: int | None) -> StepRow:
    """``--step N`` (1-based), or the last step that ran (a stored ladder) or can run (a plan)."""
    if step is not None:
        if not 1 <= step <= len(state.rows):
            raise UserError(f"--step {step}: the ladder has steps 1 to {len(state.rows)}")
        return state.rows[step - 1]
    chosen = state.final_row or next((r for r in reversed(state.rows) if r.config and r.status != "skipped"), None)
    if chosen is None:
        raise UserError("no step of the ladder has a configuration to export")
    return chosen


def _export_step(row: StepRow, fmt: str, output: str, engine_version: str | None = None) -> int:
    from app.export.ladder_report import launch_script

    return shared.write_output(launch_script(row, fmt, engine_version), fmt, output,
                        f"wrote {output} (step {row.index + 1}, {row.name}, as {fmt})")


def cmd_ladder(args: argparse.Namespace) -> int:
    from app.ladder.run import Ladder

    price_table(args.price or ())  # a bad --price is refused before anything is launched
    profile, stem = shared.load_profile_arg(args.profile)
    config = profile.run
    spec, default = ladder_of(profile.ladder, config)
    if args.output is not None:
        shared.check_output(args.output)
    json_path = shared.json_target(args.json)
    if default:
        print(safe(f"{stem} has no [campaigns.ladder] table: using the default order (baseline, FP8 weights, "
                   "batching, FP8 KV cache, prefix caching, speculative decoding)"), file=sys.stderr)
    bus = Bus()
    if args.dry_run or args.output is not None:
        planned = Ladder(config, bus, spec=spec, profile=stem, gpu=args.gpu).plan()
        if args.output is not None:
            return _export_step(_step_index(planned, args.step), args.format, args.output)
        print(format_plan(planned))
        if json_path is not None:
            shared.write_json({"plan": planned.model_dump(mode="json")}, json_path)
        return 0 if any(r.status != "skipped" for r in planned.rows) else shared.EXIT_FAILED
    shared.check_resume_stores(args, "ladder")

    where = open_fleet(args, config)

    def build(recorder: Any, follow: Callable[[Bus], None]) -> Ladder:
        on_cluster: dict[str, Any] = {"fleet": where.fleet, "max_parallel": where.parallel, "on_slot_bus": follow} \
            if where.fleet is not None else {}
        if args.resume is None:
            ladder = Ladder(config, bus, spec=spec, profile=stem, recorder=recorder, telemetry=not args.no_telemetry,
                            **on_cluster)
        else:
            from app.ladder.stored import resumable_ladder

            stored = resumable_ladder(recorder.store, args.resume or None, stem)
            ladder = Ladder.resume(stored, bus, recorder=recorder, telemetry=not args.no_telemetry, **on_cluster)
            kept = sum(1 for r in stored.rows if r.status == "completed")
            print(safe(f"resuming ladder {stored.ladder_id} ({stored.status}): {kept} completed step(s) kept"))
        ladder.cluster = cluster_options(args, where)  # where it runs now: what `tunebench resume` reuses
        return ladder

    console = _LadderConsole(sys.stdout, args.verbose)
    state: LadderState
    ladder, state, recorder = shared.run_campaign(bus, args, build, console.handle, name="tunebench-ladder",
                                                  extra_events=(CampaignUpdated,),
                                                  cancel_note="stopping requests and the engine; --resume goes on "
                                                              "later")
    print()
    costs = _stored_step_costs(args, state)
    print(format_ladder_table(state, costs))
    if json_path is not None:
        campaign = ladder.campaign_result.to_dict() if ladder.campaign_result is not None else None
        shared.write_json({"ladder": ladder_json(state, costs), "campaign": campaign}, json_path, announce=True)
    final = state.final_row
    shared.report_stored(recorder, (f"stored as ladder {state.ladder_id}: runs {', '.join(map(str, state.run_ids))} "
                             f"(tunebench ladders show {state.ladder_id}; tunebench ladders report {state.ladder_id} "
                             f"-o ladder.html"
                             + (f"; tunebench export {final.run_ids[-1]} --format bash: the final step's launch "
                                "script" if final is not None and final.run_ids else "") + ")")
                   if state.run_ids else None)
    return shared.exit_code("ladder", state.status, state.reason, ok=not any(r.status == "failed" for r in state.rows),
                            cancelled_note=f"tunebench: ladder cancelled: tunebench ladder {args.profile} --resume "
                                           f"{state.ladder_id} goes on")


# --- stored ladders ----------------------------------------------------------------------------

def _load(args: argparse.Namespace) -> Any:
    """The stored ladder ``args.ladder`` names."""
    from app.ladder.stored import load_ladder

    return shared.with_store(args, lambda store: load_ladder(store, args.ladder))


def cmd_ladders_list(args: argparse.Namespace) -> int:
    from app.ladder.stored import list_ladders

    ladders = shared.with_store(args, list_ladders)

    def line(s: Any) -> str:
        st = s.state
        done = st.completed_rows
        top = max((r.factor_baseline or 0.0 for r in done), default=0.0)
        return (f"{st.ladder_id}  {shared.when_text(st.started_wall_s)}  {st.status:<11}  "
                f"{len(done)}/{len(st.rows)} steps ran" + (f", up to {factor_text(top)} output tok/s" if top else "")
                + f"  {st.name}  runs {', '.join(map(str, s.run_ids))}")

    return shared.print_list(ladders, as_json=args.json, dump=lambda s: s.state.model_dump(mode="json"),
                             empty="no stored ladders (tunebench ladder PROFILE runs one)", line=line)


def cmd_ladders_show(args: argparse.Namespace) -> int:
    _check_pricing(args)
    stored = _load(args)
    state = stored.state
    costs = _stored_step_costs(args, state)
    if args.json:
        return shared.print_json(ladder_json(state, costs))
    print(safe(f"ladder {state.ladder_id}: {state.name} ({state.status}"
               + (f": {state.reason}" if state.reason else "") + ")"))
    print(format_ladder_table(state, costs, step_slo_whose(args.slo)))
    return 0


def cmd_ladders_compare(args: argparse.Namespace) -> int:
    from app.cli.store_cmds import cmd_compare

    stored = _load(args)
    ids = stored.run_ids
    if len(ids) < 2:
        raise UserError(f"ladder {stored.ladder_id} has {len(ids)} stored run(s): nothing to compare")
    return cmd_compare(argparse.Namespace(runs=[str(i) for i in ids], baseline=str(ids[0]), json=args.json,
                                          no_series=True, db=args.db))


def cmd_ladders_report(args: argparse.Namespace) -> int:
    from app.export.ladder_report import render_ladder_report

    shared.check_output(args.output)
    _check_pricing(args)
    stored = _load(args)
    costs = _stored_step_costs(args, stored.state)
    return shared.write_output(render_ladder_report(stored.state, title=args.title, costs=costs,
                                                    slo_whose=step_slo_whose(args.slo)), "html", args.output)


def cmd_ladders_export(args: argparse.Namespace) -> int:
    shared.check_output(args.output)
    stored = _load(args)
    row = _step_index(stored.state, args.step)
    return _export_step(row, args.format, args.output, stored.state.engine_version)


def register(sub: argparse._SubParsersAction) -> None:
    db = db_parent()
    ladder = sub.add_parser("ladder", parents=[db],
                            help="the acceleration ladder: a plain engine, then one feature at a time, each step "
                                 "measured against the baseline, the previous step and the physical ceiling")
    ladder.add_argument("profile", help="profile file or shipped profile name (e.g. cpu-ladder); without a "
                                        "[campaigns.ladder] table, the default order after the seeds")
    ladder.add_argument("--json", metavar="FILE", help="write the ladder (its steps, figures and runs) as JSON")
    ladder.add_argument("--dry-run", action="store_true",
                        help="check and plan every step without launching anything (a GPU ladder on a machine without "
                             "a GPU is checked and planned for the ladder's GPU)")
    ladder.add_argument("--gpu", metavar="NAME", help="with --dry-run: plan for this GPU (e.g. H100)")
    ladder.add_argument("--export", dest="output", metavar="FILE",
                        help="write a step's launch script instead of running ('-': standard output)")
    ladder.add_argument("--format", "-f", choices=shared.SCRIPT_FORMATS, default="bash", help="with --export (default bash)")
    ladder.add_argument("--step", type=bounded_int(1, 1000), metavar="N", help="with --export: step N (default: the last that can run)")
    ladder.add_argument("--resume", nargs="?", const="", default=None, metavar="LADDER",
                        help="go on with a stopped or crashed ladder (default: this profile's newest unfinished one); "
                             "the steps before the first unfinished one are kept")
    add_run_options(ladder, store_help="do not record the runs in the database")
    add_price_argument(ladder)
    add_cluster_options(ladder)
    ladder.set_defaults(handler=cmd_ladder)

    ladders = sub.add_parser("ladders", parents=[db], help="stored ladders: list (the default), show, compare, "
                                                           "report, export")
    lsub = ladders.add_subparsers(dest="ladders_command", metavar="ACTION")
    ladders.set_defaults(handler=cmd_ladders_list, json=False)
    db = db_parent(argparse.SUPPRESS, "run database")  # after the action too, without hiding one given before it
    shared.add_list_show(lsub, [db], "ladder", list_handler=cmd_ladders_list, show_handler=cmd_ladders_show,
                  show_help="one ladder's steps, figures and factors",
                  show_target_help="ladder id (or a unique start), or one of its runs")
    cmp = lsub.add_parser("compare", parents=[db, json_parent()],
                          help="compare the ladder's runs as a whole, the first step as baseline")
    cmp.add_argument("ladder")
    cmp.set_defaults(handler=cmd_ladders_compare)
    shared.add_report(lsub, [db], "ladder", handler=cmd_ladders_report, help="the ladder's HTML report")
    for action in ("show", "report"):
        add_price_argument(lsub.choices[action])
        add_good_slo_argument(lsub.choices[action], "the steps were")
    exp = lsub.add_parser("export", parents=[db], help="a step's launch script (default: the final step that ran)")
    exp.add_argument("ladder")
    exp.add_argument("--step", type=bounded_int(1, 1000), metavar="N", help="step N (1-based)")
    exp.add_argument("--format", "-f", choices=shared.SCRIPT_FORMATS, default="bash")
    exp.add_argument("-o", "--output", metavar="FILE", default=STDOUT,
                     help="output file ('-' or none: standard output)")
    exp.set_defaults(handler=cmd_ladders_export)
