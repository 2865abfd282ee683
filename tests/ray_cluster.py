"""A real Ray cluster on this machine for the fleet's tests: a head and worker nodes started with
``ray.cluster_utils.Cluster``, every Ray process pinned to 127.0.0.1 and to a temporary directory
of its own. It is shut down through its handle (never ``ray stop``, which would stop every Ray
process on the machine). See ../shared/notes/ray-and-postgres.md for why the pin is needed."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.small_profile import LLAMACPP_DEMO_ENGINE

TINY_PROFILE = """
name = "fleet tiny"
tags = ["fleet-test"]
""" + LLAMACPP_DEMO_ENGINE + """
[features]
max_num_seqs = 4
[workload]
kind = "random"
num_requests = {requests}
[workload.input_len]
mean = 64
[workload.output_len]
mean = 32
[load]
concurrency = 4
warmup_requests = {warmup_requests}
"""
"""The fleet's trial in its tests and benchmark: the llama.cpp CPU engine (the fastest start) and
a small random workload; one trial takes 2 CPUs, a worker node's all."""


MID_RUN_RATE_RPS = 10.0
"""The pace of a tiny run that a test acts on mid-run (partitions, kills, interrupts): the run
lasts ``requests / MID_RUN_RATE_RPS`` seconds, however fast the machine."""


def tiny_profile_text(requests: int = 16, warmup_requests: int = 1, rate_rps: float | None = None) -> str:
    """``rate_rps``: sent at that constant rate (at most 4 in flight) instead of 4 at a time, so a
    test that acts mid-run knows the run lasts ``requests / rate_rps`` seconds on any machine (the
    tiny model serves an unpaced load in a second or two, less on a faster machine)."""
    text = TINY_PROFILE.replace("{requests}", str(requests)).replace("{warmup_requests}", str(warmup_requests))
    if rate_rps is not None:
        text = text.replace("concurrency = 4\n", f'pattern = "constant"\nrate_rps = {rate_rps}\nmax_concurrency = 4\n')
    return text


def tiny_profile(folder: Path, requests: int = 16, rate_rps: float | None = None) -> Path:
    """The tiny profile written to ``folder``."""
    path = folder / "tiny.toml"
    path.write_text(tiny_profile_text(requests, rate_rps=rate_rps))
    return path


LOOPBACK_PIN = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Makes every Ray process use 127.0.0.1 on these machines (tests only: never the product's)."""
WORKER_CPUS = 2
"""A worker node holds one trial of a CPU engine (its core and the client's)."""


@dataclass
class LocalRayCluster:
    cluster: Any
    tmp_dir: str
    workers: dict[str, Any] = field(default_factory=dict)
    """Custom resource name -> the node that has it."""

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def env(self) -> dict[str, str]:
        """The environment of a driver started as a subprocess (the CLI)."""
        return {**os.environ, **LOOPBACK_PIN, "RAY_TMPDIR": self.tmp_dir}

    def add_worker(self, name: str, env_vars: dict[str, str] | None = None) -> Any:
        """A worker node with ``name`` as a custom resource; ``env_vars`` are its own (its raylet's
        and so its workers' environment)."""
        node = self.cluster.add_node(num_cpus=WORKER_CPUS, resources={name: 1}, env_vars=env_vars)
        self.cluster.wait_for_nodes()
        self.workers[name] = node
        return node

    def remove_worker(self, name: str) -> None:
        self.cluster.remove_node(self.workers.pop(name))

    def node_id_of(self, name: str) -> str:
        import ray

        for node in ray.nodes():
            if node.get("Alive") and name in (node.get("Resources") or {}):
                return str(node["NodeID"])
        raise LookupError(name)

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


def start_test_cluster(worker_names: tuple[str, ...] = ("node_a", "node_b")) -> LocalRayCluster:
    """A head that holds no trial (no CPUs to give) and a worker node per name, each with that
    name as a custom resource; this process is connected as a driver."""
    os.environ.update(LOOPBACK_PIN)
    tmp_dir = tempfile.mkdtemp(prefix="tb-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    os.environ["RAY_TMPDIR"] = tmp_dir
    import ray
    from ray.cluster_utils import Cluster

    started = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    out = LocalRayCluster(cluster, tmp_dir)
    for name in worker_names:
        out.add_worker(name)
    ray.init(address=cluster.address, namespace="tunebench", log_to_driver=False)
    print(f"test Ray cluster at {cluster.address}: {len(worker_names)} workers in {time.monotonic() - started:.1f} s")
    return out
