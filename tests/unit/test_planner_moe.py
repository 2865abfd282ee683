"""The planner's mixture-of-experts arithmetic against figures worked out by hand from the published
config.json fields in tests/data/moe (sources in its README).

DeepSeek-V3 (61 layers, the first 3 dense, hidden 7168, MLA, 256 routed experts top-8 + 1 shared):
  attention per layer (MLA): q_a 7168x1536 + norm 1536 + q_b 1536x128x(128+64)
      + kv_a 7168x(512+64) + norm 512 + kv_b 512x128x(128+128) + o 128x128x7168 = 187,107,328
  one expert 3 x 7168 x 2048 = 44,040,192; router 256 x 7168 = 1,835,008; norms 2 x 7168
  dense layer  187,107,328 + 3 x 7168 x 18432 + 14,336                      =    583,483,392
  MoE layer    187,107,328 + 257 x 44,040,192 + 1,835,008 + 14,336          = 11,507,271,424
  embedding = head = 129,280 x 7168 = 926,679,040; final norm 7168
  total  = 3 x 583,483,392 + 58 x 11,507,271,424 + 2 x 926,679,040 + 7168 = 671,026,404,352 (published 671B)
  active: a MoE layer runs 8 routed + 1 shared: 187,107,328 + 9 x 44,040,192 + 1,835,008 + 14,336
          = 585,318,656; 3 x 583,483,392 + 58 x 585,318,656 + 1,853,365,248 = 37,552,282,624 (published 37B)
  KV per token (MLA): (512 + 64) x 61 layers x 2 bytes = 70,272 (BF16)
Mixtral 8x7B (32 layers, hidden 4096, 32/8 heads, 8 experts of 3 x 4096 x 14336 = 176,160,768, top-2):
  layer total 41,943,040 + 8 x 176,160,768 + 32,768 + 8192 = 1,451,270,144; x 32 + 2 x 131,072,000 + 4096
      = 46,702,792,704 (published 46.7B)
  layer active 41,943,040 + 2 x 176,160,768 + 32,768 + 8192 = 394,305,536; x 32 + 262,148,096
      = 12,879,925,248 (published 12.9B)
Routing (uniform, independent): a batch of B tokens touches E x (1 - (1 - k/E)^B) experts of a layer;
Mixtral at B = 2: 8 x (1 - (3/4)^2) = 3.5; DeepSeek-V3 at B = 32: 256 x (1 - (31/32)^32) = 163.3.
All-to-all with expert parallelism: 2 x B x k x hidden x 2 bytes x MoE layers; DeepSeek-V3 at B = 64:
2 x 64 x 8 x 7168 x 2 x 58 = 851,443,712 bytes per step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.cli import main
from app.config import RunConfig
from app.planner import PlannerError, make_plan
from app.planner.arch import ModelArch, arch_from_config, arch_from_folder
from app.planner.plan import (
    ROUTING_ASSUMPTION,
    ROUTING_RULE,
    decode_ceiling,
    expected_experts_touched,
    moe_step,
    step_bytes,
    weight_bytes,
)
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "moe"


def fixture_arch(name: str) -> ModelArch:
    return arch_from_config(json.loads((FIXTURES / f"{name}.json").read_text()), name, source=name)


def model_folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(FIXTURES / f"{name}.json", folder / "config.json")
    return folder


def gpu_config(model: str, features: Features) -> RunConfig:
    return RunConfig(engine=EngineConfig(model=model, runtime=RuntimeConfig(kind="executable", executable="vllm")),
                     features=features,
                     workload=WorkloadConfig(input_len=LengthSpec(mean=16), output_len=LengthSpec(mean=16)),
                     load=LoadConfig(concurrency=1))


def test_deepseek_v3_parameters_and_mla_kv() -> None:
    arch = fixture_arch("deepseek-v3")
    assert (arch.num_experts, arch.num_experts_per_token, arch.num_shared_experts) == (256, 8, 1)
    assert arch.moe_layers == 58 and arch.params_per_expert == 44_040_192
    assert arch.params_total == 671_026_404_352
    assert arch.params_active == 37_552_282_624
    assert arch.params_total == pytest.approx(671e9, rel=0.02)
    assert arch.params_active == pytest.approx(37e9, rel=0.02)
    assert arch.kv_bytes_per_token(2) == (512 + 64) * 61 * 2 == 70_272
    assert arch.kv_bytes_per_token(1) == 35_136
    assert any("multi-token-prediction" in n for n in arch.notes)


def test_mixtral_8x7b_parameters() -> None:
    arch = fixture_arch("mixtral-8x7b")
    assert (arch.num_experts, arch.num_experts_per_token, arch.num_shared_experts, arch.moe_layers) == (8, 2, 0, 32)
    assert arch.params_total == 46_702_792_704
    assert arch.params_active == 12_879_925_248
    assert arch.params_total == pytest.approx(46.7e9, rel=0.02)
    assert arch.params_active == pytest.approx(12.9e9, rel=0.02)
    assert arch.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2


def test_qwen3_moe_fields_and_dense_layers() -> None:
    arch = fixture_arch("qwen3-30b-a3b")
    assert (arch.num_experts, arch.num_experts_per_token, arch.moe_layers) == (128, 8, 48)
    assert arch.params_per_expert == 3 * 2048 * 768
    assert arch.params_total == pytest.approx(30.5e9, rel=0.02)  # the model card's 30.5B / 3.3B
    assert arch.params_active == pytest.approx(3.3e9, rel=0.02)
    config = json.loads((FIXTURES / "qwen3-30b-a3b.json").read_text())
    # decoder_sparse_step 2 routes layers 2, 4, ...; mlp_only_layers keeps the listed ones dense.
    assert arch_from_config({**config, "decoder_sparse_step": 2}, "q", "t").moe_layers == 24
    assert arch_from_config({**config, "mlp_only_layers": [0, 47]}, "q", "t").moe_layers == 46
    fewer = arch_from_config({**config, "mlp_only_layers": [0]}, "q", "t")
    dense_minus_moe_layer = 3 * 2048 * 6144 - (128 * 3 * 2048 * 768 + 128 * 2048)
    assert fewer.params_total - arch.params_total == dense_minus_moe_layer
    # Qwen2-MoE style: one shared expert of its own width, with a one-output gate, in every MoE layer.
    shared = arch_from_config({**config, "shared_expert_intermediate_size": 4096}, "q", "t")
    assert shared.num_shared_experts == 1
    assert shared.params_active - arch.params_active == 48 * (3 * 2048 * 4096 + 2048)


def test_expected_experts_touched_by_hand() -> None:
    assert expected_experts_touched(8, 2, 1) == pytest.approx(2.0)
    assert expected_experts_touched(8, 2, 2) == pytest.approx(3.5)
    assert expected_experts_touched(256, 8, 32) == pytest.approx(163.3, abs=0.05)
    assert expected_experts_touched(0, 0, 64) == 0.0


@pytest.mark.parametrize("name", ["deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_batch_bytes_from_one_token_to_all_weights(name: str) -> None:
    arch = fixture_arch(name)
    held, read_one_token = weight_bytes(arch, 1.0)
    steps = [moe_step(arch, 1.0, b) for b in (1, 2, 4, 8, 16, 32, 64, 256, 1024, 100_000)]
    assert steps[0].weight_bytes == pytest.approx(read_one_token)
    assert all(a.weight_bytes <= b.weight_bytes for a, b in zip(steps, steps[1:], strict=False))
    assert all(a.weight_bytes < b.weight_bytes for a, b in zip(steps[:5], steps[1:5], strict=False))
    assert steps[-1].weight_bytes <= held - arch.params_embedding * 2.0 + 1.0
    assert steps[-1].weight_bytes == pytest.approx(held - arch.params_embedding * 2.0, rel=1e-9)
    # Attention, dense layers and shared experts are read once per step, whatever the batch.
    assert len({round(s.shared_bytes) for s in steps}) == 1
    # Not one token's active bytes times the batch: at B = 4 far less than 4 x, attention included once.
    assert steps[2].weight_bytes < 4 * read_one_token


def test_mixtral_step_bytes_by_hand() -> None:
    arch = fixture_arch("mixtral-8x7b")
    step = moe_step(arch, 2.0, 2)
    expert_bytes = 176_160_768 * 2.0
    assert step.routed_bytes == pytest.approx(32 * 3.5 * expert_bytes)
    _, read_one_token = weight_bytes(arch, 2.0)
    assert step.weight_bytes == pytest.approx(read_one_token + 32 * 1.5 * expert_bytes)


def test_expert_parallelism_divides_the_routed_bytes_and_adds_an_all_to_all() -> None:
    arch = fixture_arch("deepseek-v3")
    alone, spread = moe_step(arch, 1.0, 64), moe_step(arch, 1.0, 64, expert_parallel=8)
    assert alone.all_to_all_bytes == 0.0
    assert spread.routed_bytes == pytest.approx(alone.routed_bytes)
    assert spread.routed_bytes_per_device == pytest.approx(alone.routed_bytes / 8)
    assert spread.all_to_all_bytes == 2 * 64 * 8 * 7168 * 2 * 58 == 851_443_712


def test_plan_from_a_config_json_fixture(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "deepseek-v3")
    features = Features(weights_dtype="fp8", tensor_parallel_size=8)
    plan = make_plan(gpu_config(str(folder), features), gpu="H200", batches=[1, 64])
    assert plan.moe is not None and plan.moe.routing == ROUTING_RULE
    assert ROUTING_ASSUMPTION in plan.assumptions
    assert plan.moe.params_active == 37_552_282_624 and plan.moe.expert_parallel == 1
    # FP8 body, BF16 embedding and head: the token's read is its 35.70 G active body bytes plus the 1.85 GB head.
    kv_per_seq = 70_272 * plan.memory.mean_decode_context_tokens
    assert step_bytes(plan, 1) == pytest.approx(37_552_282_624 - 926_679_040 + 926_679_040 + kv_per_seq)
    bandwidth = plan.hardware.count * plan.hardware.bandwidth_bytes_per_s
    assert plan.ceilings[0].decode_output_tok_per_s == pytest.approx(bandwidth / step_bytes(plan, 1))
    expected_64 = 64 * bandwidth / (moe_step(plan.arch, 1.0, 64).weight_bytes + 64 * kv_per_seq)
    assert decode_ceiling(plan, 64) == pytest.approx(expected_64)
    assert plan.memory.kv_bytes_per_token_per_device == 70_272  # the MLA latent is not split by TP
    spread = make_plan(gpu_config(str(folder), features), gpu="H200", batches=[64], expert_parallel=True)
    assert spread.moe is not None and spread.moe.expert_parallel == 8
    assert spread.moe.steps[0].all_to_all_bytes == 851_443_712
    assert decode_ceiling(spread, 64) == pytest.approx(decode_ceiling(plan, 64))


def test_expert_parallelism_of_a_dense_model_is_refused(tmp_path: Path) -> None:
    config = gpu_config("meta-llama/Meta-Llama-3-8B-Instruct", Features(weights_dtype="fp8"))
    assert make_plan(config, gpu="H100 SXM", batches=[1]).moe is None
    with pytest.raises(PlannerError, match="mixture-of-experts"):
        make_plan(config, gpu="H100 SXM", batches=[1], expert_parallel=True)


def test_plan_command_prints_active_and_total_and_the_routing(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = model_folder(tmp_path, "mixtral-8x7b")
    profile = tmp_path / "mixtral.toml"
    profile.write_text(f'name = "Mixtral"\n[engine]\nkind = "vllm"\nmodel = "{folder}"\n'
                       '[engine.runtime]\nkind = "executable"\nexecutable = "vllm"\n'
                       '[features]\nweights_dtype = "bf16"\ntensor_parallel_size = 2\n')
    assert main(["plan", str(profile), "--gpu", "H100 SXM", "--expert-parallel"]) == 0
    out = capsys.readouterr().out
    assert "12.88 B active of 46.70 B parameters per token" in out
    assert "uniform and independent" in out and "E x (1 - (1 - k/E)^B)" in out
    assert "expert parallel over 2 devices, 4 experts each" in out
    assert "experts touched/layer" in out and "all-to-all/step" in out


def test_safetensors_headers_keep_the_routed_split(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "mixtral-8x7b")
    arch = arch_from_folder(folder, "m")  # no headers: counted from the config
    assert arch.params_routed == 32 * 8 * 176_160_768
    assert arch.params_routed_active == 32 * 2 * 176_160_768
