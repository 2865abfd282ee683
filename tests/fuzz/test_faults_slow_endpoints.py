"""Endpoints that never finish answering: one that accepts and stays silent, one that streams an
endless reply. ``tunebench run --endpoint`` against either ends within the profile's request
timeout plus 5 s, failed in words, and the probe's memory stays flat; SIGTERM and Ctrl-C end it,
and a cancel ends the probe, long before the silent endpoint's time-out (the strict figures, 2 s
from the signal and 1 s from the cancel, are benchmarks/responsiveness.py's: a loaded 2-core
machine decides them)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.errors import UserError
from app.load.cache import probe_salt
from app.load.client import ClientOptions
from app.store import RunStore
from tests.fuzz.test_faults_endpoint import PROFILE as FAULT_PROFILE

REPO = Path(__file__).resolve().parents[2]
PROFILE = FAULT_PROFILE.replace("request_timeout_s = 10", "request_timeout_s = {timeout_s}")
assert "{timeout_s}" in PROFILE
ENDLESS_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
PROBE_PEAK_MAX_BYTES = 8 << 20
ENDS_WITHIN_S = 10.0
"""How soon a signalled run or a cancelled probe must end here: only one that waits for its time-out
(120 s for the run, 60 s for the probe) misses it."""
"""The old probe read an endless reply into memory at about 6.5 MB/s, for as long as it came."""


class Server:
    """A loopback server whose every connection is ``silent`` (read the request, never answer) or
    ``endless`` (a 200 head, then body bytes until the client goes)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.first_request = threading.Event()
        self.first_request_at_s = 0.0
        self.paths: list[str] = []
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.5)
            try:
                head = conn.recv(65536)
            except OSError:
                return
            self.paths.append(head.split(b" ", 2)[1].decode() if head.count(b" ") >= 2 else "?")
            if not self.first_request.is_set():
                self.first_request_at_s = time.monotonic()
                self.first_request.set()
            try:
                if self.mode == "endless":
                    conn.sendall(ENDLESS_HEAD)
                    block = b"[" + b"0," * 32_000
                    while not self._stop.is_set():
                        conn.sendall(block)
                        time.sleep(0.005)
                else:
                    self._stop.wait()
            except OSError:
                return

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    @contextlib.contextmanager
    def running(self) -> Iterator[Server]:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(5)
            self._sock.close()


def _start_run(url: str, tmp_path: Path, timeout_s: float) -> tuple[subprocess.Popen[str], Path]:
    profile, db = tmp_path / "p.toml", tmp_path / "runs.db"
    profile.write_text(PROFILE.format(timeout_s=timeout_s))
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "run", str(profile), "--endpoint", url, "--db", str(db),
                             "--no-telemetry"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, db


def _stored(db: Path) -> tuple[str, str]:
    with RunStore(db) as store:
        runs = store.list_runs()
    assert len(runs) == 1, runs
    return runs[0].status, runs[0].reason or ""


@pytest.mark.parametrize("mode", ["silent", "endless"])
def test_a_run_against_an_endpoint_that_never_finishes_ends_within_its_timeout(mode: str, tmp_path: Path) -> None:
    timeout_s = 5.0
    with Server(mode).running() as server:
        proc, db = _start_run(server.url, tmp_path, timeout_s)
        try:
            assert server.first_request.wait(60), proc.communicate(timeout=10)
            # its timeout, then slack for storing the run and a CLI's exit on a loaded machine; a hang is
            # for ever, so the slack only has to be finite
            while proc.poll() is None and time.monotonic() - server.first_request_at_s < timeout_s + 15.0:
                time.sleep(0.1)
            elapsed_s = time.monotonic() - server.first_request_at_s
            print(f"{mode}: the run ended {elapsed_s:.2f} s after its first request")
            assert proc.poll() is not None, f"still running {elapsed_s:.1f} s after its first request"
        finally:
            if proc.poll() is None:
                proc.kill()
            out, err = proc.communicate(timeout=30)
    assert "Traceback" not in out + err, err
    assert proc.returncode != 0
    status, reason = _stored(db)
    assert status == "failed", (status, reason)
    expected = "did not answer a one-token request within 5 s" if mode == "silent" else "over 1 MiB"
    assert expected in reason and expected in out + err, (reason, out, err)


def signal_a_run_on_a_silent_endpoint(sig: signal.Signals, tmp_path: Path) -> tuple[float, str, Path]:
    """A CLI run waiting on a silent endpoint gets ``sig``: seconds until it ended, its output and
    its store."""
    with Server("silent").running() as server:
        proc, db = _start_run(server.url, tmp_path, timeout_s=120)
        try:
            assert server.first_request.wait(60), proc.communicate(timeout=10)
            deadline_s = time.monotonic() + 20
            while "/v1/completions" not in server.paths and time.monotonic() < deadline_s:
                time.sleep(0.05)  # /version answers nothing: the salt probe comes once its share is spent
            time.sleep(0.3)
            proc.send_signal(sig)
            signalled_at_s = time.monotonic()
            out, err = proc.communicate(timeout=20)
            elapsed_s = time.monotonic() - signalled_at_s
        finally:
            if proc.poll() is None:
                proc.kill()
    return elapsed_s, out + err, db


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_end_a_run_waiting_on_a_silent_endpoint(sig: signal.Signals, tmp_path: Path) -> None:
    elapsed_s, output, db = signal_a_run_on_a_silent_endpoint(sig, tmp_path)
    assert "Traceback" not in output, output
    print(f"{sig.name}: the run ended {elapsed_s:.2f} s after the signal")
    assert elapsed_s < ENDS_WITHIN_S, f"{sig.name} took {elapsed_s:.1f} s to end the run"
    assert _stored(db)[0] == "cancelled"


@pytest.mark.parametrize("mode", ["silent", "endless"])
def test_the_salt_probe_keeps_its_deadline_and_its_memory(mode: str) -> None:
    with Server(mode).running() as server:
        opts = ClientOptions(base_url=server.url, model="fake", request_timeout_s=3.0)
        tracemalloc.start()
        started_s = time.monotonic()
        try:
            with pytest.raises(UserError, match="did not answer" if mode == "silent" else "over 1 MiB"):
                probe_salt(opts, deadline_s=3.0)
            elapsed_s = time.monotonic() - started_s
            peak_bytes = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert elapsed_s < 3.0 + 5.0, elapsed_s  # its deadline, and slack for a loaded machine (tracemalloc on)
    assert peak_bytes < PROBE_PEAK_MAX_BYTES, peak_bytes


def cancel_a_salt_probe(cancel_after_s: float = 0.5) -> tuple[object, float]:
    """The salt probe of a silent endpoint (a 60 s deadline), cancelled ``cancel_after_s`` in:
    what it returned and the seconds from the cancel to its return."""
    cancel = threading.Event()
    cancelled_at_s: list[float] = []

    def fire() -> None:
        cancelled_at_s.append(time.monotonic())
        cancel.set()

    with Server("silent").running() as server:
        threading.Timer(cancel_after_s, fire).start()
        found = probe_salt(ClientOptions(base_url=server.url, model="fake"), deadline_s=60.0, cancel=cancel)
        returned_at_s = time.monotonic()
    assert cancelled_at_s, "the probe returned before the cancel"
    return found, returned_at_s - cancelled_at_s[0]


def test_the_salt_probe_stops_when_the_run_is_cancelled() -> None:
    found, after_cancel_s = cancel_a_salt_probe()
    assert found is None
    assert after_cancel_s < ENDS_WITHIN_S
