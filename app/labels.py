"""Human names of configuration settings and of their values, defined once for every face that
names a setting: the GUI's editors and their messages, the Compare view's configuration
differences, the A/B headline ("prefix caching off -> on"), a suggested run name and the HTML
report. Pure Python (no Qt), so the report and the CLI can use it too.

Features are named by the feature catalogue (``engine_adapters.features``); the rest by
:data:`LABELS`, or by their field name made readable (:func:`humanize`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from app.analysis.compare import flatten
from engine_adapters.features import FEATURES_BY_KEY
from engine_adapters.registry import ADAPTERS

LABELS: dict[str, str] = {
    "engine.kind": "Engine", "engine.runtime.kind": "Runtime", "engine.runtime.managed": "Managed runtime",
    "engine.runtime.python": "Python (venv)", "engine.runtime.executable": "Executable",
    "engine.runtime.docker_image": "Docker image", "engine.model": "Model", "engine.port": "Port (0 = free)",
    "engine.runtime": "Runtime", "engine.version": "Engine version", "model": "Model",
    "hardware.gpus": "GPUs", "hardware.cpu": "CPU", "hardware.driver": "GPU driver",
    "workload.kind": "Workload", "workload.num_requests": "Requests", "workload.api": "API",
    "workload.input_len.mean": "Input tokens (mean)", "workload.output_len.mean": "Output tokens (mean)",
    "workload.input_len.distribution": "Input length shape", "workload.input_len.spread": "Input spread (tokens)",
    "workload.output_len.distribution": "Output length shape", "workload.output_len.spread": "Output spread (tokens)",
    "workload.shared_prefix_tokens": "Shared prefix (tokens)", "workload.shared_prefix_fraction": "Share with the prefix",
    "workload.turns": "Turns per conversation", "workload.seed": "Seed", "workload.temperature": "Temperature",
    "workload.ignore_eos": "Ignore EOS (exact lengths)", "workload.dataset_path": "Dataset file",
    "workload.cache": "Prefix cache at start",
    "load.pattern": "Load pattern", "load.concurrency": "Concurrency", "load.rate_rps": "Rate (req/s)",
    "load.burstiness": "Burstiness", "load.ramp_start_rps": "Ramp start (req/s)", "load.levels": "Levels",
    "load.sweep_of": "Sweep of", "load.max_concurrency": "Max in flight", "load.duration_s": "Duration (s)",
    "load.max_requests": "Max requests", "load.warmup_requests": "Warm-up requests", "load.slo": "Goodput SLOs",
    "load.max_error_fraction": "Error budget (fraction)", "load.request_timeout_s": "Request timeout (s)",
    "load.workers": "Client processes",
    "features.kv_offload_backend": "KV offload backend",
    "features.speculative.ngram_prompt_lookup_min": "N-gram window (min)",
}

NO_VALUE_TEXT: dict[str, str] = {
    "load.duration_s": "no limit", "load.max_requests": "all of them", "load.max_concurrency": "no cap",
    "load.rate_rps": "not set", "load.slo": "none", "workload.dataset_path": "none",
    "engine.runtime.python": "not set", "engine.runtime.executable": "not set",
}
"""What an unset optional setting means, where it is not an engine default (client-side limits)."""

ENGINE_DEFAULT = "engine default"


def engine_defaults(kind: str = "vllm") -> Mapping[str, Any]:
    """What the engine does with a switch left unset (``{"prefix_caching": True}``), as its
    adapter declares it; empty when it declares nothing."""
    defaults = getattr(ADAPTERS.get(kind), "engine_defaults", None)
    return defaults if isinstance(defaults, Mapping) else {}


def humanize(name: str) -> str:
    """``max_error_fraction`` -> ``Max error fraction``; keeps unit suffixes readable."""
    words = name.split("_")
    units = {"s": "(s)", "ms": "(ms)", "gib": "(GiB)", "rps": "(req/s)", "pct": "(%)"}
    if len(words) > 1 and words[-1] in units:
        words[-1] = units[words[-1]]
    text = " ".join(words)
    return text[:1].upper() + text[1:]


def label_for(path: str) -> str:
    """The name a person reads for a setting path (``features.prefix_caching`` -> ``Prefix caching``)."""
    info = FEATURES_BY_KEY.get(path.removeprefix("features."))
    if info is not None and path.startswith("features."):
        return info.label
    return LABELS.get(path) or humanize(path.rsplit(".", 1)[-1])


def lower_first(label: str) -> str:
    """``Prefix caching`` -> ``prefix caching`` in running text; ``KV-cache precision`` and
    ``API`` keep their capitals."""
    if len(label) > 1 and label[0].isupper() and label[1].islower():
        return label[0].lower() + label[1:]
    return label


def no_value_text(path: str) -> str:
    """What ``None`` means for this setting: a client-side "no limit", or the engine's default."""
    return NO_VALUE_TEXT.get(path, ENGINE_DEFAULT if path.startswith("features.") else "not set")


def _number(value: float) -> str:
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.4g}"


def value_text(path: str, value: Any, engine_default: Any = None) -> str:
    """A setting's value as a person says it: ``on``/``off``, ``16``, ``engine default (on)``."""
    if value is None:
        text = no_value_text(path)
        if text == ENGINE_DEFAULT and engine_default is not None:
            return f"{value_text(path, engine_default)} ({ENGINE_DEFAULT})"
        return text
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int | float):
        return _number(value) if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return ", ".join(value_text(path, v) for v in value) or "none"
    return str(value)


# Messages name fields by their path's last part (``rate_rps``); a person knows them by label.
_FIELD_WORD = re.compile(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b")


def in_field_words(message: str, paths: Iterable[str]) -> str:
    """``load pattern 'poisson' needs rate_rps`` -> ``... needs Rate (req/s)``: every field name
    of ``paths`` that appears in a message is replaced by its label."""
    by_name: dict[str, str] = {}
    for path in paths:
        by_name.setdefault(path.rsplit(".", 1)[-1], label_for(path))
    return _FIELD_WORD.sub(lambda m: by_name.get(m.group(1), m.group(1)), message)


def describe_change(diff: Sequence[tuple[str, Sequence[Any]]], before: int = 0, after: int = 1,
                    *, max_items: int = 2, engine_defaults: Mapping[str, Any] | None = None) -> str:
    """What changed between two columns of a configuration diff, as a person says it:
    ``prefix caching off -> on, concurrency 8 -> 16`` (the first ``max_items``, then "+N more")."""
    defaults = engine_defaults or {}
    parts = []
    for key, values in diff:
        if key.startswith(("hardware.", "imported_from")) or key == "engine.version":
            continue
        default = defaults.get(key.removeprefix("features."))
        a, b = (value_text(key, values[i], default) for i in (before, after))
        parts.append(f"{lower_first(label_for(key))} {a} \u2192 {b}")
    if len(parts) > max_items:
        return ", ".join(parts[:max_items]) + f" (+{len(parts) - max_items} more)"
    return ", ".join(parts)


def suggest_run_name(config: Mapping[str, Any], previous: Mapping[str, Any] | None, fallback: str,
                     *, engine_defaults: Mapping[str, Any] | None = None, max_items: int = 2) -> str:
    """A run name from what differs from the previous run: ``prefix caching on`` or
    ``concurrency 16, output tokens (mean) 32``; ``fallback`` (the profile's name) when nothing
    differs or there is no previous run."""
    if previous is None:
        return fallback
    now, before = flatten(dict(config)), flatten(dict(previous))
    skip = ("name", "description", "tags")
    defaults = engine_defaults or {}
    parts = []
    for key in sorted(set(now) & set(before)):  # a setting the other run did not record is not a change
        if key in skip or repr(now.get(key)) == repr(before.get(key)):
            continue
        parts.append(f"{lower_first(label_for(key))} {value_text(key, now.get(key), defaults.get(key.removeprefix('features.')))}")
    if not parts:
        return fallback
    if len(parts) > max_items:
        return ", ".join(parts[:max_items]) + f" (+{len(parts) - max_items} more)"
    return ", ".join(parts)


def features_on(features: Mapping[str, Any]) -> list[str]:
    """The features set away from their defaults, as a person says them (``prefix caching on``,
    ``KV-cache precision fp8``): what a presentation's title shows. A switch left to the engine
    is not listed."""
    from engine_adapters.config import Features

    now, default = flatten(dict(features)), flatten(Features().model_dump())
    out = []
    for info in FEATURES_BY_KEY.values():
        value = now.get(info.key)
        if value is None or value == default.get(info.key) or value == [] or (
                info.key == "speculative.method" and value == "off"):
            continue
        if info.key.startswith("speculative.") and info.key != "speculative.method" and now.get(
                "speculative.method") in (None, "off"):
            continue
        out.append(f"{lower_first(info.label)} {value_text('features.' + info.key, value)}")
    return out
