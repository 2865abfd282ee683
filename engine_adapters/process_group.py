"""Finding and ending a process group. Kept free of heavier imports so the engine watchdog, a
process of its own per engine, starts fast and small."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil

STOP_GRACE_S = (15.0, 8.0, 5.0)  # after SIGINT, after SIGTERM, after SIGKILL


def group_members(pgid: int, not_before: float | None = None) -> list[psutil.Process]:
    """Live processes in a process group (optionally only those created after a time)."""
    members = []
    for proc in psutil.process_iter(["pid", "create_time", "status"]):
        try:
            if os.getpgid(proc.pid) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if not_before is not None and proc.info["create_time"] + 1.0 < not_before:
                continue
            members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def stop_group(pgid: int, grace_s: tuple[float, float, float] = STOP_GRACE_S,
               leader: subprocess.Popen[str] | None = None, not_before: float | None = None) -> str:
    """SIGINT, then SIGTERM, then SIGKILL to a process group; returns the signal that ended it."""
    for sig, wait_s in zip((signal.SIGINT, signal.SIGTERM, signal.SIGKILL), grace_s, strict=True):
        if not group_members(pgid, not_before):
            return "already gone" if sig == signal.SIGINT else signal.Signals(sig).name
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if leader is not None:
                leader.poll()  # reap the leader so it does not linger as a zombie
            if not group_members(pgid, not_before):
                return signal.Signals(sig).name
            time.sleep(0.1)
    return "SIGKILL (processes remain)"
