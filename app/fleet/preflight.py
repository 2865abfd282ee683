"""Before a campaign on a cluster: every node that could host one of its trials checks, with a
task that runs there, what a trial will need (the engine runtime, the model, free GPUs, a free
port). Nothing launches until all pass, unless bad nodes are left out (docs/fleet.md)."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.config import RunConfig
from app.errors import UserError
from app.fleet.cluster import NodeView, nodes
from engine_adapters.config import DEMO_MODEL

BUSY_GPU_BYTES = 2 * 2**30
"""A GPU holding more than this of other processes' memory is busy: a trial there would measure
a shared GPU."""
CHECK_TIMEOUT_S = 120.0


def node_problems(config: RunConfig) -> list[str]:
    """Runs on a node (a Ray task): what would stop a trial of ``config`` here, one line each."""
    import ray

    from engine_adapters.hardware import probe_hardware
    from engine_adapters.runtimes import MANAGED_RUNTIMES, RuntimeErrorMessage, addon_path, demo_model_dir

    problems: list[str] = []
    runtime = config.engine.runtime
    if runtime.kind == "managed":
        managed = MANAGED_RUNTIMES.get(runtime.managed)
        if managed is None:
            problems.append(f"unknown managed runtime '{runtime.managed}'")
        elif not managed.is_installed():
            problems.append(f"the engine runtime '{runtime.managed}' is not installed "
                            "(tunebench cluster prepare installs it)")
    elif runtime.kind == "python" and runtime.python and not Path(runtime.python).exists():
        problems.append(f"the engine's interpreter {runtime.python} does not exist")
    elif runtime.kind == "executable" and runtime.executable and shutil.which(runtime.executable) is None:
        problems.append(f"the engine command '{runtime.executable}' is not on PATH")
    elif runtime.kind == "docker" and shutil.which("docker") is None:
        problems.append("docker is not installed")
    if config.features.disaggregation.enabled:
        try:
            addon_path(config.engine)  # NIXL and the router, beside the runtime of every node with a pool engine
        except RuntimeErrorMessage as exc:
            problems.append(str(exc))
    model = config.engine.model
    if model == DEMO_MODEL:
        if not (demo_model_dir() / ".tunebench-complete.json").is_file():
            problems.append("the demo model is not there (tunebench cluster prepare makes it)")
    elif model.startswith(("/", "./", "~")) and not Path(model).expanduser().exists():
        problems.append(f"the model path {model} does not exist")
    gpu_ids = {str(g) for g in ray.get_gpu_ids()}
    hardware = probe_hardware()
    if not hardware.has_gpu and not _cpu_engine(config) and config.features.gpu_count > 0:
        problems.append("no NVIDIA GPU is visible" + (f" ({hardware.nvml_error})" if hardware.nvml_error else ""))
    for gpu, used_bytes in _gpu_memory_in_use(gpu_ids).items():
        if used_bytes > BUSY_GPU_BYTES:
            problems.append(f"GPU {gpu} is busy: {used_bytes / 2**30:.1f} GiB in use by other processes")
    port = config.engine.port
    if port:
        try:
            with socket.socket() as probe:
                probe.bind((config.engine.host, port))
        except OSError as exc:
            problems.append(f"port {port} on {config.engine.host} is taken ({exc.strerror or exc})")
    return problems


def _cpu_engine(config: RunConfig) -> bool:
    from engine_adapters.runtimes import is_cpu_build

    return is_cpu_build(config.engine.runtime)


def _gpu_memory_in_use(only: set[str]) -> dict[str, int]:
    """GPU index -> bytes other processes hold (empty without NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        out = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            if only and str(index) not in only:
                continue
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            out[str(index)] = sum(int(p.usedGpuMemory or 0) for p in processes)
        return out
    except Exception:
        return {}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


@dataclass
class Preflight:
    """What the checks found: the nodes that may host trials, and one line per node and problem."""

    hosts: list[NodeView] = field(default_factory=list)
    bad: dict[str, list[str]] = field(default_factory=dict)
    """Node label -> its problems."""

    @property
    def lines(self) -> list[str]:
        return [f"node {label}: {problem}" for label, problems in self.bad.items() for problem in problems]


def can_host(view: NodeView, wanted: dict[str, float]) -> bool:
    return view.alive and all(view.total.get(k, 0.0) >= amount for k, amount in wanted.items())


def preflight(config: RunConfig, wanted: dict[str, float]) -> Preflight:
    """Checks every live node that could hold a trial needing ``wanted`` (one task per node, all
    at once)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    views = [v for v in nodes() if can_host(v, wanted)]
    check = ray.remote(num_cpus=0)(node_problems)
    pending = {v.node_id: check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(v.node_id, soft=False))
               .remote(config) for v in views}
    out = Preflight(hosts=views)
    for view in views:
        try:
            problems = ray.get(pending[view.node_id], timeout=CHECK_TIMEOUT_S)
        except Exception as exc:
            problems = [f"the check did not run: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"]
        if problems:
            out.bad[view.label] = problems
    return out


def checked_hosts(config: RunConfig, wanted: dict[str, float], skip_bad_nodes: bool,
                  report: Callable[[str], None]) -> list[NodeView]:
    """The nodes that may host trials, after the preflight. Each problem is reported as one line
    ("node X: ..."); then a UserError, unless ``skip_bad_nodes`` leaves those nodes out and some
    passed."""
    found = preflight(config, wanted)
    if not found.hosts:
        need = ", ".join(f"{k} {v:g}" for k, v in sorted(wanted.items()))
        raise UserError(f"no live node of the cluster can hold a trial that needs {need} on one node")
    good = [v for v in found.hosts if v.label not in found.bad]
    failed = bool(found.bad) and (not skip_bad_nodes or not good)
    for line in found.lines:
        report(line if failed else f"left out: {line}")
    if failed:
        raise UserError(f"the preflight failed on {len(found.bad)} of {len(found.hosts)} node(s), so nothing was "
                        "launched" + ("" if skip_bad_nodes else " (--skip-bad-nodes leaves the bad ones out)"))
    return good
