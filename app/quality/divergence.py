"""Agreement and KL divergence between a reference's greedy outputs and a run's, defined as
llama.cpp's ``llama-perplexity --kl-divergence`` defines them, from top-k logprobs.

Per scored position, with the reference's distribution P and the run's Q over the next token:

- KLD = sum_i P(i) (log P(i) - log Q(i)), the reference as the base (llama.cpp's direction);
- "same top token": argmax P == argmax Q;
- delta p: Q(t) - P(t) for the scored token t (the reference's own next token), its RMS over positions.

Mean KLD carries llama.cpp's error, sqrt((mean(kld^2) - mean^2) / (n - 1)); the same-top share its
binomial error sqrt(s (1 - s) / (n - 1)); percentiles are over positions.

Top-k logprobs leave mass unseen. The tokens in both top-k lists are kept one by one and every
other token is lumped into one "rest" outcome, whose probability each side knows exactly
(1 - the kept mass). KL over that coarser partition never exceeds the true KL (the log-sum
inequality), so with a tail the figure is a lower bound; the reference mass in the rest is counted
per position (``tail_mass_*``). With the whole vocabulary on both sides the rest is empty and the
figure is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel

TopK = Mapping[int, float]
"""A position's top-k: token id -> natural-log probability."""
TAIL_EPSILON = 1e-5
"""Reference mass below this in the lumped rest counts as none: the whole vocabulary's listed mass
misses 1 by rounding alone (the engine's float32 softmax, logprobs kept to 6 decimals), over a
micro either side on the demo model's 512 tokens served by llama.cpp."""


@dataclass(frozen=True)
class Position:
    """One scored position's figures."""

    kld: float
    same_top: bool
    p_diff: float
    tail_mass: float
    """The reference's probability outside the tokens both top-k lists name."""


def _lumped_kl(p_kept: Sequence[float], q_kept: Sequence[float], p_rest: float, q_rest: float) -> float:
    total = 0.0
    for p, q in zip(p_kept, q_kept, strict=True):
        if p > 0.0:
            total += p * (math.log(p) - math.log(q)) if q > 0.0 else math.inf
    if p_rest > TAIL_EPSILON:
        total += p_rest * (math.log(p_rest) - math.log(max(q_rest, 1e-300)))
    return total


def score_position(reference: TopK, run: TopK, scored_token: int) -> Position:
    """One position: the reference's top-k against the run's, the scored token being the
    reference's next token. A scored token missing from the run's top-k counts as probability 0
    (its delta p then over-states the change by at most the run's smallest listed probability)."""
    if not reference or not run:
        raise ValueError("a scored position needs the top logprobs of both sides")
    shared = [t for t in reference if t in run]
    p_kept = [math.exp(reference[t]) for t in shared]
    q_kept = [math.exp(run[t]) for t in shared]
    p_rest = max(0.0, 1.0 - sum(p_kept))
    q_rest = max(0.0, 1.0 - sum(q_kept))
    kld = max(0.0, _lumped_kl(p_kept, q_kept, p_rest, q_rest))
    same_top = max(reference, key=lambda t: reference[t]) == max(run, key=lambda t: run[t])
    p_ref = math.exp(reference[scored_token]) if scored_token in reference else 0.0
    q_run = math.exp(run[scored_token]) if scored_token in run else 0.0
    return Position(kld=kld, same_top=same_top, p_diff=q_run - p_ref, tail_mass=p_rest if p_rest > TAIL_EPSILON else 0.0)


class KldStats(BaseModel):
    """KL divergence over the scored positions, as llama.cpp reports it."""

    positions: int
    mean: float
    error: float | None = None
    """llama.cpp's ± on the mean (None with fewer than two positions)."""
    median: float
    p90: float
    p99: float
    max: float
    same_top: float
    same_top_error: float | None = None
    rms_dp: float
    """RMS of the change in the scored token's probability (0..1, not percent)."""
    tail_mass_mean: float
    tail_mass_max: float
    positions_with_tail: int
    """Positions where the reference had mass outside the shared top-k: there KL is a lower bound."""

    @property
    def exact(self) -> bool:
        return self.positions_with_tail == 0


def kld_stats(positions: Sequence[Position]) -> KldStats | None:
    """The figures over positions; None when nothing was scored."""
    n = len(positions)
    if n == 0:
        return None
    kld = np.array([p.kld for p in positions], dtype=float)
    same = float(np.mean([p.same_top for p in positions]))
    dp = np.array([p.p_diff for p in positions], dtype=float)
    tail = np.array([p.tail_mass for p in positions], dtype=float)
    mean = float(kld.mean())
    error = math.sqrt(max(0.0, float(np.mean(kld * kld)) - mean * mean) / (n - 1)) if n > 1 else None
    return KldStats(positions=n, mean=mean, error=error, median=float(np.percentile(kld, 50)),
                    p90=float(np.percentile(kld, 90)), p99=float(np.percentile(kld, 99)), max=float(kld.max()),
                    same_top=same, same_top_error=math.sqrt(same * (1 - same) / (n - 1)) if n > 1 else None,
                    rms_dp=math.sqrt(float(np.mean(dp * dp))), tail_mass_mean=float(tail.mean()),
                    tail_mass_max=float(tail.max()), positions_with_tail=int(np.count_nonzero(tail)))


def first_divergence(reference: Sequence[int], run: Sequence[int]) -> int | None:
    """The first position where the two outputs differ (a shorter output differs where it ends);
    None when they are identical."""
    for i, (a, b) in enumerate(zip(reference, run, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(run) else min(len(reference), len(run))


class Agreement(BaseModel):
    """How far a run's greedy outputs follow the reference's, token for token."""

    outputs: int
    token_share: float
    """Reference tokens the run reproduced before its first divergence, over all reference tokens."""
    exact_match: float
    """Outputs identical to the reference's, whole."""
    diverged: int
    first_divergence_min: int | None = None
    first_divergence_median: float | None = None
    """Over the outputs that diverged (token index, 0 = the first generated token)."""


def agreement(reference: Sequence[Sequence[int]], run: Sequence[Sequence[int]]) -> Agreement:
    if len(reference) != len(run) or not reference:
        raise ValueError("agreement needs the same number of outputs on both sides, at least one")
    total = sum(len(r) for r in reference)
    divergences = [first_divergence(r, s) for r, s in zip(reference, run, strict=True)]
    kept = sum(len(r) if d is None else min(d, len(r)) for r, d in zip(reference, divergences, strict=True))
    at = [d for d in divergences if d is not None]
    return Agreement(outputs=len(reference), token_share=kept / total if total else 1.0,
                     exact_match=sum(d is None for d in divergences) / len(reference), diverged=len(at),
                     first_divergence_min=min(at) if at else None,
                     first_divergence_median=float(np.median(at)) if at else None)
