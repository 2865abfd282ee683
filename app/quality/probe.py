"""The quality probe against a running engine: greedy outputs with their top-k logprobs on a fixed
prompt set, compared with a reference's (``app.quality.divergence`` defines the figures).

It runs after the timed load, at a stated batch (``[quality] batch``), so the speed figures never
see it; its wall time is part of its figures.

How each engine is scored:

- vLLM: the reference's own tokens, teacher-forced: one request per prompt with the prompt and
  the reference's output as a token-array prompt and ``prompt_logprobs``, so every reference
  position is scored. Top logprobs are asked with ``return_tokens_as_token_ids`` (vLLM keys them
  by token string otherwise, and identical strings collide).
- llama.cpp (its server returns logprobs only for tokens it generates): the positions up to and
  including the first divergence, where both sides saw the same prefix. Its server also leaves out
  the logprobs of a token that ends inside a UTF-8 character; such positions are not scored. The
  prompt cache is off: a prompt's prefix reused from an earlier request is computed in another
  batch shape, so the figures would depend on what the engine served before.

The control is the reference against itself: a run without a reference generates (llama.cpp) or
scores (vLLM) its own outputs a second time. Identical figures mean KL 0 and 100% agreement; any
difference is that configuration's noise floor at that batch, reported as such, never as a loss.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from app.quality.config import DEFAULT_TOP_LOGPROBS, WHOLE_VOCABULARY, QualityConfig
from app.quality.divergence import (
    Agreement,
    KldStats,
    Position,
    agreement,
    first_divergence,
    kld_stats,
    score_position,
)
from engine_adapters.bounded_http import FetchError, fetch
from engine_adapters.demo_task import examples

REQUEST_DEADLINE_S = 300.0
MAX_REPLY_BYTES = 256 * 2**20
LLAMACPP_WHOLE_VOCABULARY = 1 << 20
"""What ``n_probs`` asks of llama.cpp for the whole vocabulary (it returns at most the vocabulary)."""
PROBED_ENGINES = ("vllm", "llamacpp")
LOGPROB_DIGITS = 6
"""Logprobs are rounded as they arrive: a reference's capture stays small enough for the run's row,
and a stored reference compares exactly as the one in memory."""
_MAX_ALLOWED_RE = re.compile(r"greater than max allowed: (\d+)")


class ProbeError(Exception):
    """The probe cannot measure (one line, shown and stored; the speed run is unaffected)."""


@dataclass
class Output:
    """One prompt's greedy output: token ids and, per generated position, the top-k (None where
    the engine gave none)."""

    prompt: str
    prompt_ids: list[int]
    tokens: list[int]
    top: list[dict[int, float] | None] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "prompt_ids": self.prompt_ids, "tokens": self.tokens,
                "top": [None if t is None else [list(t), [round(v, LOGPROB_DIGITS) for v in t.values()]]
                        for t in self.top]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Output:
        top = [None if t is None else dict(zip((int(i) for i in t[0]), (float(v) for v in t[1]), strict=True))
               for t in data.get("top") or []]
        return cls(prompt=str(data["prompt"]), prompt_ids=[int(i) for i in data.get("prompt_ids") or []],
                   tokens=[int(i) for i in data["tokens"]], top=top)


class QualityFigures(BaseModel):
    """What a run's ``quality`` holds: the figures against its reference, the noise floor, and
    the capture that makes this run a reference for others."""

    measured: bool = False
    error: str | None = None
    """Why nothing was measured, in one line (the speed figures stand)."""
    engine: str = ""
    model: str = ""
    """The model as configured (``tunebench:demo``, a path or a hub id): what a reference must share."""
    prompts: int = 0
    output_tokens: int = 0
    top_logprobs: int = 0
    """The top-k the engine gave (the whole vocabulary when it was asked for and allowed)."""
    batch: int = 1
    scoring: str = ""
    wall_s: float | None = None
    reference: dict[str, Any] = Field(default_factory=dict)
    """``kind``: ``self`` (the control: no other reference), ``run``, ``ladder baseline`` or
    ``tune reference``; with the reference's ``run_id``/``uid``/``label`` where known."""
    agreement: Agreement | None = None
    kld: KldStats | None = None
    noise_floor: dict[str, Any] | None = None
    """The reference against itself: ``agreement`` and ``kld`` as above (identical: KL 0)."""
    within_noise: bool | None = None
    """The figures against the reference do not exceed the reference's own noise floor."""
    accuracy: dict[str, Any] | None = None
    """Task accuracy with its standard error (lm-eval), when tasks were asked for."""
    capture: list[dict[str, Any]] = Field(default_factory=list)
    """This run's outputs (``Output.to_json``): what a later run compares against."""

    def shown(self) -> dict[str, Any]:
        """The figures without the capture (what ``--json`` and the screens carry)."""
        data = self.model_dump(mode="json", exclude={"capture"})
        data["captured_outputs"] = len(self.capture)
        return data


def quality_cell(shown: dict[str, Any] | None) -> str:
    """A step's or a run's quality in a table cell: ``99.6% KLD 0.0012`` (tokens identical before
    the first divergence, mean KLD), ``= ref`` for the reference itself, ``n/a`` when not measured."""
    if not shown:
        return "-"
    if not shown.get("measured"):
        return "n/a"
    agreement, kld = shown.get("agreement") or {}, shown.get("kld") or {}
    if (shown.get("reference") or {}).get("kind") == "self":
        return "= ref" + (f" (floor {kld['mean']:.2g})" if kld.get("mean") else "")
    text = f"{agreement.get('token_share', 0.0):.1%}" if agreement else "?"
    if kld:
        text += f" KLD {kld.get('mean', 0.0):.2g}" + ("" if not kld.get("positions_with_tail") else "+")
    return text + (" ~noise" if shown.get("within_noise") else "")


def shown_quality(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored run's ``quality`` as shown: the capture left out (its size said)."""
    if not stored:
        return None
    shown = {k: v for k, v in stored.items() if k != "capture"}
    shown["captured_outputs"] = len(stored.get("capture") or [])
    return shown


@dataclass
class Reference:
    """The outputs a run is compared against, and where they come from (or why there are none)."""

    kind: str
    outputs: list[Output] = field(default_factory=list)
    model: str = ""
    noise_floor: dict[str, Any] | None = None
    run_id: int | None = None
    uid: str | None = None
    label: str = ""
    problem: str | None = None
    accuracy: float | None = None
    """The reference's task accuracy (a fraction), where lm-eval scored it: what a run's
    ``accuracy_drop`` is measured from."""

    def described(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for key in ("run_id", "uid"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.label:
            out["label"] = self.label
        return out

    @classmethod
    def of_figures(cls, figures: dict[str, Any] | None, kind: str, *, run_id: int | None = None,
                   uid: str | None = None, label: str = "") -> Reference:
        """A stored (or just measured) run's quality as a reference; ``problem`` says why it cannot be one."""
        ref = cls(kind=kind, run_id=run_id, uid=uid, label=label)
        where = f"run {run_id}" if run_id is not None else (label or "the reference")
        if not figures:
            ref.problem = f"{where} has no quality figures: run it with a [quality] table to make it a reference"
        elif not figures.get("capture"):
            ref.problem = f"{where} kept no outputs to compare with ({figures.get('error') or 'no probe ran'})"
        else:
            try:
                ref.outputs = [Output.from_json(o) for o in figures["capture"]]
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                ref.problem = f"{where}'s stored outputs cannot be read: {exc}"
            ref.model = str(figures.get("model") or "")
            ref.noise_floor = figures.get("noise_floor")
            value = (figures.get("accuracy") or {}).get("value")
            ref.accuracy = float(value) if isinstance(value, int | float) else None
        return ref


def read_prompts(config: QualityConfig) -> list[str]:
    """The prompt set: the built-in fixed set (the demo task's prompts, the same for every run),
    or the lines of a file."""
    if isinstance(config.prompts, int):
        return [e.prompt for e in examples(config.prompts, "test", seed=0)]
    path = Path(config.prompts).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProbeError(f"the prompts file {path} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ProbeError(f"the prompts file {path} holds no prompt")
    return prompts


class _Client:
    """One engine's two requests: a greedy generation with its top-k, and (where the engine can)
    the top-k at each position of given tokens, teacher-forced."""

    teacher_forced = False
    scoring = ""

    def __init__(self, base_url: str, headers: dict[str, str], model: str, top_logprobs: int,
                 cancel: Callable[[], bool]) -> None:
        self.base_url, self.headers, self.model, self.top = base_url.rstrip("/"), dict(headers), model, top_logprobs
        self.given_top = top_logprobs
        self._cancel = cancel

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        class _Flag:
            def is_set(_self) -> bool:  # noqa: N805 - a tiny adapter to bounded_http's cancel flag
                return self._cancel()

        try:
            reply = fetch(self.base_url + path, deadline_s=REQUEST_DEADLINE_S, max_bytes=MAX_REPLY_BYTES, method="POST",
                          body=json.dumps(body).encode(), headers={"Content-Type": "application/json", **self.headers},
                          cancel=_Flag())
        except FetchError as exc:
            raise ProbeError(f"the engine did not answer the probe: {exc.reason}") from None
        if not reply.ok:
            raise _HttpRefused(reply.status, reply.text[:500])
        try:
            data = json.loads(reply.text)
        except (ValueError, RecursionError):
            raise ProbeError(f"the engine's reply to {path} is not JSON") from None
        if not isinstance(data, dict):
            raise ProbeError(f"the engine's reply to {path} is not a JSON object")
        return data

    def generate(self, prompt: str, max_tokens: int) -> Output:
        raise NotImplementedError

    def score(self, prompt_ids: Sequence[int], tokens: Sequence[int]) -> list[dict[int, float] | None]:
        raise NotImplementedError


class _HttpRefused(ProbeError):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"the engine refused the probe's request (HTTP {status}): {text.strip()[:300]}")
        self.status, self.text = status, text


def _keyed(entries: dict[str, Any]) -> dict[int, float]:
    """vLLM's ``{"token_id:12": logprob}`` (or ``{"12": {"logprob": ...}}``) as ``{12: logprob}``."""
    out: dict[int, float] = {}
    for key, value in entries.items():
        token = int(str(key).rsplit(":", 1)[-1])
        out[token] = round(float(value["logprob"] if isinstance(value, dict) else value), LOGPROB_DIGITS)
    return out


class _VllmClient(_Client):
    teacher_forced = True
    scoring = "teacher-forced: every reference position scored with prompt_logprobs"

    def _with_cap(self, body: dict[str, Any], field_name: str, path: str = "/v1/completions") -> dict[str, Any]:
        """The request, asked again at the engine's cap when it refuses the top-k asked
        (``--max-logprobs``, 20 by default)."""
        body[field_name] = self.top
        try:
            return self._post(path, body)
        except _HttpRefused as exc:
            capped = _MAX_ALLOWED_RE.search(exc.text)
            if exc.status != 400 or not capped:
                raise
            self.top = int(capped.group(1))
            body[field_name] = self.top
            return self._post(path, body)

    def generate(self, prompt: str, max_tokens: int) -> Output:
        data = self._with_cap({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                               "return_tokens_as_token_ids": True, "return_token_ids": True}, "logprobs")
        choice = (data.get("choices") or [{}])[0]
        tokens, prompt_ids = choice.get("token_ids"), choice.get("prompt_token_ids")
        logprobs = choice.get("logprobs") or {}
        top = logprobs.get("top_logprobs")
        if tokens is None or prompt_ids is None or not isinstance(top, list):
            raise ProbeError("the engine returned no token ids or no top logprobs: it cannot be probed")
        return Output(prompt, [int(t) for t in prompt_ids], [int(t) for t in tokens],
                      [None if t is None else _keyed(t) for t in top][:len(tokens)])

    def score(self, prompt_ids: Sequence[int], tokens: Sequence[int]) -> list[dict[int, float] | None]:
        if not tokens:
            return []
        data = self._with_cap({"model": self.model, "prompt": list(prompt_ids) + list(tokens), "max_tokens": 1,
                               "temperature": 0.0, "return_tokens_as_token_ids": True}, "prompt_logprobs")
        choice = (data.get("choices") or [{}])[0]
        scored = choice.get("prompt_logprobs")
        if not isinstance(scored, list) or len(scored) != len(prompt_ids) + len(tokens):
            raise ProbeError("the engine returned no prompt logprobs for the reference's tokens")
        return [None if t is None else _keyed(t) for t in scored[len(prompt_ids):]]


class _LlamacppClient(_Client):
    scoring = "generated tokens up to and including the first divergence (llama.cpp gives no prompt logprobs)"

    def generate(self, prompt: str, max_tokens: int) -> Output:
        n_probs = LLAMACPP_WHOLE_VOCABULARY if self.top == WHOLE_VOCABULARY else self.top
        data = self._post("/completion", {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0,
                                          "n_probs": n_probs, "return_tokens": True, "cache_prompt": False})
        tokens = data.get("tokens")
        probs = data.get("completion_probabilities")
        if not isinstance(tokens, list) or not isinstance(probs, list):
            raise ProbeError("the engine returned no tokens or no probabilities: it cannot be probed")
        top: list[dict[int, float] | None] = [None] * len(tokens)
        j = 0
        for i, token in enumerate(tokens):  # entries of tokens cut inside a UTF-8 character are missing
            if j < len(probs) and isinstance(probs[j], dict) and probs[j].get("id") == token:
                top[i] = {int(e["id"]): round(float(e["logprob"]), LOGPROB_DIGITS) for e in probs[j].get("top_logprobs") or []}
                j += 1
        given = max((len(t) for t in top if t), default=0)
        self.top = given if self.top == WHOLE_VOCABULARY else min(self.top, given or self.top)
        return Output(prompt, [], [int(t) for t in tokens], top)


def client_for(engine_kind: str, base_url: str, headers: dict[str, str], model: str, top_logprobs: int,
               cancel: Callable[[], bool]) -> _Client:
    if engine_kind == "vllm":
        return _VllmClient(base_url, headers, model, top_logprobs, cancel)
    if engine_kind == "llamacpp":
        return _LlamacppClient(base_url, headers, model, top_logprobs, cancel)
    raise ProbeError(f"the quality probe reads logprobs from {' and '.join(PROBED_ENGINES)} only, not {engine_kind}: "
                     "no quality figures for this run")


def _positions(reference: Sequence[Output], scored: Sequence[Sequence[dict[int, float] | None]],
               limits: Sequence[int]) -> list[Position]:
    """Each output's first ``limit`` positions where both sides have a top-k."""
    out = []
    for ref, run_top, limit in zip(reference, scored, limits, strict=True):
        for i in range(min(limit, len(ref.tokens), len(ref.top), len(run_top))):
            r, s = ref.top[i], run_top[i]
            if r and s:
                out.append(score_position(r, s, ref.tokens[i]))
        # positions past the reference's scored ones carry no reference distribution
    return out


def compare(client: _Client, reference: Sequence[Output], run: Sequence[Output], batch: int) -> tuple[Agreement, KldStats | None]:
    """Agreement of the run's outputs with the reference's, and KL at the positions the engine scores."""
    agreed = agreement([r.tokens for r in reference], [o.tokens for o in run])
    if client.teacher_forced:
        own_ids = [o.prompt_ids for o in run]
        with ThreadPoolExecutor(max_workers=batch) as pool:
            scored = list(pool.map(lambda pair: client.score(pair[0], pair[1].tokens), zip(own_ids, reference, strict=True)))
        limits = [len(r.tokens) for r in reference]
    else:
        scored = [o.top for o in run]
        limits = [len(r.tokens) if (d := first_divergence(r.tokens, o.tokens)) is None else d + 1
                  for r, o in zip(reference, run, strict=True)]
    return agreed, kld_stats(_positions(reference, scored, limits))


def _floor_dict(agreed: Agreement, kld: KldStats | None) -> dict[str, Any]:
    return {"agreement": agreed.model_dump(mode="json"), "kld": None if kld is None else kld.model_dump(mode="json")}


def _within(kld: KldStats | None, agreed: Agreement, floor: dict[str, Any] | None) -> bool | None:
    """Whether the figures stay inside the reference's noise floor: KL no more than the floor's
    mean plus twice its error, agreement no less than the floor's."""
    if not floor:
        return None
    floor_agreement = (floor.get("agreement") or {}).get("token_share")
    floor_kld = floor.get("kld") or {}
    kld_ok = kld is None or kld.mean <= (floor_kld.get("mean") or 0.0) + 2 * (floor_kld.get("error") or 0.0) + 1e-9
    agree_ok = floor_agreement is None or agreed.token_share >= floor_agreement - 1e-9
    return kld_ok and agree_ok


def run_probe(config: QualityConfig, engine_kind: str, base_url: str, headers: dict[str, str], model: str,
              reference: Reference | None, cancel: Callable[[], bool] = lambda: False,
              top_logprobs: int = DEFAULT_TOP_LOGPROBS, model_id: str | None = None) -> QualityFigures:
    """The probe's figures for the engine at ``base_url`` (``model`` as the engine names it in
    requests; ``model_id``, the model as configured, is what a reference must share: the same
    model served from another file or in another precision is still the same model;
    ``top_logprobs`` from ``QualityConfig.top_logprobs_for`` it); a ``ProbeError`` (one line) when
    it cannot measure. Without a reference the run is its own: the figures are the control."""
    started = time.monotonic()
    model_id = model_id or model
    figures = QualityFigures(engine=engine_kind, model=model_id, output_tokens=config.output_tokens,
                             batch=config.batch)
    if reference is not None and reference.problem:
        raise ProbeError(reference.problem)
    if reference is not None and reference.model and reference.model != model_id:
        raise ProbeError(f"the reference ({reference.described().get('label') or reference.kind}) ran model "
                         f"{reference.model}, this run {model_id}: outputs of different models are not compared")
    prompts = read_prompts(config)
    if reference is not None and [o.prompt for o in reference.outputs] != prompts:
        raise ProbeError("the reference was measured on other prompts: give the same [quality] prompts to both")
    client = client_for(engine_kind, base_url, headers, model, top_logprobs, cancel)
    figures.scoring = client.scoring
    with ThreadPoolExecutor(max_workers=config.batch) as pool:
        outputs = list(pool.map(lambda p: client.generate(p, config.output_tokens), prompts))
    if not any(any(t for t in o.top) for o in outputs):
        raise ProbeError("the engine returned no logprobs for its tokens: it cannot be probed")
    if reference is None:  # the control: this configuration against itself, measured as any run is
        with ThreadPoolExecutor(max_workers=config.batch) as pool:
            repeat = list(pool.map(lambda p: client.generate(p, config.output_tokens), prompts))
        agreed, kld = compare(client, outputs, repeat, config.batch)
        figures.noise_floor = _floor_dict(agreed, kld)
        figures.reference = {"kind": "self"}
    else:
        agreed, kld = compare(client, reference.outputs, outputs, config.batch)
        figures.noise_floor = reference.noise_floor
        figures.within_noise = _within(kld, agreed, reference.noise_floor)
        figures.reference = reference.described()
    figures.agreement, figures.kld = agreed, kld
    figures.capture = [o.to_json() for o in outputs]
    figures.prompts, figures.top_logprobs = len(prompts), client.top
    figures.measured = True
    figures.wall_s = time.monotonic() - started
    return figures
