"""Prompts: generated (random, shared prefix, multi-turn, long context, code-like) or imported
(ShareGPT JSON, JSONL). Seeded: the same workload and seed give the same conversations.

Every request is a :class:`Conversation` of one or more turns; a single request is a
conversation of one turn. Lengths are in the model's tokens when its tokenizer is local
(:mod:`app.load.tokens`), otherwise approximated and labelled (``Dataset.lengths_exact``).

Building a large workload takes a while (a million prompts, or a ShareGPT file of 650 MB), so it
can be cancelled: ``build_dataset(..., cancelled=event.is_set)`` asks between prompts, file chunks
and JSON entries, and raises :class:`BuildCancelled` within a moment of it turning true.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from app.errors import UserError, read_user_text
from app.load.tokens import TokenCounter, named_tokenizer
from app.load.traces import Trace, block_token_ids, json_lines, prompt_ids, read_trace
from app.workload import LengthSpec, WorkloadConfig

_WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case point "
    "government company number group problem fact be have do say get make go know take see come think look "
    "want give use find tell ask seem feel try leave call good new first last long great little own other "
    "old right big high different small large next early young important few public bad same able to of in "
    "for on with at by from up about into over after the and a that it not he as you this but his they her "
    "she or an will my one all would there their what so out if who which me when can like no just him "
    "river stone cloud engine market signal window garden letter mirror silver forest orange planet bridge "
    "castle doctor pencil rocket summer winter valley harbor lantern meadow thunder velvet whisper"
).split()

_CODE_LINES = (
    "def {name}_{i}(items, limit={i}):\n",
    "    result = []\n",
    "    for index, item in enumerate(items):\n",
    "        if index >= limit:\n",
    "            break\n",
    "        result.append(item * {i} + offset_{j})\n",
    "    return result\n",
    "\n",
    "class {Name}{i}Handler(BaseHandler):\n",
    "    def handle(self, request):\n",
    "        value = self.{name}_{j}(request.items)\n",
    "        return Response(value, status=200)\n",
    "\n",
)
_CODE_NAMES = ("parse", "load", "render", "update", "fetch", "merge", "scale", "encode")


class DatasetError(UserError):
    """A dataset file that cannot be used (missing, unreadable, not the format it claims)."""


class BuildCancelled(Exception):
    """The run was cancelled while its workload was built. Not a DatasetError: nothing is wrong
    with the input, and the run ends ``cancelled``, not ``failed``."""


Check = Callable[[], None]
"""Called between units of work; raises BuildCancelled once the build is to stop."""


def _never() -> None:
    """The check of a build nobody can cancel."""


def cancel_check(cancelled: Callable[[], bool] | None) -> Check:
    """A :data:`Check` from a ``cancelled() -> bool`` (e.g. ``threading.Event.is_set``, cheap
    enough to ask once per prompt)."""
    if cancelled is None:
        return _never

    def check() -> None:
        if cancelled():
            raise BuildCancelled("cancelled while the workload was built")

    return check


@dataclass
class Turn:
    user: str
    output_tokens: int
    input_tokens: int  # this turn's user text, counted by the dataset's tokenizer


@dataclass
class Conversation:
    id: int
    turns: list[Turn]
    system: str | None = None  # the shared prefix, when this conversation carries it
    system_tokens: int = 0


@dataclass
class Dataset:
    conversations: list[Conversation]
    lengths_exact: bool
    length_source: str
    notes: list[str] = field(default_factory=list)  # e.g. lines skipped while importing
    arrivals_s: list[float] | None = None
    """A trace's arrival times (seconds from its first request, one per conversation), for the
    load pattern that replays them (``app.load.traces``)."""

    @property
    def num_requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)


def sample_lengths(spec: LengthSpec, n: int, rng: np.random.Generator) -> list[int]:
    """Draw ``n`` lengths from the spec, clipped to [minimum, maximum]."""
    if spec.distribution == "fixed" or spec.spread == 0:
        raw = np.full(n, float(spec.mean))
    elif spec.distribution == "uniform":
        raw = rng.integers(spec.mean - spec.spread, spec.mean + spec.spread + 1, size=n).astype(float)
    else:
        raw = np.rint(rng.normal(spec.mean, spec.spread, size=n))
    upper = spec.maximum if spec.maximum is not None else np.inf
    return [int(v) for v in np.clip(raw, spec.minimum, upper)]


def _words(rng: np.random.Generator, n: int) -> str:
    return " ".join(_WORDS[i] for i in rng.integers(0, len(_WORDS), size=n))


def _code(rng: np.random.Generator, n_lines: int) -> str:
    lines = []
    for k in range(n_lines):
        template = _CODE_LINES[k % len(_CODE_LINES)]
        name = _CODE_NAMES[int(rng.integers(0, 3))]  # few names: repetitive, as real code is
        lines.append(template.format(name=name, Name=name.title(), i=k // len(_CODE_LINES), j=int(rng.integers(0, 4))))
    return "".join(lines)


def fit_to_tokens(counter: TokenCounter, text_source: Callable[[int], str], n_tokens: int,
                  check: Check = _never) -> tuple[str, int]:
    """Text of exactly ``n_tokens`` tokens when the tokenizer allows (re-encoding a cut can merge
    or split a token; the few cases that still miss are returned with their true length). A
    prompt of a million tokens takes seconds, so ``check`` is asked between its steps too."""
    text, grow = "", max(8, n_tokens)
    ids: list[int] = []
    for _ in range(64):
        check()
        text = text_source(grow)
        ids = counter.encode(text)
        if len(ids) >= n_tokens:
            break
        grow *= 2
    ids = ids[:n_tokens]
    text = counter.decode(ids)
    for _ in range(6):
        check()
        count = counter.count(text)
        if count == n_tokens:
            return text, count
        if count > n_tokens:
            text = counter.decode(counter.encode(text)[: n_tokens - (count - n_tokens)])
        else:
            extra = counter.encode(text_source(8))
            text = counter.decode(counter.encode(text) + extra[: n_tokens - count])
    return text, counter.count(text)


def _generated(workload: WorkloadConfig, counter: TokenCounter, rng: np.random.Generator,
               check: Check = _never) -> list[Conversation]:
    n = workload.num_requests
    turns = workload.turns if workload.kind == "multi_turn" else 1
    in_lens = sample_lengths(workload.input_len, n * turns, rng)
    out_lens = sample_lengths(workload.output_len, n * turns, rng)
    conversations = []
    for c in range(n):
        conv_turns = []
        for t in range(turns):
            check()
            k = c * turns + t
            if workload.kind == "code":
                def source(m: int) -> str:
                    return _code(rng, max(4, m // 4))
                text, count = fit_to_tokens(counter, source, in_lens[k], check)
            elif workload.kind == "long_context":
                head, question = "Document:\n", "\n\nQuestion: summarise the document above in detail.\nAnswer:"
                frame = counter.count(head) + counter.count(question)
                body, _ = fit_to_tokens(counter, lambda m: _words(rng, m), max(1, in_lens[k] - frame), check)
                text = head + body + question
                count = counter.count(text)
            else:
                text, count = fit_to_tokens(counter, lambda m: _words(rng, m), in_lens[k], check)
            conv_turns.append(Turn(text, out_lens[k], count))
        conversations.append(Conversation(c, conv_turns))
    return conversations


MAX_DATASET_BYTES = 2 * 2**30
"""ShareGPT's usual file is about 650 MB; a dataset is read whole."""


def _read_text(path: Path, what: str, check: Check = _never) -> str:
    """Regular files only (a named pipe would block the run forever), at most MAX_DATASET_BYTES,
    read in chunks so a cancel is seen while a large file comes off a slow disk."""
    return read_user_text(path, f"{what} file", DatasetError, max_bytes=MAX_DATASET_BYTES, between_chunks=check)


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _skip_space(text: str, i: int) -> int:
    """The index of the first non-whitespace character (in JSON's sense) at or after ``i``."""
    match = _JSON_SPACE.match(text, i)
    return match.end() if match else i


def _json_list(text: str, check: Check) -> Any:
    """``json.loads(text)``, decoding a top-level array one element at a time so ``check`` is
    asked between elements (parsing a 650 MB ShareGPT file in one call takes seconds and cannot
    be interrupted). The same values and the same errors as ``json.loads``."""
    i = _skip_space(text, 0)
    if not text.startswith("[", i):
        return json.loads(text)  # not an array: one call, and json's own message for it
    decoder = json.JSONDecoder()
    items: list[Any] = []
    i = _skip_space(text, i + 1)
    if text.startswith("]", i):
        i += 1
    else:
        while True:
            check()
            item, i = decoder.raw_decode(text, i)
            items.append(item)
            i = _skip_space(text, i)
            if text.startswith(",", i):
                i = _skip_space(text, i + 1)
            elif text.startswith("]", i):
                i += 1
                break
            else:
                raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
    end = _skip_space(text, i)
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return items


_Item = TypeVar("_Item")


def _pick(items: list[_Item], n: int, rng: np.random.Generator) -> list[_Item]:
    """``n`` items in a seeded order, cycling when the file has fewer."""
    order = rng.permutation(len(items))
    return [items[int(order[i % len(items)])] for i in range(n)]


def load_sharegpt(path: Path, workload: WorkloadConfig, counter: TokenCounter,
                  rng: np.random.Generator, check: Check = _never) -> tuple[list[Conversation], list[str]]:
    """ShareGPT JSON: the first human turn is the prompt, the reply's length the output length
    (as ``vllm bench serve`` does); prompts under 4 tokens are skipped, as there."""
    try:
        data = _json_list(_read_text(path, "ShareGPT JSON", check), check)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not a ShareGPT JSON file: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise DatasetError(f"{path}: not a ShareGPT JSON file: arrays or objects nested too deeply") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: not a ShareGPT JSON file: expected a list of conversations, got "
                           f"{type(data).__name__}")
    items: list[tuple[str, int, int]] = []  # prompt, output tokens, prompt tokens
    notes: list[str] = []
    bad = 0
    for entry in data:
        check()
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2 or not all(isinstance(t, dict) for t in turns[:2]):
            bad += 1
            continue
        prompt = turns[0].get("value", turns[0].get("content"))
        reply = turns[1].get("value", turns[1].get("content"))
        if not isinstance(prompt, str) or not isinstance(reply, str):
            bad += 1
            continue
        prompt_tokens = counter.count(prompt)
        if prompt_tokens < 4:
            continue
        out = max(1, counter.count(reply))
        if workload.output_len.maximum is not None:
            out = min(out, workload.output_len.maximum)
        items.append((prompt, out, prompt_tokens))
    if bad:
        notes.append(f"{path.name}: skipped {bad} of {len(data)} entries without a human and a reply turn")
    if not items:
        raise DatasetError(f"{path}: no usable ShareGPT conversations (each needs 'conversations' with a "
                           f"human turn and a reply)")
    chosen = _pick(items, workload.num_requests, rng)
    return [Conversation(i, [Turn(p, o, t)]) for i, (p, o, t) in enumerate(chosen)], notes


def load_jsonl(path: Path, workload: WorkloadConfig, counter: TokenCounter,
               rng: np.random.Generator, check: Check = _never) -> tuple[list[Conversation], list[str]]:
    """One prompt per line: a JSON string, or an object with ``prompt`` and optionally
    ``output_tokens`` (or ``max_tokens``); other lengths come from ``output_len``."""
    text = _read_text(path, "JSONL", check)
    fallback = sample_lengths(workload.output_len, max(1, text.count("\n") + 1), rng)
    items: list[tuple[str, int]] = []
    problems: list[str] = []
    for lineno, obj, problem in json_lines(text, check):
        if problem is not None:
            problems.append(f"line {lineno}: {problem}")
            continue
        prompt, out = (obj, None) if isinstance(obj, str) else (
            (obj.get("prompt"), obj.get("output_tokens", obj.get("max_tokens"))) if isinstance(obj, dict) else (None, None))
        if not isinstance(prompt, str) or not prompt:
            problems.append(f"line {lineno}: no 'prompt' string")
            continue
        if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
            problems.append(f"line {lineno}: output_tokens must be a positive integer")
            continue
        items.append((prompt, out if out is not None else fallback[(lineno - 1) % len(fallback)]))
    notes = []
    if problems:
        notes.append(f"{path.name}: skipped {len(problems)} line(s): " + "; ".join(problems[:5])
                     + (" ..." if len(problems) > 5 else ""))
    if not items:
        raise DatasetError(f"{path}: no usable prompts in this JSONL file"
                           + (f" ({problems[0]})" if problems else ""))
    chosen = _pick(items, workload.num_requests, rng)
    conversations = []
    for i, (p, o) in enumerate(chosen):
        check()
        conversations.append(Conversation(i, [Turn(p, o, counter.count(p))]))
    return conversations, notes


def workload_trace(workload: WorkloadConfig, check: Check = _never) -> Trace:
    """The trace a ``trace`` workload replays: its window, at most ``num_requests`` of it."""
    return read_trace(Path(workload.dataset_path or "").expanduser(), workload.trace_format,
                      block_tokens=workload.trace_block_tokens, start_s=workload.trace_start_s,
                      end_s=workload.trace_end_s, max_requests=workload.num_requests, check=check)


def read_inputs(workload: WorkloadConfig, check: Check = _never) -> tuple[TokenCounter | None, Trace | None]:
    """The files a workload names, read and checked before anything starts (an engine, a client,
    a campaign's first run): its named tokenizer and its trace. Raises a UserError saying which."""
    return named_tokenizer(workload.tokenizer), workload_trace(workload, check) if workload.kind == "trace" else None


def trace_dataset(trace: Trace, counter: TokenCounter, rng: np.random.Generator, check: Check = _never) -> Dataset:
    """A trace's requests as prompts of their lengths: equal block ids become equal token blocks
    (made from the seeded words), the rest of each prompt its own."""
    blocks: dict[int, list[int]] = {}

    def fresh(n_tokens: int) -> list[int]:
        return block_token_ids(counter.encode, lambda m: _words(rng, m), n_tokens, check)

    conversations = []
    for i, request in enumerate(trace.requests):
        check()
        text = counter.decode(prompt_ids(request, trace.block_tokens, blocks, fresh))
        conversations.append(Conversation(i, [Turn(text, request.output_tokens, counter.count(text))]))
    span = f"{trace.duration_s:,.1f} s" + (f" of its {trace.span_s:,.1f} s" if trace.duration_s < trace.span_s else "")
    note = (f"trace {trace.path.name} ({trace.format}): {len(trace.requests):,} requests over {span}; "
            + trace.reuse().text(trace.block_tokens))
    return Dataset(conversations, counter.exact, counter.source, [note], [r.at_s for r in trace.requests])


def build_dataset(workload: WorkloadConfig, counter: TokenCounter, variant: int = 0, *,
                  cancelled: Callable[[], bool] | None = None, trace: Trace | None = None) -> Dataset:
    """The conversations of one load level. ``variant`` (the level index) changes the seed so
    levels do not hit each other's prefix cache, while keeping the same distributions.
    ``cancelled`` is asked between prompts (and file chunks, JSON entries): once it is true the
    build raises BuildCancelled, so a cancelled run stops here instead of after every prompt.
    ``trace``: the ``trace`` workload's trace, when already read (a run reads it before it starts)."""
    check = cancel_check(cancelled)
    rng = np.random.default_rng([workload.seed, variant])
    notes: list[str] = []
    if workload.kind == "trace":
        return trace_dataset(trace or workload_trace(workload, check), counter, rng, check)
    if workload.kind == "sharegpt":
        conversations, notes = load_sharegpt(Path(workload.dataset_path or "").expanduser(), workload, counter, rng,
                                             check)
    elif workload.kind == "jsonl":
        conversations, notes = load_jsonl(Path(workload.dataset_path or "").expanduser(), workload, counter, rng,
                                          check)
    else:
        conversations = _generated(workload, counter, rng, check)
    if workload.shared_prefix_tokens > 0:
        # One system prompt per dataset, carried by an exact, seeded share of the conversations.
        prefix_rng = np.random.default_rng([workload.seed, variant, 1])
        prefix, prefix_tokens = fit_to_tokens(counter, lambda m: _words(prefix_rng, m), workload.shared_prefix_tokens,
                                              check)
        carriers = round(workload.shared_prefix_fraction * len(conversations))
        chosen = set(int(i) for i in prefix_rng.permutation(len(conversations))[:carriers])
        for conv in conversations:
            if conv.id in chosen:
                conv.system, conv.system_tokens = prefix, prefix_tokens
    check()
    return Dataset(conversations, counter.exact, counter.source, notes)
