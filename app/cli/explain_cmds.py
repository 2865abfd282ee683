"""``tunebench explain RUN [--against REF] [--json] [--db ...]``: a stored run explained from what
it measured (``app.analysis.findings``); ``tunebench explain --rules``: every rule, what it
reads and which engines' counters support it; ``tunebench explain --planner``: every stored run
against the planner's ceiling, and how close each hardware came to it; ``--ladder ID`` and
``--tune ID``: a campaign explained with its runs' findings (``app.campaign_findings``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from app.analysis.findings import RULES, Finding, explain, finding_dicts, load_run, supported_engines
from app.campaign_findings import ladder_lines, tune_lines
from app.cli.argtypes import db_parent, json_parent
from app.cli.store_cmds import open_store
from app.cli.terminal import safe
from app.errors import UserError
from app.ladder.stored import load_ladder
from app.planner.stored import ceiling_checks, level_limits, planner_accuracy
from app.run_findings import suggestion_text
from app.tuner.stored import load_tune
from engine_adapters.registry import METRICS


def finding_text(finding: Finding) -> list[str]:
    """One block per finding: severity and rule, the explanation, the evidence, the next trial."""
    lines = [f"[{finding.severity}] {finding.rule} (confidence {finding.confidence})", f"  {finding.explanation}"]
    lines += [f"  - {e.text()}" for e in finding.evidence]
    if finding.suggestion:
        lines.append("  next trial: " + suggestion_text(finding.suggestion))
    return lines


def _share(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.1f}%"


def _error(pct: float) -> str:
    """``+300%``: the ceiling predicted four times what was measured."""
    return f"{pct:+,.0f}%"


def planner_report(args: argparse.Namespace) -> int:
    """Every stored level the planner could plan, against its ceiling, and per hardware how close
    the runs came: how good the planner is on this hardware."""
    with open_store(args) as store:
        checks = ceiling_checks(store.get_run(info.id) for info in reversed(store.list_runs()))
    accuracy = planner_accuracy(checks)
    if args.json:
        json.dump({"hardware": [asdict(a) for a in accuracy],
                   "levels": [{"run": c.run_id, "name": c.name, "hardware": c.hardware, "level": c.level,
                               "error_pct": c.error_pct, **c.figures.model_dump(mode="json")} for c in checks]},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not checks:
        print("no stored run the planner could plan (an imported run, or one without a known GPU or CPU bandwidth)")
        return 0
    print(f"planner against measurement: {len(checks)} level(s) of {len({c.run_id for c in checks})} run(s)")
    for a in accuracy:
        above = f"; {a.above_ceiling} above the ceiling (a bug in the plan or the measurement)" if a.above_ceiling else ""
        error = f"; prediction error {_error(a.median_error_pct)} (median)" if a.median_error_pct is not None else ""
        print(safe(f"{a.hardware}: {a.levels} level(s), measured {_share(a.median_share)} of the ceiling "
                   f"(median; {_share(a.lowest_share)} to {_share(a.highest_share)}){error}{above}"))
    print("prediction error: (the ceiling - the measured rate) / the measured rate; the planner predicts the "
          "physics' limit, so what a run leaves below it is its error on this hardware")
    print()
    for c in checks:
        f = c.figures
        print(safe(f"run {c.run_id} ({c.name}) level {c.level} on {c.hardware}: {f.measured_tok_per_s:,.0f} of "
                   f"{f.ceiling_tok_per_s:,.0f} tok/s at a batch of {f.batch:,.1f}"
                   + (f" (prediction error {_error(c.error_pct)})" if c.error_pct is not None else "")
                   + f": {f.text()}"))
    return 0


def campaign_report(args: argparse.Namespace) -> int:
    """A ladder's steps or a tune's pick and rejected trials, each with its runs' findings."""
    with open_store(args) as store:
        if args.ladder is not None:
            lines = ladder_lines(store, load_ladder(store, args.ladder).state)
        else:
            lines = tune_lines(store, load_tune(store, args.tune))
    print("\n".join(safe(line) for line in lines))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    if args.planner:
        return planner_report(args)
    if args.ladder is not None or args.tune is not None:
        return campaign_report(args)
    if args.rules:
        engines = {kind: m.metric_names for kind, m in METRICS.items()}
        for r in RULES.values():
            print(safe(f"{r.name}: {r.detects}"))
            print(safe(f"  reads: {r.reads}; engines: {', '.join(supported_engines(r, engines)) or 'none'}"))
        return 0
    if args.run is None:
        raise UserError("explain needs a RUN (id, uid prefix or name), or --rules, or --planner")
    with open_store(args) as store:
        run = load_run(store, args.run, level_limits)
        reference = load_run(store, args.against, level_limits) if args.against is not None else None
    findings = explain(run, reference)
    if args.json:
        json.dump(finding_dicts(findings), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    against = f" against run {reference.run.id}" if reference is not None else ""
    print(safe(f"run {run.run.id} ({run.run.name}){against}"))
    for finding in findings:
        if finding.rule == "no_warning":
            print(safe(finding.explanation))
            continue
        print()
        print("\n".join(safe(line) for line in finding_text(finding)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", parents=[db_parent(), json_parent()],
                       help="a stored run explained from what it measured: findings and the next trial")
    p.add_argument("run", nargs="?", help="run id, uid (prefix) or name")
    p.add_argument("--against", metavar="REF", help="a reference run: also say why RUN differs from it")
    p.add_argument("--rules", action="store_true", help="list the rules, what each reads and the engines it supports")
    p.add_argument("--ladder", metavar="ID", help="a stored ladder: each step's factor and why (its runs' findings)")
    p.add_argument("--tune", metavar="ID", help="a stored tune: its pick and why each rejected trial failed")
    p.add_argument("--planner", action="store_true",
                   help="every stored run against the planner's ceiling: how close each hardware came to it")
    p.set_defaults(handler=cmd_explain)
