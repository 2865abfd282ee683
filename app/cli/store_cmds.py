"""``tunebench runs list|show|delete|tag|rename``, ``tunebench compare``, ``tunebench export``,
``tunebench import``: the run store from the command line (``--db PATH`` or ``TUNEBENCH_DB``)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from app.analysis.compare import Comparison, MetricDelta, compare_runs
from app.analysis.metric_catalog import metric
from app.cli.argtypes import (
    MAX_COUNT,
    add_good_slo_argument,
    add_price_argument,
    add_sizing_arguments,
    bounded_int,
    db_parent,
    json_parent,
)
from app.cli.terminal import safe
from app.cost import (
    PriceTable,
    RunCost,
    compared_costs,
    compared_good_costs,
    comparison_slo,
    cost_factor,
    cost_factor_text,
    price_table,
    unused_prices,
    usd_text,
)
from app.errors import UserError
from app.events import NOTE_PREFIX
from app.export import DATA_FORMATS, SCRIPT_FORMATS, STDOUT, Target, export, import_results
from app.export.files import check_target
from app.headline import compared_quality
from app.money import short_text
from app.profiles import ProfileError, resolve_profile
from app.quality.probe import quality_cell, shown_quality
from app.quality.task_accuracy import Z_95, compare_task_accuracy, comparison_lines
from app.quality.text import quality_kept
from app.store import RunInfo, RunStore, StoreError, StoreMissing
from db.models import RUN_STATUSES
from engine_adapters.registry import engine_terms_for

_AGO_RE = re.compile(r"^(\d{1,12}(?:\.\d{1,12})?)\s*([smhdw])$")
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class NoStore(UserError):
    """The store a command would read is not there: a command that can do without it (export of a
    shipped profile) tells this apart from the store's other errors."""


@contextmanager
def open_store(args: argparse.Namespace, *, create: bool = False) -> Iterator[RunStore]:
    """The store named by --db, TUNEBENCH_DB or the default; store errors become one line. Only
    a command that stores new runs passes ``create``: one that reads (or changes stored runs)
    refuses a store that is not there, and makes nothing (``RunStore(create=False)``)."""
    try:
        store = RunStore(args.db, create=create)
    except StoreMissing as exc:
        raise NoStore(str(exc)) from None
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
    if not text:
        raise UserError("the date is empty: give YYYY-MM-DD[THH:MM] (UTC) or an age like 36h or 7d")
    match = _AGO_RE.match(text)
    if match:
        return time.time() - float(match.group(1)) * _UNITS_S[match.group(2)]
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"{text[:40]!r} is not a date (YYYY-MM-DD[THH:MM]) or an age like 36h or 7d") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _when_arg(text: str) -> float:
    """``parse_when`` for argparse: a bad date is a usage error."""
    try:
        return parse_when(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_when_arg.__name__ = "date"


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


def _num(value: Any, fmt: str = "{:,.1f}") -> str:
    return "-" if not isinstance(value, int | float) else fmt.format(value)


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _table(rows: list[list[str]], header: list[str]) -> None:
    cells = [[safe(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _one_line(text: str, limit: int = 40) -> str:
    text = safe(" ".join(str(text).split()))
    return text if len(text) <= limit else text[:limit - 1] + "…"


# --- runs ---------------------------------------------------------------------------------------

def cmd_runs_list(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        runs = store.list_runs(engine=args.engine, model=args.model, tag=args.tag, status=args.status,
                               since=args.since, until=args.until, name=args.name, author=args.author,
                               host=args.host, gpu_model=args.gpu, limit=args.limit)
    if args.json:
        _print_json([r.model_dump(mode="json") for r in runs])
        return 0
    shared = len({(r.author, r.host) for r in runs}) > 1  # a team's store: say whose each run is
    if not runs:
        filters = [args.engine, args.model, args.tag, args.status, args.since, args.until, args.name, args.author,
                   args.host, args.gpu]
        print("no runs" + (" match" if any(f is not None for f in filters) else " stored yet"))
        return 0
    _table([[str(r.id), r.status + ("*" if r.imported else ""), _one_line(r.name, 30), _one_line(r.model, 30),
             _when(r.started_at), _num(r.metrics.get("output_tok_per_s")), _num(r.metrics.get("ttft_ms_p50")),
             _num(r.metrics.get("requests_total"), "{:,.0f}"), ",".join(r.tags)]
            + ([_one_line(_by(r), 30)] if shared else []) for r in runs],
           ["ID", "STATUS", "NAME", "MODEL", "STARTED (UTC)", "OUT TOK/S", "TTFT P50 MS", "REQUESTS", "TAGS"]
           + (["BY"] if shared else []))
    if any(r.imported for r in runs):
        print("* imported from another tool")
    return 0


def _show_text(store: RunStore, run_id: int, show_log: bool) -> None:
    run = store.get_run(run_id)

    def out(line: str) -> None:
        """Every line holds user text (name, notes, tags, endpoint, log): escaped."""
        print(safe(line))

    out(f"run {run.id}  {run.name}")
    out(f"  uid:       {run.uid}")
    out(f"  status:    {run.status}" + (f" ({run.reason})" if run.reason else ""))
    out(f"  started:   {_when(run.started_at)} UTC" + (f", {run.duration_s:.1f} s" if run.duration_s else ""))
    out(f"  engine:    {run.engine_kind} {run.engine_version or ''}".rstrip())
    out(f"  model:     {run.model}")
    if run.imported_from:
        out(f"  imported:  {run.imported_from}")
    if run.tags:
        out(f"  tags:      {', '.join(run.tags)}")
    if run.notes:
        out(f"  notes:     {run.notes}")
    if run.endpoint:
        out(f"  endpoint:  {run.endpoint}")
    if run.argv:
        out(f"  argv:      {' '.join(run.argv)}")
    hw = run.hardware or {}
    if hw:
        gpus = ", ".join(str(g.get("name")) for g in hw.get("gpus") or []) or "no GPU"
        out(f"  hardware:  {gpus}; CPU {hw.get('cpu_model', '?')} x{hw.get('cpu_count_logical', '?')}, "
              f"{(hw.get('ram_total_bytes') or 0) / 2**30:.0f} GiB RAM")
    out(f"  recorded:  {run.n_requests:,} requests, {run.n_samples:,} samples, {run.n_log_lines:,} log lines"
          + (f", {run.dropped_items:,} items dropped by a slow writer" if run.dropped_items else ""))
    for level in run.levels:
        summary = level.summary or {}
        out(f"  level {level.idx} {level.label}: " + ", ".join(
            f"{k}={_num(v, '{:,.4g}')}" for k, v in list(summary.items())[:6] if isinstance(v, int | float)))
    if run.metrics:
        out("  metrics:")
        for key, value in run.metrics.items():
            if not key.startswith("L") and isinstance(value, int | float):  # per-level and reliability notes aside
                shown = metric(key)
                out(f"    {shown.label:34s} {shown.format(value)}")
    quality = shown_quality(run.quality)
    if quality:
        against = quality.get("reference") or {}
        where = {"self": "itself (the control)"}.get(against.get("kind", ""), against.get("label") or
                                                         f"run {against.get('run_id', '?')}")
        out(f"  quality:   {quality_cell(quality)} against {where}" + (
            f"; probe {quality['wall_s']:.1f} s at batch {quality.get('batch')}" if quality.get("wall_s") else "")
            + (f" ({quality['error']})" if quality.get("error") else ""))
    log = store.log_lines(run.id)
    notes = [line.removeprefix(NOTE_PREFIX) for line in log if line.startswith(NOTE_PREFIX)]
    if notes:
        out("  tunebench's notes:")  # which tokenizer counted, cache salts, what the trace implies, ...
        for note in notes:
            out(f"    - {note}")
    if show_log:
        out("  engine log:")
        for line in log:
            out(f"    | {line}")


def find_request(records: list[dict[str, Any]], run_id: int, wanted: str) -> dict[str, Any]:
    """The stored request sent as ``X-Request-Id: wanted`` (``app.load.client.request_id``)."""
    ids = [(r.get("extra") or {}).get("request_id") for r in records]
    for record, rid in zip(records, ids, strict=True):
        if rid == wanted:
            return record
    known = [rid for rid in ids if rid]
    if not known:
        raise UserError(f"run {run_id} recorded no request ids (it was recorded before tunebench sent them, or "
                        "imported)")
    raise UserError(f"run {run_id} has no request {short_text(wanted)}: its {len(known):,} ids run from "
                    f"{known[0]} to {known[-1]}")


def request_timeline(record: dict[str, Any]) -> list[str]:
    """One request's life in lines, its times from the start of its level: scheduled, sent, first
    and last token, the tokens and how it ended."""
    extra = record.get("extra") or {}
    start_s, scheduled_s = extra.get("start_s"), extra.get("scheduled_s")
    ttft_ms, e2e_ms, itl = record.get("ttft_ms"), record.get("e2e_ms"), record.get("itl_ms") or []

    def at(offset_s: float | None) -> str:
        return f"+{offset_s:,.3f} s" if isinstance(offset_s, int | float) else "-"

    lines = [f"request {extra.get('request_id') or record['seq']} (level {record['level']}, "
             f"the run's request {extra.get('index', record['seq'])})"]
    if scheduled_s is not None:
        lines.append(f"  scheduled    {at(scheduled_s)} after the level started")
    queued = extra.get("queue_ms")
    lines.append(f"  sent         {at(start_s)}" + (f" ({queued:,.1f} ms after it was scheduled)"
                                                     if isinstance(queued, int | float) else ""))
    if isinstance(ttft_ms, int | float):
        lines.append(f"  first token  {at(start_s + ttft_ms / 1e3 if start_s is not None else None)} "
                     f"(TTFT {ttft_ms:,.1f} ms)")
    if isinstance(e2e_ms, int | float):
        gaps = f"; {len(itl):,} tokens after the first" + (
            f": ITL p50 {float(np.median(itl)):,.2f} ms, max {max(itl):,.2f} ms" if itl else "")
        lines.append(f"  last token   {at(start_s + e2e_ms / 1e3 if start_s is not None else None)} "
                     f"(E2E {e2e_ms:,.1f} ms{gaps})")
    finish = extra.get("finish_reason")
    lines.append(f"  tokens       {record.get('input_tokens') if record.get('input_tokens') is not None else '?'} in, "
                 f"{record.get('output_tokens') or 0:,} out" + (f" (finish: {finish})" if finish else ""))
    http = f"HTTP {extra['http_status']}, " if extra.get("http_status") is not None else ""
    lines.append(f"  {http}" + (f"failed: {record['error']}" if record.get("error") else "completed"))
    return lines


def cmd_runs_show(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        run_id = store.resolve(args.run)
        if args.request is not None:
            record = find_request(store.request_records(run_id), run_id, args.request)
            if args.json:
                _print_json(record)
            else:
                print("\n".join(safe(line) for line in request_timeline(record)))
            return 0
        if args.json:
            data = store.get_run(run_id).model_dump(mode="json")
            data["quality"] = shown_quality(data.get("quality"))  # the figures, not the outputs kept
            if args.log:
                data["log"] = store.log_lines(run_id)
            _print_json(data)
        else:
            _show_text(store, run_id, args.log)
    return 0


def _by(run: RunInfo) -> str:
    """Who recorded a run, and where: ``ada@gpu-box-7``."""
    return "@".join(part for part in (run.author, run.host) if part)


def cmd_runs_delete(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        ids = [store.resolve(r) for r in args.runs]  # all must exist before anything is deleted
        others = [(i, run.author) for i in ids if (run := store.get_run(i)).author not in ("", store.author)]
        if others and not args.force:
            shown = ", ".join(f"{i} ({author})" for i, author in others[:5]) + (", ..." if len(others) > 5 else "")
            raise StoreError(f"run(s) {shown} were recorded by someone else; nothing was deleted: pass --force to "
                             f"delete them")
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
        print(safe(f"run {run_id}: tags {', '.join(tags) or '(none)'}"))
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
    print(safe(f"run {run_id}: renamed to {name}"))
    return 0


# --- compare --------------------------------------------------------------------------------------

def _comparison_cell(m: MetricDelta, i: int, footnotes: dict[str, int]) -> str:
    """A figure with its change and verdict (``2,345.6 (x1.90 better)``); an unreliable one is
    marked and its reason goes to a numbered footnote, so the table stays narrow."""
    text = m.value_text(i)
    if m.values[i] is None:
        return text
    verdict = m.verdict(i)
    own = m.unreliable[i]
    if own is not None or verdict == "unreliable":
        reason = own or f"the baseline's figure is unreliable: {m.unreliable[m.baseline]}"
        mark = footnotes.setdefault(reason, len(footnotes) + 1)
        return f"{text} (unreliable [{mark}])"
    note = m.note(i)
    return f"{text} ({note})" if note else text


def _print_comparison(c: Comparison) -> None:
    labels = [f"#{r.id}" + (f" x{len(m)}" if len(m) > 1 else "") + (" (base)" if i == c.baseline else "")
              for i, (r, m) in enumerate(zip(c.runs, c.members, strict=True))]
    for i, r in enumerate(c.runs):
        print(safe(f"{labels[i]:14s} {r.name}  [{r.status}]  {r.model}  {_when(r.started_at)}"
                   + (f"  (mean of runs {', '.join(str(x) for x in c.members[i])})" if len(c.members[i]) > 1 else "")))
    print()
    if c.unfair:
        print(safe(f"warning: {c.unfair}: a figure that moved may have moved with the machine"))
        print()
    if c.config_diff:
        print("configuration differences:")
        settings: list[list[str]] = []
        for k, vals in c.config_diff:
            settings.append([k, *[_one_line(json.dumps(v) if not isinstance(v, str) else v, 28) for v in vals]])
            if k in c.engine_terms:  # what each engine was given, in its own words
                settings.append(["  as given to the engine", *[_one_line(t or "(engine default)", 28)
                                                                 for t in c.engine_terms[k]]])
        _table(settings, ["SETTING", *labels])
    else:
        print("configuration: identical")
    footnotes: dict[str, int] = {}
    for title, rows in (("headline", c.headline()), ("all figures", [m for m in c.metrics if not m.headline])):
        if not rows:
            continue
        print(f"\n{title} (against the baseline; x = factor where higher is better, % where lower is better):")
        _table([[f"{m.metric.label}, {m.metric.direction_text}" if m.metric.direction != "neutral"
                 else m.metric.label, *[_comparison_cell(m, i, footnotes) for i in range(len(m.values))]]
                for m in rows], ["METRIC", *labels])
    for reason, mark in footnotes.items():
        print(f"[{mark}] {reason}")
    if any(len(m) > 1 for m in c.members):
        print("repeat sets: mean ± half the 95% confidence interval; 'no significant difference' = "
              "Welch's t-test p >= 0.05 (docs/metrics.md)")
    if c.series:
        print(f"\n{len(c.series)} telemetry series aligned at {c.bin_s:g} s (see --json or an html export)")


def _print_quality(c: Comparison) -> None:
    """Each probed run's quality against its reference, in the words every face uses
    (``app.quality.text``); nothing when no run was probed."""
    kept = [compared_quality(c, i) for i in range(len(c.runs))]
    if not any(kept):
        return
    print("\nquality (the probe against each run's reference; 'within the noise floor': nothing measurably lost):")
    for i, (run, said) in enumerate(zip(c.runs, kept, strict=True)):
        label = f"#{run.id}" + (" (base)" if i == c.baseline else "")
        print(safe(f"  {label}: {said.text if said is not None else 'no quality probe'}"))


def _print_costs(c: Comparison, costs: list[RunCost], prices: PriceTable, good_slo_text: str = "") -> None:
    """$ per 1M tokens per run and the factor against the baseline in words (lower is better)."""
    labels = [f"#{r.id}" + (" (base)" if i == c.baseline else "") for i, r in enumerate(c.runs)]
    base = costs[c.baseline]
    print("\ncost at each run's measured throughput (lower is better; $ per 1M tokens = GPUs x price per "
          "GPU-hour / (tok/s x 3600) x 1e6):")
    rows = []
    good = any(cost.good_output is not None for cost in costs)
    kept = [quality_kept(run.quality) for run in c.runs]  # beside the price: what it kept of the reference
    quality = [[k.figure if k is not None else "-"] for k in kept] if any(k and k.measured for k in kept) \
        else [[] for _ in kept]
    for i, cost in enumerate(costs):
        if cost.output.usd is None:
            rows.append([labels[i], "n/a", "n/a", *(["n/a"] if good else []), *quality[i], "-"])
            continue
        factor = "" if i == c.baseline else cost_factor_text(base, cost)
        good_cells = []
        if good:
            good_usd = cost.good_output.usd if cost.good_output is not None else None
            good_cells = [usd_text(good_usd) if good_usd is not None else "n/a"]
        rows.append([labels[i], usd_text(cost.output.usd) + (f" ({factor})" if factor else ""),
                     usd_text(cost.total.usd), *good_cells, *quality[i], cost.price_text()])
    _table(rows, ["RUN", "$/1M OUTPUT TOKENS", "$/1M TOTAL TOKENS", *(["$/1M GOOD OUTPUT"] if good else []),
                  *(["QUALITY KEPT"] if quality[0] else []), "PRICE"])
    for label, cost in zip(labels, costs, strict=True):
        if cost.reason:  # below the table, so a long reason does not widen it
            print(safe(f"{label}: cost: n/a ({cost.reason})"))
        elif cost.good_output is not None and cost.good_output.reason:
            print(safe(f"{label}: good-output cost: n/a ({cost.good_output.reason})"))
        if cost.note:
            print(safe(f"{label}: cost {cost.note}"))
    if good:
        print(safe(f"good output: the output tokens of the requests that met {good_slo_text}; its cost is the "
                   "output cost over their share of the output"))
    elif good_slo_text:
        print(safe(f"good output not priced: {good_slo_text}: pass --slo to price it"))
    devices = {cost.device for cost in costs if cost.device is not None}
    if len(devices) > 1:
        print(safe(f"the runs ran on different hardware ({', '.join(sorted(devices))}): each is priced on its "
                   "own; the cost is what differs"))
    if unused := unused_prices(prices, costs):
        print(safe(f"--price for {', '.join(unused)} priced none of the runs"))


def cmd_compare(args: argparse.Namespace) -> int:
    prices = price_table(getattr(args, "price", None) or ())  # `ladders compare` passes none
    asked = getattr(args, "slo", None)
    if asked:
        comparison_slo((), asked)  # a bad --slo is refused before the store is opened
    with open_store(args) as store:
        comparison = compare_runs(store, args.runs, args.baseline, series=args.json and not args.no_series,
                                  engine_terms_of=engine_terms_for)
        costs = compared_costs(comparison, prices)
        slo, whose = comparison_slo(comparison.runs, asked)
        if slo is not None:
            costs = compared_good_costs(store, comparison, costs, slo)
    good_slo_text = f"{whose} '{slo}'" if slo is not None else whose
    accuracy = compare_task_accuracy([run.summary for run in comparison.runs], comparison.baseline)
    if args.json:
        doc = comparison.to_dict()
        doc["task_accuracy"] = [row.model_dump(mode="json") for row in accuracy]
        base = costs[comparison.baseline]
        for run, detail in zip(doc["runs"], comparison.runs, strict=True):
            run["quality"] = shown_quality(detail.quality)  # its figures against its reference, the outputs left out
        for run, cost in zip(doc["runs"], costs, strict=True):
            run["cost"] = {**cost.to_dict(), "factor_vs_baseline": cost_factor(base, cost),
                           "vs_baseline": cost_factor_text(base, cost) or None}
        _print_json(doc)
    else:
        _print_comparison(comparison)
        _print_quality(comparison)
        if accuracy:
            print(f"\ntask accuracy (lm-eval; beyond noise: |a - b| > {Z_95} x sqrt(se_a^2 + se_b^2)):")
            labels = [f"#{r.id}" + (" (base)" if i == comparison.baseline else "") for i, r in enumerate(comparison.runs)]
            for line in comparison_lines(accuracy, labels):
                print(safe(line))
        _print_costs(comparison, costs, prices, good_slo_text)
    return 0


# --- export / import -----------------------------------------------------------------------------

def _profile_target(target: str) -> Path | None:
    if target.endswith(".toml") or Path(target).is_file():
        try:
            return resolve_profile(target)
        except ProfileError as exc:
            raise UserError(str(exc)) from None
    return None


def _is_shipped_profile(name: str) -> bool:
    try:
        resolve_profile(name)
    except ProfileError:
        return False
    return True


def _script_target(args: argparse.Namespace, store: RunStore) -> Target:
    """A launch script's source: a stored run, else a shipped profile of that name."""
    ref = args.targets[0]
    try:
        store.resolve(ref)
        return Target(runs=[ref])
    except StoreError:
        try:
            return Target(profile=resolve_profile(ref))
        except ProfileError:
            raise UserError(f"'{ref}' is neither a stored run nor a profile") from None


def cmd_export(args: argparse.Namespace) -> int:
    """Render with ``app.export.export`` (the GUI's dialog calls the same), to ``-o FILE`` or
    standard output (no ``-o``, or ``-o -``)."""
    from app.export.capacity import Sizing, check_prices

    fmt, targets = args.format, args.targets
    output = None if args.output in (None, STDOUT) else Path(args.output)
    if output is not None:
        check_target(output)  # before the work: a bad path is refused at once
    prices = tuple(args.price or ())
    if fmt == "html":
        price_table(prices)  # a bad --price is refused before the store is opened
    priced = None if fmt == "html" else args.price  # the report's cost line, not a sizing
    given = (args.slo, args.users, args.tokens_per_day, args.headroom, args.percentile, priced, args.gpu)
    sizing = None if all(v is None for v in given) else Sizing(
        args.slo, args.users, args.tokens_per_day, args.headroom, args.percentile, prices, args.gpu)
    if sizing is not None and fmt == "k8s":
        check_prices(sizing)  # a bad --price is refused before the store is opened, as by `capacity`
    if fmt in SCRIPT_FORMATS:
        if len(targets) != 1:
            raise UserError(f"--format {fmt} exports one run or profile")
        profile = _profile_target(targets[0])
        if profile is not None:
            text = export(Target(profile=profile), fmt, output, sizing=sizing)
        else:
            try:
                with open_store(args) as store:
                    text = export(_script_target(args, store), fmt, output, store=store, sizing=sizing)
            except NoStore:  # no store to hold a run of that name: a shipped profile's, or the error
                if not _is_shipped_profile(targets[0]):
                    raise
                text = export(Target(profile=resolve_profile(targets[0])), fmt, output, sizing=sizing)
    else:
        with open_store(args) as store:
            for target in targets:
                try:
                    store.resolve(target)
                except StoreError:
                    if target.endswith(".toml") or Path(target).is_file() or _is_shipped_profile(target):
                        raise UserError(f"--format {fmt} needs runs; '{target}' is a profile, which has no "
                                        "results") from None
                    raise
            text = export(Target(runs=targets, baseline=args.baseline, title=args.title), fmt, output, store=store,
                          sizing=sizing, prices=prices)
    if output is None:
        sys.stdout.write(text)
    else:
        print(safe(f"wrote {output}"), file=sys.stderr)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    with open_store(args, create=True) as store:
        runs: list[RunInfo] = [store.get_run(i) for i in import_results(store, args.file, args.name)]
    if args.json:
        _print_json([r.model_dump(mode="json") for r in runs])
    else:
        for run in runs:
            print(safe(f"imported {args.file} as run {run.id} ({run.name}, "
                       f"{run.metrics.get('requests_total', 0):,.0f} requests)"))
    return 0


# --- registration ----------------------------------------------------------------------------------

def register(sub: argparse._SubParsersAction) -> None:
    db = db_parent()
    as_json = json_parent()

    runs = sub.add_parser("runs", help="list, show, tag, rename or delete stored runs")
    rsub = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=True)

    ls = rsub.add_parser("list", parents=[db, as_json], help="stored runs, newest first")
    ls.add_argument("--engine", help="engine kind, e.g. vllm")
    ls.add_argument("--model", help="model name contains this")
    ls.add_argument("--name", help="run name contains this")
    ls.add_argument("--tag", help="has this tag")
    ls.add_argument("--status", choices=RUN_STATUSES)
    ls.add_argument("--since", type=_when_arg, help="started at or after: YYYY-MM-DD[THH:MM] (UTC) or an age like 7d")
    ls.add_argument("--until", type=_when_arg, help="started before: YYYY-MM-DD[THH:MM] (UTC) or an age like 1h")
    ls.add_argument("--author", help="recorded by this author ($TUNEBENCH_AUTHOR, else the OS user)")
    ls.add_argument("--host", help="recorded on this host")
    ls.add_argument("--gpu", help="GPU model contains this, e.g. H200")
    ls.add_argument("--limit", type=bounded_int(1, MAX_COUNT), help="at most N runs")
    ls.set_defaults(handler=cmd_runs_list)

    show = rsub.add_parser("show", parents=[db, as_json], help="everything recorded about one run")
    show.add_argument("run", help="run id, uid (prefix) or name")
    show.add_argument("--log", action="store_true", help="include the engine log")
    show.add_argument("--request", metavar="RID", help="one request's timeline, by the X-Request-Id tunebench sent it "
                                                       "with (tb-...: as the engine's log names it)")
    show.set_defaults(handler=cmd_runs_show)

    rm = rsub.add_parser("delete", parents=[db], help="delete runs and all their data")
    rm.add_argument("runs", nargs="+", metavar="RUN")
    rm.add_argument("--force", action="store_true", help="also delete runs another author recorded (a team's store)")
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
    add_price_argument(cmp)
    add_good_slo_argument(cmp, "the runs were")
    cmp.set_defaults(handler=cmd_compare)

    export = sub.add_parser("export", parents=[db], help="a launch script from a run or profile, or a run's data")
    export.add_argument("targets", nargs="+", metavar="RUN_OR_PROFILE",
                        help="a run (id, uid or name) or a profile (.toml or shipped name); html compares several runs")
    export.add_argument("--format", "-f", required=True, choices=[*SCRIPT_FORMATS, *DATA_FORMATS])
    export.add_argument("-o", "--output", metavar="FILE",
                        help="output file, replaced whole (scripts are made executable); '-' or none: standard "
                             "output. Links, pipes and devices are refused")
    export.add_argument("--baseline", metavar="RUN", help="html: the baseline run (default: the first)")
    export.add_argument("--title", help="html: report title")

    export.add_argument("--slo", help="k8s: size the Deployment's replicas at this SLO from the run's measured levels, "
                                      "as `tunebench capacity` does (with --users and/or --tokens-per-day)")
    add_sizing_arguments(export, defaults=False)
    export.set_defaults(handler=cmd_export)

    imp = sub.add_parser("import", parents=[db, as_json],
                         help="import a `vllm bench serve` result, a GuideLLM benchmarks.json or a tunebench JSON export")
    imp.add_argument("file")
    imp.add_argument("--name", help="name of the imported run")
    imp.set_defaults(handler=cmd_import)
