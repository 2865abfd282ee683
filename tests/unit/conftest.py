"""Unit tests never see the engines that end-to-end tests share in the same session: each gets
a private registry of running engines."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_engine_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBENCH_STATE_DIR", str(tmp_path / "state"))
