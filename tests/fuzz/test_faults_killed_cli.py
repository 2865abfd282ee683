"""``kill -9`` of ``tunebench run`` mid-load: nothing of the run may outlive it. Its load-client
worker (a spawned process holding the CLI's stdout and stderr) must notice that its parent is gone
and exit, so that whoever reads the CLI's output (a pipe, ``tee``, a script) gets end-of-file
instead of waiting on an orphan that keeps sending load.

The CLI is stopped (SIGSTOP) for a while before the kill, as a busy CLI on a loaded machine falls
behind reading its client's results: the worker's results pipe fills, and an orphan that winds down
in order blocks for ever flushing into it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from tests.fakes.openai_server import FakeBehaviour, FakeOpenAIServer
from tests.fuzz.test_faults_endpoint import PROFILE as FAULT_PROFILE

REPO = Path(__file__).resolve().parents[2]
PROFILE = FAULT_PROFILE.replace("num_requests = 4", "num_requests = 50000")
assert "num_requests = 50000" in PROFILE
ORPHAN_GRACE_S = 10.0
"""How long the run's processes may outlive the CLI (a generous bound: the rule is 'within seconds')."""
STARTED_REQUESTS = 20
"""Completions the server must have seen before the CLI is stopped: the load is flowing."""
UNREAD_REQUESTS = 2000
"""Completions while the CLI is stopped: their records (over 100 bytes each) are well over the
64 KiB a pipe holds."""


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigkill_of_the_cli_mid_load_leaves_no_process_and_closes_its_output(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text(PROFILE)
    behaviour = FakeBehaviour(mode="ok")
    with FakeOpenAIServer(behaviour) as server:
        cli = subprocess.Popen([sys.executable, "-m", "app.cli", "run", str(profile), "--endpoint", server.base_url,
                                "--db", str(tmp_path / "runs.db"), "--no-telemetry"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
        assert cli.stdout is not None
        output = cli.stdout
        eof = threading.Event()
        read: list[bytes] = []

        def reader() -> None:
            while chunk := output.read1(65536):
                read.append(chunk)
            eof.set()

        threading.Thread(target=reader, daemon=True).start()
        descendants: list[psutil.Process] = []
        try:
            deadline_s = time.monotonic() + 120
            while server.requests < STARTED_REQUESTS and cli.poll() is None and time.monotonic() < deadline_s:
                time.sleep(0.1)
            assert server.requests >= STARTED_REQUESTS and cli.poll() is None, (server.requests, b"".join(read))
            descendants = psutil.Process(cli.pid).children(recursive=True)
            assert descendants, "the run's load client should run in a process of its own"
            cli.send_signal(signal.SIGSTOP)
            stopped_at = server.requests
            while server.requests < stopped_at + UNREAD_REQUESTS and time.monotonic() < deadline_s:
                time.sleep(0.1)
            assert server.requests >= stopped_at + UNREAD_REQUESTS, "the client stopped sending with the CLI"
            cli.send_signal(signal.SIGKILL)
            cli.wait(10)
            killed_at_s = time.monotonic()
            got_eof = eof.wait(ORPHAN_GRACE_S)
            while not all(_gone(p) for p in descendants) and time.monotonic() - killed_at_s < ORPHAN_GRACE_S:
                time.sleep(0.1)
            left = [(p.pid, p.name()) for p in descendants if not _gone(p)]
            assert not left, f"still running {ORPHAN_GRACE_S:.0f} s after the CLI was killed: {left}"
            assert got_eof, "a reader of the CLI's output got no end-of-file"
        finally:
            for proc in descendants:  # a failing run leaves nothing behind either
                if not _gone(proc):
                    proc.kill()
            if cli.poll() is None:
                cli.kill()
