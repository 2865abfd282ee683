""""% of limit": a measured decode rate against the planner's ceiling at the batch the engine
really ran, and the roofline point it makes. The one computation the CLI's level table, the GUI's
tiles, ceiling line and roofline, and the HTML report all show (none of them recomputes it).

The batch is the engine's own mean tokens per step (``vllm:iteration_tokens_total``), bounded by
the requests the client had in flight: prefill chunks and draft tokens raise tokens per step above
the number of decoding sequences, but never the sequences above the requests that exist. A rate
above its ceiling is never shown as a percentage: it is a bug in the plan or the measurement
(``percent_of_ceiling`` says which figures disagree).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from app.config import RunConfig
from app.errors import UserError
from app.load.metrics import LevelSummary
from app.planner.arch import PlannerError
from app.planner.plan import (
    Plan,
    decode_ceiling,
    decode_flop_per_token,
    gpu_hardware,
    make_plan,
    percent_of_ceiling,
    step_bytes,
)
from engine_adapters.gpu_specs import find_gpu_spec

ABOVE_CEILING_TEXT = "above the ceiling: a bug"


class LimitFigures(BaseModel):
    """One measured decode rate against its ceiling, and where it sits on the roofline."""

    batch: float
    """Sequences decoding at once (the engine's tokens per step, bounded by the requests in flight)."""
    batch_source: str
    measured_tok_per_s: float
    ceiling_tok_per_s: float
    fraction: float | None
    """measured / ceiling (0..1.05); None when the measurement is above the ceiling (``flag``)."""
    flag: str | None = None
    acceptance_length: float = 1.0
    arithmetic_intensity_flop_per_byte: float
    achieved_flop_per_s: float

    def text(self) -> str:
        """``34% of limit`` or ``above the ceiling: a bug`` (never ``120%``)."""
        if self.fraction is None:
            return ABOVE_CEILING_TEXT
        return f"{100 * min(self.fraction, 1.0):.0f}% of limit"

    def percent_text(self) -> str:
        """``34%`` or ``bug`` (a narrow table cell)."""
        return "bug" if self.fraction is None else f"{100 * min(self.fraction, 1.0):.0f}%"

    def detail(self) -> str:
        """What the figure compares, in one line (a tooltip, a note under a table)."""
        spec = f", {self.acceptance_length:.2f} tokens per step per sequence" if self.acceptance_length > 1 else ""
        return (f"{self.measured_tok_per_s:,.0f} of a {self.ceiling_tok_per_s:,.0f} tok/s decode ceiling at batch "
                f"{self.batch:,.1f} ({self.batch_source}{spec})" + (f": {self.flag}" if self.flag else ""))


class Roofline(BaseModel):
    """The plan's hardware as a roofline: the bandwidth slope and, where published, the compute roof."""

    bandwidth_bytes_per_s: float
    """All devices together."""
    peak_flop_per_s: float | None
    """Dense FLOP/s of all devices at the weights' precision; None for a CPU (no published figure)."""
    label: str

    @property
    def ridge_flop_per_byte(self) -> float | None:
        """The intensity where the slope meets the roof: below it, decode is memory-bound."""
        return self.peak_flop_per_s / self.bandwidth_bytes_per_s if self.peak_flop_per_s else None

    def attainable_flop_per_s(self, intensity_flop_per_byte: float) -> float:
        slope = self.bandwidth_bytes_per_s * intensity_flop_per_byte
        return min(slope, self.peak_flop_per_s) if self.peak_flop_per_s else slope


def _with_acceptance(plan: Plan, acceptance_length: float | None) -> Plan:
    """The plan at a measured mean acceptance length (speculative decoding), else as planned."""
    if acceptance_length is None or not math.isfinite(acceptance_length) or acceptance_length < 1.0 \
            or acceptance_length == plan.acceptance_length:
        return plan
    return plan.model_copy(update={"acceptance_length": acceptance_length})


def limit_at(plan: Plan, measured_tok_per_s: float | None, batch: float | None, *, batch_source: str,
             acceptance_length: float | None = None) -> LimitFigures | None:
    """``measured_tok_per_s`` (output tokens) against the decode ceiling at ``batch`` sequences;
    None when either is unknown or nothing was decoded."""
    if measured_tok_per_s is None or batch is None or not math.isfinite(measured_tok_per_s) \
            or not math.isfinite(batch) or measured_tok_per_s <= 0 or batch <= 0:
        return None
    used = _with_acceptance(plan, acceptance_length)
    ceiling = decode_ceiling(used, batch)
    fraction, flag = percent_of_ceiling(measured_tok_per_s, ceiling)
    flop_per_token = decode_flop_per_token(used.arch)
    share = batch / used.replicas  # one data-parallel replica's share of the batch
    intensity = share * used.acceptance_length * flop_per_token / step_bytes(used, share)
    return LimitFigures(batch=batch, batch_source=batch_source, measured_tok_per_s=measured_tok_per_s,
                        ceiling_tok_per_s=ceiling, fraction=None if flag else fraction, flag=flag,
                        acceptance_length=used.acceptance_length, arithmetic_intensity_flop_per_byte=intensity,
                        achieved_flop_per_s=measured_tok_per_s * flop_per_token)


def running_batch(tokens_per_step: float | None, in_flight: float | None) -> tuple[float | None, str]:
    """(sequences decoding at once, where the figure comes from): the engine's tokens per step,
    at least 1 and at most the requests in flight; the requests in flight when the engine does
    not say."""
    if tokens_per_step is not None and math.isfinite(tokens_per_step) and tokens_per_step > 0:
        batch = max(1.0, tokens_per_step)
        if in_flight is not None and math.isfinite(in_flight) and in_flight >= 1 and batch > in_flight:
            return float(in_flight), "engine tokens per step, capped at the requests in flight"
        return batch, "engine tokens per step"
    if in_flight is not None and math.isfinite(in_flight) and in_flight >= 1:
        return float(in_flight), "requests in flight (the engine does not report tokens per step)"
    return None, ""


def limit_figures(plan: Plan, summary: LevelSummary) -> LimitFigures | None:
    """A finished level's output tok/s against the ceiling at the batch its engine ran."""
    engine = summary.engine
    measured = summary.output_tok_per_s
    if measured <= 0 and engine.generation_tokens and summary.duration_s > 0:
        measured = engine.generation_tokens / summary.duration_s
    batch, source = running_batch(engine.engine_tokens_per_step_mean,
                                  float(summary.peak_concurrency) if summary.peak_concurrency else None)
    return limit_at(plan, measured, batch, batch_source=source, acceptance_length=engine.spec_mean_acceptance_length)


def live_limit_figures(plan: Plan, latest: Mapping[tuple[str, str], float]) -> LimitFigures | None:
    """The same comparison on the live telemetry (``(source, name) -> last value``): the client's
    rolling output tok/s (else the engine's), at the engine's interval tokens per step bounded by
    the requests running (else in flight)."""
    measured = latest.get(("client", "output_tok_per_s"))
    if measured is None or measured <= 0:
        measured = latest.get(("engine", "generation_tok_per_s"))
    cap = latest.get(("engine", "requests_running"))
    if cap is None or cap < 1:
        cap = latest.get(("client", "requests_in_flight"))
    batch, source = running_batch(latest.get(("engine", "tokens_per_step_mean")), cap)
    return limit_at(plan, measured, batch, batch_source=source,
                    acceptance_length=latest.get(("engine", "spec_mean_acceptance_length")))


def roofline(plan: Plan) -> Roofline:
    hw = plan.hardware
    tflops = hw.fp8_tflops if plan.weights_dtype == "fp8" and hw.fp8_tflops else hw.bf16_tflops
    peak = hw.count * tflops * 1e12 if tflops else None
    label = (f"{hw.name} x{hw.count}: {hw.count * hw.bandwidth_bytes_per_s / 1e9:,.0f} GB/s"
             + (f", {hw.count * tflops:,.0f} dense TFLOP/s" if tflops else ", no published FLOP/s"))
    return Roofline(bandwidth_bytes_per_s=hw.count * hw.bandwidth_bytes_per_s, peak_flop_per_s=peak, label=label)


def plan_for_run(config: RunConfig, hardware: Mapping[str, Any] | None = None) -> tuple[Plan | None, str | None]:
    """(the plan a run is measured against, why there is none). A recorded run's GPU (its
    ``hardware`` fingerprint) is looked up in the spec table; without one the plan is for this
    machine (a CPU run: this host's measured bandwidth, cached)."""
    try:
        gpus = list((hardware or {}).get("gpus") or [])
        if gpus:
            name = str(gpus[0].get("name", "")) if isinstance(gpus[0], Mapping) else ""
            spec = find_gpu_spec(name)
            if spec is None:
                return None, f"no ceiling: GPU '{name}' is not in the spec table"
            count = config.features.gpu_count
            return make_plan(config, hardware=gpu_hardware(spec, count)), None
        return make_plan(config), None
    except (PlannerError, UserError) as exc:
        return None, f"no ceiling: {exc}"
