"""Host sampler on psutil: machine CPU and memory, plus the engine's process tree (RSS and CPU).

For the CPU engine these are the only resource graphs; on a GPU machine they show what CPU
offload costs. ``engine_cpu_pct`` is in percent of ONE core (a tree busy on 3 cores reads 300),
``cpu_pct`` is the whole machine (100 = every core busy).
"""

from __future__ import annotations

import threading
import time

import psutil

from app.events import TelemetrySupport

# CPU percentages are CPU-time deltas over wall-time deltas; the kernel counts CPU time in 10 ms
# ticks, so a reading over less than this is noise (one tick over 1 ms reads 1,000%).
MIN_CPU_INTERVAL_S = 0.1

HOST_QUANTITIES: tuple[str, ...] = (
    "cpu_pct", "memory_used_bytes", "memory_total_bytes", "engine_rss_bytes", "engine_cpu_pct",
)


class ProcessTree:
    """An engine process and its descendants. The children list is refreshed every
    ``refresh_s`` (scanning /proc for children costs milliseconds); the Process objects are
    kept between ticks because psutil measures CPU percent since the previous call on the same
    object."""

    def __init__(self, root_pid: int, refresh_s: float = 2.0) -> None:
        self.root_pid = root_pid
        self.refresh_s = refresh_s
        self._procs: dict[int, psutil.Process] = {}
        self._baselined_at: dict[int, float] = {}  # pid -> when its CPU baseline was taken
        self._refreshed_at = -1e18
        self._lock = threading.Lock()
        self.alive = True

    def _refresh(self) -> None:
        try:
            root = self._procs.get(self.root_pid) or psutil.Process(self.root_pid)
            members = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._procs, self.alive = {}, False
            return
        keep: dict[int, psutil.Process] = {}
        for proc in members:
            old = self._procs.get(proc.pid)
            keep[proc.pid] = old if old is not None and old.is_running() else proc
            if old is None:
                try:
                    keep[proc.pid].cpu_percent(None)  # start its CPU baseline
                    self._baselined_at[proc.pid] = time.monotonic()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    keep.pop(proc.pid, None)
        self._baselined_at = {pid: t for pid, t in self._baselined_at.items() if pid in keep}
        self._procs, self.alive = keep, True
        self._refreshed_at = time.monotonic()

    def members(self) -> list[psutil.Process]:
        with self._lock:
            if time.monotonic() - self._refreshed_at >= self.refresh_s:
                self._refresh()
            return list(self._procs.values())

    def pids(self) -> set[int]:
        return {p.pid for p in self.members()}

    def usage(self) -> tuple[float, float | None] | None:
        """(RSS bytes, CPU percent of one core) summed over the tree; None once it is gone. CPU is
        None while a member's baseline is too recent to measure against: a few milliseconds of
        CPU ticks over a few milliseconds of wall time read as thousands of percent."""
        rss, cpu, seen, too_recent = 0.0, 0.0, 0, False
        now_s = time.monotonic()
        for proc in self.members():
            try:
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    cpu += proc.cpu_percent(None)
                if now_s - self._baselined_at.get(proc.pid, -1e18) < MIN_CPU_INTERVAL_S:
                    too_recent = True  # this reading is noise; it is the baseline for the next one
                self._baselined_at[proc.pid] = now_s
                seen += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                with self._lock:
                    self._refreshed_at = -1e18  # a member left: rescan next tick
        if not seen:
            return None
        return rss, None if too_recent else cpu


class HostSampler:
    """Machine-wide CPU and memory, plus the engine tree when an engine PID is known."""

    def __init__(self, engine_tree: ProcessTree | None = None) -> None:
        self.tree = engine_tree
        self.errors = 0
        self._cpu_baseline_at = -1e18

    def open(self) -> TelemetrySupport:
        psutil.cpu_percent(None)  # the first call only sets psutil's baseline
        self._cpu_baseline_at = time.monotonic()
        unsupported = {} if self.tree is not None else {
            "engine_rss_bytes": "no engine process given", "engine_cpu_pct": "no engine process given"}
        if self.tree is not None:
            self.tree.members()
        return TelemetrySupport(
            source="host", available=True, supported=[q for q in HOST_QUANTITIES if q not in unsupported],
            unsupported=unsupported, detail=f"{psutil.cpu_count(logical=True)} logical CPUs",
            labels={"engine_cpu_pct": "engine process tree CPU (% of one core)", "cpu_pct": "machine CPU (% of all cores)"})

    def sample(self) -> dict[str, float]:
        values: dict[str, float] = {}
        try:
            now_s = time.monotonic()
            cpu_pct = float(psutil.cpu_percent(None))
            if now_s - self._cpu_baseline_at >= MIN_CPU_INTERVAL_S:
                values["cpu_pct"] = cpu_pct  # else: too soon after the baseline to mean anything
            self._cpu_baseline_at = now_s
            memory = psutil.virtual_memory()
            values["memory_total_bytes"] = float(memory.total)
            values["memory_used_bytes"] = float(memory.total - memory.available)
        except Exception:  # noqa: BLE001 - /proc unreadable: count, keep sampling
            self.errors += 1
        if self.tree is not None:
            usage = self.tree.usage()
            if usage is not None:
                values["engine_rss_bytes"] = usage[0]
                if usage[1] is not None:
                    values["engine_cpu_pct"] = usage[1]
        return values
