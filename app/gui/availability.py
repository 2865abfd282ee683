"""Which feature toggles this machine and installed engine can honour, and why not.

Nothing here restates engine facts: each candidate value is put to the adapter's own
``validate`` (hardware and installed flags), and the catalogue's declared requirements
(``FeatureInfo.requires``) are checked against the hardware fingerprint. Pure Python; the GUI
runs it in a worker because flag discovery may start the engine's interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.config import RunConfig
from app.gui.fields import FieldSpec, field_spec, get_path, with_value
from engine_adapters.base import FlagSet, ValidationIssue
from engine_adapters.features import FEATURES, Capability, offered_by
from engine_adapters.hardware import HardwareInfo
from engine_adapters.registry import get_adapter, maturity


@dataclass
class Availability:
    """Per feature path (``features.x``): a reason the whole toggle is off, or reasons per choice."""

    disabled: dict[str, str] = field(default_factory=dict)
    disabled_choices: dict[str, dict[str, str]] = field(default_factory=dict)
    cautions: dict[str, dict[str, str]] = field(default_factory=dict)
    engine_version: str | None = None
    hardware_summary: str = ""
    engine_note: str = ""
    """How far the engine's adapter is proven, when not by a real run ("not yet run on a GPU: ...")."""


def _candidates(spec: FieldSpec, current: Any) -> list[Any]:
    """Values that switch a feature on, to ask the adapter about."""
    if spec.kind == "choice":
        return [c for c in spec.choices if c != current]
    if spec.kind in ("bool", "tristate"):
        return [True, False]
    if spec.kind == "int" and spec.name.endswith("parallel_size"):
        return [2]
    if spec.kind == "float" and spec.name.endswith("_gib"):
        return [1.0]
    if spec.kind == "float" and spec.name == "gpu_memory_utilization":
        return [0.9]
    return []


def _missing(cap: Capability, hardware: HardwareInfo) -> bool:
    if cap is Capability.CUDA_GPU:
        return not hardware.has_gpu
    if cap is Capability.MULTI_GPU:
        return len(hardware.gpus) < 2
    return False  # FP8 capabilities depend on the chosen value: the adapter's validate judges them


def _key_issues(issues: list[ValidationIssue], key: str) -> list[ValidationIssue]:
    return [i for i in issues if i.field == key]


def compute_availability(config: RunConfig, hardware: HardwareInfo, flags: FlagSet | None) -> Availability:
    adapter = get_adapter(config.engine.kind)
    base = RunConfig.model_validate(config.model_dump())
    base = base.model_copy(update={"features": type(base.features)()})  # judge each toggle from defaults
    out = Availability(engine_version=flags.version if flags else None, hardware_summary=hardware.summary(),
                       engine_note=maturity(config.engine.kind) or "")
    baseline = {str(i) for i in adapter.validate(base.engine, base.features, flags, hardware)}
    for info in FEATURES:
        path = f"features.{info.key}"
        missing = [cap for cap in info.requires if _missing(cap, hardware)]
        if missing:
            out.disabled[path] = (f"needs {missing[0].value}; none is visible here"
                                  if missing[0] is Capability.CUDA_GPU
                                  else f"needs {missing[0].value} ({len(hardware.gpus)} visible)")
            continue
        spec = field_spec(path)
        current = get_path(base, path)
        candidates = _candidates(spec, current)
        if not candidates and spec.kind == "int" and not offered_by(info, config.engine.kind):
            candidates = [1]  # another engine's count (GPU layers): the adapter's refusal is the reason
        for value in candidates:
            try:
                trial = with_value(base, path, value)
            except ValueError:
                continue
            issues = [i for i in adapter.validate(trial.engine, trial.features, flags, hardware)
                      if str(i) not in baseline]
            mine = _key_issues(issues, info.key)
            errors = [i for i in mine if i.severity == "error"]
            if errors:
                out.disabled_choices.setdefault(path, {})[str(value)] = errors[0].message
            elif mine:
                out.cautions.setdefault(path, {})[str(value)] = mine[0].message
        bad = out.disabled_choices.get(path, {})
        if candidates and spec.kind != "choice" and len(bad) == len(candidates):
            out.disabled[path] = next(iter(bad.values()))
    return out


# --- the configuration as it stands, on this machine ------------------------------------------

GPU_CAPABILITIES = (Capability.CUDA_GPU, Capability.FP8_COMPUTE, Capability.MULTI_GPU)
RUNTIME_FIELD = "engine.runtime"


def _open_files_limit() -> int | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def judge_here(config: RunConfig, hardware: HardwareInfo, issues: list[ValidationIssue]) -> list[ValidationIssue]:
    """What the adapter's own ``validate`` does not say about the configuration as it stands on
    this machine, so that every setting that cannot work here is flagged by its field before
    Start: a GPU feature switched on where no GPU is visible (and, when the configured runtime
    itself needs a GPU, every feature set away from its default), and loads the client cannot
    keep (more requests in flight than the level has, or than this process may open files)."""
    out: list[ValidationIssue] = []
    flagged = {i.field for i in issues}
    default = type(config.features)()
    changed = [info for info in FEATURES
               if get_path(config.features, info.key) != get_path(default, info.key)]
    if not hardware.has_gpu:
        runtime_needs_gpu = next((i for i in issues if i.field.startswith(RUNTIME_FIELD) and i.severity == "error"
                                  and "GPU" in i.message), None)
        for info in changed:
            if info.key in flagged:
                continue
            value = get_path(config.features, info.key)
            missing = next((cap for cap in info.requires_for(value) if cap in GPU_CAPABILITIES), None)
            if missing is not None:
                out.append(ValidationIssue(info.key, f"needs {missing.value.split(' (')[0]}; none is visible here",
                                           "error"))
            elif runtime_needs_gpu is not None:
                out.append(ValidationIssue(info.key, "not testable here: its runtime needs a GPU", "warning"))
    load, workload = config.load, config.workload
    if load.pattern.takes_concurrency:
        peak = int(max(load.levels)) if load.pattern.takes_levels and load.levels else load.concurrency
        per_level = min(workload.num_requests, load.max_requests or workload.num_requests)
        if load.pattern.closed_loop and load.duration_s is None and peak > per_level:
            out.append(ValidationIssue("load.concurrency", f"{peak:,} is more than the {per_level:,} requests of the "
                                       f"level: at most {per_level:,} will ever be in flight", "warning"))
        limit = _open_files_limit()
        if limit is not None and peak > limit - 64:
            out.append(ValidationIssue("load.concurrency", f"{peak:,} connections at once exceed this machine's "
                                       f"limit of {limit:,} open files (ulimit -n): requests beyond it will fail",
                                       "error"))
    return out
