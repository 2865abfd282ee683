"""The planner's physics against figures worked out by hand: Llama-3-8B and 70B parameter and KV
sizes, the batch-1 FP8 decode ceiling on an H100, memory warnings, and the CPU demo's KV plan
against what vLLM's CPU build allocates (1 GiB / 1,024 bytes per token)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from app.cli import main
from app.config import RunConfig
from app.planner import PlannerError, load_arch, make_plan, percent_of_ceiling
from app.planner.arch import arch_from_folder
from app.planner.plan import Hardware, decode_ceiling
from app.planner.seeds import check_stacking_table
from app.workload import LengthSpec, LoadConfig, WorkloadConfig
from engine_adapters.config import EngineConfig, Features, RuntimeConfig
from engine_adapters.gpu_specs import GPU_SPECS, find_gpu_spec

LLAMA_8B = "meta-llama/Meta-Llama-3-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.3-70B-Instruct"


def gpu_config(model: str, features: Features | None = None, concurrency: int = 1, input_len: int = 16,
               output_len: int = 16) -> RunConfig:
    return RunConfig(engine=EngineConfig(model=model, runtime=RuntimeConfig(kind="executable", executable="vllm")),
                     features=features or Features(),
                     workload=WorkloadConfig(input_len=LengthSpec(mean=input_len), output_len=LengthSpec(mean=output_len)),
                     load=LoadConfig(concurrency=concurrency))


def test_llama_3_8b_parameters_and_kv() -> None:
    arch = load_arch(LLAMA_8B)
    assert arch.params_total == 8_030_261_248
    assert arch.kv_bytes_per_token(2) == 131_072
    assert arch.kv_bytes_per_token(1) == 65_536
    plan = make_plan(gpu_config(LLAMA_8B, Features(weights_dtype="bf16")), gpu="H100 SXM")
    assert plan.memory.weights_bytes == pytest.approx(16.06e9, rel=1e-3)


def test_llama_3_8b_fp8_batch_1_ceiling_on_h100() -> None:
    plan = make_plan(gpu_config(LLAMA_8B, Features(weights_dtype="fp8")), gpu="H100 SXM", batches=[1])
    ceiling = plan.ceilings[0].decode_output_tok_per_s
    assert 370 <= ceiling <= 420, ceiling
    assert ceiling == pytest.approx(417, abs=3)  # FP8 body, BF16 head, embedding rows only
    assert any("output head stay BF16" in a for a in plan.assumptions)
    # More sequences share one read of the weights: the ceiling rises with the batch, sub-linearly.
    assert decode_ceiling(plan, 64) > 30 * ceiling
    assert decode_ceiling(plan, 64) < 64 * ceiling


def test_llama_70b_kv_and_fit_warning() -> None:
    assert load_arch(LLAMA_70B).kv_bytes_per_token(2) == 327_680
    one_gpu = make_plan(gpu_config(LLAMA_70B, Features(weights_dtype="bf16")), gpu="H100 SXM", gpus=1)
    assert not one_gpu.memory.fits
    assert any("does not fit" in w for w in one_gpu.warnings)
    four = make_plan(gpu_config(LLAMA_70B, Features(weights_dtype="bf16", tensor_parallel_size=4)), gpu="H100 SXM")
    assert four.memory.fits and four.hardware.count == 4


def test_fp8_kv_doubles_the_sequences_that_fit() -> None:
    features = Features(weights_dtype="fp8")
    bf16 = make_plan(gpu_config(LLAMA_8B, features, input_len=4096), gpu="H100 SXM")
    fp8 = make_plan(gpu_config(LLAMA_8B, features.model_copy(update={"kv_cache_dtype": "fp8"}), input_len=4096),
                    gpu="H100 SXM")
    assert fp8.memory.kv_tokens == pytest.approx(2 * bf16.memory.kv_tokens, rel=1e-6)
    assert fp8.memory.max_concurrent_seqs >= 2 * bf16.memory.max_concurrent_seqs - 1


def test_concurrency_beyond_kv_memory_is_warned() -> None:
    config = gpu_config(LLAMA_8B, Features(weights_dtype="bf16"), concurrency=5000, input_len=8000)
    plan = make_plan(config, gpu="H100 SXM")
    assert any("cannot be held in KV memory" in w for w in plan.warnings)


def test_cpu_demo_kv_plan_matches_vllm_cpu_allocation(tmp_path: Path) -> None:
    """vLLM's CPU build holds VLLM_CPU_KVCACHE_SPACE GiB of KV: 1 GiB / 1,024 bytes = 1,048,576 tokens
    for the demo model (2 layers x 2 KV heads x 64 x 2 bytes x K and V), the figure the engine logs."""
    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "intermediate_size": 512, "vocab_size": 512, "tie_word_embeddings": False}))
    config = RunConfig(engine=EngineConfig(model=str(folder)))
    cpu = Hardware(kind="cpu", name="test CPU", memory_bytes=16 * 2**30, bandwidth_bytes_per_s=10e9)
    plan = make_plan(config, hardware=cpu)
    assert plan.memory.kv_bytes_per_token == 1024
    assert plan.memory.kv_tokens == 1_048_576
    assert plan.prefill_tok_per_s is None and any("prefill ceiling: not computed" in a for a in plan.assumptions)


def test_gguf_weight_types_count_their_bits_with_the_block_scales() -> None:
    """Q8_0 is 34 bytes per 32 weights (8.5 bits), Q4_0 18 bytes (4.5 bits): the body of the model
    shrinks by those factors against BF16, the embedding and the output head stay 16-bit (as the
    quantized GGUF keeps them), and the batch-1 ceiling rises as the bytes read fall."""
    plans = {dtype: make_plan(gpu_config(LLAMA_8B, Features(weights_dtype=dtype)), gpu="H100 SXM", batches=[1])
             for dtype in ("bf16", "q8_0", "q4_0")}
    assert plans["q8_0"].weight_bytes_per_param == 8.5 / 8 and plans["q4_0"].weight_bytes_per_param == 4.5 / 8
    arch = load_arch(LLAMA_8B)
    head_bytes = 2 * (arch.params_embedding + arch.params_lm_head)
    body = arch.params_total - arch.params_embedding - arch.params_lm_head
    for dtype, bits in (("q8_0", 8.5), ("q4_0", 4.5)):
        assert plans[dtype].memory.weights_bytes == pytest.approx(body * bits / 8 + head_bytes)
    ceilings = [plans[d].ceilings[0].decode_output_tok_per_s for d in ("bf16", "q8_0", "q4_0")]
    assert ceilings == sorted(ceilings) and ceilings[0] < ceilings[1] < ceilings[2]


def test_parameters_counted_exactly_from_safetensors_headers(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": 16, "vocab_size": 10}))
    header = {"model.embed_tokens.weight": {"dtype": "BF16", "shape": [10, 8], "data_offsets": [0, 160]},
              "lm_head.weight": {"dtype": "BF16", "shape": [10, 8], "data_offsets": [160, 320]},
              "model.layers.0.mlp.up_proj.weight": {"dtype": "F8_E4M3", "shape": [16, 8], "data_offsets": [320, 448]},
              "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(448))
    arch = arch_from_folder(folder, "m")
    assert arch.params_exact and arch.params_total == 80 + 80 + 128
    assert arch.checkpoint_bytes == 160 + 160 + 128
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(PlannerError, match="not a safetensors file"):
        arch_from_folder(folder, "m")


def test_unknown_model_says_what_is_missing() -> None:
    with pytest.raises(PlannerError, match="config.json"):
        load_arch("nobody/unknown-model-123")


def test_gpu_spec_table_covers_the_cards_and_names() -> None:
    for name in ("A100 40GB", "A100 80GB SXM", "H100 SXM", "H100 PCIe", "H800 SXM", "H20", "H200 SXM", "B200",
                 "L40S", "RTX 4090", "RTX 5090"):
        spec = find_gpu_spec(name)
        assert spec is not None and spec.name == name and spec.source
    assert find_gpu_spec("NVIDIA H100 80GB HBM3").name == "H100 SXM"  # type: ignore[union-attr]
    assert find_gpu_spec("NVIDIA H200").name == "H200 SXM"  # type: ignore[union-attr]
    assert find_gpu_spec("NVIDIA A100-SXM4-40GB").name == "A100 40GB"  # type: ignore[union-attr]
    assert find_gpu_spec("NVIDIA H20").name == "H20"  # type: ignore[union-attr]
    assert all(s.memory_bandwidth_bytes_per_s > 0 for s in GPU_SPECS)


def test_a_measurement_above_the_ceiling_is_flagged_not_a_record() -> None:
    fraction, flag = percent_of_ceiling(120.0, 100.0)
    assert fraction == pytest.approx(1.2) and flag is not None and "above the physical ceiling" in flag
    assert percent_of_ceiling(80.0, 100.0) == (pytest.approx(0.8), None)


def test_seed_stacking_table_single_sequence_is_bounded_by_bandwidth() -> None:
    verdicts = check_stacking_table()
    first = verdicts[0]
    assert first.output_ceiling_tok_per_s == pytest.approx(124, rel=0.05)  # 27 GB / 3.35 TB/s
    assert first.verdict != "output"  # 2,000 tok/s cannot be output tokens of one sequence
    assert [v.row.claimed_tok_per_s for v in verdicts] == [2000, 20000, 35000, 45000, 60000]


def test_plan_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "qwen3-27b-fp8-h100", "--gpu", "H800", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hardware"]["name"] == "H800 SXM" and data["ceilings"]
    assert main(["plan", "qwen3-27b-fp8-h100", "--gpu", "Z9000"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
