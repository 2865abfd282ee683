"""Trace replay: a real trace's requests, at their own arrival times, with their prefix reuse.

A trace says when each request came, how long its prompt and reply were and, in the Mooncake
format, which blocks of its prompt it shared with others. Replaying it shows an engine the load
and the prefix reuse of production, which generated prompts cannot. The formats (docs/workloads.md):

- **Mooncake** (JSONL): ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
  (one id per block of ``block_tokens`` prompt tokens, 512 in Mooncake's traces);
- **Azure LLM inference trace** (CSV): ``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``
  (no prefix information: every prompt is its own);
- **tunebench** (JSONL): ``at_s`` (seconds), ``input_tokens``, ``output_tokens`` and optionally
  ``blocks`` (as Mooncake's ``hash_ids``).

Equal block ids become equal token blocks, so the engine sees the trace's reuse; what the trace
implies (:class:`TraceReuse`) is stated beside the hit rate the engine measures. A bad line
refuses the whole trace, by its line number: a trace replayed in part is not that trace.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from app.errors import UserError, read_user_text
from app.workload import MAX_DURATION_S, LoadConfig

TraceFormat = Literal["auto", "mooncake", "azure", "tunebench"]
TRACE_FORMATS: tuple[str, ...] = ("mooncake", "azure", "tunebench")
MAX_TRACE_BYTES = 2 * 2**30
MAX_TRACE_TOKENS = 2_000_000
"""Longest prompt or reply a trace line may ask for (as ``app.workload.MAX_TOKENS``)."""

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(UserError):
    """A trace that cannot be replayed: missing, unreadable, or a bad line (named by its number)."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it came (seconds from the trace's first), its lengths, and
    the ids of its prompt's blocks (empty: a prompt of its own)."""

    line: int
    at_s: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class TraceReuse:
    """The prefix reuse a trace implies, before any engine sees it.

    ``block_reuse`` counts blocks (1 - distinct / total, as the trace's own statistics do);
    ``prefix_token_reuse`` counts the prompt tokens in whole blocks whose whole prefix came
    before, which is what a prefix cache can hit, and what the engine's hit rate is compared with.
    """

    total_blocks: int
    distinct_blocks: int
    prompt_tokens: int
    prefix_hit_tokens: int

    @property
    def block_reuse(self) -> float | None:
        return 1.0 - self.distinct_blocks / self.total_blocks if self.total_blocks else None

    @property
    def prefix_token_reuse(self) -> float | None:
        return self.prefix_hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    def text(self, block_tokens: int) -> str:
        if not self.total_blocks:
            return "the trace names no shared blocks: it implies no prefix reuse"
        return (f"{self.total_blocks:,} blocks of {block_tokens:,} tokens, {self.distinct_blocks:,} distinct "
                f"({self.block_reuse:.1%} reused); the trace implies {self.prefix_token_reuse:.1%} of prompt "
                f"tokens hit in a prefix cache")


@dataclass(frozen=True)
class Trace:
    """The requests of a trace's window, in arrival order, times counted from the window's first."""

    path: Path
    format: str
    block_tokens: int
    requests: list[TraceRequest]
    span_s: float
    """How long the whole trace lasts (its first to its last arrival), before any window."""

    @property
    def duration_s(self) -> float:
        return self.requests[-1].at_s if self.requests else 0.0

    def reuse(self) -> TraceReuse:
        """What a prefix cache of unbounded size could hit, request after request (a trie of the
        block prefixes seen so far: a block hits only behind the same blocks)."""
        children: dict[tuple[int, int], int] = {}
        distinct: set[int] = set()
        total = prompt = hits = 0
        for req in self.requests:
            prompt += req.input_tokens
            node, matching = 0, True
            for k, block in enumerate(req.blocks):
                total += 1
                distinct.add(block)
                full = (k + 1) * self.block_tokens <= req.input_tokens
                child = children.get((node, block))
                if child is None:
                    matching = False
                    child = children[(node, block)] = len(children) + 1
                elif matching and full:
                    hits += self.block_tokens
                node = child
        return TraceReuse(total, len(distinct), prompt, hits)

    def with_unique_blocks(self) -> Trace:
        """The same trace with every block its own: the arrivals and lengths, none of the reuse."""
        ids = iter(range(1, 1 << 62))
        return Trace(self.path, self.format, self.block_tokens,
                     [TraceRequest(r.line, r.at_s, r.input_tokens, r.output_tokens, tuple(next(ids) for _ in r.blocks))
                      for r in self.requests], self.span_s)


Check = Callable[[], None]


def _no_check() -> None:
    """The check of a read nobody can cancel."""


def text_lines(text: str) -> list[str]:
    """The lines as an editor numbers them: split at newlines only (``str.splitlines`` also splits
    at form feeds, record separators and the like, and line numbers would drift)."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def json_lines(text: str, check: Check) -> Iterator[tuple[int, Any, str | None]]:
    """Each non-blank line of a JSONL text as (its number as an editor counts it, its value, None),
    or (number, None, why it is not JSON): the caller decides whether a bad line skips or stops.
    ``check`` runs before each line, so a long file can be cancelled."""
    for number, raw in enumerate(text_lines(text), start=1):
        check()
        if not raw.strip():
            continue
        try:
            value, problem = json.loads(raw), None
        except json.JSONDecodeError as exc:
            value, problem = None, f"not JSON ({exc.msg})"
        except RecursionError:
            value, problem = None, "JSON nested too deeply"
        yield number, value, problem


def _bad(path: Path, line: int, problem: str) -> TraceError:
    return TraceError(f"{path}: line {line}: {problem}")


def _count(value: Any, name: str, path: Path, line: int, minimum: int = 1) -> int:
    """A whole number of tokens, in range (a float such as 12.0 is accepted, as CSV gives)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _bad(path, line, f"{name} must be a whole number, got {json.dumps(value)[:40]}")
    try:
        number = float(value)
    except ValueError:
        raise _bad(path, line, f"{name} must be a whole number, got {str(value)[:40]!r}") from None
    if not math.isfinite(number) or not number.is_integer():
        raise _bad(path, line, f"{name} must be a whole number, got {str(value)[:40]}")
    if not minimum <= number <= MAX_TRACE_TOKENS:
        raise _bad(path, line, f"{name} must be between {minimum:,} and {MAX_TRACE_TOKENS:,}, got {int(number):,}")
    return int(number)


def _time(value: Any, name: str, path: Path, line: int, scale: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(path, line, f"{name} must be a number, got {json.dumps(value)[:40]}")
    if not math.isfinite(value) or value < 0:
        raise _bad(path, line, f"{name} must be a finite number >= 0, got {value}")
    return float(value) * scale


def _blocks(value: Any, name: str, path: Path, line: int, input_tokens: int, block_tokens: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _bad(path, line, f"{name} must be a list of whole numbers")
    most = math.ceil(input_tokens / block_tokens)
    if len(value) > most:
        raise _bad(path, line, f"{len(value):,} {name} for {input_tokens:,} prompt tokens: at most {most:,} blocks "
                               f"of {block_tokens:,} tokens (trace_block_tokens)")
    return tuple(value)


def _json_lines(text: str, path: Path, check: Check) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for number, obj, problem in json_lines(text, check):
        if problem is not None:
            raise _bad(path, number, problem)
        if not isinstance(obj, dict):
            raise _bad(path, number, f"expected a JSON object, got {type(obj).__name__}")
        out.append((number, obj))
    return out


@dataclass(frozen=True)
class _JsonFormat:
    """A JSONL trace format: its keys, and its time unit in seconds."""

    name: str
    at: str
    seconds_per_unit: float
    input: str
    output: str
    blocks: str
    only_these_keys: bool  # tunebench's own format: a key it does not know is a mistake

    def keys(self) -> tuple[str, ...]:
        return self.at, self.input, self.output, self.blocks


_MOONCAKE = _JsonFormat("Mooncake", "timestamp", 1e-3, "input_length", "output_length", "hash_ids", False)
_TUNEBENCH = _JsonFormat("tunebench trace", "at_s", 1.0, "input_tokens", "output_tokens", "blocks", True)


def _json_trace(text: str, path: Path, block_tokens: int, fmt: _JsonFormat, check: Check) -> list[TraceRequest]:
    out = []
    for number, obj in _json_lines(text, path, check):
        for key in fmt.keys()[:3]:
            if key not in obj:
                raise _bad(path, number, f"no '{key}' (a {fmt.name} line has {', '.join(fmt.keys()[:3])} and "
                                         f"{'optionally ' if fmt.only_these_keys else ''}{fmt.blocks})")
        unknown = sorted(set(obj) - set(fmt.keys())) if fmt.only_these_keys else []
        if unknown:
            raise _bad(path, number, f"unknown key(s) {', '.join(map(repr, unknown[:5]))}")
        tokens = _count(obj[fmt.input], fmt.input, path, number)
        out.append(TraceRequest(number, _time(obj[fmt.at], fmt.at, path, number, fmt.seconds_per_unit), tokens,
                                _count(obj[fmt.output], fmt.output, path, number),
                                _blocks(obj.get(fmt.blocks), fmt.blocks, path, number, tokens, block_tokens)))
    return out


def _azure_time(value: str, path: Path, line: int) -> float:
    """A TIMESTAMP as the Azure traces write it (``2023-11-16 18:15:46.6805900``), or seconds."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        raise _bad(path, line, f"TIMESTAMP {value[:40]!r} is neither a date and time nor seconds") from None


def _azure(text: str, path: Path, check: Check) -> list[TraceRequest]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        return []
    except csv.Error as exc:
        raise _bad(path, 1, f"not CSV ({exc})") from None
    columns = {name.strip(): k for k, name in enumerate(header)}
    missing = [c for c in _AZURE_COLUMNS if c not in columns]
    if missing:
        raise _bad(path, 1, f"no column {', '.join(missing)} (an Azure trace's header is "
                            f"{','.join(_AZURE_COLUMNS)})")
    out = []
    try:
        for row in reader:
            check()
            number = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) < len(header):
                raise _bad(path, number, f"{len(row)} columns, the header has {len(header)}")
            out.append(TraceRequest(number, _azure_time(row[columns["TIMESTAMP"]], path, number),
                                    _count(row[columns["ContextTokens"]].strip(), "ContextTokens", path, number),
                                    _count(row[columns["GeneratedTokens"]].strip(), "GeneratedTokens", path, number)))
    except csv.Error as exc:
        raise _bad(path, reader.line_num, f"not CSV ({exc})") from None
    return out


def detect_format(path: Path, text: str) -> str:
    """The trace's format from its first line: a CSV header, or a JSON object's keys."""
    first = next((line for line in text_lines(text) if line.strip()), None)
    if first is None:
        raise TraceError(f"{path}: no requests in this trace")
    if path.suffix.lower() == ".csv" or first.lstrip().startswith("TIMESTAMP"):
        return "azure"
    try:
        obj = json.loads(first)
    except (json.JSONDecodeError, RecursionError):
        raise TraceError(f"{path}: line 1: neither JSON nor an Azure CSV header; set workload.trace_format "
                         f"({', '.join(TRACE_FORMATS)})") from None
    if isinstance(obj, dict) and "input_length" in obj:
        return "mooncake"
    if isinstance(obj, dict) and "input_tokens" in obj:
        return "tunebench"
    raise TraceError(f"{path}: line 1: not a trace line this knows (Mooncake: input_length; tunebench: "
                     f"input_tokens); set workload.trace_format")


def read_trace(path: Path, fmt: str = "auto", *, block_tokens: int = 512, start_s: float = 0.0,
               end_s: float | None = None, max_requests: int | None = None, check: Check = _no_check) -> Trace:
    """The requests of the trace at ``path`` whose arrival falls in ``[start_s, end_s)`` seconds
    from its first, at most ``max_requests``, with times counted from the first of them. Every
    line is checked, in the window or not: one bad line refuses the trace."""
    text = read_user_text(path, "trace", TraceError, max_bytes=MAX_TRACE_BYTES, between_chunks=check)
    kind = detect_format(path, text) if fmt == "auto" else fmt
    if kind in ("mooncake", "tunebench"):
        requests = _json_trace(text, path, block_tokens, _MOONCAKE if kind == "mooncake" else _TUNEBENCH, check)
    elif kind == "azure":
        requests = _azure(text, path, check)
    else:
        raise TraceError(f"unknown trace format {fmt!r}; one of auto, {', '.join(TRACE_FORMATS)}")
    if not requests:
        raise TraceError(f"{path}: no requests in this trace")
    requests.sort(key=lambda r: r.at_s)  # stable: equal times keep the file's order
    first = requests[0].at_s
    span = requests[-1].at_s - first
    chosen = [r for r in requests if r.at_s - first >= start_s and (end_s is None or r.at_s - first < end_s)]
    if max_requests is not None:
        chosen = chosen[:max_requests]
    if not chosen:
        window = f"[{start_s:g}, {end_s:g}) s" if end_s is not None else f"from {start_s:g} s"
        raise TraceError(f"{path}: no request in the window {window}; the trace spans {span:,.3f} s")
    base = chosen[0].at_s
    return Trace(path, kind, block_tokens,
                 [TraceRequest(r.line, r.at_s - base, r.input_tokens, r.output_tokens, r.blocks) for r in chosen], span)


def span_text(seconds: float) -> str:
    """A span in the unit a reader grasps (seconds to years), with its seconds."""
    for unit_s, unit in ((365.25 * 86_400, "years"), (86_400.0, "days"), (3_600.0, "hours")):
        if seconds >= 2 * unit_s:
            return f"{seconds / unit_s:,.1f} {unit} ({seconds:,.0f} s)"
    return f"{seconds:,.1f} s"


def check_replay(trace: Trace, load: LoadConfig) -> None:
    """Refuse, before anything is sent, a replay that would last longer than any run may
    (``MAX_DURATION_S``, the config's bound on every duration): a stray timestamp (a trace's
    milliseconds read as seconds, a line from another epoch) makes the run wait for it for ever.
    Only the ``trace`` pattern waits for the trace's times; ``speedup``, ``duration_s`` and
    ``max_requests`` shorten the wait, and the message names each way out."""
    if not load.pattern.replays_trace or not trace.requests:
        return
    last = trace.requests[min(len(trace.requests), load.max_requests or len(trace.requests)) - 1]
    replay_s = last.at_s / load.speedup
    if load.duration_s is not None:
        replay_s = min(replay_s, load.duration_s)
    if replay_s <= MAX_DURATION_S:
        return
    faster = f" at speedup {load.speedup:g}" if load.speedup != 1 else ""
    raise TraceError(f"{trace.path}: line {last.line}: arrives {span_text(last.at_s)} after the first request, so "
                     f"replaying the trace{faster} would take {span_text(replay_s)}, longer than any run may last "
                     f"({span_text(MAX_DURATION_S)}); replay a window of it (workload.trace_end_s, seconds from its "
                     f"first request), faster (load.speedup) or for at most load.duration_s, or fix its times")


def block_token_ids(encode: Callable[[str], list[int]], words: Callable[[int], str], n_tokens: int,
                    check: Check = _no_check) -> list[int]:
    """``n_tokens`` token ids of fresh text that starts at a word boundary, so blocks joined
    one after another tokenize as they were made (a tokenizer does not merge across a space)."""
    ids: list[int] = []
    grow = max(8, n_tokens)
    for _ in range(64):
        check()
        ids = encode(" " + words(grow))
        if len(ids) >= n_tokens:
            break
        grow *= 2
    return ids[:n_tokens]


def prompt_ids(request: TraceRequest, block_tokens: int, blocks: dict[int, list[int]],
               fresh: Callable[[int], list[int]]) -> list[int]:
    """A request's prompt as token ids: its blocks' (made once each by ``fresh`` and kept in
    ``blocks``, so equal ids are equal tokens), then tokens of its own for what they leave."""
    ids: list[int] = []
    for block in request.blocks:
        if len(ids) >= request.input_tokens:
            break
        if block not in blocks:
            blocks[block] = fresh(block_tokens)
        ids.extend(blocks[block][:request.input_tokens - len(ids)])
    if len(ids) < request.input_tokens:
        ids.extend(fresh(request.input_tokens - len(ids)))
    return ids

