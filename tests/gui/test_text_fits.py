"""Nothing clips: every text of the presentation mode, the before/after view and the desk's tiles
and plot legends fits its widget, measured with the font's metrics, at projector sizes and
display scalings, with the longest figures a real run produces."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.exceptions import TimeoutError as WaitTimeout

from app.events import Progress
from app.gui.main_window import MainWindow
from app.gui.theme import DARK
from app.headline import Headline, HeadlineFigure
from app.quality.text import quality_kept
from tests.gui.text_fit import cut_labels, cut_plot_texts, logical_sizes

SIX_DIGITS = 123456.7
LONGEST_SUMMARY = {"output_tok_per_s": SIX_DIGITS, "ttft_ms_p50": 38.5, "engine_ttft_ms_mean": 31.7,
                   "itl_ms_p50": 2.42, "engine_itl_ms_mean": 3.21, "requests_completed": 400000,
                   "requests_failed": 0}


LONGEST_QUALITY = {"measured": True, "within_noise": True,
                   "reference": {"kind": "ladder baseline", "label": "step 1 (baseline with a long name)"},
                   "agreement": {"token_share": 0.996}, "kld": {"mean": 0.00123, "error": 0.0003,
                                                                 "positions_with_tail": 4},
                   "accuracy": {"task": "demo_repeat", "value": 0.94, "stderr": 0.021, "reference_value": 0.95}}
"""The probe's longest words: a long reference name, a KLD lower bound, accuracy, within noise."""


def _longest_figures(window: MainWindow) -> None:
    """A run's summary with a six-digit throughput, client figures flagged unreliable, a cost of
    $0.000123 and a ceiling far above the curves (its legend says "off the scale")."""
    for i in range(1, 6):  # the curves' legends
        window.bus.sample("engine", {"generation_tok_per_s": 100.0 * i, "ttft_mean_ms": 30.0, "itl_mean_ms": 3.0})
        window.bus.emit(Progress(run_id="r", level=0, requests_done=i, errors=0, requests_in_flight=1,
                                 output_tokens=i, elapsed_s=float(i), output_tok_per_s=90.0 * i, ttft_ms_p50=40.0,
                                 itl_ms_p50=2.0))
    for row, plots in ((window.dashboard.tiles, window.dashboard.plots), (window.presentation.tiles,
                                                                          window.presentation.plots)):
        row.show_summary(LONGEST_SUMMARY, {"ttft_ms_p50": "the client was starved", "itl_ms_p50": "starved"},
                         "Run summary \u2014 prefix caching on with a long run name, concurrency 8: 400,000 "
                         "requests in 1,234.5 s (completed)")
        row.limit_tile.show("100%", "% of limit", "of 127,641 at batch 256.0")
        row.show_cost("$0.000123", "8 GPU x 2.49 $/GPU-h (default price, as of 2026-12)")
        plots.panels["tokens"].set_ceiling(2_764_100.0)
    window.dashboard.tiles.show_quality(LONGEST_QUALITY)  # the desk's row only (a projector has no room)
    window.dashboard.show_plots()


def _fits_at_every_size(qtbot, window: MainWindow, check: Callable[[], list[str]], shots: Path,  # type: ignore[no-untyped-def]
                        prefix: str) -> None:
    failures = []
    for width, height, name in logical_sizes():
        window.resize(width, height)
        try:  # the layout settles over a few event-loop turns (more on a loaded machine)
            qtbot.waitUntil(lambda w=width: window.size().width() == w and not check(), timeout=5000)
        except WaitTimeout:
            failures.append(f"{name} ({width}x{height}): " + "; ".join(check()))
        window.grab().save(str(shots / f"{prefix}-{width}x{height}.png"))
    assert not failures, "\n".join(failures)


def test_the_presentation_never_cuts_a_figure_at_any_projector_size_or_scaling(
        qtbot, window: MainWindow, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    window.presentation.set_heading("prefix caching on with a long run name", "tunebench:demo \u00b7 256 concurrent "
                                    "\u00b7 1,024 in / 2,048 out tokens", "Features: prefix caching on, FP8 KV cache")
    _longest_figures(window)
    qtbot.keyClick(window, Qt.Key.Key_F11)
    window.showNormal()  # offscreen "full screen" is the virtual screen; the sizes below are the projector's
    assert window.presentation.tiles.tiles["tok_s"].text() == "123,457"
    presentation = window.presentation
    _fits_at_every_size(qtbot, window, lambda: cut_labels(presentation) + cut_plot_texts(presentation.plots.panels),
                        tmp_path, "presentation")


def test_the_before_after_view_never_cuts_a_figure(qtbot, window: MainWindow, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    figures = [HeadlineFigure("output_tok_per_s", "Output throughput", "tok/s", 1836.0, SIX_DIGITS, "1,836",
                              "123,457", "67.2\u00d7 higher", "better"),
               HeadlineFigure("engine_ttft_ms_mean", "TTFT mean (engine)", "ms", 91.2, 19.7, "91.2", "19.7",
                              "4.6\u00d7 faster", "better"),
               HeadlineFigure("ttft_ms_p50", "TTFT p50", "ms", 121.0, 173.0, "121", "173", "", "unreliable",
                              note="the client was starved: its timings are not the engine's")]
    headline = Headline("prefix caching off (run 12, 2026-12-04 21:40)", "prefix caching on (run 13, 2026-12-04 21:45)",
                        "prefix caching off \u2192 on", figures, figures[0], quality_kept(LONGEST_QUALITY))
    qtbot.keyClick(window, Qt.Key.Key_F11)
    window.showNormal()
    window.presentation.show_before_after(headline, "$0.000123 \u2192 $0.000002 per 1M output tokens (98% less)")
    assert window.presentation.page == "before_after"
    quality = window.presentation.before_after.quality
    assert quality.text().endswith("; within the noise floor") and DARK.muted in quality.styleSheet()  # greyed
    _fits_at_every_size(qtbot, window, lambda: cut_labels(window.presentation), tmp_path, "before-after")


@pytest.mark.parametrize("size", [(1366, 768), (1440, 900), (1920, 1080)])
def test_the_desk_tiles_and_plot_legends_never_cut_a_figure(qtbot, window: MainWindow,  # type: ignore[no-untyped-def]
                                                            size: tuple[int, int]) -> None:
    _longest_figures(window)
    window.resize(*size)
    dashboard = window.dashboard

    def cut() -> list[str]:
        return cut_labels(dashboard.tiles) + cut_plot_texts(dashboard.plots.panels)

    try:
        qtbot.waitUntil(lambda: not cut(), timeout=5000)
    except WaitTimeout:
        pytest.fail("; ".join(cut()))
