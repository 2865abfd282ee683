"""A throwaway X server (Xvfb) for the GUI tests that must run under a real display server, not
only Qt's offscreen platform: ``make xvfb`` (part of ``make test``) installs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

START_TIMEOUT_S = 30.0


@contextmanager
def xvfb(width: int, height: int) -> Iterator[str]:
    """An X server with one ``width`` x ``height`` screen; yields its ``DISPLAY`` (a free number,
    told by the server itself through ``-displayfd``)."""
    binary = shutil.which("Xvfb")
    assert binary is not None, "Xvfb is not installed: run `make xvfb` (Debian's xvfb package)"
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([binary, "-displayfd", str(write_fd), "-screen", "0", f"{width}x{height}x24",
                             "-nolisten", "tcp"], pass_fds=(write_fd,), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as told:
            number = told.readline().strip()  # written once the server accepts clients
        assert number.isdigit(), f"Xvfb did not start: {proc.stderr.read().decode(errors='replace')[-500:] if proc.stderr else ''}"
        yield f":{number}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
