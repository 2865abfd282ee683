"""Quality in the workbench: the Live tile (what the run kept of its reference's outputs, from the
run's ``QualityMeasured``) and Compare's A/B of outputs (the same prompt's two outputs side by
side, the first differing token highlighted). The words are ``app.quality.text``'s and the split
``app.quality.outputs``'s; this module only draws them."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import QLabel, QTextBrowser, QVBoxLayout, QWidget

from app.gui.series import TileSpec
from app.gui.theme import LIGHT
from app.quality.outputs import OutputPair
from app.quality.text import quality_kept

if TYPE_CHECKING:
    from app.gui.dashboard import Tile

QUALITY_TILE = TileSpec("quality", "quality kept", "", "", "{}")
"""Tokens identical to the reference's before the first divergence (the quality probe's agreement),
with the mean KLD under it; greyed within the reference's noise floor."""
QUALITY_TILE_TIP = ("The quality probe after the load: the share of the reference's tokens this run reproduced "
                    "before its first divergence (greedy decoding), and the mean KL divergence of its next-token "
                    "distributions (llama.cpp's convention). Greyed: within the reference's own noise floor")
DIVERGENCE_COLOUR = "#fde293"
"""The first differing token's background: a highlighter's yellow, legible in either theme's text."""


def show_quality(tile: Tile, shown: Mapping[str, Any] | None) -> None:
    """The tile for a run's quality figures (``QualityFigures`` as JSON); hidden without any."""
    kept = quality_kept(shown)
    tile.setVisible(kept is not None)
    if kept is None:
        return
    tile.show(kept.figure, QUALITY_TILE.label if kept.measured else "quality", kept.detail,
              f"{kept.text}\n\n{QUALITY_TILE_TIP}")
    label = tile.value_label
    if label.property("greyed") != kept.greyed:
        label.setProperty("greyed", kept.greyed)  # the theme's rule greys it
        label.style().unpolish(label)
        label.style().polish(label)


def waiting_for_quality(tile: Tile) -> None:
    """A run with a probe: the tile says when its figure comes."""
    tile.setVisible(True)
    tile.show("\u2013", QUALITY_TILE.label, "after the load", QUALITY_TILE_TIP)


def _side(shared: str, token: str, rest: str) -> str:
    """One output as HTML: the shared text, the first differing token highlighted, the rest muted."""
    out = html.escape(shared)
    if token or rest:
        out += (f'<span style="background:{DIVERGENCE_COLOUR}; font-weight:600;">{html.escape(token) or "&#8709;"}</span>'
                f'<span style="color:{LIGHT.muted};">{html.escape(rest)}</span>')
    return out.replace("\n", "<br>")


def pairs_html(pairs: Sequence[OutputPair], before_label: str, after_label: str) -> str:
    """The pairs as one table: the prompt, then the before and after outputs side by side."""
    head = (f'<tr><th align="left">prompt</th><th align="left">{html.escape(before_label)}</th>'
            f'<th align="left">{html.escape(after_label)}</th></tr>')
    rows = []
    for pair in pairs:
        mark = "identical" if pair.diverged_at is None else f"differs from token {pair.diverged_at + 1}"
        rows.append(f'<tr><td><span style="color:{LIGHT.muted};">{html.escape(pair.prompt)}<br>{mark}</span></td>'
                    f"<td>{_side(pair.shared, pair.before_token, pair.before_rest)}</td>"
                    f"<td>{_side(pair.shared, pair.after_token, pair.after_rest)}</td></tr>")
    return (f'<table cellspacing="0" cellpadding="5" border="1" style="border-collapse:collapse;" width="100%">'
            f"{head}{''.join(rows)}</table>")


class OutputsView(QWidget):
    """Compare's A/B of outputs: the baseline's and the first other run's outputs of each prompt
    their probes shared, side by side, where they first differ highlighted."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.note = QLabel("")
        self.note.setObjectName("outputsNote")
        self.note.setWordWrap(True)
        self.note.setStyleSheet(f"color: {LIGHT.muted};")
        self.table = QTextBrowser()
        self.table.setObjectName("outputsTable")
        self.table.setOpenLinks(False)
        layout.addWidget(self.note)
        layout.addWidget(self.table, 1)
        self.pairs: list[OutputPair] = []
        self.clear()

    def show_pairs(self, pairs: Sequence[OutputPair], note: str, before_label: str, after_label: str) -> None:
        self.pairs = list(pairs)
        self.note.setText(note or "Compare two runs that ran the quality probe to see their outputs side by side.")
        self.table.setHtml(pairs_html(pairs, before_label, after_label) if pairs else "")
        self.table.setVisible(bool(pairs))

    def clear(self) -> None:
        self.show_pairs([], "", "", "")
