"""What `run`, `ladder` and `tune` share: open the run store as a recorder, do the work on a
thread while the main thread prints the bus, and turn Ctrl-C or SIGTERM into a clean cancel."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from app.bus import Bus, Subscription
from app.errors import UserError
from app.events import Event

T = TypeVar("T")


def open_recorder(bus: Bus, args: argparse.Namespace) -> Any:
    """The recorder writing this command's runs (subscribed before anything is published), or
    None with ``--no-store``."""
    if getattr(args, "no_store", False):
        return None
    from app.recording import record_to_default_store
    from app.store import StoreError

    try:
        return record_to_default_store(bus, args.db)
    except StoreError as exc:  # its message names the store and what to do
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot open the run database: {exc}") from None


def run_in_foreground(work: Callable[[], T], sub: Subscription, handle: Callable[[Event], None],
                      cancel: threading.Event, *, name: str, recorder: Any = None,
                      cancel_note: str = "stopping requests and the engine (Ctrl-C again does not hurry it)") -> T:
    """``work()`` on a thread; the bus's events go to ``handle`` here until it ends. Ctrl-C and
    SIGTERM set ``cancel`` (the work stops its engine and returns); the recorder is closed in all
    cases, and an exception from the work is raised again here."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # re-raised on the main thread
            box["error"] = exc

    previous = signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    try:
        while thread.is_alive() or len(sub):
            try:
                for ev in sub.drain(timeout_s=0.2):
                    if isinstance(ev, Event):
                        handle(ev)
            except KeyboardInterrupt:
                if not cancel.is_set():
                    print(f"\ncancelling: {cancel_note}", file=sys.stderr)
                cancel.set()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if recorder is not None:
            recorder.close()
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value
