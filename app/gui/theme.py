"""Colours and fonts: the desk theme and the dark, large presentation theme (readable from the
back of a room on a projector)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Theme:
    name: str
    background: str
    foreground: str
    panel: str
    accent: str
    good: str
    bad: str
    muted: str
    curves: tuple[str, ...]
    tile_value_pt: int
    tile_label_pt: int
    plot_title_pt: int
    axis_pt: int
    line_width: float
    tile_sub_pt: int = 8
    header_pt: int = 10


LIGHT = Theme(
    name="light", background="#ffffff", foreground="#202124", panel="#f1f3f4", accent="#1a73e8",
    good="#188038", bad="#d93025", muted="#5f6368",
    curves=("#1a73e8", "#e8710a", "#188038", "#d93025", "#9334e6", "#007b83", "#b06000"),
    tile_value_pt=20, tile_label_pt=9, plot_title_pt=10, axis_pt=8, line_width=1.0, tile_sub_pt=8, header_pt=9,
)

DARK = Theme(
    name="dark", background="#0b0f14", foreground="#f5f7fa", panel="#161c24", accent="#4fc3f7",
    good="#66bb6a", bad="#ef5350", muted="#9aa5b1",
    curves=("#4fc3f7", "#ffb74d", "#81c784", "#e57373", "#ba68c8", "#4dd0e1", "#fff176"),
    tile_value_pt=48, tile_label_pt=16, plot_title_pt=18, axis_pt=14, line_width=3.0, tile_sub_pt=13, header_pt=16,
)


MIN_THEME_PT = 7


def scaled(theme: Theme, factor: float) -> Theme:
    """The theme with every font ``factor`` times its size (never under ``MIN_THEME_PT``): the
    presentation keeps its design size on a smaller or more scaled screen."""
    def pt(size: int) -> int:
        return max(MIN_THEME_PT, round(size * factor))

    return replace(theme, tile_value_pt=pt(theme.tile_value_pt), tile_label_pt=pt(theme.tile_label_pt),
                   plot_title_pt=pt(theme.plot_title_pt), axis_pt=pt(theme.axis_pt),
                   tile_sub_pt=pt(theme.tile_sub_pt), header_pt=pt(theme.header_pt))


def stylesheet(theme: Theme) -> str:
    """Qt style sheet for a top-level widget in this theme."""
    return (f"QWidget {{ background: {theme.background}; color: {theme.foreground}; }}"
            f"QFrame#tile {{ background: {theme.panel}; border-radius: 10px; }}"
            f"QLabel#tileValue {{ font-size: {theme.tile_value_pt}pt; font-weight: 600; color: {theme.foreground}; "
            f"background: transparent; }}"
            f"QLabel#tileValue[greyed=\"true\"] {{ color: {theme.muted}; }}"
            f"QLabel#tileLabel {{ font-size: {theme.tile_label_pt}pt; color: {theme.muted}; background: transparent; }}"
            f"QLabel#tileSub {{ font-size: {theme.tile_sub_pt}pt; color: {theme.muted}; background: transparent; }}"
            f"QLabel#tileHeader {{ font-size: {theme.header_pt}pt; color: {theme.muted}; font-weight: 600; }}"
            f"QLabel#banner {{ font-size: {theme.tile_label_pt}pt; color: {theme.muted}; }}")
