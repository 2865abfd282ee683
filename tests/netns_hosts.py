"""Real hosts on one machine for the tests of faults as production has them: each host is a network
namespace with an address of its own on a bridge, so a partition is a link set down and nothing is
pinned to 127.0.0.1 (../shared/notes/hosts-in-namespaces.md).

The hosts of :func:`start_hosts`:

- ``head``: the Ray head (no CPUs to give) and the driver (the tunebench CLI); the bridge lives here;
- ``w1``, ``w2``: Ray worker nodes (2 CPUs each: one trial of a CPU engine) joined with
  ``ray start --address``;
- ``db``: PostgreSQL (the team's store).

Each host has its own ``RAY_TMPDIR``, state directory (its engine registry) and data directory
(where a recording spills). Every process a host runs stays in its namespace, so ``ip netns pids``
lists them: teardown stops each Ray node by its process group, then kills what is left in each
namespace by pid, then deletes the namespaces (never ``ray stop``, which finds Ray processes by name
across the machine). It runs from the fixture's finaliser, at exit and on SIGTERM/SIGHUP; namespaces
of a test process that was killed with SIGKILL are removed by the next :func:`start_hosts`.
Traffic goes only between namespaces made here: the root namespace has no address on the bridge.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from engine_adapters.launcher import EngineRecord
from engine_adapters.process_group import group_members
from tests.pg_server import PgServer, start_pg_server

T = TypeVar("T")

NETNS_PREFIX = "tbh"
"""Every namespace of the suite is named ``tbh<pid>x<random>-<host>``: the pid of the test process
that made it (so a later run removes those of a killed one), a random part (no clash)."""
ROOT_COMMAND = "sudo -E make test  (network namespaces and veth pairs need root: CAP_SYS_ADMIN and CAP_NET_ADMIN)"
WORKER_CPUS = 2
RAY_START_TIMEOUT_S = 180.0
STOP_GRACE_S = 10.0
RAY_HEAD_PORT = 6379
"""Each host has its own ports: Ray's defaults clash with nothing."""
HEALTH_CHECK_ENV = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "10",
}
"""The head calls a node that answers no health check for about 10-20 s dead (Ray's default is about
a minute): a partition of a worker is noticed soon, and one of the store's host for 5 s is not one."""
_CLONE_NEWNET = 0x40000000
_RAY_ENV_DROPPED = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS", "RAY_TMPDIR", "TUNEBENCH_DB")


def _run(argv: list[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip()}")
    return done


def namespaces_can_be_made() -> str | None:
    """None when this process can make network namespaces; else why not and what would allow it."""
    if os.geteuid() != 0:
        return f"the hosts' tests need root to make network namespaces; run {ROOT_COMMAND}"
    if shutil.which("ip") is None:
        return "the hosts' tests need the `ip` command (iproute2): apt-get install iproute2"
    return None


def in_netns(netns: str, call: Callable[[], T]) -> T:
    """``call()`` in a thread that joined network namespace ``netns``: the sockets it makes live
    there (and keep working from any thread afterwards)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {netns}")
            finally:
                os.close(fd)
            box["value"] = call()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"in-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


@dataclass
class Host:
    """One host: a network namespace with one address, and directories of its own."""

    name: str
    netns: str
    address: str
    device: str
    """Its link to the bridge, inside its namespace: down is a partition."""
    root: Path
    ray_token: str
    """The cluster's token: ``ray start --head`` turns Ray's token authentication on by default, and
    every node and driver must present it (given here, never ~/.ray/auth_token, the user's own)."""

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def ray_tmp(self) -> Path:
        return self.root / "ray"

    def exec_argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process on this host: its own directories, this checkout first on
        the path, nothing of another Ray cluster (no loopback pin)."""
        env = {k: v for k, v in os.environ.items() if k not in _RAY_ENV_DROPPED}
        repo = str(Path(__file__).resolve().parent.parent)
        env.update(TUNEBENCH_STATE_DIR=str(self.state_dir), TUNEBENCH_DATA_DIR=str(self.data_dir),
                   RAY_TMPDIR=str(self.ray_tmp), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.ray_token,
                   PYTHONPATH=os.pathsep.join([repo, env.get("PYTHONPATH", "")]))
        env.update(extra)
        return env

    def partition(self) -> None:
        _run(self.exec_argv(["ip", "link", "set", self.device, "down"]))

    def heal(self) -> None:
        _run(self.exec_argv(["ip", "link", "set", self.device, "up"]))

    def pids(self) -> list[int]:
        """Every process in this host's namespace."""
        done = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True, timeout=30,
                              check=False)
        return [int(p) for p in done.stdout.split() if p.strip().isdigit()]

    def registered_engines(self) -> list[EngineRecord]:
        """This host's engine registry (its state directory's, as the launcher writes it)."""
        records = []
        for path in (self.state_dir / "engines").glob("*.json"):
            with contextlib.suppress(ValueError, TypeError, OSError):
                records.append(EngineRecord(**json.loads(path.read_text())))
        return records

    def running_engines(self) -> list[EngineRecord]:
        """The registered engines whose processes still run."""
        return [r for r in self.registered_engines() if group_members(r.pgid, not_before=r.create_time)]


@dataclass
class RayNode:
    """A Ray node that ``ray start --block`` runs in the foreground in a process group of its own."""

    host: Host
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        _stop_groups([self.process])


def _stop_groups(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to the process groups they lead, then SIGKILL to what is left of them."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(group_members(p.pid) for p in processes) and time.monotonic() < deadline:
            for process in processes:
                process.poll()
            time.sleep(0.1)
        if not any(group_members(p.pid) for p in processes):
            break
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_GRACE_S)


@dataclass(eq=False)
class Hosts:
    """The hosts of a session, its Ray cluster and its PostgreSQL server."""

    tag: str
    subnet: str
    hosts: dict[str, Host]
    root: Path
    nodes: dict[str, RayNode] = field(default_factory=dict)
    pg: PgServer | None = None
    _closed: bool = False

    @property
    def address(self) -> str:
        """The Ray cluster's address, as a node and the driver reach it."""
        return f"{self.hosts['head'].address}:{RAY_HEAD_PORT}"

    @property
    def workers(self) -> list[Host]:
        return [self.hosts[name] for name in ("w1", "w2")]

    def start_ray_node(self, name: str, *, extra_env: dict[str, str] | None = None) -> RayNode:
        """The head on ``head``, a worker (``WORKER_CPUS`` CPUs, a custom resource named after the
        host) elsewhere; returns once ``ray start`` says the node runs."""
        host = self.hosts[name]
        host.ray_tmp.mkdir(parents=True, exist_ok=True)
        common = ["--node-ip-address", host.address, "--block", "--disable-usage-stats"]
        if name == "head":
            argv = ["ray", "start", "--head", "--port", str(RAY_HEAD_PORT), "--num-cpus", "0",
                    "--include-dashboard", "false", *common]
        else:
            argv = ["ray", "start", "--address", self.address, "--num-cpus", str(WORKER_CPUS),
                    "--resources", json.dumps({name: 1}), *common]
        ray = str(Path(sys.executable).with_name("ray"))
        log = self.root / f"ray-{name}-{len(list(self.root.glob(f'ray-{name}-*')))}.log"
        env = host.env(**HEALTH_CHECK_ENV, **(extra_env or {}))
        with open(log, "wb") as out:
            process = subprocess.Popen(host.exec_argv([ray, *argv[1:]]), stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env, cwd=str(host.root),
                                       start_new_session=True)
        node = RayNode(host, process, log)
        self.nodes[name] = node
        deadline = time.monotonic() + RAY_START_TIMEOUT_S
        while b"Ray runtime started" not in log.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                node.stop()
                raise RuntimeError(f"the Ray node on {name} ({host.address}) did not start; its log "
                                   f"{log}:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        return node

    def stop_ray_node(self, name: str) -> None:
        node = self.nodes.pop(name, None)
        if node is not None:
            node.stop()

    def cli_argv(self, args: list[str], host: str = "head") -> list[str]:
        return self.hosts[host].exec_argv([sys.executable, "-m", "app.cli", *args])

    def cli(self, args: list[str], *, host: str = "head", timeout_s: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """The tunebench CLI run on ``host``."""
        return subprocess.run(self.cli_argv(args, host), capture_output=True, text=True, timeout=timeout_s,
                              env={**self.hosts[host].env(), **(env or {})}, cwd=str(self.root), check=False)

    def nodes_by_address(self) -> dict[str, str]:
        """Ray node id -> the address of its host, for the live nodes (a driver on the head asks)."""
        code = (f"import json, ray; ray.init(address={self.address!r}, log_to_driver=False); "
                "print(json.dumps({n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']}))")
        done = subprocess.run(self.hosts["head"].exec_argv([sys.executable, "-c", code]), capture_output=True,
                              text=True, timeout=120, env=self.hosts["head"].env(), check=False)
        if done.returncode != 0:
            raise RuntimeError(f"cannot list the Ray nodes: {done.stderr[-2000:]}")
        nodes: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
        return nodes

    def host_at(self, address: str) -> Host:
        return next(h for h in self.hosts.values() if h.address == address)

    def leftover_processes(self) -> dict[str, list[int]]:
        return {name: pids for name, host in self.hosts.items() if (pids := host.pids())}

    def close(self) -> None:
        """Stop everything the hosts run, then delete the namespaces (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            nodes, self.nodes = list(self.nodes.values()), {}
            with contextlib.suppress(Exception):
                _stop_groups([n.process for n in nodes])
            if self.pg is not None:
                with contextlib.suppress(Exception):
                    self.pg.close()
        finally:
            _remove_namespaces([h.netns for h in self.hosts.values()])
            shutil.rmtree(self.root, ignore_errors=True)
            _OPEN.discard(self)


_OPEN: set[Hosts] = set()
_HANDLERS_INSTALLED = False


def _kill_namespace_processes(netns: str) -> None:
    for _ in range(3):
        done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30,
                              check=False)
        pids = [int(p) for p in done.stdout.split() if p.strip().isdigit()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


def _remove_namespaces(names: list[str]) -> None:
    for netns in names:
        _kill_namespace_processes(netns)
    for netns in names:  # a namespace takes its links with it (each veth has one end in ours)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30, check=False)


def suite_namespaces(pid: int | None = None) -> list[str]:
    """The namespaces named by the suite's rule (those of test process ``pid``, when given)."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False)
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    prefix = f"{NETNS_PREFIX}{pid}x" if pid is not None else NETNS_PREFIX
    return [n for n in names if n.startswith(prefix) and n[len(NETNS_PREFIX):].split("x", 1)[0].isdigit()]


def _remove_orphaned_namespaces() -> None:
    """The namespaces of test processes that are gone (killed before their teardown ran)."""
    for netns in suite_namespaces():
        owner = int(netns[len(NETNS_PREFIX):].split("x", 1)[0])
        try:
            os.kill(owner, 0)
            continue
        except ProcessLookupError:
            _remove_namespaces([netns])
        except PermissionError:
            continue


def close_all() -> None:
    for hosts in list(_OPEN):
        hosts.close()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    atexit.register(close_all)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, _on_signal)
    _HANDLERS_INSTALLED = True


HOST_NUMBERS = {"head": 1, "w1": 11, "w2": 12, "db": 21}


def make_hosts() -> Hosts:
    """The namespaces, the bridge (in ``head``) and a veth from it to each other host, with a
    /24 of 10.231.0.0/16 picked at random. Nothing runs yet."""
    problem = namespaces_can_be_made()
    if problem:
        raise RuntimeError(problem)
    _remove_orphaned_namespaces()
    _install_handlers()
    tag = f"{NETNS_PREFIX}{os.getpid()}x{secrets.token_hex(2)}"
    subnet = f"10.231.{secrets.randbelow(254) + 1}"
    root = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    token = secrets.token_hex(32)
    hosts = {name: Host(name, f"{tag}-{name}", f"{subnet}.{number}", "br0" if name == "head" else "eth0",
                        root / name, token) for name, number in HOST_NUMBERS.items()}
    out = Hosts(tag, subnet, hosts, root)
    _OPEN.add(out)
    try:
        for host in hosts.values():
            _run(["ip", "netns", "add", host.netns])
            for folder in (host.state_dir, host.data_dir, host.ray_tmp):
                folder.mkdir(parents=True, exist_ok=True)
            _run(host.exec_argv(["ip", "link", "set", "lo", "up"]))
        head = hosts["head"]
        _run(head.exec_argv(["ip", "link", "add", "br0", "type", "bridge"]))
        _run(head.exec_argv(["ip", "addr", "add", f"{head.address}/24", "dev", "br0"]))
        _run(head.exec_argv(["ip", "link", "set", "br0", "up"]))
        for host in hosts.values():
            if host is head:
                continue
            port = f"to-{host.name}"
            _run(head.exec_argv(["ip", "link", "add", port, "type", "veth", "peer", "name", host.device,
                                 "netns", host.netns]))
            _run(head.exec_argv(["ip", "link", "set", port, "master", "br0"]))
            _run(head.exec_argv(["ip", "link", "set", port, "up"]))
            _run(host.exec_argv(["ip", "addr", "add", f"{host.address}/24", "dev", host.device]))
            _run(host.exec_argv(["ip", "link", "set", host.device, "up"]))
    except BaseException:
        out.close()
        raise
    return out


def start_hosts(pg_base_dir: Path) -> Hosts:
    """The hosts, a Ray head and two workers on them, and PostgreSQL on ``db``."""
    hosts = make_hosts()
    try:
        started = time.monotonic()
        db = hosts.hosts["db"]
        hosts.pg = start_pg_server(pg_base_dir, host=db.address, netns=db.netns)
        hosts.start_ray_node("head")
        for host in hosts.workers:
            hosts.start_ray_node(host.name)
        print(f"hosts {hosts.tag} on {hosts.subnet}.0/24: Ray at {hosts.address}, PostgreSQL at "
              f"{db.address}:{hosts.pg.port}, in {time.monotonic() - started:.1f} s")
    except BaseException:
        hosts.close()
        raise
    return hosts
