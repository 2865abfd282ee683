"""Metrics the store derives from its own request rows, so every run (recorded, interrupted or
imported) is compared on the same definitions whatever produced it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class RequestArrays:
    """A run's requests as columns (NaN where a value is missing)."""

    level: np.ndarray
    start_wall: np.ndarray
    ttft_ms: np.ndarray
    e2e_ms: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    ok: np.ndarray
    errors: list[str | None] = field(default_factory=list)
    itl_flat: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))
    itl_bounds: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    """All inter-token latencies back to back: request i's are ``itl_flat[itl_bounds[i]:itl_bounds[i+1]]``."""

    def itl(self, i: int) -> np.ndarray:
        return self.itl_flat[self.itl_bounds[i]:self.itl_bounds[i + 1]]

    def __len__(self) -> int:
        return int(self.ttft_ms.shape[0])

    def select(self, mask: np.ndarray) -> RequestArrays:
        idx = np.flatnonzero(mask)
        counts = np.diff(self.itl_bounds)
        flat = self.itl_flat[np.repeat(mask, counts)] if self.itl_flat.size else self.itl_flat
        return RequestArrays(self.level[idx], self.start_wall[idx], self.ttft_ms[idx], self.e2e_ms[idx],
                             self.input_tokens[idx], self.output_tokens[idx], self.ok[idx],
                             [self.errors[i] for i in idx] if self.errors else [],
                             flat, np.concatenate(([0], np.cumsum(counts[idx], dtype=np.int64))))


def _stats(prefix: str, values: np.ndarray, out: dict[str, float]) -> None:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return
    out[f"{prefix}_mean"] = float(values.mean())
    for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES), strict=True):
        out[f"{prefix}_p{p}"] = float(v)


def summarize_requests(req: RequestArrays, duration_s: float | None = None) -> dict[str, float]:
    """Latency percentiles, throughput and errors of a set of requests (names carry units)."""
    out: dict[str, float] = {}
    total = len(req)
    if total == 0:
        return out
    ok = req.ok
    failed = int((~ok).sum())
    out["requests_total"] = float(total)
    out["requests_failed"] = float(failed)
    out["error_rate_pct"] = 100.0 * failed / total
    _stats("ttft_ms", req.ttft_ms[ok], out)
    _stats("e2e_ms", req.e2e_ms[ok], out)
    if req.itl_flat.size:
        itl_all = req.itl_flat if ok.all() else req.itl_flat[np.repeat(ok, np.diff(req.itl_bounds))]
        if itl_all.size:
            _stats("itl_ms", itl_all, out)
    out_tok = req.output_tokens[ok]
    multi = ok & (req.output_tokens > 1) & np.isfinite(req.e2e_ms) & np.isfinite(req.ttft_ms)
    if multi.any():
        tpot = (req.e2e_ms[multi] - req.ttft_ms[multi]) / (req.output_tokens[multi] - 1)
        _stats("tpot_ms", tpot, out)
    out["output_tokens_total"] = float(np.nansum(out_tok))
    out["input_tokens_total"] = float(np.nansum(req.input_tokens[ok]))
    if duration_s is None:
        starts = req.start_wall
        ends = starts + np.nan_to_num(req.e2e_ms, nan=0.0) / 1000.0
        if np.isfinite(starts).any():
            duration_s = float(np.nanmax(ends) - np.nanmin(starts))
    if duration_s and duration_s > 0:
        out["duration_s"] = float(duration_s)
        out["output_tok_per_s"] = out["output_tokens_total"] / duration_s
        out["requests_per_s"] = float(ok.sum()) / duration_s
    return out


def lower_is_better(metric: str) -> bool | None:
    """Direction of improvement from the metric's name (None = neither, e.g. a count)."""
    name = metric.rsplit(".", 1)[-1]
    if any(k in name for k in ("_per_s", "throughput", "hit", "goodput", "accept")):
        return False
    if any(k in name for k in ("_ms", "latency", "failed", "error", "_s_", "startup_s", "preempt")):
        return True
    return None
