"""Following a CLI or an exported script from an e2e test: its output line by line, its health."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request

from engine_adapters.launcher import group_members


def read_until(proc: subprocess.Popen[str], pattern: str, timeout_s: float,
               seen: list[str] | None = None) -> tuple[re.Match[str], list[str]]:
    """Read the process's stdout until a line matches (the CLI flushes each line); the lines read
    are appended to ``seen`` (a new list unless given), for the failure message."""
    deadline = time.monotonic() + timeout_s
    seen = [] if seen is None else seen
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the command exited ({proc.poll()}) before {pattern!r}:\n" + "".join(seen[-30:]))
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match, seen
    raise AssertionError(f"no {pattern!r} within {timeout_s} s:\n" + "".join(seen[-30:]))


def wait_health(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Wait for the engine an exported script started to answer /health."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the exported script exited before the engine was ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"no /health after {timeout_s} s")


def sigkill_and_check_engine_stops(proc: subprocess.Popen[str], engine_pid: int, what: str) -> None:
    """SIGKILL the CLI and wait (up to 60 s) for its engine's watchdog to end the engine's group."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    killed = time.monotonic()
    while group_members(engine_pid) and time.monotonic() - killed < 60:
        time.sleep(0.2)
    assert group_members(engine_pid) == [], f"the engine outlived the killed {what}"
