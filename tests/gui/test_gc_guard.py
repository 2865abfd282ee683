"""The cyclic garbage collector runs on the GUI thread only (``app.gui.gc_guard``): a worker
thread that allocates past every threshold triggers no collection there, the guard's timer
collects on the GUI thread, and stopping the guard gives Python its own collection back."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from app.gui.gc_guard import GuiGarbageCollector, guard_garbage_collection


@pytest.fixture
def collections() -> Iterator[list[str]]:
    """The thread of every collection that starts."""
    seen: list[str] = []

    def callback(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(threading.current_thread().name)

    gc.callbacks.append(callback)
    yield seen
    gc.callbacks.remove(callback)


def _make_cycles(n: int) -> None:
    for _ in range(n):
        a: dict[str, Any] = {}
        a["self"] = a  # a cycle only the collector frees


def test_collections_happen_on_the_gui_thread_only(qtbot, qapp, collections: list[str]) -> None:  # type: ignore[no-untyped-def]
    guard = guard_garbage_collection(qapp)
    assert guard is guard_garbage_collection(qapp) and not gc.isenabled()
    worker = threading.Thread(target=_make_cycles, args=(50 * gc.get_threshold()[0],), name="allocating-worker")
    worker.start()
    worker.join()
    assert "allocating-worker" not in collections
    qtbot.waitUntil(lambda: bool(collections), timeout=5000)  # the guard's timer saw it was due
    assert set(collections) == {threading.main_thread().name}


def test_stopping_the_guard_gives_python_its_collection_back(qapp) -> None:  # type: ignore[no-untyped-def]
    guard = guard_garbage_collection(qapp)  # the one this test runs under (tests/gui/conftest.py)
    guard.stop()
    assert gc.isenabled() and qapp.findChild(GuiGarbageCollector) is None
    again = guard_garbage_collection(qapp)  # as the next window would make it
    assert again is not guard and not gc.isenabled()
    again.stop()
    assert gc.isenabled()
