"""The findings in the HTML report (``tunebench export --format html``, the workbench's Export):
each run's findings with evidence and the next trial, and why a run differs from the baseline;
the same for one run on its own. The runs are those of tests/unit/test_findings.py."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from app.compare_bundle import compare_extras
from app.export import render_report, report_comparison
from app.run_findings import changes, headline_finding, stored_findings, top_change, why_lines
from app.store import RunStore
from tests.unit.test_findings import SHARED, Engine, Recorded, llama_config, store_run

PREFIX_OFF = Recorded(llama_config(prefix_caching=False, workload=SHARED), Engine(hit_ratio=0.0), name="prefix off")
PREFIX_ON = Recorded(llama_config(prefix_caching=True, workload=SHARED), Engine(hit_ratio=0.85), name="prefix on")


def _section(html: str) -> str:
    match = re.search(r"<h2>Findings</h2>(.*?)<h2>", html, re.S)
    assert match is not None, "the report has no Findings section"
    return match.group(1)


def test_the_report_has_each_runs_findings_and_why_the_second_differs(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        off, on = store_run(store, PREFIX_OFF), store_run(store, PREFIX_ON)
        comparison = report_comparison(store, [off, on])
        section = _section(render_report(comparison, store=store))
        extras = compare_extras(comparison, store)
        alone = _section(render_report(report_comparison(store, [off]), store=store))
    assert "[warning] prefix_cold" in section and "Next trial: <code>features.prefix_caching = true</code>" in section
    assert "prefix-cache hit rate 0%" in section  # the evidence, with its unit
    why = top_change(extras.why[0])
    assert why is not None and "prefill did 85% less work" in why.explanation
    assert f"Why run {on} differs from run {off}: prefix hits 0.00 -&gt; 0.85" in section
    assert section.index("prefix on") < section.index(f"Why run {on} differs")  # under the run it explains
    assert "[warning] prefix_cold" in alone and "Why run" not in alone
    assert [f.rule for f in extras.findings[0]][0] == "prefix_cold"  # warnings first


def test_the_presentation_sentence_is_the_first_warning(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        off, on = store_run(store, PREFIX_OFF), store_run(store, PREFIX_ON)
        cold = stored_findings(store, off)
        hitting = stored_findings(store, on, off)
    lead = headline_finding(cold)
    assert lead is not None and lead.rule == "prefix_cold"
    assert headline_finding(hitting) is None  # a healthy run: nothing to read out
    assert top_change(hitting) is not None and top_change(cold) is None


def test_without_a_store_the_report_has_no_findings_section(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        off = store_run(store, PREFIX_OFF)
        comparison = report_comparison(store, [off])
    assert "<h2>Findings</h2>" not in render_report(comparison)


def test_compares_why_lines_say_the_settings_once_then_each_mechanism(tmp_path: Path) -> None:
    """Every change between two runs acts through the same settings: Compare says them once, above
    the mechanisms that moved, each without the runs and the settings again."""
    with RunStore(tmp_path / "runs.db") as store:
        off, on = store_run(store, PREFIX_OFF), store_run(store, PREFIX_ON)
        faster = store_run(store, replace(PREFIX_ON, ttft_ms=20.0, name="prefix on, faster first tokens"))
        hitting = stored_findings(store, faster, off)
        fewer = store_run(store, Recorded(PREFIX_ON.config, Engine(hit_ratio=0.3), name="fewer hits"))
        same = stored_findings(store, fewer, on)
        cold = stored_findings(store, off)
    moved = changes(hitting)
    assert [f.rule for f in moved] == ["changed_prefix_hits", "changed_ttft"]  # the mechanism, then the outcome
    lines = why_lines(hitting)
    head, finding = lines[0]
    assert finding is None and head.startswith(f"Why run {faster} differs from run {off}: features.prefix_caching False")
    assert [f for _text, f in lines[1:]] == moved
    assert lines[1][0].startswith("prefix hits 0.00 -> 0.85: prefill did 85% less work")
    for text, _f in lines[1:]:  # the settings and the runs, once
        assert "configuration" not in text and "prefix_caching" not in text and "Why run" not in text, text
    assert all("features.prefix_caching False -> True" in f.explanation for f in moved)  # each finding whole
    same_lines = why_lines(same)  # two runs of one configuration: said once too
    assert same_lines[0] == (f"Why run {fewer} differs from run {on}, with the same configuration:", None)
    assert same_lines[1][0].startswith("prefix hits 0.85 -> 0.30") and "same" not in same_lines[1][0]
    assert why_lines(cold) == []  # no reference: nothing to say why
