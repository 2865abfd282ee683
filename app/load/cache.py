"""Cold or warm prefix cache at the start of every measured level.

An engine keeps its prefix cache between runs (the GUI keeps engines; ``--endpoint`` attaches to
one that served anything before), and a seeded workload sends the same prompts every time: run the
same profile twice and the second run is measured warm (6% then 75% hit rate was seen, +44%
throughput). So each level's requests carry a fresh random ``cache_salt``: vLLM mixes the salt into
the hash of a prompt's first block, so nothing cached under another salt can be hit, while the
requests of one level, which share the salt, still share their prefixes (a shared-prefix or
multi-turn workload keeps its real hits).

- ``cold`` (default): a fresh salt per level. The warm-up before the first level gets a salt of its
  own: warm-up is for the engine (compilation, allocation, connections), which no salt touches, and
  a dataset workload can pick the very prompts of the first level, which would then start warm.
- ``warm``: each level's prompts are sent once, unmeasured (the priming pass), then the measured
  pass follows with the same salt: labelled "warm (primed)".

Where the engine takes no salt (another engine, a vLLM before 0.9, or an endpoint that answers
400 to the field) requests go without one and the run's notes say that levels may start warm.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from app.errors import UserError
from app.load.client import ClientOptions
from app.load.datasets import Conversation, Dataset, Turn
from app.load.executor import CancelFlag, LiveStats, StopRule, run_level
from app.load.metrics import RequestRecord
from app.load.patterns import LevelPlan
from engine_adapters.bounded_http import FetchError, FetchTimeout, FetchTooLarge, Reply, fetch

CacheMode = Literal["cold", "warm"]
SALT_FIELD = "cache_salt"
SALT_SINCE: dict[str, tuple[int, ...]] = {"vllm": (0, 9, 0)}
"""Engines that take ``cache_salt`` in completions and chat requests, and since which version
(vLLM: pull request 17045, first released in 0.9.0). An older vLLM ignores unknown fields."""
PRIMING_CONCURRENCY = 16  # an open-loop level has no concurrency of its own to prime at
PROBE_MAX_BYTES = 1 << 20
"""A one-token reply is well under a KiB; more is not an OpenAI-compatible answer."""

Note = Callable[[str], None]


def new_salt() -> str:
    """A salt no earlier request can have used (vLLM: at most 128 characters, no '@', '/', '\\')."""
    return "tunebench-" + secrets.token_hex(16)


def _version_tuple(version: str) -> tuple[int, ...] | None:
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    if not match:
        return None
    return tuple(int(g or 0) for g in match.groups())


def salt_support(engine_kind: str, engine_version: str | None) -> str | None:
    """None when the engine takes a cache salt, else why not (one phrase)."""
    since = SALT_SINCE.get(engine_kind)
    if since is None:
        return f"the {engine_kind} engine takes no cache salt"
    parsed = _version_tuple(engine_version) if engine_version else None
    if parsed is not None and parsed < since:
        return (f"{engine_kind} {engine_version} predates cache salts "
                f"({'.'.join(map(str, since))}) and ignores them")
    return None


def probe_salt(opts: ClientOptions, deadline_s: float | None = None, cancel: CancelFlag | None = None) -> str | None:
    """Ask the endpoint once (one output token) whether it takes a cache salt: None when it does
    (or when it cannot tell: then the levels report what goes wrong), else its refusal.

    Both requests together get ``deadline_s`` (default: the profile's request timeout) and a small
    size cap: an endpoint that cannot answer a one-token request within it would time out every
    request of the run, so the run fails now, in words, instead of hanging (or filling memory from
    an endless reply)."""
    chat = opts.api == "chat"
    url = opts.base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    body: dict[str, object] = {"model": opts.model, "max_tokens": 1, "temperature": 0.0}
    body.update({"messages": [{"role": "user", "content": "cache salt probe"}]} if chat
                else {"prompt": "cache salt probe"})
    headers = {"Content-Type": "application/json", **opts.headers}
    end_s = time.monotonic() + (opts.request_timeout_s if deadline_s is None else deadline_s)

    def post(payload: dict[str, object]) -> Reply:
        return fetch(url, method="POST", body=json.dumps(payload).encode(), headers=headers, cancel=cancel,
                     deadline_s=max(0.0, end_s - time.monotonic()), max_bytes=PROBE_MAX_BYTES)

    try:
        salted = post({**body, SALT_FIELD: new_salt()})
        if salted.status != 400 and salted.status != 422:
            return None
        plain = post(body)
    except FetchTimeout:
        raise UserError(f"the endpoint {opts.base_url} did not answer a one-token request within "
                        f"{opts.request_timeout_s:g} s (load.request_timeout_s); nothing was measured") from None
    except FetchTooLarge:
        raise UserError(f"the endpoint {opts.base_url} answered a one-token request with over "
                        f"{PROBE_MAX_BYTES >> 20} MiB: not an OpenAI-compatible server; nothing was measured") from None
    except FetchError:  # refused, not HTTP, cancelled: the levels (or the cancel) say so
        return None
    if plain.status != 200:
        return None  # refused for another reason: not the salt's fault
    try:
        err = json.loads(salted.text).get("error")
        detail = str(err.get("message") if isinstance(err, dict) else err or salted.text)
    except (ValueError, AttributeError, RecursionError):  # RecursionError: JSON nested past the parser
        detail = salted.text
    return (f"the endpoint refused the {SALT_FIELD} field (HTTP {salted.status}: "
            f"{' '.join(detail.split())[:160]})")


@dataclass
class CachePlan:
    """How every level of one run starts: the mode asked for, and whether salts are sent."""

    mode: CacheMode = "cold"
    salted: bool = True
    unsalted_reason: str = ""

    @classmethod
    def for_run(cls, mode: CacheMode, engine_kind: str, engine_version: str | None, opts: ClientOptions, *,
                attached: bool, deadline_s: float | None = None, cancel: CancelFlag | None = None) -> CachePlan:
        """Decide once per run. An attached endpoint is asked (one tiny request) whether it
        takes the salt; an engine tunebench runs is known by its kind and version."""
        reason = salt_support(engine_kind, engine_version)
        if reason is None and attached:
            reason = probe_salt(opts, deadline_s, cancel)
        return cls(mode, reason is None, reason or "")

    @property
    def label(self) -> str:
        """What the levels were measured on, for notes, tables and the GUI."""
        if self.mode == "warm":
            return "warm (primed)"
        return "cold" if self.salted else "cold not guaranteed"

    def notes(self) -> list[str]:
        if self.mode == "warm":
            note = ("prefix cache: warm (primed): each level's prompts were sent once, unmeasured, "
                    "before its measured pass")
            return [note if self.salted else note + f"; levels may also hit earlier runs' prompts: {self.unsalted_reason}"]
        if self.salted:
            return ["prefix cache: cold: each level's requests carry a fresh cache salt (prefixes are still "
                    "shared within a level)"]
        return [f"prefix cache: cold not guaranteed: requests go without a cache salt ({self.unsalted_reason}); a "
                "level may hit prompts cached by earlier runs or levels on the same engine"]

    def level_options(self, opts: ClientOptions) -> ClientOptions:
        """The client options of one level (or of the warm-up): a salt no other level shares."""
        return dataclasses.replace(opts, cache_salt=new_salt() if self.salted else None)

    def prime(self, plan: LevelPlan, dataset: Dataset, opts: ClientOptions, rule: StopRule, note: Note, *,
              run: LevelRun | None = None, cancel: CancelFlag | None = None, seed: int = 0) -> bool:
        """In warm mode, send the prompts the level will send, once and unmeasured, with the
        level's salt (``opts``), through ``run`` (the run's client processes; default: here);
        True when a priming pass ran. Single-turn prompts get one output token (their prompt
        blocks are what the level can hit); multi-turn conversations run in full, so the history
        the level resends matches."""
        if self.mode != "warm":
            return False
        convs = dataset.conversations
        unique = len(convs) if rule.max_requests is None else min(rule.max_requests, len(convs))
        priming = Dataset([_priming_copy(c) for c in convs[:unique]], dataset.lengths_exact, dataset.length_source)
        concurrency = max(1, min(unique, plan.concurrency or PRIMING_CONCURRENCY))
        primer = LevelPlan(plan.index, f"{plan.label} (priming)", "closed", concurrency=concurrency)
        counts = [0, 0]

        def count(rec: RequestRecord) -> None:
            counts[0] += 1
            counts[1] += 0 if rec.ok else 1

        (run or _run_here)(primer, priming, opts, StopRule(max_requests=unique, max_error_fraction=1.0),
                           live=LiveStats(None), cancel=cancel, seed=seed, on_record=count)
        note(f"level {plan.label}: primed with {counts[0]} unmeasured requests"
             + (f" ({counts[1]} failed)" if counts[1] else ""))
        return True


class LevelRun(Protocol):
    """How a level's requests are sent: :meth:`app.load.procs.ClientPool.run_level`'s shape."""

    def __call__(self, plan: LevelPlan, dataset: Dataset, opts: ClientOptions, rule: StopRule, *, live: LiveStats,
                 cancel: Any, seed: int, on_record: Callable[[RequestRecord], None] | None = None) -> object: ...


def _run_here(plan: LevelPlan, dataset: Dataset, opts: ClientOptions, rule: StopRule, *, live: LiveStats,
              cancel: Any, seed: int, on_record: Callable[[RequestRecord], None] | None = None) -> object:
    return asyncio.run(run_level(plan, dataset, opts, rule, live=live, cancel=cancel, seed=seed, on_record=on_record))


def _priming_copy(conv: Conversation) -> Conversation:
    if len(conv.turns) > 1:
        return conv
    turns = [Turn(t.user, 1, t.input_tokens) for t in conv.turns]
    return Conversation(conv.id, turns, conv.system, conv.system_tokens)
