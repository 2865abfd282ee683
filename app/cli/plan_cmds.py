"""``tunebench plan PROFILE [--gpu NAME] [--gpus N] [--json]``: the memory plan and the physical
ceilings, before anything is launched."""

from __future__ import annotations

import argparse
import json
import sys

from app.cli.argtypes import bounded_float, bounded_int
from app.errors import UserError
from app.planner import Plan, make_plan
from app.profiles import ProfileError, load_profile, resolve_profile
from engine_adapters.gpu_specs import GIB


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def format_plan(plan: Plan) -> str:
    m, hw = plan.memory, plan.hardware
    lines = [
        f"model      {plan.model}: {_count(plan.arch.params_total)} parameters "
        f"({'exact, from safetensors headers' if plan.arch.params_exact else 'from the config'})",
        f"hardware   {hw.name} x{hw.count}: {hw.bandwidth_bytes_per_s / 1e12:.3g} TB/s, "
        f"{hw.memory_bytes / GIB:.0f} GiB per device",
        f"weights    {plan.weights_dtype}: {_bytes(m.weights_bytes)} ({_bytes(m.weights_bytes_per_device)} per device)",
        f"KV cache   {plan.kv_dtype}: {m.kv_bytes_per_token:,.0f} bytes per token; pool "
        f"{m.kv_pool_bytes_per_device / GIB:.2f} GiB per device = {m.kv_tokens:,} tokens",
        f"sequences  {m.max_concurrent_seqs:,} of {m.context_tokens:,} tokens fit at once",
        *_moe_summary(plan),
        "",
        f"{'batch':>6}  {'decode ceiling (output tok/s)':>30}  {'per device':>11}  {'FLOP/byte':>9}",
    ]
    for row in plan.ceilings:
        lines.append(f"{row.batch:>6}  {row.decode_output_tok_per_s:>30,.0f}  "
                     f"{row.decode_output_tok_per_s_per_device:>11,.0f}  {row.arithmetic_intensity_flop_per_byte:>9.1f}")
    lines.extend(_moe_steps(plan))
    if plan.prefill_tok_per_s:
        lines.append(f"prefill ceiling: {plan.prefill_tok_per_s:,.0f} tok/s")
    lines.append("")
    lines.append("assumptions:")
    lines.extend(f"  - {a}" for a in plan.assumptions)
    if plan.warnings:
        lines.append("warnings:")
        lines.extend(f"  ! {w}" for w in plan.warnings)
    return "\n".join(lines)


def _moe_summary(plan: Plan) -> list[str]:
    moe = plan.moe
    if moe is None:
        return []
    shared = f" + {moe.shared_experts} shared" if moe.shared_experts else ""
    placed = (f"; expert parallel over {moe.expert_parallel} devices, {moe.experts / moe.expert_parallel:g} experts "
              "each" if moe.expert_parallel > 1 else "")
    return [f"MoE        {moe.experts} routed experts, top-{moe.experts_per_token}{shared}, in {moe.moe_layers} "
            f"layers: {_count(moe.params_active)} active of {_count(moe.params_total)} parameters per token{placed}",
            f"routing    assumed {moe.routing}"]


def _moe_steps(plan: Plan) -> list[str]:
    """Per ceiling row: the experts a replica's batch touches and the bytes its decode step moves."""
    moe = plan.moe
    if moe is None:
        return []
    lines = ["", f"{'batch':>6}  {'experts touched/layer':>21}  {'weights read/step':>17}  "
                 f"{'routed per device':>17}  {'all-to-all/step':>15}"]
    for row, step in zip(plan.ceilings, moe.steps, strict=True):
        lines.append(f"{row.batch:>6}  {step.experts_touched_per_layer:>21.1f}  {_bytes(step.weight_bytes):>17}  "
                     f"{_bytes(step.routed_bytes_per_device):>17}  {_bytes(step.all_to_all_bytes):>15}")
    return lines


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        config = load_profile(resolve_profile(args.profile))
    except ProfileError as exc:
        raise UserError(str(exc)) from None
    plan = make_plan(config, gpu=args.gpu, gpus=args.gpus, acceptance_rate=args.acceptance,
                     expert_parallel=args.expert_parallel)
    if args.json:
        json.dump(plan.model_dump(mode="json"), sys.stdout, indent=2)
        print()
    else:
        print(format_plan(plan))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="memory plan and physical ceilings for a profile, before launch")
    p.add_argument("profile", help="profile file or shipped profile name")
    p.add_argument("--gpu", help="plan for this GPU from the spec table (e.g. H100, H800, H200, A100 80GB SXM)")
    p.add_argument("--gpus", type=bounded_int(1, 4096), help="number of GPUs (default: TP x PP of the profile)")
    p.add_argument("--acceptance", type=bounded_float(0.0, 1.0), help="speculative decoding acceptance rate (default 0.7)")
    p.add_argument("--expert-parallel", action="store_true",
                   help="MoE: spread the routed experts whole over the replica's devices (adds an all-to-all)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(handler=cmd_plan)
