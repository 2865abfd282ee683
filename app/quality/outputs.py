"""Two runs' outputs of the same prompts side by side, split where they first diverge, so a
customer sees what a precision step changed rather than reading a number. The outputs are the
ones the quality probe kept (``QualityFigures.capture``: token ids), decoded with the model's
local tokenizer where there is one (else the token ids are shown). Pure Python; no Qt."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.load.tokens import HfTokenizer, TokenizerError, find_tokenizer_file
from app.quality.divergence import first_divergence
from engine_adapters.runtimes import RuntimeErrorMessage, resolve_model

Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class OutputPair:
    """One prompt's two outputs: the text both produced, then each side's first differing token
    and the rest of its output (all empty after ``shared`` when the outputs are identical)."""

    prompt: str
    shared: str
    before_token: str = ""
    before_rest: str = ""
    after_token: str = ""
    after_rest: str = ""
    diverged_at: int | None = None
    """The first differing token's index (0 = the first generated token); None: identical."""


def token_ids_text(ids: Sequence[int]) -> str:
    """Token ids where no tokenizer is at hand: ``⟨12⟩⟨7⟩``."""
    return "".join(f"\u27e8{i}\u27e9" for i in ids)


def _split(decode: Decode, tokens: list[int], at: int) -> tuple[str, str, str]:
    """(text before ``at``, token ``at``, the rest), each decoded in context so a token that is
    part of a word or a character keeps its spelling."""
    head = decode(tokens[:at])
    with_token = decode(tokens[:at + 1])
    whole = decode(tokens)
    if not (with_token.startswith(head) and whole.startswith(with_token)):  # a merge across the cut: decode alone
        return head, decode(tokens[at:at + 1]), decode(tokens[at + 1:])
    return head, with_token[len(head):], whole[len(with_token):]


def output_pair(prompt: str, before: list[int], after: list[int], decode: Decode) -> OutputPair:
    at = first_divergence(before, after)
    if at is None:
        return OutputPair(prompt, decode(before))
    shared, before_token, before_rest = _split(decode, before, at)
    _, after_token, after_rest = _split(decode, after, at)  # the same ids before ``at``: the same text
    return OutputPair(prompt, shared, before_token, before_rest, after_token, after_rest, at)


def decoder_for(config: Mapping[str, Any]) -> tuple[Decode, bool]:
    """The decoder of a stored run's model (its configuration): its local tokenizer.json, else
    token ids; True when it is the tokenizer."""
    engine = config.get("engine") or {}
    candidates: list[str | None] = []
    try:
        candidates.append(resolve_model(str(engine.get("model") or "")) if engine.get("model") else None)
    except RuntimeErrorMessage:
        pass  # the demo model not generated here: ids
    candidates += [engine.get("tokenizer"), (config.get("workload") or {}).get("tokenizer")]
    path = find_tokenizer_file(*candidates)
    if path is not None:
        try:
            return HfTokenizer(path).decode, True
        except TokenizerError:
            pass
    return token_ids_text, False


def side_by_side(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, config: Mapping[str, Any],
                 before_label: str = "the baseline", after_label: str = "the other run",
                 decode: Decode | None = None) -> tuple[list[OutputPair], str]:
    """Each prompt both runs' probes answered, in the before run's order, with a note on how to
    read them (or why there is nothing to show). ``before``/``after`` are the runs' stored
    ``quality``; ``config`` is the after run's configuration (its model's tokenizer decodes)."""
    kept = {}
    for label, figures in ((before_label, before), (after_label, after)):
        capture = (figures or {}).get("capture") or []
        if not capture:
            return [], f"{label} kept no outputs (run it with a [quality] table) to compare side by side"
        kept[label] = {str(o.get("prompt")): [int(t) for t in o.get("tokens") or []] for o in capture}
    shared = [p for p in kept[before_label] if p in kept[after_label]]
    if not shared:
        return [], "the two runs' probes answered other prompts: give both the same [quality] prompts"
    decoder, exact = (decode, True) if decode is not None else decoder_for(config)
    pairs = [output_pair(p, kept[before_label][p], kept[after_label][p], decoder) for p in shared]
    diverged = sum(p.diverged_at is not None for p in pairs)
    note = (f"{len(pairs) - diverged} of {len(pairs)} outputs identical; where they differ, the first differing "
            f"token is highlighted (greedy decoding, the probe's prompts)")
    return pairs, note + ("" if exact else "; no local tokenizer: token ids shown")
