"""Disaggregated prefill/decode and expert parallelism, the parts every engine shares: each
pool's engine configuration and the checks before a launch. The launch of the whole group
(prefill engines, decode engines and the router that joins them) is ``engine_adapters.pd_group``.

What an engine calls its connector, its pool flags and its router is the adapter's
(:class:`DisaggregatedEngine`); this module knows no engine by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from engine_adapters.base import ValidationIssue
from engine_adapters.config import EngineConfig, Features, PdRole
from engine_adapters.hardware import HardwareInfo
from engine_adapters.runtimes import RuntimeErrorMessage, resolve_model

POOL_ROLES: tuple[PdRole, ...] = ("prefill", "decode")
GROUP_SETTINGS = ("prefill_instances", "decode_instances", "prefill_tensor_parallel_size", "decode_tensor_parallel_size",
              "placement")
"""The group's settings (``DisaggregationConfig``): no single engine's flag renders them."""
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
"""Where a ``config.json`` gives a MoE's routed experts (DeepSeek, Qwen-MoE, Mixtral, others)."""


class DisaggregatedEngine(Protocol):
    """What an engine adds to run as a P/D group: its router, and each pool engine's environment."""

    display_name: str
    router_api_key_env: str
    """Where the router reads the key it presents to the pools' engines."""
    pool_metrics: frozenset[str]
    """The samples of the pools' engines' and the router's /metrics that a run keeps per pool
    (prefill and decode tokens, KV transfer, the router's requests)."""

    def router_argv(self, engine: EngineConfig, features: Features, prefill: Sequence[tuple[str, int]],
                    decode_urls: Sequence[str], port: int, *, metrics_port: int | None = None,
                    portable: bool = False) -> list[str]:
        """The router's argv: it listens on ``port`` (its metrics on ``metrics_port`` where it has
        them) and joins the pools' engines (``prefill``: each prefill engine's URL and side port)."""
        ...

    def pool_env(self, features: Features, side_port: int, host: str = "127.0.0.1") -> dict[str, str]:
        """Environment one pool engine needs for its connector (``side_port``: a free port of its
        own; ``host``: the address it listens on, another node's when the pools are spread)."""
        ...

    def pool_args(self, features: Features, side_port: int) -> list[str]:
        """Arguments one pool engine needs beyond its features' flags (a bootstrap port)."""
        ...


def pool_features(features: Features, role: PdRole) -> Features:
    """The features one engine of a pool runs with: its pool's tensor parallel size, no data
    parallelism (a pool's size is its engines), and its role, which its adapter turns into flags."""
    return features.model_copy(update={
        "tensor_parallel_size": features.pool_tensor_parallel_size(role), "data_parallel_size": 1,
        "disaggregation": features.disaggregation.model_copy(update={"role": role})})


def disaggregation_issues(features: Features, hardware: HardwareInfo | None, *, cpu_build: bool,
                          display_name: str) -> list[ValidationIssue]:
    """The checks every engine shares before a P/D launch, each in one line."""
    d = features.disaggregation
    if not d.enabled:
        default = type(d)()
        return [ValidationIssue(f"disaggregation.{name}", "has no effect: disaggregated prefill/decode is off "
                                                         "(set disaggregation.connector)")
                for name in GROUP_SETTINGS if getattr(d, name) != getattr(default, name)][:1]
    issues: list[ValidationIssue] = []
    if features.data_parallel_size > 1:
        issues.append(ValidationIssue("data_parallel_size", "with disaggregated prefill/decode, size the pools "
                                      "(prefill_instances, decode_instances) instead of data parallel replicas"))
    if d.role is None and hardware is not None and features.nodes == 1 and not d.spread:
        need = features.gpu_count
        if cpu_build:
            engines = d.prefill_instances + d.decode_instances
            if engines > max(hardware.cpu_count_logical, 1):
                issues.append(ValidationIssue(
                    "disaggregation.prefill_instances",
                    f"{engines} CPU engines ({d.prefill_instances} prefill + {d.decode_instances} decode) need at least "
                    f"one core each; this machine has {hardware.cpu_count_logical}"))
        elif need > len(hardware.gpus):
            issues.append(ValidationIssue(
                "disaggregation.prefill_instances",
                f"the P/D pools need {need} GPUs ({_pool_text(features, 'prefill')} + {_pool_text(features, 'decode')}); "
                f"{len(hardware.gpus)} visible: shrink the pools, or export a multi-node recipe "
                "(--format ray or k8s-multinode)"))
    if cpu_build and d.kv_buffer_device != "cpu":
        issues.append(ValidationIssue("disaggregation.kv_buffer_device",
                                      f"{display_name}'s CPU build has no GPU to stage KV in: set kv_buffer_device = 'cpu'"))
    return issues


def _pool_text(features: Features, role: PdRole) -> str:
    return (f"{role} {features.pool_instances(role)} x TP {features.pool_tensor_parallel_size(role)}"
            + (f" x PP {features.pipeline_parallel_size}" if features.pipeline_parallel_size > 1 else ""))


def expert_count(model_config: Mapping[str, Any]) -> int | None:
    """A model's routed experts per MoE layer, 0 for a dense model, None when the config is empty."""
    if not model_config:
        return None
    inner = model_config.get("text_config")
    config = {**model_config, **inner} if isinstance(inner, Mapping) else model_config
    for key in EXPERT_COUNT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def local_model_config(engine: EngineConfig) -> dict[str, Any]:
    """The model's config.json when the model is a local folder; {} when it cannot be read here."""
    try:
        path = Path(resolve_model(engine.model)).expanduser() / "config.json"
        data = json.loads(path.read_text(encoding="utf-8"))
    except (RuntimeErrorMessage, OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def expert_parallel_issues(engine: EngineConfig, features: Features) -> list[ValidationIssue]:
    """EP needs a mixture-of-experts model (told from a local config.json; a hub id is not
    looked up), and EPLB needs EP."""
    issues: list[ValidationIssue] = []
    if features.eplb and features.expert_parallel_size == 1:
        issues.append(ValidationIssue("eplb", "expert load balancing needs expert parallelism: set expert_parallel_size"))
    if features.expert_parallel_size > 1 and expert_count(local_model_config(engine)) == 0:
        issues.append(ValidationIssue("expert_parallel_size",
                                      f"expert parallelism needs a mixture-of-experts model; {engine.model} is dense "
                                      "(its config.json names no routed experts)"))
    return issues


def has_router(adapter: object) -> bool:
    """Whether an adapter can launch a P/D group (it names a router)."""
    return all(callable(getattr(adapter, name, None)) for name in ("router_argv", "pool_env", "pool_args"))
