"""Change notification without Qt: a typed list of callbacks a model calls after it changed.

The headless models the workbench draws from (``app.editing``, ``app.live_run``) say what
changed through these, so they can be driven and tested without a Qt event loop; the GUI
subscribes its widgets (or a Qt adapter) to them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Listeners(Generic[T]):
    """Callbacks called in subscription order with one value. ``connect`` returns the function
    that disconnects, so a subscriber that goes away can stop listening."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[T], None]] = []

    def connect(self, callback: Callable[[T], None]) -> Callable[[], None]:
        self._callbacks.append(callback)
        return lambda: self.disconnect(callback)

    def disconnect(self, callback: Callable[[T], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def emit(self, value: T) -> None:
        for callback in list(self._callbacks):  # a callback may disconnect itself
            callback(value)

    def __len__(self) -> int:
        return len(self._callbacks)
