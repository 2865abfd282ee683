"""``tunebench runs list|show|delete|tag|rename``, ``tunebench compare``, ``tunebench export``,
``tunebench import``: the run store from the command line (``--db PATH`` or ``TUNEBENCH_DB``)."""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.errors import UserError
from app.export import (
    DATA_FORMATS,
    SCRIPT_FORMATS,
    import_results,
    render_launch,
    render_report,
    run_to_csv,
    run_to_json,
    spec_from_profile,
    spec_from_run,
)
from app.profiles import ProfileError, resolve_profile
from db.compare import Comparison, MetricDelta, align_series, compare_runs, run_metrics
from db.models import RUN_STATUSES
from db.store import RunInfo, RunStore, StoreError
from db.summary import lower_is_better

_AGO_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@contextmanager
def open_store(args: argparse.Namespace) -> Iterator[RunStore]:
    """The store named by --db, TUNEBENCH_DB or the default; store errors become one line."""
    try:
        store = RunStore(args.db)
    except StoreError as exc:
        raise UserError(str(exc)) from None
    try:
        yield store
    except StoreError as exc:
        raise UserError(str(exc)) from None
    finally:
        store.close()


def parse_when(text: str) -> float:
    """``2026-11-01``, ``2026-11-01T10:00`` (UTC) or an age such as ``36h`` / ``7d``."""
    text = text.strip()
    match = _AGO_RE.match(text)
    if match:
        return time.time() - float(match.group(1)) * _UNITS_S[match.group(2)]
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"'{text}' is not a date (YYYY-MM-DD[THH:MM]) or an age like 36h or 7d") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


def _num(value: Any, fmt: str = "{:,.1f}") -> str:
    return "-" if not isinstance(value, int | float) else fmt.format(value)


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _one_line(text: str, limit: int = 40) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# --- runs ---------------------------------------------------------------------------------------

def cmd_runs_list(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        runs = store.list_runs(engine=args.engine, model=args.model, tag=args.tag, status=args.status,
                               since=parse_when(args.since) if args.since else None,
                               until=parse_when(args.until) if args.until else None, name=args.name,
                               limit=args.limit)
    if args.json:
        _print_json([r.model_dump(mode="json") for r in runs])
        return 0
    if not runs:
        print("no runs" + (" match" if any([args.engine, args.model, args.tag, args.status, args.since, args.until,
                                             args.name]) else " stored yet"))
        return 0
    _table([[str(r.id), r.status + ("*" if r.imported else ""), _one_line(r.name, 30), _one_line(r.model, 30),
             _when(r.started_at), _num(r.metrics.get("output_tok_per_s")), _num(r.metrics.get("ttft_ms_p50")),
             _num(r.metrics.get("requests_total"), "{:,.0f}"), ",".join(r.tags)] for r in runs],
           ["ID", "STATUS", "NAME", "MODEL", "STARTED (UTC)", "OUT TOK/S", "TTFT P50 MS", "REQUESTS", "TAGS"])
    if any(r.imported for r in runs):
        print("* imported from another tool")
    return 0


def _show_text(store: RunStore, run_id: int, show_log: bool) -> None:
    run = store.get_run(run_id)
    print(f"run {run.id}  {run.name}")
    print(f"  uid:       {run.uid}")
    print(f"  status:    {run.status}" + (f" ({run.reason})" if run.reason else ""))
    print(f"  started:   {_when(run.started_at)} UTC" + (f", {run.duration_s:.1f} s" if run.duration_s else ""))
    print(f"  engine:    {run.engine_kind} {run.engine_version or ''}".rstrip())
    print(f"  model:     {run.model}")
    if run.imported_from:
        print(f"  imported:  {run.imported_from}")
    if run.tags:
        print(f"  tags:      {', '.join(run.tags)}")
    if run.notes:
        print(f"  notes:     {run.notes}")
    if run.endpoint:
        print(f"  endpoint:  {run.endpoint}")
    if run.argv:
        print(f"  argv:      {' '.join(run.argv)}")
    hw = run.hardware or {}
    if hw:
        gpus = ", ".join(str(g.get("name")) for g in hw.get("gpus") or []) or "no GPU"
        print(f"  hardware:  {gpus}; CPU {hw.get('cpu_model', '?')} x{hw.get('cpu_count_logical', '?')}, "
              f"{(hw.get('ram_total_bytes') or 0) / 2**30:.0f} GiB RAM")
    print(f"  recorded:  {run.n_requests:,} requests, {run.n_samples:,} samples, {run.n_log_lines:,} log lines"
          + (f", {run.dropped_items:,} items dropped by a slow writer" if run.dropped_items else ""))
    for level in run.levels:
        summary = level.summary or {}
        print(f"  level {level.idx} {level.label}: " + ", ".join(
            f"{k}={_num(v, '{:,.4g}')}" for k, v in list(summary.items())[:6] if isinstance(v, int | float)))
    if run.metrics:
        print("  metrics:")
        for key, value in run.metrics.items():
            if not key.startswith("L"):
                print(f"    {key:24s} {value:,.4g}")
    if show_log:
        print("  engine log:")
        for line in store.log_lines(run.id):
            print(f"    | {line}")


def cmd_runs_show(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        run_id = store.resolve(args.run)
        if args.json:
            data = store.get_run(run_id).model_dump(mode="json")
            if args.log:
                data["log"] = store.log_lines(run_id)
            _print_json(data)
        else:
            _show_text(store, run_id, args.log)
    return 0


def cmd_runs_delete(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        ids = [store.resolve(r) for r in args.runs]  # all must exist before anything is deleted
        for run_id in ids:
            store.delete(run_id)
            print(f"deleted run {run_id}")
    return 0


def cmd_runs_tag(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        run_id = store.resolve(args.run)
        tags = store.tag(run_id, remove=args.tags) if args.remove else store.tag(run_id, add=args.tags)
    if args.json:
        _print_json({"id": run_id, "tags": tags})
    else:
        print(f"run {run_id}: tags {', '.join(tags) or '(none)'}")
    return 0


def cmd_runs_rename(args: argparse.Namespace) -> int:
    name = args.name.strip()
    if not name:
        raise UserError("the new name must not be blank")
    with open_store(args) as store:
        run_id = store.resolve(args.run)
        store.rename(run_id, name)
        if args.notes is not None:
            store.set_notes(run_id, args.notes)
    print(f"run {run_id}: renamed to {name}")
    return 0


# --- compare --------------------------------------------------------------------------------------

def _print_comparison(c: Comparison) -> None:
    labels = [f"#{r.id}" + (" (base)" if i == c.baseline else "") for i, r in enumerate(c.runs)]
    for i, r in enumerate(c.runs):
        print(f"{labels[i]:12s} {r.name}  [{r.status}]  {r.model}  {_when(r.started_at)}")
    print()
    if c.config_diff:
        print("configuration differences:")
        _table([[k, *[_one_line(json.dumps(v) if not isinstance(v, str) else v, 28) for v in vals]]
                for k, vals in c.config_diff], ["SETTING", *labels])
    else:
        print("configuration: identical")
    print()
    rows = []
    for m in c.metrics:
        cells = []
        for i, v in enumerate(m.values):
            cell = _num(v, "{:,.4g}")
            if i != c.baseline and m.delta[i] is not None:
                pct = m.delta_pct[i]
                verdict = {"better": ", better", "worse": ", worse"}.get(m.verdict(i), "")
                cell += f" ({pct:+.1f}%{verdict})" if pct is not None else f" ({m.delta[i]:+,.4g})"
            cells.append(cell)
        rows.append([m.name, *cells])
    print("metrics (delta vs baseline):")
    _table(rows, ["METRIC", *labels])
    if c.series:
        print(f"\n{len(c.series)} telemetry series aligned at {c.bin_s:g} s (see --json or an html export)")


def cmd_compare(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        comparison = compare_runs(store, args.runs, args.baseline, series=args.json and not args.no_series)
    if args.json:
        _print_json(comparison.to_dict())
    else:
        _print_comparison(comparison)
    return 0


# --- export / import -----------------------------------------------------------------------------

def _write_output(text: str, output: str | None, executable: bool) -> None:
    if output in (None, "-"):
        sys.stdout.write(text)
        return
    path = Path(output)
    if path.is_dir():
        raise UserError(f"{path} is a directory: give a file name with -o")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        if executable:
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    print(f"wrote {path}", file=sys.stderr)


def _profile_target(target: str) -> Path | None:
    if target.endswith(".toml") or Path(target).is_file():
        try:
            return resolve_profile(target)
        except ProfileError as exc:
            raise UserError(str(exc)) from None
    return None


def cmd_export(args: argparse.Namespace) -> int:
    fmt = args.format
    targets = args.targets
    if fmt in SCRIPT_FORMATS:
        if len(targets) != 1:
            raise UserError(f"--format {fmt} exports one run or profile")
        profile = _profile_target(targets[0])
        if profile is not None:
            spec = spec_from_profile(profile)
        else:
            with open_store(args) as store:
                try:
                    spec = spec_from_run(store.get_run(targets[0]))
                except StoreError:
                    try:
                        spec = spec_from_profile(resolve_profile(targets[0]))
                    except (ProfileError, UserError):
                        raise UserError(f"'{targets[0]}' is neither a stored run nor a profile") from None
        _write_output(render_launch(spec, fmt), args.output, executable=fmt in ("bash", "docker"))
        return 0
    with open_store(args) as store:
        for target in targets:
            try:
                store.resolve(target)
            except StoreError:
                if target.endswith(".toml") or Path(target).is_file() or _is_shipped_profile(target):
                    raise UserError(f"--format {fmt} needs runs; '{target}' is a profile, which has no "
                                    "results") from None
                raise
        if fmt == "html":
            comparison = (compare_runs(store, targets, args.baseline) if len(targets) > 1
                          else _single(store, targets[0]))
            text = render_report(comparison, args.title)
        elif len(targets) != 1:
            raise UserError(f"--format {fmt} exports one run")
        elif fmt == "json":
            text = json.dumps(run_to_json(store, targets[0]), indent=1, default=str) + "\n"
        else:
            text = run_to_csv(store, targets[0])
    _write_output(text, args.output, executable=False)
    return 0


def _is_shipped_profile(name: str) -> bool:
    try:
        resolve_profile(name)
    except ProfileError:
        return False
    return True


def _single(store: RunStore, ref: str) -> Comparison:
    """A report of one run: the same tables and charts, with no deltas."""
    run = store.get_run(ref)
    series, bin_s = align_series(store, [run])
    metrics = [MetricDelta(k, [v], [0.0], [0.0], lower_is_better(k)) for k, v in run_metrics(run).items()]
    return Comparison([run], 0, [], metrics, series, bin_s)


def cmd_import(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        runs: list[RunInfo] = [store.get_run(i) for i in import_results(store, args.file, args.name)]
    if args.json:
        _print_json([r.model_dump(mode="json") for r in runs])
    else:
        for run in runs:
            print(f"imported {args.file} as run {run.id} ({run.name}, "
                  f"{run.metrics.get('requests_total', 0):,.0f} requests)")
    return 0


# --- registration ----------------------------------------------------------------------------------

def _db_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--db", metavar="PATH", default=None,
                        help="run database (default: $TUNEBENCH_DB or runs.db in the user data directory)")
    return parent


def register(sub: argparse._SubParsersAction) -> None:
    db = _db_parent()
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON")

    runs = sub.add_parser("runs", help="list, show, tag, rename or delete stored runs")
    rsub = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=True)

    ls = rsub.add_parser("list", parents=[db, as_json], help="stored runs, newest first")
    ls.add_argument("--engine", help="engine kind, e.g. vllm")
    ls.add_argument("--model", help="model name contains this")
    ls.add_argument("--name", help="run name contains this")
    ls.add_argument("--tag", help="has this tag")
    ls.add_argument("--status", choices=RUN_STATUSES)
    ls.add_argument("--since", help="started at or after: YYYY-MM-DD[THH:MM] (UTC) or an age like 7d")
    ls.add_argument("--until", help="started before: YYYY-MM-DD[THH:MM] (UTC) or an age like 1h")
    ls.add_argument("--limit", type=int, help="at most N runs")
    ls.set_defaults(handler=cmd_runs_list)

    show = rsub.add_parser("show", parents=[db, as_json], help="everything recorded about one run")
    show.add_argument("run", help="run id, uid (prefix) or name")
    show.add_argument("--log", action="store_true", help="include the engine log")
    show.set_defaults(handler=cmd_runs_show)

    rm = rsub.add_parser("delete", parents=[db], help="delete runs and all their data")
    rm.add_argument("runs", nargs="+", metavar="RUN")
    rm.set_defaults(handler=cmd_runs_delete)

    tag = rsub.add_parser("tag", parents=[db, as_json], help="add (or --remove) tags")
    tag.add_argument("run")
    tag.add_argument("tags", nargs="+", metavar="TAG")
    tag.add_argument("--remove", action="store_true", help="remove these tags instead")
    tag.set_defaults(handler=cmd_runs_tag)

    rename = rsub.add_parser("rename", parents=[db], help="rename a run (and optionally set its notes)")
    rename.add_argument("run")
    rename.add_argument("name")
    rename.add_argument("--notes", help="replace the run's notes")
    rename.set_defaults(handler=cmd_runs_rename)

    cmp = sub.add_parser("compare", parents=[db, as_json],
                         help="config differences and metric deltas of runs against a baseline")
    cmp.add_argument("runs", nargs="+", metavar="RUN")
    cmp.add_argument("--baseline", metavar="RUN", help="the run deltas are measured against (default: the first)")
    cmp.add_argument("--no-series", action="store_true", help="leave the aligned telemetry out of --json")
    cmp.set_defaults(handler=cmd_compare)

    export = sub.add_parser("export", parents=[db], help="a launch script from a run or profile, or a run's data")
    export.add_argument("targets", nargs="+", metavar="RUN_OR_PROFILE",
                        help="a run (id, uid or name) or a profile (.toml or shipped name); html compares several runs")
    export.add_argument("--format", "-f", required=True, choices=[*SCRIPT_FORMATS, *DATA_FORMATS])
    export.add_argument("-o", "--output", metavar="FILE", help="output file (default: standard output)")
    export.add_argument("--baseline", metavar="RUN", help="html: the baseline run (default: the first)")
    export.add_argument("--title", help="html: report title")
    export.set_defaults(handler=cmd_export)

    imp = sub.add_parser("import", parents=[db, as_json],
                         help="import a `vllm bench serve` result, a GuideLLM benchmarks.json or a tunebench JSON export")
    imp.add_argument("file")
    imp.add_argument("--name", help="name of the imported run")
    imp.set_defaults(handler=cmd_import)
