"""Quality in the workbench: the Live tile follows the run's ``QualityMeasured`` through the
window's bus drain, and Compare of two stored runs with probe figures says the quality kept (card,
the presentation's before/after view) and shows the same prompt's two outputs side by
side, the first differing token highlighted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt

from app.config import RunConfig
from app.events import QualityMeasured
from app.export.report import render_report
from app.gui.main_window import MainWindow
from app.gui.quality_view import DIVERGENCE_COLOUR
from app.gui.theme import DARK
from app.load.tokens import HfTokenizer, find_tokenizer_file
from app.quality.config import QualityConfig
from app.quality.probe import Output
from app.store import RunStore
from engine_adapters.config import DEMO_MODEL
from engine_adapters.demo_task import examples
from engine_adapters.runtimes import resolve_model
from tests.gui.test_history import _select, seed_runs
from tests.unit.test_cost_live import _started
from tests.unit.test_quality_text import FLOOR

pytestmark = pytest.mark.gui


def _figures(token_share: float, *, within: bool | None, reference: dict[str, Any],
             capture: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"measured": True, "engine": "vllm", "model": DEMO_MODEL, "prompts": 3, "output_tokens": 8,
            "reference": reference, "agreement": {**FLOOR["agreement"], "token_share": token_share},
            "kld": {**FLOOR["kld"], "mean": 0.0123}, "noise_floor": FLOOR, "within_noise": within,
            "capture": capture or []}


def test_the_quality_tile_follows_the_probe(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    rows = (window.dashboard.tiles,)
    assert not window.dashboard.tiles.quality_tile.isVisibleTo(window)  # no probe, no tile
    window.bus.emit(_started(RunConfig(name="fp8", quality=QualityConfig()), {}))
    qtbot.waitUntil(lambda: window.dashboard.tiles.quality_tile.sub.text() == "after the load", timeout=5000)
    measured = _figures(0.875, within=False, reference={"kind": "run", "run_id": 3, "label": "fp16"})
    window.bus.emit(QualityMeasured(run_id="live-fp8", quality=measured))
    qtbot.waitUntil(lambda: all(row.quality_tile.text() == "87.5%" for row in rows), timeout=5000)
    tile = window.dashboard.tiles.quality_tile
    assert tile.sub.text() == "KLD 0.012" and not tile.value_label.property("greyed")
    assert "quality kept: 87.5% of tokens identical to fp16" in tile.toolTip()
    window.bus.emit(QualityMeasured(run_id="live-fp8", quality={**measured, "within_noise": True}))
    qtbot.waitUntil(lambda: tile.value_label.property("greyed") is True, timeout=5000)
    assert tile.sub.text().endswith("(within noise)")
    window.dashboard.tiles.live()  # a new run: no figure of the last one left
    assert not tile.isVisibleTo(window)


def _demo_tokens(text: str) -> list[int]:
    path = find_tokenizer_file(resolve_model(DEMO_MODEL))
    assert path is not None, "the demo model's tokenizer.json (make engine generates the demo model)"
    return HfTokenizer(path).encode(text)


@pytest.fixture
def probed(tmp_path: Path, make_window: Callable[..., MainWindow]) -> tuple[MainWindow, list[int], list[str]]:
    """Two stored runs whose probes answered the demo task's first three prompts: the first is the
    reference (its own control), the second differs in one answer."""
    db = tmp_path / "probed.db"
    ids = seed_runs(db)
    prompts = [e for e in examples(3, "test", seed=0)]
    answers = [e.answer for e in prompts]
    changed = answers[1].split(" ")
    changed[2] = "lazy" if changed[2] != "lazy" else "fox"
    other = [answers[0], " ".join(changed), answers[2]]
    with RunStore(db) as store:
        for run_id, outputs, figures in (
                (ids[0], answers, _figures(1.0, within=None, reference={"kind": "self"})),
                (ids[1], other, _figures(0.875, within=False, reference={"kind": "run", "run_id": ids[0],
                                                                            "label": "demo c16"}))):
            capture = [Output(p.prompt, [], _demo_tokens(text)).to_json() for p, text in zip(prompts, outputs, strict=True)]
            store.update_run(run_id, quality={**figures, "capture": capture})
    return make_window(db_path=db), ids, [answers[1], other[1]]


def test_compare_says_the_quality_kept_and_shows_the_two_outputs(qtbot, probed) -> None:  # type: ignore[no-untyped-def]
    window, (reference, other), (before, after) = probed
    window.tabs.setCurrentWidget(window.history)
    qtbot.waitUntil(lambda: len(window.history.runs) == 2, timeout=10_000)
    _select(window, [reference, other])
    qtbot.mouseClick(window.history.compare_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.compare.comparison is not None, timeout=10_000)
    card = window.compare.card.text()
    assert f"quality kept: 87.5% of tokens identical to #{reference} demo c16, mean KLD 0.012" in card
    outputs = window.compare.outputs
    assert [p.diverged_at for p in outputs.pairs] == [None, outputs.pairs[1].diverged_at, None]
    pair = outputs.pairs[1]
    assert pair.diverged_at is not None and pair.shared + pair.before_token + pair.before_rest == before
    assert pair.shared + pair.after_token + pair.after_rest == after and pair.before_token != pair.after_token
    assert outputs.note.text().startswith("2 of 3 outputs identical")
    shown = outputs.table.toHtml()
    assert DIVERGENCE_COLOUR in shown and "differs from token" in shown
    report = render_report(window.compare.comparison)
    assert '<div class="quality">quality kept: 87.5% of tokens identical to' in report
    window.present_before_after()
    quality = window.presentation.before_after.quality
    assert quality.isVisibleTo(window) and quality.text().startswith("quality kept: 87.5% of tokens identical")
    assert quality.styleSheet().endswith("font-weight: 600;") and DARK.muted not in quality.styleSheet()  # not greyed
