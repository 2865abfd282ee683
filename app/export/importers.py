"""Other tools' results in: ``vllm bench serve`` (one result, or several appended), GuideLLM's
``benchmarks.json`` and tunebench's own run export, each stored as a run marked imported.

All or nothing: a file is read whole, every value is checked and converted in memory, and only
then are all its runs written, in one store transaction. A bad value anywhere leaves no run
behind, and the one-line message names the field (``ttfts[3]: inf is not a finite number``).
Bounds admit every real measurement and refuse what would overflow the store or the charts.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.errors import UserError, read_user_text
from app.export.checks import (
    MAX_COUNT,
    MAX_EPOCH_S,
    MAX_LEVEL_INDEX,
    MAX_MONO_S,
    MAX_MS,
    ImportProblem,
    as_list,
    as_object,
    as_text,
    count,
    json_object,
    key_name,
    metric,
    parse_date,
    real,
    reals,
    request_record,
    show,
    summary_map,
)
from app.export.data import EXPORT_FORMAT
from app.load.client import SAMPLE_MAX_PIECES, SAMPLE_PROMPT_CHARS
from app.store import FINAL_STATUSES, ImportedRun, LevelInfo, RunStore, SampleIn, StoreError

MAX_IMPORT_BYTES = 256 * 2**20


def level_sample(value: Any, field: str) -> dict[str, Any] | None:
    """A level's request as it streamed (``app.load.client.stream_sample``), checked: as many text
    pieces as arrival times (which never go back) and token counts, within the kept sizes."""
    if value is None:
        return None
    sample = json_object(value, field)
    times = reals(sample.get("t_ms"), f"{field}.t_ms", 0.0, MAX_MS)
    pieces = [as_text(p, f"{field}.text[{i}]") for i, p in enumerate(as_list(sample.get("text"), f"{field}.text"))]
    tokens = [count(n, f"{field}.tokens[{i}]", MAX_COUNT) or 0
              for i, n in enumerate(as_list(sample.get("tokens"), f"{field}.tokens"))]
    if not len(times) == len(pieces) == len(tokens) or len(times) > SAMPLE_MAX_PIECES:
        raise ImportProblem(f"{field}: t_ms, text and tokens must be as long as each other (at most "
                            f"{SAMPLE_MAX_PIECES}), got {len(times)}, {len(pieces)} and {len(tokens)}")
    if any(later < earlier for earlier, later in itertools.pairwise(times)):
        raise ImportProblem(f"{field}.t_ms: arrival times must not go back")
    return {"prompt": as_text(sample.get("prompt"), f"{field}.prompt")[:SAMPLE_PROMPT_CHARS], "text": pieces,
            "t_ms": times, "tokens": tokens, "output_tokens": sum(tokens),
            "ttft_ms": real(sample.get("ttft_ms"), f"{field}.ttft_ms", 0.0, MAX_MS),
            "e2e_ms": real(sample.get("e2e_ms"), f"{field}.e2e_ms", 0.0, MAX_MS),
            "start_wall_s": real(sample.get("start_wall_s"), f"{field}.start_wall_s", 0.0, MAX_EPOCH_S)}
"""Largest result file read (a detailed ``vllm bench serve`` result of 100k requests is ~100 MB)."""


# --- vllm bench serve ----------------------------------------------------------------------------

_VLLM_BENCH_METRICS = {
    "output_throughput": "output_tok_per_s", "request_throughput": "requests_per_s", "duration": "duration_s",
    "total_token_throughput": "total_tok_per_s", "request_goodput": "goodput_rps",
}
_VLLM_BENCH_STATS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
_VLLM_BENCH_SETTINGS = ("backend", "endpoint_type", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
                        "burstiness", "max_concurrency")


def _vllm_bench_metrics(data: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, name in _VLLM_BENCH_METRICS.items():
        if (v := metric(data.get(key), key)) is not None:
            out[name] = float(v)
    for short, name in _VLLM_BENCH_STATS.items():
        for stat, suffix in (("mean", "mean"), ("median", "p50"), ("p90", "p90"), ("p99", "p99")):
            if (v := metric(data.get(f"{stat}_{short}_ms"), f"{stat}_{short}_ms")) is not None:
                out[f"{name}_{suffix}"] = float(v)
    completed = count(data.get("completed"), "completed", MAX_COUNT)
    failed = count(data.get("failed"), "failed", MAX_COUNT) or 0
    if completed is not None:
        out["requests_total"] = float(completed + failed)
        out["requests_failed"] = float(failed)
        out["error_rate_pct"] = 100.0 * failed / (completed + failed) if completed + failed else 0.0
    return out


def _vllm_bench(data: Mapping[str, Any], source: str, name: str | None) -> ImportedRun:
    """A ``vllm bench serve --save-result [--save-detailed]`` result (times in seconds)."""
    started = parse_date(data.get("date")) or time.time()
    ttfts = as_list(data.get("ttfts"), "ttfts")
    n = len(ttfts)

    def column(key: str) -> list[Any]:
        value = data.get(key)
        if value is None:
            return [None] * n
        if not isinstance(value, list) or len(value) != n:
            raise ImportProblem(f"{key}: expected a list with one entry per request ({n})")
        return value

    itls, latencies, ins, outs, errors = (column(k) for k in ("itls", "latencies", "input_lens", "output_lens",
                                                               "errors"))
    starts = [real(s, f"start_times[{i}]", -MAX_MONO_S, MAX_MONO_S) for i, s in enumerate(column("start_times"))]
    first = min((s for s in starts if s is not None), default=0.0)
    requests = []
    for i, start in enumerate(starts):
        where = {"ttft_ms": f"ttfts[{i}]", "e2e_ms": f"latencies[{i}]", "input_tokens": f"input_lens[{i}]",
                 "output_tokens": f"output_lens[{i}]", "itl_ms": f"itls[{i}]", "error": f"errors[{i}]",
                 "start_wall": f"start_times[{i}]"}
        record = request_record(where, ttft_ms=ttfts[i], e2e_ms=latencies[i], input_tokens=ins[i],
                                output_tokens=outs[i], itl_ms=itls[i], error=errors[i], scale=1e3,
                                start_wall=None if start is None else started + (start - first))
        if record["error"]:  # a failed request's zeros are not measurements
            record.update(ttft_ms=None, e2e_ms=None, itl_ms=[])
        requests.append(record)
    model = as_text(data.get("model_id") or data.get("model"), "model_id")
    settings = json_object({k: data[k] for k in _VLLM_BENCH_SETTINGS if k in data}, "settings")
    summary = {k: m for k, v in data.items() if (m := metric(v, key_name(k))) is not None}
    duration_s = real(data.get("duration"), "duration", 0.0, MAX_EPOCH_S)
    return ImportedRun(
        name=name or f"vllm bench serve {model}".strip(), imported_from=f"vllm bench serve: {source}",
        started_at=started, finished_at=started + (duration_s or 0.0), model=model, engine_kind="vllm",
        config={"imported": {"tool": "vllm bench serve", **settings}}, summary=summary,
        extra_metrics=_vllm_bench_metrics(data), requests=requests)


# --- GuideLLM ------------------------------------------------------------------------------------

_GUIDELLM_STATS = {"time_to_first_token_ms": ("ttft_ms", 1.0), "inter_token_latency_ms": ("itl_ms", 1.0),
                   "time_per_output_token_ms": ("tpot_ms", 1.0), "request_latency": ("e2e_ms", 1000.0)}
_GUIDELLM_RATES = {"output_tokens_per_second": "output_tok_per_s", "requests_per_second": "requests_per_s",
                   "tokens_per_second": "total_tok_per_s"}


def _guidellm_metrics(metrics: Mapping[str, Any], field: str) -> dict[str, float]:
    """A benchmark's figures. Every part read must have its shape (an object where GuideLLM writes
    one): a part of another type is refused, not read as missing."""
    out: dict[str, float] = {}

    def successful(key: str) -> tuple[Mapping[str, Any], str]:
        """A distribution's successful requests (older files: the distribution itself) and its field."""
        node = as_object(metrics.get(key), f"{field}.{key}")
        if "successful" not in node:
            return node, f"{field}.{key}"
        return as_object(node["successful"], f"{field}.{key}.successful"), f"{field}.{key}.successful"

    for key, (name, scale) in _GUIDELLM_STATS.items():
        stats, where = successful(key)
        pcts = as_object(stats.get("percentiles"), f"{where}.percentiles")
        for src, suffix in (("mean", "mean"), ("median", "p50")):
            if (v := metric(stats.get(src), f"{where}.{src}")) is not None:
                out[f"{name}_{suffix}"] = v * scale
        for p in ("p90", "p99"):
            if (v := metric(pcts.get(p), f"{where}.percentiles.{p}")) is not None:
                out[f"{name}_{p}"] = v * scale
    for key, name in _GUIDELLM_RATES.items():
        stats, where = successful(key)
        if (v := metric(stats.get("mean"), f"{where}.mean")) is not None:
            out[name] = float(v)
    totals = as_object(metrics.get("request_totals"), f"{field}.request_totals")
    ok = count(totals.get("successful"), f"{field}.request_totals.successful", MAX_COUNT)
    bad = sum(count(totals.get(k), f"{field}.request_totals.{k}", MAX_COUNT) or 0 for k in ("errored", "incomplete"))
    if ok is not None:
        out["requests_total"], out["requests_failed"] = float(ok + bad), float(bad)
        out["error_rate_pct"] = 100.0 * bad / (ok + bad) if ok + bad else 0.0
    return out


def _find_model(*nodes: Any) -> str:
    """The model a GuideLLM benchmark ran against (looked up without recursion, a few levels deep)."""
    queue = [n for n in nodes if isinstance(n, Mapping)]
    for node in queue:  # breadth first; grows as it goes
        for key in ("model", "backend_model", "model_id"):
            if isinstance(node.get(key), str) and node[key]:
                return str(node[key])
        if len(queue) < 64:
            queue += [node[k] for k in ("backend", "worker", "backend_args", "args") if isinstance(node.get(k), Mapping)]
    return ""


def _guidellm(data: Mapping[str, Any], source: str, name: str | None) -> ImportedRun:
    """A GuideLLM ``benchmarks.json``: one level per benchmark. The structure is checked as it is
    read: a benchmark, request or part of its metrics that is not an object is refused by name."""
    benchmarks = [as_object(b, f"benchmarks[{i}]", required=True)
                  for i, b in enumerate(as_list(data.get("benchmarks"), "benchmarks"))]
    if not benchmarks:
        raise UserError(f"{source}: a GuideLLM file without benchmarks")
    requests: list[dict[str, Any]] = []
    levels: list[LevelInfo] = []
    for idx, bench in enumerate(benchmarks):
        field = f"benchmarks[{idx}]"
        reqs = as_object(bench.get("requests"), f"{field}.requests")
        for state in ("successful", "errored", "incomplete"):
            for j, item in enumerate(as_list(reqs.get(state), f"{field}.requests.{state}")):
                r = as_object(item, f"{field}.requests.{state}[{j}]", required=True)
                where = f"{field}.requests.{state}[{j}]."
                ok = state == "successful"
                start_key = "start_time" if r.get("start_time") is not None else "request_start_time"
                names = {"start_wall": where + start_key, "input_tokens": where + "prompt_tokens",
                         "output_tokens": where + "output_tokens", "error": where + "error"}
                record = request_record(names, level=idx, start_wall=r.get(start_key), input_tokens=r.get("prompt_tokens"),
                                  output_tokens=r.get("output_tokens"), error=None if ok else r.get("error") or state)
                if ok:
                    record["ttft_ms"] = real(r.get("time_to_first_token_ms"), f"{where}time_to_first_token_ms",
                                              0.0, MAX_MS)
                    record["e2e_ms"] = real(r.get("request_latency"), f"{where}request_latency", 0.0, MAX_MS, 1e3)
                requests.append(record)
        profile = as_object(as_object(bench.get("args"), f"{field}.args").get("profile"), f"{field}.args.profile")
        label = as_text(profile.get("type_") or profile.get("strategy_type"), f"{field}.args.profile.type_")
        levels.append(LevelInfo(idx=idx, label=label or f"benchmark {idx}",
                                summary=_guidellm_metrics(as_object(bench.get("metrics"), f"{field}.metrics"),
                                                          f"{field}.metrics"),
                                started_at=real(bench.get("start_time"), f"{field}.start_time", 0.0, MAX_EPOCH_S),
                                finished_at=real(bench.get("end_time"), f"{field}.end_time", 0.0, MAX_EPOCH_S)))
    model = _find_model(benchmarks[0], data.get("args"))
    started = min((lv.started_at for lv in levels if lv.started_at), default=None) or time.time()
    ended = max((lv.finished_at for lv in levels if lv.finished_at), default=None) or started
    summaries = [lv.summary or {} for lv in levels]
    metrics = dict(summaries[0]) if len(levels) == 1 else {
        f"L{lv.idx}.{k}": v for lv, s in zip(levels, summaries, strict=True) for k, v in s.items()}
    return ImportedRun(name=name or f"GuideLLM {model}".strip(), imported_from=f"GuideLLM: {source}",
                       started_at=started, finished_at=ended, model=model,
                       config={"imported": {"tool": "GuideLLM", "benchmarks": len(levels)}},
                       extra_metrics=metrics, requests=requests, levels=levels)


# --- tunebench's own export ----------------------------------------------------------------------

def _tunebench_request(rec: Any, field: str) -> dict[str, Any]:
    if not isinstance(rec, Mapping):
        raise ImportProblem(f"{field}: expected an object, got {show(rec)}")
    extra = json_object(rec.get("extra"), f"{field}.extra")
    return request_record(f"{field}.", level=rec.get("level"), start_wall=rec.get("start_wall"), ttft_ms=rec.get("ttft_ms"),
                    e2e_ms=rec.get("e2e_ms"), input_tokens=rec.get("input_tokens"),
                    output_tokens=rec.get("output_tokens"), itl_ms=rec.get("itl_ms"), error=rec.get("error"),
                    extra=extra)


def _samples(raw: Any) -> list[SampleIn]:
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        raise ImportProblem(f"samples: expected an object with one entry per source, got {show(raw)}")
    out: list[SampleIn] = []
    for source, block in raw.items():
        field = f"samples.{key_name(source)}"
        if not isinstance(block, Mapping):
            raise ImportProblem(f"{field}: expected an object, got {show(block)}")
        names = [as_text(n, f"{field}.names[{i}]") for i, n in enumerate(as_list(block.get("names"), f"{field}.names"))]
        t_mono = reals(block.get("t_mono"), f"{field}.t_mono", -MAX_MONO_S, MAX_MONO_S)
        t_wall = reals(block.get("t_wall"), f"{field}.t_wall", 0.0, MAX_EPOCH_S)
        rows = as_list(block.get("values"), f"{field}.values")
        if not len(t_mono) == len(t_wall) == len(rows):
            raise ImportProblem(f"{field}: t_mono, t_wall and values differ in length "
                                f"({len(t_mono)}, {len(t_wall)}, {len(rows)})")
        for i, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != len(names):
                raise ImportProblem(f"{field}.values[{i}]: expected a list of {len(names)} values")
            values: dict[str, float] = {}
            for name, v in zip(names, row, strict=True):
                if v is None or (v.__class__ is float and not math.isfinite(v)):
                    continue  # not sampled
                values[name] = real(v, f"{field}.values[{i}]", -math.inf, math.inf)  # type: ignore[assignment]
            out.append(SampleIn(str(source), t_mono[i], t_wall[i], values))
    return out


def _tunebench(data: Mapping[str, Any], source: str, name: str | None) -> ImportedRun:
    run = data.get("run")
    if not isinstance(run, Mapping):
        raise UserError(f"{source}: not a tunebench run export (it has no 'run' object)")
    levels: list[LevelInfo] = []
    for i, lv in enumerate(as_list(run.get("levels"), "run.levels")):
        field = f"run.levels[{i}]"
        if not isinstance(lv, Mapping):
            raise ImportProblem(f"{field}: expected an object, got {show(lv)}")
        idx = count(lv.get("idx", i), f"{field}.idx", MAX_LEVEL_INDEX)
        if idx is None or any(other.idx == idx for other in levels):
            raise ImportProblem(f"{field}.idx: each level needs its own index, got {show(idx)}")
        levels.append(LevelInfo(
            idx=idx, label=as_text(lv.get("label"), f"{field}.label"), params=json_object(lv.get("params"),
                                                                                          f"{field}.params"),
            started_at=real(lv.get("started_at"), f"{field}.started_at", 0.0, MAX_EPOCH_S),
            finished_at=real(lv.get("finished_at"), f"{field}.finished_at", 0.0, MAX_EPOCH_S),
            summary=summary_map(lv.get("summary"), f"{field}.summary"),
            sample=level_sample(lv.get("sample"), f"{field}.sample")))
    status = as_text(run.get("status"), "run.status", "completed")
    status = "interrupted" if status == "running" else status  # its recorder is not coming back
    if status not in FINAL_STATUSES:
        raise ImportProblem(f"run.status: {show(status)} is not a run status ({', '.join(FINAL_STATUSES)})")
    argv = run.get("argv")
    started = real(run.get("started_at"), "run.started_at", 0.0, MAX_EPOCH_S) or time.time()
    return ImportedRun(
        name=name or as_text(run.get("name"), "run.name") or "imported", imported_from=f"tunebench: {source}",
        started_at=started, finished_at=real(run.get("finished_at"), "run.finished_at", 0.0, MAX_EPOCH_S) or started,
        status=status, reason=as_text(run.get("reason"), "run.reason") or None, notes=as_text(run.get("notes"), "run.notes"),
        model=as_text(run.get("model"), "run.model"), engine_kind=as_text(run.get("engine_kind"), "run.engine_kind"),
        engine_version=as_text(run.get("engine_version"), "run.engine_version") or None,
        t0_mono=real(run.get("t0_mono"), "run.t0_mono", -MAX_MONO_S, MAX_MONO_S),
        config=json_object(run.get("config"), "run.config"), hardware=json_object(run.get("hardware"), "run.hardware"),
        argv=None if argv is None else [as_text(a, f"run.argv[{i}]") for i, a in enumerate(as_list(argv, "run.argv"))],
        tags=[as_text(t, f"run.tags[{i}]") for i, t in enumerate(as_list(run.get("tags"), "run.tags"))],
        summary=summary_map(run.get("summary"), "run.summary"),
        requests=[_tunebench_request(r, f"requests[{i}]") for i, r in enumerate(as_list(data.get("requests"), "requests"))],
        samples=_samples(data.get("samples")), levels=levels,
        log_lines=[as_text(line, f"log[{i}]") for i, line in enumerate(as_list(data.get("log"), "log"))])


# --- files ---------------------------------------------------------------------------------------

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
        except RecursionError:
            raise UserError(f"{path}: not valid JSON (nested too deeply)") from None
        except ValueError as exc:  # an integer of more than 4300 digits
            raise UserError(f"{path}: not valid JSON ({str(exc).splitlines()[0]})") from None
        docs.append(doc)
    if not docs:
        raise UserError(f"{path}: empty file")
    return docs


def _parse_document(data: Any, path: Path, name: str | None) -> ImportedRun:
    """One document as a run, checked in memory; nothing is written."""
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    try:
        if data.get("format") == EXPORT_FORMAT:
            return _tunebench(data, path.name, name)
        if isinstance(data.get("benchmarks"), list):
            return _guidellm(data, path.name, name)
        if any(k in data for k in ("ttfts", "output_throughput", "p99_ttft_ms", "request_throughput")):
            return _vllm_bench(data, path.name, name)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise UserError(f"{path}: could not import: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                        ) from None
    raise UserError(f"{path}: not a vllm bench serve result, a GuideLLM benchmarks.json or a tunebench run export")


def parse_results(path: str | Path, name: str | None = None) -> list[ImportedRun]:
    """The runs in a result file, checked in memory (:func:`import_results` stores them)."""
    path = Path(path)
    docs = _json_documents(read_user_text(path, "file", max_bytes=MAX_IMPORT_BYTES), path)
    runs = []
    for i, doc in enumerate(docs):
        label = name if name is None or len(docs) == 1 else f"{name} #{i + 1}"
        try:
            runs.append(_parse_document(doc, path, label))
        except UserError as exc:
            if len(docs) == 1:
                raise
            raise UserError(f"document {i + 1} of {len(docs)} in {exc}") from None
    return runs


def import_results(store: RunStore, path: str | Path, name: str | None = None) -> list[int]:
    """Import a ``vllm bench serve`` result (one, or several appended), a GuideLLM
    ``benchmarks.json`` or a tunebench run export as runs marked imported; returns their ids.
    All or nothing: every document is checked before anything is written, and all are written
    in one transaction."""
    runs = parse_results(path, name)
    try:
        return store.import_runs(runs)
    except StoreError as exc:
        raise UserError(f"{path}: could not import: {exc}") from None
