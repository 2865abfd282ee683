"""Checking a configuration and launching its engine: the one path the CLI, the runner and the
GUI all use, so a configuration is judged the same way everywhere."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field

from app.config import RunConfig
from app.errors import EngineFailed, UserError
from app.quality.config import WHOLE_VOCABULARY
from engine_adapters.base import FlagSet, ValidationIssue
from engine_adapters.config import EngineConfig, Features
from engine_adapters.disaggregation import has_router
from engine_adapters.hardware import HardwareInfo, probe_hardware
from engine_adapters.launcher import EngineProcess, EngineStartError, ExitCallback, LogCallback, PhaseCallback
from engine_adapters.pd_group import DisaggregatedGroup, DisaggregatedStartError, PoolLauncher, launch_here
from engine_adapters.registry import get_adapter
from engine_adapters.runtimes import RuntimeErrorMessage, addon_path


@dataclass
class CheckReport:
    issues: list[ValidationIssue] = field(default_factory=list)
    flags: FlagSet | None = None
    hardware: HardwareInfo | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[ValidationIssue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[ValidationIssue]:
        return [i for i in self.issues if i.severity == "warning"]


def check_config(config: RunConfig, discover_flags: bool = True, *, hardware: HardwareInfo | None = None,
                 flags: FlagSet | None = None) -> CheckReport:
    """Validate without launching: combinations, hardware, and the installed version's flags.
    ``hardware`` and ``flags`` already probed are reused (the GUI probes once and validates on
    every edit); flags are discovered only when ``discover_flags`` and none are given."""
    adapter = get_adapter(config.engine.kind)
    report = CheckReport(hardware=hardware or probe_hardware(), flags=flags)
    if discover_flags and flags is None and config.engine.runtime.kind == "docker":
        report.notes.append("flags are not checked for docker images")
    elif discover_flags and flags is None:
        try:
            report.flags = adapter.discover_flags(config.engine)
        except (RuntimeErrorMessage, OSError, ValueError, subprocess.SubprocessError) as exc:
            # The engine's --help could not be read: validation goes on without its flags.
            report.notes.append(f"flags not checked against the installed engine: {exc}")
    try:
        report.issues = adapter.validate(config.engine, config.features, report.flags, report.hardware)
    except RuntimeErrorMessage as exc:
        report.issues = [ValidationIssue("engine", str(exc))]
    return report


def _refuse_errors(config: RunConfig) -> None:
    report = check_config(config)
    if report.errors:
        raise UserError("; ".join(f"{i.field}: {i.message}" for i in report.errors))


def is_group(config: RunConfig) -> bool:
    """Whether the configuration launches a disaggregated prefill/decode group, not one engine."""
    return config.features.disaggregation.enabled and config.features.disaggregation.role is None


MAX_LOGPROBS_FLAG = "--max-logprobs"
SPREAD_NEEDS_A_CLUSTER = ("disaggregation.placement = 'spread' puts every pool engine on a node of its own: run it on a "
                          "Ray cluster (--cluster ADDRESS), or set placement = 'together' to run the group on this "
                          "machine")


def _with_quality_flags(config: RunConfig) -> Features:
    """The features to launch with: a quality probe asking vLLM for the whole vocabulary's
    logprobs needs ``--max-logprobs -1`` (vLLM caps them at 20), so its KL is exact."""
    quality, features = config.quality, config.features
    if (quality is None or not quality.enabled or config.engine.kind != "vllm"
            or quality.top_logprobs_for(config.engine.model) != WHOLE_VOCABULARY
            or any(arg.split("=", 1)[0] == MAX_LOGPROBS_FLAG for arg in features.extra_args)):
        return features
    return features.model_copy(update={"extra_args": [*features.extra_args, MAX_LOGPROBS_FLAG, str(WHOLE_VOCABULARY)]})


def launch_engine(
    config: RunConfig,
    *,
    force: bool = False,
    on_log: LogCallback | None = None,
    on_phase: PhaseCallback | None = None,
    on_exit: ExitCallback | None = None,
) -> EngineProcess:
    """Validate, then start the engine (returns before it is ready). ``force`` skips validation."""
    if not force:
        _refuse_errors(config)
    if is_group(config):
        raise UserError("disaggregated prefill/decode runs as a group of engines behind a router, which "
                        "tunebench run launches; to start it by hand, export it (tunebench export PROFILE "
                        "--format bash), then measure it with tunebench run --endpoint URL")
    engine = EngineProcess(config.engine, _with_quality_flags(config), get_adapter(config.engine.kind),
                           on_log=on_log, on_phase=on_phase, on_exit=on_exit)
    try:
        engine.start()
    except (RuntimeErrorMessage, EngineStartError) as exc:
        raise EngineFailed(str(exc)) from None
    return engine


def _with_addon(engine: EngineConfig) -> EngineConfig:
    """The engine with its runtime's add-on (NIXL, the router) on ``PYTHONPATH``: only the
    group's processes get it, never tunebench's venv."""
    try:
        path = addon_path(engine)
    except RuntimeErrorMessage as exc:
        raise UserError(str(exc)) from None
    if path is None:
        return engine
    env = dict(engine.runtime.env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    return engine.model_copy(update={"runtime": engine.runtime.model_copy(update={"env": env})})


def launch_group(
    config: RunConfig,
    *,
    force: bool = False,
    on_log: LogCallback | None = None,
    on_phase: PhaseCallback | None = None,
    on_exit: ExitCallback | None = None,
    launch_member: PoolLauncher | None = None,
) -> DisaggregatedGroup:
    """Validate, then start every engine of a disaggregated prefill/decode group (returns before
    they are ready; the router starts once they are, in ``wait_ready``). Stopped again if any
    fails to start. ``launch_member`` places each pool engine (a cluster's nodes); None: here."""
    if not force:
        _refuse_errors(config)
    adapter = get_adapter(config.engine.kind)
    if not has_router(adapter):
        raise UserError(f"{adapter.display_name} has no disaggregated prefill/decode launch in tunebench")
    if launch_member is None and config.features.disaggregation.spread:
        raise UserError(SPREAD_NEEDS_A_CLUSTER)
    group = DisaggregatedGroup(_with_addon(config.engine), _with_quality_flags(config), adapter,
                               on_log=on_log, on_phase=on_phase, on_exit=on_exit,
                               launch_member=launch_member or launch_here)
    try:
        group.start()
    except (RuntimeErrorMessage, EngineStartError, DisaggregatedStartError) as exc:
        group.stop()
        raise EngineFailed(str(exc)) from None
    return group
