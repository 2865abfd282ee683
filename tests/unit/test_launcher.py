"""The launcher's process handling, on real (small) process trees: group stop escalation,
startup failure diagnosed at once, port in use, and orphans left by a killed owner.

The "engine" here is a short Python script standing in for the server binary; the vLLM engine
itself is exercised by tests/e2e/test_engine_e2e.py."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engine_adapters.base import Phase
from engine_adapters.config import EngineConfig, Features
from engine_adapters.launcher import (
    QUIET_AT_EXIT,
    EngineProcess,
    EngineStartError,
    group_members,
    reap_orphans,
    registered_engines,
    send_probes,
    stop_group,
)
from engine_adapters.process_group import process_identity, process_start_s, same_process_alive
from engine_adapters.vllm import VllmAdapter

FAKE_SERVER = textwrap.dedent('''
    import http.server, os, signal, subprocess, sys, threading, time
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode in ("stubborn", "deaf"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if mode == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # a child in the same group, like vLLM's engine core, holding the output pipe; it ignores
    # SIGINT from birth (inherited across exec): set in its own interpreter, a quick stop could
    # still end it with SIGINT before it got that far
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"])
    if mode not in ("stubborn", "deaf"):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    print("Starting to load model /fake", flush=True)
    print("warning filters:", os.environ.get("PYTHONWARNINGS"), flush=True)
    if mode == "fail":
        print("Traceback (most recent call last):", flush=True)
        print("NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.", flush=True)
        os._exit(1)
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    server = http.server.HTTPServer(("127.0.0.1", port), Health)
    print("Application startup complete.", flush=True)
    server.serve_forever()
''')


class ScriptAdapter(VllmAdapter):
    """vLLM's knowledge (phases, diagnosis) with a stand-in server binary."""

    def __init__(self, script: Path, mode: str) -> None:
        self.script, self.mode = script, mode

    def build_argv(self, engine: EngineConfig, features: Features, port: int) -> list[str]:
        return [sys.executable, str(self.script), self.mode, str(port)]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "fake_server.py"
    path.write_text(FAKE_SERVER)
    return path


def launch(script: Path, mode: str, **kwargs: object) -> EngineProcess:
    phases: list[Phase] = []
    engine = EngineProcess(EngineConfig(**kwargs), Features(), ScriptAdapter(script, mode),  # type: ignore[arg-type]
                           on_phase=lambda p, _d: phases.append(p))
    engine.phases_seen = phases  # type: ignore[attr-defined]
    engine.start()
    return engine


def test_ready_then_clean_stop_leaves_no_process(script: Path) -> None:
    engine = launch(script, "polite")
    ready = engine.wait_ready(timeout_s=30)
    assert ready.base_url == f"http://127.0.0.1:{engine.port}"
    assert engine.api_key and len(engine.api_key) >= 24
    assert [r.pid for r in registered_engines()] == [engine.pid]
    pgid = engine.pid
    assert os.getpgid(pgid) == pgid != os.getpgid(0)  # its own process group
    assert len(group_members(pgid)) == 2
    how = engine.stop(grace_s=(1.0, 3.0, 3.0))
    assert how == "SIGTERM"  # the child ignores SIGINT: TERM ends it
    assert group_members(pgid) == []
    assert registered_engines() == []
    assert engine.phases_seen[:3] == [Phase.LAUNCHING, Phase.LOADING_WEIGHTS, Phase.READY]  # type: ignore[attr-defined]
    assert engine.phase == Phase.STOPPED
    # the engine's own processes, not tunebench's, ignore the multiprocessing tracker's warning at stop
    assert f"warning filters: {QUIET_AT_EXIT}" in engine.log_lines or any(
        line.startswith("warning filters: ") and line.endswith(QUIET_AT_EXIT) for line in engine.log_lines)
    assert QUIET_AT_EXIT not in os.environ.get("PYTHONWARNINGS", "")


def test_stop_escalates_to_sigkill_for_a_deaf_group(script: Path) -> None:
    engine = launch(script, "deaf")
    engine.wait_ready(timeout_s=30)
    pgid = engine.pid
    how = engine.stop(grace_s=(0.5, 0.5, 3.0))
    assert how == "SIGKILL"
    assert group_members(pgid) == []


def test_startup_failure_is_diagnosed_at_once(script: Path) -> None:
    engine = launch(script, "fail")
    with pytest.raises(EngineStartError) as info:
        engine.wait_ready(timeout_s=300)
    raised = time.monotonic()
    # Measured from the leader's exit, not from launch: how long interpreters take to start on a
    # loaded machine is not the launcher's doing; a wait_ready that sleeps on would take ~300 s.
    assert engine.exited_monotonic is not None
    elapsed = raised - engine.exited_monotonic
    assert elapsed < 10, f"diagnosis took {elapsed:.1f} s after the exit: it waited instead of noticing it"
    assert info.value.diagnosis is not None and info.value.diagnosis.code == "fp8_kv_cpu"
    assert "AVX-512 or AMX" in str(info.value)
    assert group_members(engine.pid) == []  # the lingering child was ended too
    assert engine.phase == Phase.FAILED
    assert registered_engines() == []


def test_busy_port_is_refused_before_launch(script: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        engine = EngineProcess(EngineConfig(port=port), Features(), ScriptAdapter(script, "polite"))
        with pytest.raises(EngineStartError, match=f"port {port} on 127.0.0.1 is already in use"):
            engine.start()
        assert engine.proc is None


OWNER = textwrap.dedent('''
    import json, sys, time
    sys.path.insert(0, sys.argv[3])
    from tests.unit.test_launcher import ScriptAdapter
    from engine_adapters.config import EngineConfig, Features
    from engine_adapters.launcher import EngineProcess
    from pathlib import Path
    engine = EngineProcess(EngineConfig(), Features(), ScriptAdapter(Path(sys.argv[1]), "stubborn"))
    engine.watchdog_grace_s = (0.5, 3.0, 3.0)
    engine.start()
    engine.wait_ready(timeout_s=30)
    print(json.dumps({"pid": engine.pid, "watchdog_pid": engine._watchdog.pid}), flush=True)
    time.sleep(600)
''')


@contextlib.contextmanager
def owned_engine(script: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """A separate 'tunebench' process that starts an engine and then idles: (owner, engine pid,
    watchdog pid)."""
    owner_script = tmp_path / "owner.py"
    owner_script.write_text(OWNER)
    root = Path(__file__).resolve().parents[2]
    owner = subprocess.Popen([sys.executable, str(owner_script), str(script), "x", str(root)],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    engine_pid = watchdog_pid = 0
    try:
        line = owner.stdout.readline() if owner.stdout else ""
        started = json.loads(line)
        engine_pid, watchdog_pid = started["pid"], started["watchdog_pid"]
        yield owner, engine_pid, watchdog_pid
    finally:
        for pid in (owner.pid, watchdog_pid, engine_pid):
            if pid:
                stop_group(pid, grace_s=(0.1, 0.1, 1.0))
        owner.wait(timeout=10)


def _gone_within(pgid: int, timeout_s: float) -> float | None:
    """Seconds until the group had no live member, or None if it outlived the time-out."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not group_members(pgid):
            return time.monotonic() - started
        time.sleep(0.1)
    return None


def test_engine_is_stopped_by_its_watchdog_when_the_owner_is_killed(script: Path, tmp_path: Path) -> None:
    with owned_engine(script, tmp_path) as (owner, engine_pid, watchdog_pid):
        assert group_members(engine_pid), "the engine should be running"
        assert psutil.Process(watchdog_pid).is_running()
        assert os.getsid(watchdog_pid) == watchdog_pid != os.getsid(owner.pid)  # out of reach of a terminal's Ctrl-C
        time.sleep(1.0)
        assert group_members(engine_pid), "the watchdog must leave a live owner's engine alone"
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        # the group ignores SIGINT (the test's grace: 0.5 s), then ends on SIGTERM
        took_s = _gone_within(engine_pid, timeout_s=15)
        assert took_s is not None, "the engine outlived its killed owner"
        assert _gone_within(watchdog_pid, timeout_s=5) is not None, "the watchdog should exit after its work"
        assert registered_engines() == []


def test_orphan_of_a_killed_owner_and_watchdog_is_found_and_stopped(script: Path, tmp_path: Path) -> None:
    with owned_engine(script, tmp_path) as (owner, engine_pid, watchdog_pid):
        reap_orphans()  # owner alive: not an orphan, left alone
        assert group_members(engine_pid)
        os.kill(watchdog_pid, signal.SIGKILL)  # both die at once (say, the whole session is killed)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        time.sleep(1.0)
        assert group_members(engine_pid), "with its watchdog gone too, the engine survives its owner: an orphan"
        stopped = reap_orphans(grace_s=(0.5, 3.0, 3.0))
        assert [r.pid for r in stopped] == [engine_pid]
        assert group_members(engine_pid) == []
        assert registered_engines() == []


def test_clean_stop_releases_the_watchdog(script: Path) -> None:
    engine = launch(script, "polite")
    engine.wait_ready(timeout_s=30)
    watchdog = engine._watchdog
    assert watchdog is not None
    engine.stop(grace_s=(1.0, 3.0, 3.0))
    assert watchdog.proc.returncode == 0  # reaped, not left a zombie
    assert engine._watchdog is None


def test_watchdog_released_when_the_engine_dies_on_its_own(script: Path) -> None:
    engine = launch(script, "fail")
    watchdog = engine._watchdog
    assert watchdog is not None
    with pytest.raises(EngineStartError):
        engine.wait_ready(timeout_s=60)
    engine.wait_exited()
    assert watchdog.proc.returncode == 0


def test_a_live_owner_stays_itself_when_the_kernels_boot_time_moves(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel reports its boot time in whole seconds, from the wall clock: a clock slewed or
    stepped across a second moves it by one. Start times taken then must not call a live owner
    dead and stop its engines as orphans (a test session lost every shared engine that way)."""
    import psutil._pslinux as linux

    engine = launch(script, "polite")
    try:
        engine.wait_ready(timeout_s=30)
        record = engine._record
        assert record is not None
        real_boot_time, real_create_time = linux.boot_time(), psutil.Process(os.getpid()).create_time()
        for moved_s in (1.0, -1.0, 30.0):
            monkeypatch.setattr(linux, "boot_time", lambda moved_s=moved_s: real_boot_time + moved_s)
            assert abs(psutil.Process(os.getpid()).create_time() - (real_create_time + moved_s)) < 0.01, \
                "the patch must move psutil's view of the clock"
            assert same_process_alive(record.owner_pid, record.owner_create_time)
            assert reap_orphans(grace_s=(0.5, 1.0, 1.0)) == [], f"boot time moved by {moved_s} s"
            assert [p.pid for p in group_members(record.pgid, not_before=record.create_time)][:1], \
                "the engine's group must still be found as ours"
        assert engine.proc is not None and engine.proc.poll() is None
    finally:
        engine.stop(grace_s=(1.0, 3.0, 3.0))


def test_a_process_is_told_from_one_that_reused_its_pid() -> None:
    me, started_s = process_identity()
    assert same_process_alive(me, started_s)
    assert same_process_alive(me, None)  # no start recorded: the pid alone
    assert not same_process_alive(me, started_s - 5.0)
    assert not same_process_alive(me, started_s + 5.0)
    assert not same_process_alive(None, started_s)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert not same_process_alive(child.pid, started_s)  # gone (or another process now)
    # a start written by an older tunebench, in seconds since the epoch, still identifies us
    epoch_start_s = psutil.Process(me).create_time()
    assert same_process_alive(me, epoch_start_s)
    assert not same_process_alive(me, epoch_start_s - 100.0)


def test_a_start_time_is_read_past_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    odd_name = tmp_path / "x) (y z"
    odd_name.symlink_to(sys.executable)
    proc = subprocess.Popen([str(odd_name), "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).name() != "x) (y z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert psutil.Process(proc.pid).name() == "x) (y z"
        started_s = process_start_s(proc.pid)
        assert started_s is not None
        since_boot_s = psutil.Process(proc.pid).create_time() - psutil.boot_time()
        assert abs(started_s - since_boot_s) < 1.5
        assert same_process_alive(proc.pid, started_s)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_an_engine_started_from_a_thread_that_blocks_sigint_still_hears_it(script: Path) -> None:
    """A Ray actor's task thread blocks SIGINT, and a child inherits its parent thread's mask: an
    engine started there would not hear the SIGINT it is stopped with (the watchdog's first)."""
    import threading

    box: dict[str, EngineProcess] = {}

    def start() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        box["engine"] = launch(script, "polite")

    starter = threading.Thread(target=start)
    starter.start()
    starter.join()
    engine = box["engine"]
    try:
        engine.wait_ready(timeout_s=30)
        status = Path(f"/proc/{engine.pid}/status").read_text().splitlines()
        blocked = int(next(line for line in status if line.startswith("SigBlk:")).split()[1], 16)
        assert not blocked & (1 << (signal.SIGINT - 1)), f"SIGINT blocked in the engine (SigBlk {blocked:#x})"
    finally:
        engine.stop(grace_s=(1.0, 3.0, 3.0))


def test_ports_are_picked_below_the_ephemeral_range_where_outgoing_connections_take_theirs() -> None:
    """A picked port is bound by the engine up to minutes later: in the ephemeral range any
    outgoing connection may take it meanwhile (a P/D engine's NIXL side channel once did)."""
    from engine_adapters.launcher import LISTEN_PORTS, free_port, port_is_free

    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low, high = LISTEN_PORTS[0], min(LISTEN_PORTS[1], ephemeral_low - 1)
    assert high - low > 1_000, "this machine's ephemeral range leaves no room below it"
    ports = [free_port() for _ in range(20)]
    assert all(low <= port <= high for port in ports) and all(port_is_free("127.0.0.1", p) for p in ports)


def test_a_probe_waits_as_long_as_its_caller_bounds_it_and_says_when_it_timed_out() -> None:
    """A P/D group's probes go through its router (prefill, KV transfer, decode) and get the
    warm-up's bound, not one engine's: the bound given is the one kept."""
    class SlowCompletions(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(1.0)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowCompletions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        body = [{"prompt": "x", "max_tokens": 1}]
        assert send_probes(url, {}, body, "m", timeout_s=0.2) == "TimeoutError: timed out"
        assert send_probes(url, {}, body, "m", timeout_s=30.0) is None
    finally:
        server.shutdown()
        server.server_close()
