"""Leaving tunebench: launch scripts for the winning configuration (bash, docker run, docker
compose, Kubernetes; vLLM across machines: a Ray cluster script, a LeaderWorkerSet), an HTML
report for customers, runs as JSON/CSV; and the import of other tools' results (``vllm bench
serve``, GuideLLM) as runs marked imported.

One entry point for both faces: :func:`export` renders any format from a :class:`Target` and,
given a path, writes it by the one rule of :mod:`app.export.files` (atomic, scripts
executable). The CLI (``tunebench export``) and the GUI's export dialog both call it.

Modules, by job: :mod:`~app.export.quoting` (quoting per destination, templates),
:mod:`~app.export.launch` (launch scripts), :mod:`~app.export.data` (JSON, CSV),
:mod:`~app.export.report` (HTML report, SVG charts), :mod:`~app.export.importers` (imports),
:mod:`~app.export.files` (writing a file).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.cost import price_table
from app.errors import UserError
from app.export.capacity import Sizing, size
from app.export.data import (
    CSV_COLUMNS,
    DATA_FORMATS,
    EXPORT_VERSION,
    run_to_csv,
    run_to_json,
    run_to_json_text,
)
from app.export.files import STDOUT, write_atomic
from app.export.importers import import_results, parse_results
from app.export.ladder_report import render_ladder_report
from app.export.launch import (
    EXECUTABLE_FORMATS,
    SCRIPT_FORMATS,
    LaunchSpec,
    ScriptFormat,
    render_launch,
    spec_from_profile,
    spec_from_run,
)
from app.export.report import render_report, report_comparison
from app.store import RunStore

FORMATS: tuple[str, ...] = (*SCRIPT_FORMATS, *DATA_FORMATS)
SUFFIXES = {"bash": ".sh", "docker": ".sh", "compose": ".yaml", "k8s": ".yaml", "ray": ".sh", "k8s-multinode": ".yaml", "llm-d": ".yaml",
            "html": ".html", "json": ".json", "csv": ".csv"}

__all__ = [
    "CSV_COLUMNS", "DATA_FORMATS", "EXECUTABLE_FORMATS", "EXPORT_VERSION", "FORMATS", "SCRIPT_FORMATS", "STDOUT",
    "SUFFIXES", "LaunchSpec", "ScriptFormat", "Sizing", "Target", "export", "import_results", "parse_results", "render",
    "render_ladder_report", "render_launch", "render_report", "report_comparison", "run_to_csv", "run_to_json",
    "run_to_json_text", "save", "spec_from_profile", "spec_from_run", "write_atomic",
]


@dataclass(frozen=True)
class Target:
    """What is exported: stored runs (by id, uid or name) or a profile file. A launch script
    takes one run or the profile; JSON and CSV one run; the HTML report one or more runs."""

    runs: Sequence[int | str] = field(default_factory=tuple)
    profile: Path | None = None
    baseline: int | str | None = None
    """HTML: the run the others are measured against (default: the first)."""
    title: str | None = None
    """HTML: the report's title."""


def render(target: Target, fmt: str, store: RunStore | None = None, sizing: Sizing | None = None,
           prices: Sequence[str] = ()) -> str:
    """The text of one export (what a preview shows and a file receives); ``sizing``: the k8s
    Deployment's replicas from a capacity plan of the stored run, with the reasoning as comments;
    ``prices``: ``NAME=USD`` entries over the shipped list, for the HTML report's cost line."""
    if fmt not in FORMATS:
        raise UserError(f"unknown export format '{fmt}' (choose from {', '.join(FORMATS)})")
    if sizing is not None and fmt != "k8s":
        raise UserError(f"--users/--tokens-per-day/--slo size a Kubernetes Deployment: they need --format k8s, "
                        f"not --format {fmt}")
    if fmt in SCRIPT_FORMATS:
        if target.profile is not None:
            if sizing is not None:
                raise UserError(f"--users/--tokens-per-day/--slo size from a stored run's measured levels; "
                                f"{target.profile.name} is a profile, which has no results")
            return render_launch(spec_from_profile(target.profile), fmt)
        if len(target.runs) != 1:
            raise UserError(f"--format {fmt} exports one run or profile")
        run = _store(store).get_run(target.runs[0])
        spec = spec_from_run(run)
        if sizing is None:
            return render_launch(spec, fmt)
        replicas, comment = size(run, sizing)
        return render_launch(spec, fmt, replicas=replicas, replicas_comment=comment)
    if target.profile is not None:
        raise UserError(f"--format {fmt} needs runs; {target.profile.name} is a profile, which has no results")
    if not target.runs:
        raise UserError(f"--format {fmt} needs at least one run")
    store = _store(store)
    if fmt == "html":
        return render_report(report_comparison(store, list(target.runs), target.baseline), target.title, store=store,
                             prices=price_table(prices))
    if len(target.runs) != 1:
        raise UserError(f"--format {fmt} exports one run")
    return run_to_json_text(store, target.runs[0]) if fmt == "json" else run_to_csv(store, target.runs[0])


def _store(store: RunStore | None) -> RunStore:
    if store is None:
        raise UserError("exporting a run needs the run database")
    return store


def export(target: Target, fmt: str, out_path: str | Path | None = None, *, store: RunStore | None = None,
           sizing: Sizing | None = None, prices: Sequence[str] = ()) -> str:
    """Render ``fmt`` from ``target``; with ``out_path``, also write it there atomically
    (scripts executable). Returns the text, so a caller without a path can print or show it.
    ``sizing`` (k8s only) sets the Deployment's replicas from a capacity plan."""
    text = render(target, fmt, store, sizing, prices)
    if out_path is not None:
        save(text, fmt, out_path)
    return text


def save(text: str, fmt: str, out_path: str | Path) -> Path:
    """Write an already rendered export (what the GUI previewed) by the same rule as :func:`export`."""
    return write_atomic(out_path, text, executable=fmt in EXECUTABLE_FORMATS)
