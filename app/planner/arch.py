"""A model's architecture without downloading its weights: ``config.json`` and the safetensors
headers of a local folder or the Hugging Face cache, or, for the hub ids the shipped profiles
name, a small curated table.

Parameters are counted exactly from the safetensors headers when they are present (each header
gives every tensor's shape and dtype), otherwise from the config by the standard decoder formula.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from app.errors import UserError
from engine_adapters.config import DEMO_MODEL

SAFETENSORS_HEADER_MAX_BYTES = 100 * 2**20
"""A header larger than this is not a safetensors header (refused rather than read)."""


class PlannerError(UserError):
    """The plan cannot be made: says what is missing."""


class ModelArch(BaseModel):
    """What the physics needs to know about a decoder-only model."""

    model_id: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool = False
    num_experts: int = Field(0, description="MoE: routed experts per MoE layer (0 for a dense model)")
    num_experts_per_token: int = Field(0, description="MoE: routed experts each token goes to (top-k)")
    num_shared_experts: int = Field(0, description="MoE: experts every token goes through, per MoE layer")
    moe_layers: int = Field(0, description="MoE: layers whose FFN is routed (the rest are dense)")
    params_per_expert: int = Field(0, description="MoE: parameters of one routed expert's FFN in one layer")
    moe_intermediate_size: int | None = None
    sliding_window: int | None = None
    kv_lora_rank: int | None = Field(None, description="MLA: compressed KV width (DeepSeek-style)")
    qk_rope_head_dim: int | None = None
    full_attention_layers: int | None = Field(
        None, description="Hybrid models: layers with a growing KV cache (the rest keep a fixed-size state)")
    linear_state_bytes_per_seq: int = Field(
        0, description="Hybrid models: fixed recurrent state per sequence (read and written every step)")
    params_total: int
    params_embedding: int = Field(description="Input embedding table (only the batch's rows are read per step)")
    params_lm_head: int = Field(description="Output head (0 when tied to the embedding)")
    params_active: int = Field(description="Parameters used per token (MoE: only the routed experts)")
    params_exact: bool = Field(False, description="Counted from safetensors headers, not estimated from the config")
    checkpoint_bytes: int | None = Field(None, description="Bytes of the tensors on disk, from the headers")
    source: str = ""
    notes: list[str] = Field(default_factory=list)

    @property
    def params_routed(self) -> int:
        """All routed experts of all MoE layers: the parameters a token may or may not touch."""
        return self.moe_layers * self.num_experts * self.params_per_expert

    @property
    def params_routed_active(self) -> int:
        """The routed experts one token goes through (top-k in every MoE layer)."""
        return self.moe_layers * self.num_experts_per_token * self.params_per_expert

    @property
    def kv_layers(self) -> int:
        return self.full_attention_layers if self.full_attention_layers is not None else self.num_layers

    def kv_bytes_per_token(self, kv_dtype_bytes: float) -> float:
        """K and V of one token across all attention layers (MLA: one compressed latent plus the rope key)."""
        if self.kv_lora_rank:
            return self.kv_layers * (self.kv_lora_rank + (self.qk_rope_head_dim or 0)) * kv_dtype_bytes
        return 2 * self.kv_layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes


# --- from a config ------------------------------------------------------------------------------

def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal checkpoints nest the language model's settings under ``text_config``."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def _int(config: dict[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    if default is None:
        raise PlannerError(f"config.json lacks {keys[0]}")
    return default


class _Counts(BaseModel):
    total: int
    embedding: int
    head: int
    active: int
    experts: int = 0
    experts_per_token: int = 0
    moe_layers: int = 0
    shared_experts: int = 0
    params_per_expert: int = 0


def _attention_params(c: dict[str, Any], hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """One layer's attention projections: grouped-query, or DeepSeek's multi-head latent attention
    (queries and keys/values through low-rank projections, with their RMSNorms)."""
    kv_rank = _int(c, "kv_lora_rank", default=0)
    if not kv_rank:
        return hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    rope = _int(c, "qk_rope_head_dim", default=0)
    nope = _int(c, "qk_nope_head_dim", default=head_dim)
    v_dim = _int(c, "v_head_dim", default=nope)
    q_rank = _int(c, "q_lora_rank", default=0)
    q_head = nope + rope
    query = hidden * q_rank + q_rank + q_rank * heads * q_head if q_rank else hidden * heads * q_head
    key_value = hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim)
    return query + key_value + heads * v_dim * hidden


def moe_layer_count(c: dict[str, Any], layers: int) -> int:
    """Layers whose FFN is routed: DeepSeek keeps its first ``first_k_dense_replace`` layers dense
    (and routes every ``moe_layer_freq``-th after them); Qwen-MoE routes every
    ``decoder_sparse_step``-th layer except ``mlp_only_layers``; Mixtral routes every layer."""
    first_dense = _int(c, "first_k_dense_replace", default=0)
    every = max(1, _int(c, "moe_layer_freq", "decoder_sparse_step", default=1))
    dense_only = c.get("mlp_only_layers")
    skipped = {i for i in dense_only if isinstance(i, int)} if isinstance(dense_only, list) else set()
    if "decoder_sparse_step" in c:  # Qwen-MoE counts from layer 1
        return sum(1 for i in range(layers) if i not in skipped and (i + 1) % every == 0)
    return sum(1 for i in range(first_dense, layers) if i not in skipped and i % every == 0)


def _params_from_config(c: dict[str, Any], layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                        inter: int, vocab: int, tied: bool) -> _Counts:
    """Total, embedding, lm_head and active parameters by the standard decoder formula (gated MLP,
    RMSNorm). A MoE layer holds its routed experts, its shared experts and a router; a token goes
    through the shared experts and top-k routed ones."""
    attn = _attention_params(c, hidden, heads, kv_heads, head_dim)
    dense_mlp = 3 * hidden * inter
    experts = _int(c, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    moe_layers = moe_layer_count(c, layers) if experts else 0
    per_token = _int(c, "num_experts_per_tok", "num_experts_per_token", default=0)
    moe_inter = _int(c, "moe_intermediate_size", default=inter)
    per_expert = 3 * hidden * moe_inter
    shared = _int(c, "n_shared_experts", default=0)
    shared_inter = _int(c, "shared_expert_intermediate_size", default=0)
    shared_params = 3 * hidden * shared_inter + hidden if shared_inter else shared * per_expert  # + its gate
    router = hidden * experts
    norms = 2 * hidden
    embedding = vocab * hidden
    head = 0 if tied else vocab * hidden
    dense_layers = layers - moe_layers
    body_total = dense_layers * (attn + dense_mlp + norms) + moe_layers * (
        attn + experts * per_expert + shared_params + router + norms)
    body_active = dense_layers * (attn + dense_mlp + norms) + moe_layers * (
        attn + per_token * per_expert + shared_params + router + norms)
    return _Counts(total=embedding + head + hidden + body_total, embedding=embedding, head=head,
                   active=embedding + head + hidden + body_active, experts=experts,
                   experts_per_token=per_token if experts else 0, moe_layers=moe_layers,
                   shared_experts=shared or (1 if shared_inter else 0),
                   params_per_expert=per_expert if experts else 0)


def arch_from_config(config: dict[str, Any], model_id: str, source: str) -> ModelArch:
    c = _text_config(config)
    hidden = _int(c, "hidden_size", "n_embd", "d_model")
    layers = _int(c, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(c, "num_attention_heads", "n_head")
    kv_heads = _int(c, "num_key_value_heads", "num_kv_heads", default=heads)
    mla_head_dim = _int(c, "qk_nope_head_dim", default=0) + _int(c, "qk_rope_head_dim", default=0)
    head_dim = _int(c, "head_dim", default=mla_head_dim if c.get("kv_lora_rank") else hidden // heads)
    inter = _int(c, "intermediate_size", "ffn_dim", default=4 * hidden)
    vocab = _int(c, "vocab_size")
    tied = bool(c.get("tie_word_embeddings", False))
    counts = _params_from_config(c, layers, hidden, heads, kv_heads, head_dim, inter, vocab, tied)
    total, embedding, head, active = counts.total, counts.embedding, counts.head, counts.active
    layer_types = c.get("layer_types")
    full_layers = None
    state_bytes = 0
    notes: list[str] = []
    if isinstance(layer_types, list) and any(t == "linear_attention" for t in layer_types):
        full_layers = sum(1 for t in layer_types if t == "full_attention")
        linear_layers = len(layer_types) - full_layers
        v_heads = _int(c, "linear_num_value_heads", default=0)
        k_dim = _int(c, "linear_key_head_dim", default=128)
        v_dim = _int(c, "linear_value_head_dim", default=128)
        state_dtype_bytes = 4 if str(c.get("mamba_ssm_dtype", "float32")) == "float32" else 2
        state_bytes = linear_layers * v_heads * k_dim * v_dim * state_dtype_bytes
        notes.append(f"hybrid attention: {full_layers} of {len(layer_types)} layers keep a KV cache; the other "
                     f"{linear_layers} keep a fixed {state_bytes / 2**20:.0f} MiB state per sequence")
    mtp_layers = _int(c, "num_nextn_predict_layers", default=0)
    if mtp_layers:
        notes.append(f"the {mtp_layers} multi-token-prediction layer(s) are not counted (a drafter, not the model)")
    nominal = c.get("tunebench_nominal_params")
    if isinstance(nominal, int) and nominal > 0:  # curated entries whose layers the formula does not model
        active += nominal - total
        total = nominal
        notes.append(f"parameter count {nominal / 1e9:.1f} B is the model's nominal size, not counted")
    return ModelArch(
        model_id=model_id, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=inter, vocab_size=vocab, tie_embeddings=tied, num_experts=counts.experts,
        num_experts_per_token=counts.experts_per_token,
        num_shared_experts=counts.shared_experts, moe_layers=counts.moe_layers,
        params_per_expert=counts.params_per_expert,
        moe_intermediate_size=_int(c, "moe_intermediate_size", default=0) or None,
        sliding_window=c.get("sliding_window") if c.get("use_sliding_window", True) else None,
        kv_lora_rank=c.get("kv_lora_rank"), qk_rope_head_dim=c.get("qk_rope_head_dim"),
        full_attention_layers=full_layers, linear_state_bytes_per_seq=state_bytes,
        params_total=total, params_embedding=embedding, params_lm_head=head, params_active=active,
        source=source, notes=notes)


# --- safetensors headers ------------------------------------------------------------------------

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
               "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (8-byte little-endian length, then JSON): no weights read."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(8)
            if len(raw) != 8:
                raise PlannerError(f"{path}: not a safetensors file (too short)")
            (length,) = struct.unpack("<Q", raw)
            if length > SAFETENSORS_HEADER_MAX_BYTES:
                raise PlannerError(f"{path}: not a safetensors file (header of {length} bytes)")
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as exc:
        raise PlannerError(f"{path}: cannot read the safetensors header: {exc}") from None
    if not isinstance(header, dict):
        raise PlannerError(f"{path}: not a safetensors header")
    return header


def count_from_headers(files: list[Path]) -> tuple[int, int, dict[str, int]]:
    """(parameters, bytes, parameters per tensor name) over the checkpoint's files."""
    params = size = 0
    per_name: dict[str, int] = {}
    for path in files:
        for name, info in read_safetensors_header(path).items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            count = 1
            for dim in info.get("shape", []):
                count *= int(dim)
            per_name[name] = count
            params += count
            size += count * DTYPE_BYTES.get(str(info.get("dtype")), 2)
    return params, size, per_name


# --- where a model lives ------------------------------------------------------------------------

def _hf_cache_snapshot(model_id: str) -> Path | None:
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or Path.home() / ".cache" /
                                                        "huggingface") / "hub")
    folder = hub / ("models--" + model_id.replace("/", "--")) / "snapshots"
    if not folder.is_dir():
        return None
    snapshots = sorted((p for p in folder.iterdir() if (p / "config.json").is_file()), key=lambda p: p.stat().st_mtime)
    return snapshots[-1] if snapshots else None


def local_model_dir(model: str) -> Path | None:
    """A local folder with config.json for a path, the demo model id, or a hub id in the HF cache."""
    if model == DEMO_MODEL:
        from engine_adapters.runtimes import demo_model_dir

        folder = demo_model_dir()
        return folder if (folder / "config.json").is_file() else None
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return path
    return _hf_cache_snapshot(model)


def arch_from_folder(folder: Path, model_id: str) -> ModelArch:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PlannerError(f"{folder / 'config.json'}: cannot read: {exc}") from None
    if not isinstance(config, dict):
        raise PlannerError(f"{folder / 'config.json'}: not a JSON object")
    arch = arch_from_config(config, model_id, source=f"{folder / 'config.json'}")
    files = sorted(folder.glob("*.safetensors"))
    if files:
        params, size, per_name = count_from_headers(files)
        embedding = next((n for k, n in per_name.items() if k.endswith("embed_tokens.weight")), arch.params_embedding)
        head = next((n for k, n in per_name.items() if k.endswith("lm_head.weight")), 0)
        active = arch.params_active + (params - arch.params_total) if not arch.num_experts else arch.params_active
        arch = arch.model_copy(update={
            "params_total": params, "params_embedding": embedding, "params_lm_head": head, "params_active": active,
            "params_exact": True, "checkpoint_bytes": size,
            "source": f"{arch.source} and {len(files)} safetensors header(s)"})
    return arch


# Hub ids the shipped profiles (and the planner's checks) name, for machines without the checkpoint.
# Each entry is the config.json fields that matter, with where they come from.
CURATED_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "meta-llama/Meta-Llama-3-8B-Instruct": ({
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False},
        "curated from meta-llama/Meta-Llama-3-8B config.json"),
    "meta-llama/Llama-3.3-70B-Instruct": ({
        "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 28672, "vocab_size": 128256, "tie_word_embeddings": False},
        "curated from meta-llama/Llama-3.3-70B-Instruct config.json"),
    "Qwen/Qwen3.6-27B-FP8": ({
        "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4,
        "head_dim": 256, "intermediate_size": 17408, "vocab_size": 248320, "tie_word_embeddings": False,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
        "linear_num_value_heads": 48, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32", "tunebench_nominal_params": 27_000_000_000},
        "curated, APPROXIMATE: the Qwen3.5/3.6 hybrid layout (one full-attention layer in four) at 27B; "
        "check against the checkpoint's config.json"),
}
ALIASES = {
    "meta-llama/Meta-Llama-3-8B": "meta-llama/Meta-Llama-3-8B-Instruct",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Llama-3.3-70B-Instruct",
    "meta-llama/Meta-Llama-3-70B-Instruct": "meta-llama/Llama-3.3-70B-Instruct",
    "Qwen/Qwen3.6-27B": "Qwen/Qwen3.6-27B-FP8",
}


def load_arch(model: str) -> ModelArch:
    """The model's architecture: local files first, then the curated table; else a clear error."""
    folder = local_model_dir(model)
    if folder is not None:
        return arch_from_folder(folder, model)
    key = ALIASES.get(model, model)
    if key in CURATED_CONFIGS:
        config, source = CURATED_CONFIGS[key]
        return arch_from_config(dict(config), model, source=source)
    raise PlannerError(
        f"no architecture for model '{model}': not a local folder with config.json, not in the Hugging Face cache, "
        f"and not in tunebench's curated table ({', '.join(sorted(CURATED_CONFIGS))}); download its config.json and "
        f"*.safetensors headers, or point engine.model at a local copy")
