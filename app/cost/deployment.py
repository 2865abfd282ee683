"""What a stored run ran on and measured: its GPUs (TP x PP x DP) or cores, counted from its
recorded configuration, hardware and environment, and its load levels with their figures.
Everything is read from the run; nothing is modelled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from app.analysis.summary import level_summary_figures, numbers
from app.config import RunConfig
from app.cost.prices import Unit
from app.errors import UserError
from db.records import LevelInfo, RunDetail
from engine_adapters.config import Features
from engine_adapters.cpu_binding import OMP_BIND_ENV, parse_cpu_list
from engine_adapters.runtimes import is_cpu_build


def run_config(run: RunDetail) -> RunConfig:
    """The configuration a stored run was measured with; a run imported from another tool has
    none, so nothing says how many GPUs it used; a stored one that no longer validates (a price
    edited by hand) names its first bad value."""
    problem = "it records no engine configuration (GPUs, parallelism)"
    try:
        if run.config:
            return RunConfig.model_validate(run.config)
    except ValidationError as exc:
        if not run.imported:
            first = exc.errors()[0]
            problem = f"{'.'.join(str(p) for p in first['loc']) or 'its top level'}: {first['msg']}"
    where = f"was imported from {run.imported_from or 'another tool'}" if run.imported else \
        "has no valid stored configuration"
    raise UserError(f"run {run.id} {where}: {problem}, so its capacity and cost cannot be counted")


@dataclass(frozen=True)
class Deployment:
    """What one measured configuration runs on: a replica's GPUs (TP x PP) or cores, and how
    many replicas (data parallel) the measurement drove together."""

    kind: Literal["gpu", "cpu"]
    device: str
    """The GPU's name as the run recorded it, or the CPU model."""
    units_per_replica: float
    data_parallel: int
    units_per_node: int | None
    """GPUs per machine, where the run's hardware lists them (None for a CPU run)."""
    counted: str
    """How the GPUs or cores were counted, in words."""
    notes: tuple[str, ...] = ()

    @property
    def unit(self) -> Unit:
        return "GPU" if self.kind == "gpu" else "core"

    @property
    def units_measured(self) -> float:
        """GPUs (or cores) the measured throughput came from: every replica's."""
        return self.units_per_replica * self.data_parallel


def _engine_cores(run: RunDetail, runtime_env: Mapping[str, str]) -> tuple[int, str]:
    """The cores a CPU engine ran on. Most honest first: the cores its compute threads were bound
    to (``VLLM_CPU_OMP_THREADS_BIND`` in the engine's recorded environment, which tunebench sets
    for a managed CPU engine, leaving the load client's core out); else the machine's logical
    CPUs, since unbound threads may use them all."""
    for env in (run.env, runtime_env):
        bind = env.get(OMP_BIND_ENV) if isinstance(env, Mapping) else None
        cores = parse_cpu_list(bind) if isinstance(bind, str) else None
        if cores:
            return len(cores), f"the cores the engine's threads were bound to, {OMP_BIND_ENV}={bind}"
    logical = run.hardware.get("cpu_count_logical")
    if isinstance(logical, int) and not isinstance(logical, bool) and logical > 0:
        return logical, "the machine's logical CPUs: the engine's threads were not bound, so it may use them all"
    raise UserError(f"run {run.id} records neither the cores its engine was bound to nor the machine's CPU "
                    "count: its cost cannot be counted")


def _recorded_gpus(run: RunDetail, gpu: str | None, missing: str) -> list[str]:
    """The GPU names the run recorded; ``--gpu`` only for a run that records none (which then
    needs it: ``missing`` says so)."""
    listed = [str(g["name"]) for g in run.hardware.get("gpus") or [] if isinstance(g, Mapping) and g.get("name")]
    if listed and gpu:
        raise UserError(f"run {run.id} recorded its GPUs ({listed[0]}): --gpu is only for a run that names none")
    if not listed and not gpu:
        raise UserError(f"run {run.id} {missing}")
    return listed


def imported_deployment(run: RunDetail, gpu: str | None, gpus_per_replica: int) -> Deployment:
    """What an imported run ran on, as the user says (``--gpus-per-replica``, ``--gpu`` where
    its record names no GPU): the other tool recorded no engine configuration to count from."""
    if isinstance(gpus_per_replica, bool) or not isinstance(gpus_per_replica, int) or gpus_per_replica < 1:
        raise UserError(f"--gpus-per-replica must be a whole number of at least 1, got {gpus_per_replica!r}")
    listed = _recorded_gpus(run, gpu, f"was imported from {run.imported_from or 'another tool'} and records no "
                                      "GPU: pass --gpu NAME too, the card it ran on")
    plural = "s" if gpus_per_replica > 1 else ""
    return Deployment("gpu", listed[0] if listed else str(gpu), gpus_per_replica, 1, len(listed) or None,
                      f"{gpus_per_replica} GPU{plural} per replica, as you said (--gpus-per-replica): the run was "
                      f"imported from {run.imported_from or 'another tool'}, which records no parallelism",
                      ("one replica measured: the imported run says nothing of data parallelism",))


def run_deployment(run: RunDetail, gpu: str | None = None, gpus_per_replica: int | None = None) -> Deployment:
    """The GPUs (``Features.gpu_count`` = TP x PP x DP) or cores a stored run used. ``gpu`` names
    the card for a run whose record lists none (an engine measured over the network);
    ``gpus_per_replica`` says what an imported run, which records no parallelism, ran on."""
    if gpus_per_replica is not None:
        if not run.imported:
            raise UserError(f"run {run.id} records its own parallelism: --gpus-per-replica is only for an "
                            "imported run")
        return imported_deployment(run, gpu, gpus_per_replica)
    config = run_config(run)  # an imported run has none: refused, saying so
    features: Features = config.features
    dp = features.data_parallel_size
    if is_cpu_build(config.engine.runtime, run.engine_version):
        if gpu:
            raise UserError(f"run {run.id} ran on a CPU engine: --gpu does not apply")
        cores, counted = _engine_cores(run, config.engine.runtime.env)
        return Deployment("cpu", str(run.hardware.get("cpu_model") or "CPU"), cores / dp, dp, None,
                          counted + (f", {dp} data-parallel replicas" if dp > 1 else ""))
    listed = _recorded_gpus(run, gpu, "records no GPU (an engine on another machine?): pass --gpu NAME, the card "
                                      "it ran on")
    notes: list[str] = []
    used = listed[:features.gpu_count]
    if len(set(used)) > 1:
        notes.append(f"the machine has several GPU models ({', '.join(sorted(set(used)))}): priced as {used[0]}")
    if features.disaggregation.enabled:  # both pools, measured together through their router
        d = features.disaggregation
        counted = (f"disaggregated: prefill {d.prefill_instances} x {features.pool_gpu_count('prefill') // d.prefill_instances}"
                   f" + decode {d.decode_instances} x {features.pool_gpu_count('decode') // d.decode_instances} = "
                   f"{features.gpu_count} GPUs")
        return Deployment("gpu", listed[0] if listed else str(gpu), features.gpu_count, 1, len(listed) or None,
                          counted, tuple(notes))
    counted = (f"TP {features.tensor_parallel_size} x PP {features.pipeline_parallel_size} = "
               f"{features.gpus_per_replica} GPU{'s' if features.gpus_per_replica > 1 else ''} per replica"
               + (f", {dp} data-parallel replicas measured together" if dp > 1 else ""))
    return Deployment("gpu", listed[0] if listed else str(gpu), features.gpus_per_replica, dp,
                      len(listed) or None, counted, tuple(notes))


@dataclass(frozen=True)
class LevelPoint:
    """One measured load level: how many requests it kept in flight and its figures."""

    idx: int
    label: str
    concurrency: float | None
    """Requests in flight over every replica: the closed loop's concurrency, or for an open loop
    request rate x mean E2E (Little's law); None when the level recorded neither."""
    concurrency_from: str
    figures: Mapping[str, float]
    """Catalogue keys (``output_tok_per_s``, ``ttft_ms_p99``...): the store's figures."""
    goodput_slo: str | None
    """The SLO the run counted goodput under (its own, not necessarily the one asked now)."""


def _level_figures(run: RunDetail, level: LevelInfo | None, idx: int, several: bool) -> dict[str, float]:
    stored = numbers(run.metrics)
    prefix = f"L{idx}."
    figures = {k[len(prefix):]: v for k, v in stored.items() if k.startswith(prefix)}
    if not figures and not several:
        figures = {k: v for k, v in stored.items() if not re.match(r"L\d+\.", k)}
    for key, value in level_summary_figures(level.summary if level else None).items():
        figures.setdefault(key, value)  # the store's figures first: those Compare and the reports show
    return figures


def _concurrency(params: Mapping[str, Any], figures: Mapping[str, float]) -> tuple[float | None, str]:
    conc = params.get("concurrency")
    if params.get("mode", "closed") == "closed" and isinstance(conc, int) and not isinstance(conc, bool) and conc > 0:
        return float(conc), "closed loop"
    rps, e2e_ms = figures.get("requests_per_s"), figures.get("e2e_ms_mean")
    if rps and e2e_ms and rps > 0 and e2e_ms > 0:
        return rps * e2e_ms / 1000.0, "open loop: request rate x mean E2E"
    return None, ""


def _imported_levels(run: RunDetail) -> list[LevelPoint]:
    """An imported run's levels (a GuideLLM benchmark each, or the one a ``vllm bench serve`` file
    holds): the tool's own load settings are not this tool's, so the requests in flight are
    counted by Little's law from what was measured, and the run has no SLO of its own."""
    levels: list[LevelInfo | None] = list(run.levels) or [None]
    out = []
    for lv in levels:
        idx = lv.idx if lv is not None else 0
        figures = _level_figures(run, lv, idx, len(levels) > 1)
        conc, how = _concurrency({"mode": "imported"}, figures)
        out.append(LevelPoint(idx, (lv.label if lv is not None else "") or "the imported benchmark", conc,
                              how.replace("open loop", "imported"), figures, None))
    return out


def run_levels(run: RunDetail) -> list[LevelPoint]:
    """The run's levels with their figures; a run that recorded no level row (a single closed
    loop) is one level at its configured concurrency."""
    if run.imported:
        return _imported_levels(run)
    load = run_config(run).load
    run_slo = load.slo
    if not run.levels:
        params: dict[str, Any] = {"mode": "closed", "concurrency": load.concurrency} if load.pattern.closed_loop else {}
        figures = _level_figures(run, None, 0, several=False)
        conc, how = _concurrency(params, figures)
        return [LevelPoint(0, f"concurrency {load.concurrency}" if params else "level 0", conc, how, figures,
                           run_slo)]
    out = []
    several = len(run.levels) > 1
    for lv in run.levels:
        figures = _level_figures(run, lv, lv.idx, several)
        conc, how = _concurrency(lv.params, figures)
        slo = (lv.summary or {}).get("slo")
        out.append(LevelPoint(lv.idx, lv.label or f"level {lv.idx}", conc, how, figures,
                              slo if isinstance(slo, str) else run_slo))
    return out
