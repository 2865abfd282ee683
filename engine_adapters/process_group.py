"""Finding and ending a process group, and telling whether a recorded process is still the same
live one. Kept free of heavier imports so the engine watchdog, a process of its own per engine,
starts fast and small."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

STOP_GRACE_S = (15.0, 8.0, 5.0)  # after SIGINT, after SIGTERM, after SIGKILL

_EPOCH_START_FLOOR_S = 1e9
"""A recorded start above this is seconds since the epoch (written by an older tunebench, or on a
system without /proc), never seconds since boot."""
_SAME_START_TOLERANCE_S = 0.05  # /proc counts in clock ticks (1/100 s): equal starts match exactly
_EPOCH_TOLERANCE_S = 2.0  # the epoch form moves by a whole second when the kernel's boot time does


STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


@contextlib.contextmanager
def stop_signals_unblocked() -> Iterator[None]:
    """The stop signals unblocked in the calling thread while a child is started: a child inherits
    its parent thread's signal mask, and a thread that blocks SIGINT (a Ray actor's task thread
    does) would start an engine deaf to the SIGINT it is stopped with."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def process_start_s(pid: int) -> float | None:
    """When a process started: seconds since boot where /proc has it, else since the epoch.

    Since boot, because that never changes over a process's life. psutil's ``create_time`` adds
    the boot time the kernel reports *now*, in whole seconds, and that moves by one whenever the
    wall clock is stepped or slewed across a second: a start time compared later, or in another
    process, would then call a live process dead (and its engines orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        if not Path("/proc/self/stat").exists():  # no /proc on this system: the epoch form
            try:
                return float(psutil.Process(pid).create_time())
            except psutil.Error:
                return None
        return None
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after its last ')' are
    # plain, and the start time is field 22 of the whole line.
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def pid_namespace() -> str:
    """Where this process's pids mean something: the host name, the boot and the pid namespace.
    Two containers on one host (``--net=host`` gives them one host name) or one host after a
    reboot number their processes apart, so a pid recorded in one is never looked up in another."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = "?"
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = "?"
    return f"{platform.node()}/{boot}/{namespace}"


def process_identity(pid: int | None = None) -> tuple[int, float]:
    """A process (this one by default) as ``(pid, start)``: pids get reused, the pair does not."""
    pid = os.getpid() if pid is None else pid
    start = process_start_s(pid)
    if start is None:
        raise psutil.NoSuchProcess(pid)
    return pid, start


def _start_matches(pid: int, recorded_start_s: float) -> bool:
    if recorded_start_s > _EPOCH_START_FLOOR_S:
        try:
            return abs(psutil.Process(pid).create_time() - recorded_start_s) < _EPOCH_TOLERANCE_S
        except psutil.Error:
            return False
    actual = process_start_s(pid)
    return actual is not None and abs(actual - recorded_start_s) < _SAME_START_TOLERANCE_S


def same_process_alive(pid: int | None, start_s: float | None) -> bool:
    """Is the process recorded as ``(pid, start)`` still alive, and still that process? A zombie
    counts as gone; a record without a start trusts the pid alone."""
    if pid is None:
        return False
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.Error:
        return False
    return start_s is None or _start_matches(pid, start_s)


def _started_before(pid: int, reference_start_s: float) -> bool:
    """Did ``pid`` start clearly before a recorded start (so it cannot belong to that group)?"""
    if reference_start_s > _EPOCH_START_FLOOR_S:
        try:
            return psutil.Process(pid).create_time() + _EPOCH_TOLERANCE_S < reference_start_s
        except psutil.Error:
            return False
    start = process_start_s(pid)
    return start is not None and start + _SAME_START_TOLERANCE_S < reference_start_s


def group_members(pgid: int, not_before: float | None = None) -> list[psutil.Process]:
    """Live processes in a process group (optionally only those that started no earlier than a
    recorded start, as ``process_start_s`` gives it: a reused group id is not ours)."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if not_before is not None and _started_before(proc.pid, not_before):
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
