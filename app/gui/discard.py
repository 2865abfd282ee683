"""Taking a widget away."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget


def discard(widget: QWidget) -> None:
    """Off the screen and out of its layout now, freed by the event loop later. ``deleteLater``
    alone leaves it drawn where it was until the loop's own turn, which a caller pumping events
    with ``processEvents`` (a script taking screenshots) never gives: a panel then showed the
    last run's rows above the new run's."""
    widget.hide()
    widget.setParent(None)  # its layout drops it with its parent
    widget.deleteLater()
