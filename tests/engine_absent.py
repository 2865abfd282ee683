"""Launching an engine this machine does not have: what the adapters' tests check that it says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.config import RunConfig
from app.engines import launch_engine
from app.errors import EngineFailed, UserError
from engine_adapters.base import EngineAdapter
from engine_adapters.config import EngineConfig, EngineKind, Features, RuntimeConfig
from engine_adapters.launcher import EngineProcess, EngineStartError


def launch_without_the_engine(kind: EngineKind, model_dir: Path, adapter: EngineAdapter,
                              require_api_key: bool = True) -> tuple[str, EngineProcess]:
    """Refused before a start when no managed runtime has the engine (forced or not); started from
    an interpreter that lacks it, the engine's own failure: its message and the process."""
    config = RunConfig.model_validate({"engine": {"kind": kind, "model": str(model_dir)}})
    with pytest.raises(UserError, match="no managed runtime"):
        launch_engine(config)
    with pytest.raises(EngineFailed, match="no managed runtime"):
        launch_engine(config, force=True)
    engine = EngineConfig(kind=kind, model=str(model_dir), require_api_key=require_api_key, startup_timeout_s=120,
                          runtime=RuntimeConfig(kind="python", python=sys.executable))
    with EngineProcess(engine, Features(), adapter) as process:
        process.start()
        with pytest.raises(EngineStartError) as failed:
            process.wait_ready(timeout_s=120)
    return str(failed.value), process
