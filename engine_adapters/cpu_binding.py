"""Cores for a CPU engine and cores for the load client, so the engine never starves the client.

vLLM's CPU build pins its OpenMP compute threads to the cores in ``VLLM_CPU_OMP_THREADS_BIND``
(``"0-2"``, ``"0,2"``; ``|`` separates tensor-parallel ranks; ``auto`` or ``nobind``). With
``auto`` it reserves cores only for its own scheduler, so a client on the same machine competes
with the engine's API server and scheduler and wakes up late. tunebench therefore binds the
engine's compute threads explicitly, leaving the top core(s) to the client, and binds the client
process (``app.load.procs``) to exactly those. A user's own ``VLLM_CPU_OMP_THREADS_BIND`` wins;
the client then gets whatever that leaves free.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from engine_adapters.config import EngineConfig
from engine_adapters.runtimes import RuntimeErrorMessage, managed_runtime

OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
CORES_PER_CLIENT_CORE = 8
"""One core in eight (at least one) is left to the client; a 2-core machine gives it one."""


def allowed_cpus() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def split_cores(cpus: Iterable[int] | None = None) -> tuple[list[int], list[int]]:
    """(engine cores, client cores); no split (all to the engine) on a single core."""
    ids = sorted(set(cpus if cpus is not None else allowed_cpus()))
    if len(ids) < 2:
        return ids, []
    n_client = max(1, len(ids) // CORES_PER_CLIENT_CORE)
    return ids[:-n_client], ids[-n_client:]


def format_cpu_list(ids: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the form vLLM parses)."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_cpu_list(text: str) -> list[int] | None:
    """Core ids of a bind list (ranks joined); None for ``auto``, ``nobind`` or anything else."""
    ids: set[int] = set()
    try:
        for part in text.replace("|", ",").split(","):
            part = part.strip()
            if not part:
                continue
            lo, _, hi = part.partition("-")
            ids.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return None
    return sorted(ids) or None


def engine_bind_env() -> dict[str, str]:
    """Environment that pins a vLLM CPU engine's compute threads off the client's core(s)."""
    engine, client = split_cores()
    return {OMP_BIND_ENV: format_cpu_list(engine)} if client else {}


def client_cpus(engine_env: Mapping[str, str]) -> list[int] | None:
    """The cores an engine launched with ``engine_env`` leaves free for the client (None: the
    engine's threads are not pinned, or pinned to every core)."""
    pinned = parse_cpu_list(engine_env.get(OMP_BIND_ENV, ""))
    if not pinned:
        return None
    free = [c for c in allowed_cpus() if c not in set(pinned)]
    return free or None


def launch_env(engine: EngineConfig, env: Mapping[str, str]) -> dict[str, str]:
    """What to add to ``env`` when launching ``engine`` on this machine: the compute-thread
    binding, for a managed CPU runtime whose binding the user has not set. Only vLLM reads it;
    other engines get none (and so the client is not bound either: see :func:`client_cpus`)."""
    if engine.kind != "vllm" or engine.runtime.kind != "managed" or OMP_BIND_ENV in env:
        return {}
    try:
        runtime = managed_runtime(engine.runtime.managed)
    except RuntimeErrorMessage:
        return {}
    return engine_bind_env() if runtime.binds_cpu_threads else {}
