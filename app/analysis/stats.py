"""Repeat statistics: the mean of a figure over repeated runs with its 95% confidence interval
(Student t), and whether two sets of repeats differ beyond their noise (Welch's t-test).

Why Welch's test and not "the confidence intervals do not overlap": non-overlapping 95% intervals
is a much stricter test than 5% significance (two intervals can overlap by a third and the
difference still be significant), so it calls real gains "noise" too often; Welch's test does not
assume equal variances, which matters here (a configuration that queues varies more).

No SciPy: the Student t distribution needs only the regularized incomplete beta function, a few
lines below (continued fraction, Numerical Recipes 6.4), checked against tabulated quantiles in
the tests. SciPy would be a 40 MB dependency for two functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
ALPHA = 1.0 - CONFIDENCE


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom (df may be fractional)."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t: t_{0.975, 4} = 2.776."""
    if not 0.5 < p < 1.0:
        raise ValueError("p must be in (0.5, 1)")
    tail = 2.0 * (1.0 - p)  # two-sided tail probability at the quantile
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > tail:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_two_sided_p(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Aggregate:
    """A figure over ``n`` repeats: mean and its 95% confidence interval (None below 2 repeats)."""

    n: int
    mean: float
    std: float | None  # sample standard deviation (n - 1)
    ci_low: float | None
    ci_high: float | None

    @property
    def half_width(self) -> float | None:
        return None if self.ci_high is None else self.ci_high - self.mean

    def to_dict(self) -> dict[str, float | int | None]:
        return {"n": self.n, "mean": self.mean, "std": self.std, "ci_low": self.ci_low, "ci_high": self.ci_high}


def aggregate(values: Sequence[float]) -> Aggregate | None:
    """Mean and 95% Student-t confidence interval of the finite ``values`` (None when none)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(xs)
    if n == 0:
        return None
    mean = math.fsum(xs) / n
    if n < 2:
        return Aggregate(1, mean, None, None, None)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(1.0 - ALPHA / 2.0, n - 1) * std / math.sqrt(n)
    return Aggregate(n, mean, std, mean - half, mean + half)


def one_sample_p(xs: Sequence[float], value: float) -> float | None:
    """Two-sided p-value of Student's one-sample t-test that the mean of ``xs`` is ``value``
    (p >= 0.05 exactly when ``value`` lies inside the 95% confidence interval of the mean)."""
    n = len(xs)
    if n < 2:
        return None
    mean = math.fsum(xs) / n
    se2 = math.fsum((x - mean) ** 2 for x in xs) / (n - 1) / n
    if se2 == 0.0:
        return 1.0 if mean == value else 0.0
    return t_two_sided_p((mean - value) / math.sqrt(se2), n - 1)


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value that ``a`` and ``b`` have the same mean: Welch's t-test when both have
    two values or more; when one side is a single run, the one-sample test of the other side's
    repeats against it; None when neither side has repeats (no noise estimate, so no test)."""
    xa = [float(v) for v in a if v is not None and math.isfinite(v)]
    xb = [float(v) for v in b if v is not None and math.isfinite(v)]
    if len(xa) < 2 and len(xb) < 2 or not xa or not xb:
        return None
    if len(xa) == 1:
        return one_sample_p(xb, xa[0])
    if len(xb) == 1:
        return one_sample_p(xa, xb[0])
    ma, mb = math.fsum(xa) / len(xa), math.fsum(xb) / len(xb)
    va = math.fsum((x - ma) ** 2 for x in xa) / (len(xa) - 1) / len(xa)
    vb = math.fsum((x - mb) ** 2 for x in xb) / (len(xb) - 1) / len(xb)
    if va + vb == 0.0:
        return 1.0 if ma == mb else 0.0  # no noise at all: any difference is real
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va * va / (len(xa) - 1) if va else 0.0) + (vb * vb / (len(xb) - 1) if vb else 0.0))
    return t_two_sided_p(t, df)


def significant(a: Sequence[float], b: Sequence[float]) -> bool | None:
    """Whether the means of two sets of repeats differ at the 5% level (None: cannot tell)."""
    p = welch_p(a, b)
    return None if p is None else p < ALPHA
