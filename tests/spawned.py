"""Several processes writing at once, as two workbenches or a CLI beside a GUI would."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any


def run_at_once(target: Callable[..., None], args: Sequence[tuple[Any, ...]], timeout_s: float) -> None:
    """``target`` in a spawned process per entry of ``args``, all started before any is awaited;
    each must exit cleanly within ``timeout_s``."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=one) for one in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
        assert p.exitcode == 0
