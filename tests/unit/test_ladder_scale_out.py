"""A ladder that ends past one engine: "+ disaggregated prefill/decode" and, for a MoE model,
"+ EP"; the staircase states each step's GPUs and compares per GPU as well as in total."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli.ladder_cmds import format_ladder_table
from app.config import RunConfig
from app.engines import check_config
from app.ladder.run import skip_reason
from app.ladder.spec import apply_step, config_diff, scale_out_steps
from app.ladder.state import LadderState, StepRow, compute_factors
from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.hardware import GpuInfo, HardwareInfo

EIGHT_GPUS = HardwareInfo(gpus=[GpuInfo(index=i, name="H100", memory_total_bytes=80 * 2**30) for i in range(8)])


def config_for(model: str) -> RunConfig:
    return RunConfig(engine=EngineConfig(model=model, runtime=RuntimeConfig(kind="docker")),
                     features=Features(tensor_parallel_size=2))


def test_the_last_steps_build_on_the_ladder_and_count_both_pools(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"n_routed_experts": 64, "num_experts_per_tok": 6}))
    base = config_for(str(tmp_path))
    pd_step, ep_step = scale_out_steps(base, prefill_instances=1, decode_instances=2, expert_parallel_size=2)
    assert (pd_step.name, ep_step.name) == ("+ disaggregated prefill/decode", "+ EP")
    pd = apply_step(base, pd_step)
    assert pd.features.gpu_count == 6  # 1 prefill + 2 decode engines of TP 2
    ep = apply_step(pd, ep_step)
    assert ep.features.expert_parallel_size == 2
    for before, after in ((base, pd), (pd, ep)):
        report = check_config(after, discover_flags=False, hardware=EIGHT_GPUS)
        assert report.errors == [], report.errors
        assert config_diff(before, after)
    assert scale_out_steps(base)[0].features["disaggregation"]["connector"] == "nixl"
    assert len(scale_out_steps(base)) == 1  # no EP step unless asked for (a MoE model)


def test_ep_on_a_dense_model_and_pools_past_the_machine_are_skipped_with_why(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    base = config_for(str(tmp_path))
    pd_step, ep_step = scale_out_steps(base, prefill_instances=3, decode_instances=2, expert_parallel_size=2)
    pd = apply_step(base, pd_step)
    reason = skip_reason(check_config(pd, discover_flags=False, hardware=EIGHT_GPUS).issues,
                         [k for k, _a, _b in config_diff(base, pd)])
    assert reason is not None and "the P/D pools need 10 GPUs" in reason
    small = apply_step(base, scale_out_steps(base)[0])
    ep = apply_step(small, ep_step)
    reason = skip_reason(check_config(ep, discover_flags=False, hardware=EIGHT_GPUS).issues,
                         [k for k, _a, _b in config_diff(small, ep)])
    assert reason is not None and "is dense" in reason


def test_the_staircase_states_gpus_and_compares_per_gpu() -> None:
    rows = [StepRow(index=0, name="baseline", status="completed", output_tok_per_s=1000.0, total_tok_per_s=2000.0,
                    gpus=2),
            StepRow(index=1, name="+ disaggregated prefill/decode", status="completed", output_tok_per_s=2400.0,
                    total_tok_per_s=5000.0, gpus=6)]
    compute_factors(rows)
    assert rows[1].factor_baseline == 2.4 and rows[1].output_tok_per_s_per_gpu == 400.0
    assert rows[1].per_gpu_factor_baseline == 0.8  # more in total, less per GPU
    table = format_ladder_table(LadderState(name="l", rows=rows, started_wall_s=1.9e9, ladder_id="l1"))
    assert "per GPU: 1. 2 GPUs, 500 out tok/s per GPU (×1.00 vs baseline); 2. 6 GPUs, 400 out tok/s per GPU " \
           "(×0.80 vs baseline)" in table
    same = [r.model_copy(update={"gpus": 2}) for r in rows]
    assert "per GPU" not in format_ladder_table(LadderState(name="l", rows=same, started_wall_s=1.9e9, ladder_id="l1"))
