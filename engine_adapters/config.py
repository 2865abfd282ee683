"""The typed description of an engine launch: where the engine comes from, which model, and
which acceleration features are switched on.

Engine-agnostic on purpose: each adapter maps these fields to its own flags. The run-level
configuration (workload, load) lives in ``app.config`` and embeds these models, because
``engine_adapters`` must never import ``app``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

DEMO_MODEL = "tunebench:demo"
"""Model id that resolves to the tiny, locally generated demo model in the user cache."""

MAX_SEED = 2**63 - 1
"""Seeds are stored as SQLite integers (signed 64-bit)."""
MAX_ENGINE_TOKENS = 2**31 - 1
"""Engines keep lengths and batch sizes in 32-bit integers."""
MAX_PARALLEL = 4096
MAX_TIMEOUT_S = 7 * 86_400.0
"""A week: a startup timeout longer than that is a typo (and ``inf`` is refused)."""
MAX_GIB = 1_048_576.0
"""A pebibyte of offload space: more is a typo."""


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character (it cannot be passed as a command-line argument)")
    return value


ArgStr = Annotated[str, AfterValidator(_no_nul)]
ReasoningParser = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
"""A reasoning parser's name as the engine spells it (vLLM ``deepseek_r1``, SGLang ``deepseek-r1``)."""
"""A string that ends up in an engine's argv or environment."""


PANEL_RANK = "panel_rank"
ON_PANEL = "on_panel"


def panel_row(rank: int) -> JsonDict:
    """``Field(json_schema_extra=panel_row(3))``: where the workbench's configuration panel lists the
    setting in its group. Rows go by rank, equal ranks in the model's order, unranked ones last; the
    fields of a nested model take the rank of the field that holds it unless they have their own."""
    return {PANEL_RANK: rank}


def not_on_panel() -> JsonDict:
    """``Field(json_schema_extra=not_on_panel())``: a setting for profile files only; the panel has no
    row for it (nor for the fields of a nested model so marked)."""
    return {ON_PANEL: False}


class StrictModel(BaseModel):
    """Base for configuration models: unknown keys are errors (a typo in a profile must not
    silently fall back to a default), types are strict (``concurrency = "2"`` or ``true`` and
    ``prefix_caching = "yes"`` are refused; an integer is still a valid float), and no number
    is ``nan`` or infinite."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


RuntimeKind = Literal["managed", "python", "executable", "docker"]


class RuntimeConfig(StrictModel):
    """Where the engine's code comes from."""

    kind: RuntimeKind = "managed"
    managed: str = Field("vllm-cpu", description="Name of a tunebench-managed runtime (kind=managed).")
    python: ArgStr | None = Field(None, description="Interpreter of a venv that has the engine installed (kind=python).")
    executable: ArgStr | None = Field(None, description="Engine executable on PATH or a path, e.g. 'vllm' (kind=executable).")
    docker_image: ArgStr = Field("vllm/vllm-openai:latest", description="Image for kind=docker.")
    env: dict[ArgStr, ArgStr] = Field(default_factory=dict, description="Extra environment for the engine process.",
                                      json_schema_extra=not_on_panel())

    @model_validator(mode="after")
    def _needs_its_field(self) -> RuntimeConfig:
        if self.kind == "python" and not self.python:
            raise ValueError("runtime kind 'python' needs 'python' = path to the venv's interpreter")
        if self.kind == "executable" and not self.executable:
            raise ValueError("runtime kind 'executable' needs 'executable' = the engine command, e.g. 'vllm'")
        return self


EngineKind = Literal["vllm", "llamacpp", "sglang", "trtllm"]


class EngineConfig(StrictModel):
    """Which engine serves which model, and where it listens."""

    kind: EngineKind = Field("vllm", json_schema_extra=panel_row(3))
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, json_schema_extra=panel_row(2))
    model: ArgStr = Field(DEMO_MODEL, min_length=1, json_schema_extra=panel_row(1),
                          description="Model path or hub id ('tunebench:demo' = the local demo model).")
    served_model_name: ArgStr | None = Field(None, json_schema_extra=not_on_panel())
    tokenizer: ArgStr | None = Field(None, json_schema_extra=not_on_panel())
    host: str = Field("127.0.0.1", json_schema_extra=not_on_panel())
    port: int = Field(0, ge=0, le=65535, json_schema_extra=panel_row(4), description="0 = pick a free port at launch.")
    require_api_key: bool = Field(True, json_schema_extra=not_on_panel(),
                                  description="Protect the server with a per-run API key.")
    startup_timeout_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S, json_schema_extra=not_on_panel())

    @field_validator("model")
    @classmethod
    def _model_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("model must not be blank")
        return value


WeightsDtype = Literal["auto", "bf16", "fp16", "fp8", "awq", "gptq", "q8_0", "q4_0"]
GGUF_WEIGHT_BITS: dict[str, float] = {"q8_0": 8.5, "q4_0": 4.5}
"""llama.cpp's block-quantized weight types that tunebench makes from a model's 16-bit GGUF (the
``gguf`` package quantizes them; not the K-quants), and their bits per weight with the block's
scale: a block of 32 weights is 32 8-bit (Q8_0) or 4-bit (Q4_0) values plus one FP16 scale, so 34
or 18 bytes. The one table of these types: the adapters, the quantizer and the planner read it."""
GGUF_WEIGHTS_ENGINE = "llamacpp"
"""The engine that serves those types (the others quantize weights their own way: FP8, AWQ, GPTQ)."""
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0"]
"""``q8_0``/``q4_0``: llama.cpp's block-quantized KV cache (8 and 4 bits plus a scale per 32 values)."""
SpecMethod = Literal["off", "ngram", "eagle", "eagle3", "mtp", "draft_model"]
KvOffloadBackend = Literal["native", "lmcache"]
DistributedBackend = Literal["mp", "ray"]
"""vLLM's executor for several GPUs: ``mp`` (processes on one machine) or ``ray`` (a Ray cluster, across machines)."""


class SpeculativeConfig(StrictModel):
    """Speculative decoding: a cheap drafter proposes tokens, the model verifies them in one pass."""

    method: SpecMethod = "off"
    draft_model: ArgStr | None = Field(None, description="Draft/EAGLE head model (eagle, eagle3, draft_model).")
    num_speculative_tokens: int = Field(3, ge=1, le=16)
    ngram_prompt_lookup_min: int = Field(1, ge=1, le=16)
    ngram_prompt_lookup_max: int = Field(4, ge=1, le=32)

    @model_validator(mode="after")
    def _window_ordered(self) -> SpeculativeConfig:
        if self.ngram_prompt_lookup_min > self.ngram_prompt_lookup_max:
            raise ValueError("ngram_prompt_lookup_min must not exceed ngram_prompt_lookup_max")
        return self


KvConnector = Literal["nixl", "mooncake", "lmcache"]
"""How KV moves from a prefill engine to a decode engine (NIXL, Mooncake, LMCache); each adapter
names the engine's own connector or transfer backend for it."""
PdRole = Literal["prefill", "decode"]
PdPlacement = Literal["together", "spread"]


class DisaggregationConfig(StrictModel):
    """Disaggregated prefill/decode: prompts are prefilled on one pool of engines, their KV moved
    by ``connector`` to a second pool that decodes, behind a router. Off while ``connector`` is None."""

    connector: KvConnector | None = None
    prefill_instances: int = Field(1, ge=1, le=MAX_PARALLEL, description="Engines in the prefill pool.")
    decode_instances: int = Field(1, ge=1, le=MAX_PARALLEL, description="Engines in the decode pool.")
    prefill_tensor_parallel_size: int | None = Field(
        None, ge=1, le=MAX_PARALLEL, description="GPUs per prefill engine (tensor parallel); None: tensor_parallel_size.")
    decode_tensor_parallel_size: int | None = Field(
        None, ge=1, le=MAX_PARALLEL, description="GPUs per decode engine (tensor parallel); None: tensor_parallel_size.")
    kv_buffer_device: Literal["auto", "cpu"] = Field(
        "auto", description="Where the connector stages KV: 'cpu' for engines without a GPU (vLLM's CPU build).")
    placement: PdPlacement = Field(
        "together", description="On a Ray cluster: 'spread' puts every pool engine on a node of its own (the router "
                                "and the load client beside the first decode engine); 'together' keeps the group on "
                                "one node, as one machine runs it.")
    role: PdRole | None = Field(None, description="Set on each pool's engine by the launch, never by hand.")

    @property
    def enabled(self) -> bool:
        return self.connector is not None

    @property
    def spread(self) -> bool:
        return self.enabled and self.placement == "spread"


class Features(StrictModel):
    """The acceleration features a user toggles. ``None`` means "engine default".

    Each field is described once, for tooltips and grouping, in
    :data:`engine_adapters.features.FEATURES`; each adapter maps it to flags.
    """

    weights_dtype: WeightsDtype = "auto"
    kv_cache_dtype: KvCacheDtype = "auto"
    prefix_caching: bool | None = None
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    cpu_offload_gib: float = Field(0.0, ge=0, le=MAX_GIB)
    kv_offload_gib: float = Field(0.0, ge=0, le=MAX_GIB)
    kv_offload_backend: KvOffloadBackend | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = Field(None, ge=1, le=MAX_ENGINE_TOKENS)
    max_num_batched_tokens: int | None = Field(None, ge=1, le=MAX_ENGINE_TOKENS)
    max_model_len: int | None = Field(None, ge=16, le=MAX_ENGINE_TOKENS)
    cuda_graphs: bool = True
    chunked_prefill: bool | None = None
    gpu_layers: int | None = Field(None, ge=0, le=MAX_ENGINE_TOKENS,
                                   description="Layers kept on the GPU (llama.cpp -ngl); None = the engine decides.")
    flash_attention: bool | None = None
    tensor_parallel_size: int = Field(1, ge=1, le=MAX_PARALLEL)
    pipeline_parallel_size: int = Field(1, ge=1, le=MAX_PARALLEL)
    data_parallel_size: int = Field(1, ge=1, le=MAX_PARALLEL,
                                    description="Replicas of the model, each on TP x PP GPUs (vLLM --data-parallel-size).")
    distributed_executor_backend: DistributedBackend | None = None
    nodes: int = Field(1, ge=1, le=MAX_PARALLEL,
                       description="Machines the GPUs span: an export-only topology (a local launch is one machine).")
    reasoning_parser: ReasoningParser | None = Field(
        None, description="The engine's parser that streams a reasoning model's thinking apart from its answer "
                          "(vLLM and SGLang --reasoning-parser: qwen3, deepseek_r1, ...).")
    disaggregation: DisaggregationConfig = Field(default_factory=DisaggregationConfig)
    expert_parallel_size: int = Field(1, ge=1, le=MAX_PARALLEL,
                                      description="GPUs a MoE's routed experts are spread over, whole (1: off).")
    eplb: bool = Field(False, description="Expert-parallel load balancing: hot experts replicated and moved.")
    extra_args: list[ArgStr] = Field(default_factory=list)

    def pool_tensor_parallel_size(self, role: PdRole) -> int:
        """GPUs per tensor-parallel group of one engine of a P/D pool."""
        d = self.disaggregation
        own = d.prefill_tensor_parallel_size if role == "prefill" else d.decode_tensor_parallel_size
        return own or self.tensor_parallel_size

    def pool_instances(self, role: PdRole) -> int:
        d = self.disaggregation
        return d.prefill_instances if role == "prefill" else d.decode_instances

    @property
    def engine_count(self) -> int:
        """Engine processes the configuration starts: one, or every prefill and decode engine of
        a disaggregated group (its router is not an engine)."""
        d = self.disaggregation
        if d.enabled and d.role is None:
            return self.pool_instances("prefill") + self.pool_instances("decode")
        return 1

    def pool_gpu_count(self, role: PdRole) -> int:
        """GPUs a P/D pool uses: its engines x their tensor x pipeline parallel."""
        return self.pool_instances(role) * self.pool_tensor_parallel_size(role) * self.pipeline_parallel_size

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one copy of the model spans: tensor x pipeline parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpu_count(self) -> int:
        """GPUs the configuration uses in all: every data-parallel replica's TP x PP. The one
        definition the planner, tuner, ladder, validation and exports count with. Disaggregated
        (and not one pool's engine): both pools."""
        d = self.disaggregation
        if d.enabled and d.role is None:
            return self.pool_gpu_count("prefill") + self.pool_gpu_count("decode")
        return self.gpus_per_replica * self.data_parallel_size
