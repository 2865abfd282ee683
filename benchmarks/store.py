"""Run-store speed and size on both backends, side by side: write one run of 100,000 requests
(63 tokens each) and 36,000 telemetry samples the way a run does (one batch per second), ten
times per backend, then compare the ten runs. Prints a table of the figures against the targets
and exits 1 on a miss, naming each missed target below the table.

Targets:

- SQLite: under 2 s to write a run and under 300 ms to compare ten runs, both in CPU seconds of
  this process (on a shared machine wall time also counts other people's work; wall time is
  printed too, with the load average), and under 100 MiB for the database of ten runs.
- PostgreSQL: writing a run takes at most 2x SQLite's time, and comparing ten runs takes under
  200 ms of wall time (best of 3).

Why the PostgreSQL write target is a wall-time ratio, measured interleaved: the server does its
share of the work in its own processes, so CPU seconds of this process leave that share out, and
only wall time counts it (round trips included). Wall time on these shared machines drifts with
other people's load, so an absolute wall-time target would judge the machine, not the store;
a ratio to SQLite measured in the same run cancels the drift, provided both backends see the same
load: runs are written alternately (SQLite, PostgreSQL, SQLite, PostgreSQL, ...), and the
ratio is that of the two medians. The compare rounds are interleaved the same way. For a
throwaway server the server's CPU seconds (its postmaster and every backend, reaped ones
included) are printed too, to show where a write's time goes: this process, the server, or
waiting (round trips).

Both backends run at one stated durability, read back from each and printed with the figures:
SQLite as tunebench opens it (WAL, ``synchronous=NORMAL``), PostgreSQL with ``fsync=on``,
``synchronous_commit=off`` and ``full_page_writes=on``. On a power loss either may lose the last
transactions it committed, and neither corrupts its database; a faster setting on one side only
(the test suite's servers run with fsync off) would compare unlike stores.

By default PostgreSQL is a throwaway server (``tests/pg_server.py``: 127.0.0.1 only, started
crash safe as above) in the temporary directory, always stopped at the end; ``--pg-url`` uses an
existing database instead (its runs are deleted afterwards; its size figure counts every run in
tunebench's tables, and its durability is what it is configured with: printed, and called out
when it differs). ``--backends`` picks one backend: a ratio needs both, so it is then not judged.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import repo_path  # noqa: F401 (the repository importable)
from sqlalchemy import text

from app.analysis.compare import Comparison, compare_runs
from app.store import RunStore, SampleIn, StoreError
from db.dialects import POSTGRESQL, SQLITE
from db.models import Base
from tests.pg_server import CRASH_SAFE_DURABILITY, PgServerMissing, start_pg_server

WRITE_TARGET_S, COMPARE_TARGET_S, SIZE_TARGET_MIB = 2.0, 0.300, 100.0
PG_WRITE_RATIO_TARGET, PG_COMPARE_TARGET_S = 2.0, 0.200
COMPARE_ROUNDS = 3
BACKENDS = (SQLITE, POSTGRESQL)
LABELS = {SQLITE: "SQLite", POSTGRESQL: "PostgreSQL"}
PG_DATABASE = "tunebench_bench"
DURABILITY = {SQLITE: {"journal_mode": "wal", "synchronous": "NORMAL"},
              POSTGRESQL: dict(setting.split("=", 1) for setting in CRASH_SAFE_DURABILITY)}
"""The stated durability: what each backend must run with for the figures to compare like with like."""
DURABILITY_MEANS = ("on a power loss either may lose the last transactions it committed; neither corrupts "
                    "its database")
SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
"""``PRAGMA synchronous``'s answer is a number: its name by that index."""


def synthetic_run(store: RunStore, seed: int, n_requests: int, n_samples: int,
                  duration_s: float) -> tuple[int, float, float, float]:
    """Write a run in one-second batches; return (run id, seconds in batches, seconds to finish,
    CPU seconds of both: on a shared machine wall time also counts other people's work)."""
    rng = np.random.default_rng(seed)
    t_wall0, t_mono0 = 1.8e9 + seed * 10_000, 1000.0 + seed * 10_000
    run_id = store.create_run(name=f"bench-{seed}", tags=["bench"], engine_kind="vllm", model="demo",
                              config={"features": {"prefix_caching": bool(seed % 2)}, "load": {"concurrency": 64}},
                              started_at=t_wall0, t0_mono=t_mono0)
    flushes = int(duration_s)
    req_per_flush, smp_per_flush = n_requests // flushes, n_samples // flushes
    sources = ("gpu0", "host", "engine", "client")
    spent = cpu = 0.0
    for second in range(flushes):
        # the runner's `request` payload: app.load.metrics.RequestRecord as JSON, plus the run id
        requests = [{"run_id": "bench", "level": 0, "index": second * req_per_flush + i, "conversation": 0, "turn": 0,
                     "scheduled_s": second + i / req_per_flush, "start_s": second + i / req_per_flush,
                     "start_wall_s": t_wall0 + second + i / req_per_flush, "queue_ms": 0.1,
                     "ttft_ms": float(rng.gamma(4, 20)), "itl_ms": rng.gamma(8, 2, 63).tolist(), "tpot_ms": 15.0,
                     "e2e_ms": float(rng.gamma(9, 150)), "input_tokens": 128, "input_tokens_counted": 128,
                     "output_tokens": 64, "expected_output_tokens": 64, "chunks": 64, "tokens_source": "usage",
                     "finish_reason": "length", "ok": True, "error": None, "error_kind": None, "http_status": 200}
                    for i in range(req_per_flush)]
        samples = [SampleIn(sources[j % 4], t_mono0 + second + j / smp_per_flush, t_wall0 + second + j / smp_per_flush,
                            {"util_pct": float(rng.uniform(0, 100)), "memory_used_bytes": 7e10,
                             "generation_tok_per_s": float(rng.normal(1800, 50)), "kv_cache_usage_pct": 40.0})
                   for j in range(smp_per_flush)]
        started, cpu_started = time.perf_counter(), time.process_time()
        store.write_batch(run_id, requests=requests, samples=samples, log_lines=[f"log line {second}"])
        spent += time.perf_counter() - started
        cpu += time.process_time() - cpu_started
    started, cpu_started = time.perf_counter(), time.process_time()
    store.finish_run(run_id, "completed", None, {"output_tok_per_s": 1800.0}, finished_at=t_wall0 + duration_s)
    return run_id, spent, time.perf_counter() - started, cpu + time.process_time() - cpu_started


@dataclass
class Backend:
    """One store under test and what was measured on it."""

    name: str
    store: RunStore
    server_cpu: Callable[[], float | None] | None = None
    """CPU seconds the server has used so far, when it is ours (a throwaway PostgreSQL)."""
    ids: list[int] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    finishes: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    server_cpus: list[float] = field(default_factory=list)
    compare_walls: list[float] = field(default_factory=list)
    compare_cpus: list[float] = field(default_factory=list)
    list_s: float = 0.0
    size_mib: float | None = None

    @property
    def label(self) -> str:
        return LABELS[self.name]

    def write_wall(self) -> float:
        return float(np.median(np.add(self.batches, self.finishes)))


@dataclass(frozen=True)
class Target:
    """An upper bound on one backend's figure (``inclusive``: "at most", else "under")."""

    backend: str
    limit: float
    text: str
    inclusive: bool = False

    def met(self, value: float) -> bool:
        return value <= self.limit if self.inclusive else value < self.limit


@dataclass
class Row:
    """One line of the table: a figure on each backend (None: not available there; missing: the
    backend was not measured) and the targets it is judged against."""

    figure: str
    values: dict[str, float | None]
    fmt: str
    targets: tuple[Target, ...] = ()

    def cell(self, backend: str) -> str:
        if backend not in self.values:
            return "-"
        value = self.values[backend]
        return "n/a" if value is None else self.fmt.format(value)

    def misses(self) -> list[tuple[Target, float]]:
        return [(t, value) for t in self.targets
                if (value := self.values.get(t.backend)) is not None and not t.met(value)]

    def verdict(self) -> str:
        judged = [t for t in self.targets if self.values.get(t.backend) is not None]
        if not judged:
            return "not judged" if self.targets else ""
        return "MISSED" if self.misses() else "OK"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=36_000)
    parser.add_argument("--duration-s", type=float, default=900.0, help="simulated run length (one batch per second)")
    parser.add_argument("--runs", type=int, default=10, help="runs to write and compare per backend (at least 2)")
    parser.add_argument("--backends", type=_backends, default=BACKENDS, metavar="LIST",
                        help=f"comma-separated, of {', '.join(BACKENDS)} (default: both)")
    parser.add_argument("--pg-url", metavar="URL",
                        help="an existing PostgreSQL database (postgresql://USER@HOST:PORT/DB) instead of a "
                             "throwaway server; the benchmark's runs are deleted from it afterwards")
    args = parser.parse_args()
    args.runs = max(2, args.runs)
    with tempfile.TemporaryDirectory(prefix="tunebench-store-bench-") as tmp, ExitStack() as cleanup:
        # ExitStack unwinds first: runs deleted, stores closed, the server stopped; then the directory goes
        try:
            backends = [_open(name, Path(tmp), args.pg_url, cleanup) for name in args.backends]
        except (PgServerMissing, StoreError) as exc:
            hint = ("; or measure SQLite alone (--backends sqlite), or name a database (--pg-url)"
                    if isinstance(exc, PgServerMissing) else "")
            print(f"cannot open the store: {exc}{hint}", file=sys.stderr)
            return 2
        print(f"one run: {args.requests:,} requests, {args.samples:,} samples in {int(args.duration_s)} one-second "
              f"batches, then finish (metrics, compaction); {args.runs} runs per backend, written in turn "
              f"({', '.join(b.label for b in backends)}, ...)")
        load_before = os.getloadavg()[0]
        for seed in range(args.runs):
            for backend in backends:  # interleaved, so that load drift hits every backend alike
                server_before = backend.server_cpu() if backend.server_cpu else None
                run_id, batch_s, finish_s, cpu_s = synthetic_run(backend.store, seed, args.requests, args.samples,
                                                                 args.duration_s)
                server_after = backend.server_cpu() if backend.server_cpu else None
                backend.ids.append(run_id)
                backend.batches.append(batch_s)
                backend.finishes.append(finish_s)
                backend.cpus.append(cpu_s)
                if server_before is not None and server_after is not None:
                    backend.server_cpus.append(server_after - server_before)
            print(f"  run {seed + 1}/{args.runs}: " + ", ".join(
                f"{b.label} {b.batches[-1] + b.finishes[-1]:.2f} s wall, {b.cpus[-1]:.2f} s CPU" for b in backends),
                flush=True)
        comparison = _compare(backends)
        for backend in backends:
            started = time.perf_counter()
            backend.store.list_runs()
            backend.list_s = time.perf_counter() - started
            backend.size_mib = _size_mib(backend, Path(tmp))
        load_after = os.getloadavg()[0]
        print(f"compare {args.runs} runs: config diff, {len(comparison.metrics)} metric deltas, "
              f"{len(comparison.series)} aligned series x "
              f"{comparison.series[0].t_s.size if comparison.series else 0} points")
        print(f"load average while measuring: {load_before:.2f} before, {load_after:.2f} after, "
              f"on {os.cpu_count()} CPUs")
        if not _print_durability(backends):
            print("the backends do not run at the stated durability: the figures compare unlike stores")
        print()
        rows = _rows(backends, args.runs)
        _print_table(rows, [b.name for b in backends])
    misses = [(row, target, value) for row in rows for target, value in row.misses()]
    for row, target, value in misses:
        print(f"MISSED: {row.figure}: {LABELS[target.backend]} {row.fmt.format(value)} "
              f"(target: {target.text})")
    if not misses:
        met = sum(row.verdict() == "OK" for row in rows)
        not_judged = sum(row.verdict() == "not judged" for row in rows)
        print(f"\nall {met} judged targets met, {not_judged} not judged" if not_judged else
              f"\nall {met} targets met" if met else "\nno target judged")
    return 1 if misses else 0


def _backends(value: str) -> tuple[str, ...]:
    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"backends are a comma-separated list of {', '.join(BACKENDS)}")
    return tuple(name for name in BACKENDS if name in names)


def _open(name: str, tmp: Path, pg_url: str | None, cleanup: ExitStack) -> Backend:
    """The store of backend ``name``; what undoes it (closing, stopping a throwaway server,
    deleting the runs written to an existing database) goes on ``cleanup``."""
    if name == SQLITE:
        store = RunStore(tmp / "bench.db")
        cleanup.callback(store.close)
        return Backend(name, store)
    server_cpu: Callable[[], float | None] | None = None
    if pg_url is None:
        server = start_pg_server(tmp / "pg", crash_safe=True)
        cleanup.callback(server.stop)
        url = server.create_database(PG_DATABASE)
        server_cpu = lambda: _tree_cpu_s(server.pid) if server.pid is not None else None  # noqa: E731
    else:
        url = pg_url
    store = RunStore(url)
    cleanup.callback(store.close)
    backend = Backend(name, store, server_cpu)
    if pg_url is not None:
        cleanup.callback(_delete_runs, backend)
    return backend


def _durability(backend: Backend) -> dict[str, str]:
    """The settings that decide what a crash keeps, as the backend itself reports them."""
    with backend.store.engine.connect() as conn:
        if backend.name == SQLITE:
            synchronous = int(conn.exec_driver_sql("PRAGMA synchronous").scalar_one())
            return {"journal_mode": str(conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()).lower(),
                    "synchronous": SQLITE_SYNCHRONOUS[synchronous]}
        return {name: str(conn.exec_driver_sql(f"SHOW {name}").scalar_one()) for name in DURABILITY[POSTGRESQL]}


def _print_durability(backends: Sequence[Backend]) -> bool:
    """Prints each backend's durability; whether every one runs at the stated level."""
    stated = True
    for backend in backends:
        found = _durability(backend)
        wanted = DURABILITY[backend.name]
        off = [f"{name}={value} (stated: {wanted[name]})" for name, value in found.items() if value != wanted[name]]
        stated = stated and not off
        print(f"durability: {backend.label} " + ", ".join(f"{name}={value}" for name, value in found.items())
              + (f": NOT the stated level: {'; '.join(off)}" if off else ""))
    if stated:
        print(f"durability: the stated level on each backend: {DURABILITY_MEANS}")
    return stated


def _delete_runs(backend: Backend) -> None:
    for run_id in backend.ids:
        try:
            backend.store.delete(run_id)
        except StoreError as exc:
            print(f"could not delete the benchmark's run {run_id} from {backend.store.where}: {exc}", file=sys.stderr)


def _compare(backends: Sequence[Backend]) -> Comparison:
    """Compare each backend's runs, best of ``COMPARE_ROUNDS`` rounds, the rounds interleaved."""
    for backend in backends:
        compare_runs(backend.store, backend.ids[:2])  # warm imports and caches once
    comparison: Comparison | None = None
    for _ in range(COMPARE_ROUNDS):
        for backend in backends:
            started, cpu_started = time.perf_counter(), time.process_time()
            comparison = compare_runs(backend.store, backend.ids, baseline=backend.ids[0])
            backend.compare_walls.append(time.perf_counter() - started)
            backend.compare_cpus.append(time.process_time() - cpu_started)
    assert comparison is not None
    return comparison


def _size_mib(backend: Backend, tmp: Path) -> float | None:
    """SQLite: the files, once the last connection has folded the WAL in (the store is closed).
    PostgreSQL: tunebench's tables with their indexes and TOAST."""
    if backend.name == SQLITE:
        backend.store.close()
        return sum(f.stat().st_size for f in tmp.glob("bench.db*")) / 2**20
    query = text("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                 "JOIN pg_namespace n ON n.oid = c.relnamespace "
                 "WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relname = ANY(:names)")
    with backend.store.engine.connect() as conn:
        size = conn.execute(query, {"names": list(Base.metadata.tables)}).scalar_one()
    return int(size) / 2**20


def _tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of process ``pid``, its children that it has reaped, and its live children
    (for a postmaster: itself, its ended backends, its live backends and helpers), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    try:
        own = _proc_stat(pid)
    except OSError:
        return None
    total += own[1] + own[2] + own[3] + own[4]  # utime, stime, cutime, cstime
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ppid, utime, stime, _, _ = _proc_stat(int(entry.name))
        except (OSError, ValueError):  # ended meanwhile
            continue
        if ppid == pid:
            total += utime + stime
    return total / ticks


def _proc_stat(pid: int) -> tuple[int, int, int, int, int]:
    """ppid, utime, stime, cutime, cstime of ``pid`` (clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return int(fields[1]), int(fields[11]), int(fields[12]), int(fields[13]), int(fields[14])


def _rows(backends: Sequence[Backend], runs: int) -> list[Row]:
    def each(figure: Callable[[Backend], float | None]) -> dict[str, float | None]:
        return {b.name: figure(b) for b in backends}

    by_name = {b.name: b for b in backends}
    rows = [
        Row("write a run: batches, wall (median)", each(lambda b: float(np.median(b.batches))), "{:.3f} s"),
        Row("write a run: finish (metrics, compaction), wall (median)",
            each(lambda b: float(np.median(b.finishes))), "{:.3f} s"),
        Row("write a run: wall (median)", each(Backend.write_wall), "{:.3f} s"),
        Row("write a run: CPU of this process (median)", each(lambda b: float(np.median(b.cpus))), "{:.3f} s",
            (Target(SQLITE, WRITE_TARGET_S, f"SQLite < {WRITE_TARGET_S:g} s CPU"),)),
        Row("write a run: CPU of the server (median)",
            each(lambda b: float(np.median(b.server_cpus)) if b.server_cpus else None), "{:.3f} s"),
    ]
    if SQLITE in by_name and POSTGRESQL in by_name:
        ratio = by_name[POSTGRESQL].write_wall() / by_name[SQLITE].write_wall()
        rows.append(Row("write a run: wall / SQLite's (medians, interleaved)", {SQLITE: 1.0, POSTGRESQL: ratio},
                        "{:.2f}x", (Target(POSTGRESQL, PG_WRITE_RATIO_TARGET,
                                           f"PostgreSQL <= {PG_WRITE_RATIO_TARGET:g}x", inclusive=True),)))
    elif POSTGRESQL in by_name:
        rows.append(Row("write a run: wall / SQLite's (needs both backends)", {POSTGRESQL: None}, "{:.2f}x",
                        (Target(POSTGRESQL, PG_WRITE_RATIO_TARGET, f"PostgreSQL <= {PG_WRITE_RATIO_TARGET:g}x",
                                inclusive=True),)))
    rows += [
        Row(f"compare {runs} runs: CPU of this process (best of {COMPARE_ROUNDS})",
            each(lambda b: min(b.compare_cpus) * 1000), "{:.0f} ms",
            (Target(SQLITE, COMPARE_TARGET_S * 1000, f"SQLite < {COMPARE_TARGET_S * 1000:.0f} ms CPU"),)),
        Row(f"compare {runs} runs: wall (best of {COMPARE_ROUNDS})", each(lambda b: min(b.compare_walls) * 1000),
            "{:.0f} ms", (Target(POSTGRESQL, PG_COMPARE_TARGET_S * 1000,
                                 f"PostgreSQL < {PG_COMPARE_TARGET_S * 1000:.0f} ms wall"),)),
        Row(f"list {runs} runs: wall", each(lambda b: b.list_s * 1000), "{:.1f} ms"),
        Row(f"database size ({runs} runs)", each(lambda b: b.size_mib), "{:.1f} MiB",
            (Target(SQLITE, SIZE_TARGET_MIB, f"SQLite < {SIZE_TARGET_MIB:.0f} MiB"),)),
    ]
    return rows


def _print_table(rows: Sequence[Row], measured: Sequence[str]) -> None:
    header = ["figure", *(LABELS[name] for name in BACKENDS), "target", "verdict"]
    lines = [[row.figure, *(row.cell(name) for name in BACKENDS),
              ", ".join(t.text for t in row.targets) or "-", row.verdict()] for row in rows]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    right = {1, 2}  # the figures
    for line in [header, *lines]:
        print("  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                        for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip())
    not_measured = [LABELS[name] for name in BACKENDS if name not in measured]
    if not_measured:
        print(f"(-: {', '.join(not_measured)} not measured; --backends)")


if __name__ == "__main__":
    raise SystemExit(main())
