"""What the store takes and gives back: plain pydantic models and numpy blocks, so that callers
never see SQLAlchemy rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

CANCELLED = "cancelled"
"""The error text (and kind) of a request cancelled by the user."""


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
    queue_ms: np.ndarray | None = None
    """Client queueing per request, when the caller has it (the runner does; the store keeps it
    only inside the level summary)."""

    def itl(self, i: int) -> np.ndarray:
        return self.itl_flat[self.itl_bounds[i]:self.itl_bounds[i + 1]]

    def __len__(self) -> int:
        return int(self.ttft_ms.shape[0])

    @property
    def cancelled(self) -> np.ndarray:
        return np.array([e == CANCELLED for e in self.errors], dtype=bool) if self.errors else np.zeros(len(self), bool)

    def select(self, mask: np.ndarray) -> RequestArrays:
        idx = np.flatnonzero(mask)
        counts = np.diff(self.itl_bounds)
        flat = self.itl_flat[np.repeat(mask, counts)] if self.itl_flat.size else self.itl_flat
        return RequestArrays(self.level[idx], self.start_wall[idx], self.ttft_ms[idx], self.e2e_ms[idx],
                             self.input_tokens[idx], self.output_tokens[idx], self.ok[idx],
                             [self.errors[i] for i in idx] if self.errors else [],
                             flat, np.concatenate(([0], np.cumsum(counts[idx], dtype=np.int64))),
                             None if self.queue_ms is None else self.queue_ms[idx])

    @classmethod
    def from_columns(cls, *, level: Sequence[float], start_wall: Sequence[float | None],
                     ttft_ms: Sequence[float | None], e2e_ms: Sequence[float | None],
                     input_tokens: Sequence[float | None], output_tokens: Sequence[float | None],
                     ok: Sequence[bool], errors: Sequence[str | None], itl_ms: Sequence[Sequence[float]],
                     queue_ms: Sequence[float | None] | None = None) -> RequestArrays:
        """Arrays from per-request Python values (None -> NaN), as the runner holds them."""
        def col(values: Sequence[float | None]) -> np.ndarray:
            return np.array([np.nan if v is None else v for v in values], dtype=float)

        counts = np.array([len(x) for x in itl_ms], dtype=np.int64)
        flat = (np.concatenate([np.asarray(x, dtype=float) for x in itl_ms if len(x)])
                if counts.sum() else np.empty(0, dtype=float))
        return cls(col(level), col(start_wall), col(ttft_ms), col(e2e_ms), col(input_tokens), col(output_tokens),
                   np.array(ok, dtype=bool), list(errors), flat,
                   np.concatenate(([0], np.cumsum(counts, dtype=np.int64))),
                   None if queue_ms is None else col(queue_ms))


class LevelInfo(BaseModel):
    idx: int
    label: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    started_at: float | None = None
    finished_at: float | None = None
    summary: dict[str, Any] | None = None
    sample: dict[str, Any] | None = None
    """One request as it streamed (``app.load.client.StreamSample``); None for runs stored before
    samples were kept."""


def gpu_model_of(hardware: Mapping[str, Any]) -> str:
    """The GPU model a run's stored hardware names ("" for a machine without an NVIDIA GPU):
    the distinct board names, in order."""
    gpus = hardware.get("gpus") or []
    names = [str(g.get("name")) for g in gpus if isinstance(g, Mapping) and g.get("name")]
    return ", ".join(dict.fromkeys(names))


class RunInfo(BaseModel):
    """A run as listed: identity, status and headline metrics."""

    id: int
    uid: str
    name: str
    status: str
    reason: str | None = None
    tags: list[str] = Field(default_factory=list)
    notes: str = ""
    started_at: float
    finished_at: float | None = None
    engine_kind: str = ""
    engine_version: str | None = None
    model: str = ""
    imported: bool = False
    imported_from: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    author: str = ""
    host: str = ""
    gpu_model: str = ""

    @property
    def duration_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at


class RunDetail(RunInfo):
    """Everything recorded about a run except the bulky series (requests, samples, log)."""

    endpoint: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    argv: list[str] | None = None
    env: dict[str, Any] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    engine_info: dict[str, Any] = Field(default_factory=dict)
    summary: dict[str, Any] = Field(default_factory=dict)
    t0_mono: float | None = None
    quality: dict[str, Any] | None = None
    """The quality probe's figures (``app.quality``), None for a run without one (and every run
    recorded before revision 0008)."""
    writer_namespace: str = ""
    """Where the pid of the process recording it means something (``pid_namespace``)."""
    levels: list[LevelInfo] = Field(default_factory=list)
    events: list[dict[str, Any]] = Field(default_factory=list)
    n_requests: int = 0
    n_samples: int = 0
    n_log_lines: int = 0
    dropped_items: int = 0
    writer_pid: int | None = None


@dataclass
class SeriesBlock:
    """One source's samples: times and an n x k value matrix (NaN = not sampled)."""

    source: str
    names: list[str]
    t_mono: np.ndarray
    t_wall: np.ndarray
    values: np.ndarray

    def column(self, name: str) -> np.ndarray:
        return self.values[:, self.names.index(name)]


@dataclass
class SampleIn:
    """What ``write_batch`` accepts for telemetry (app.bus.Sample has the same fields)."""

    source: str
    t_mono: float
    t_wall: float
    values: Mapping[str, float]


@dataclass
class ImportedRun:
    """A finished run read from a file, every value checked, ready for :meth:`RunStore.import_runs`.
    Requests are records as ``write_batch`` takes them; levels carry their own summaries."""

    name: str
    imported_from: str
    started_at: float
    finished_at: float
    status: str = "completed"
    reason: str | None = None
    notes: str = ""
    model: str = ""
    engine_kind: str = ""
    engine_version: str | None = None
    t0_mono: float | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    hardware: Mapping[str, Any] = field(default_factory=dict)
    argv: Sequence[str] | None = None
    tags: Sequence[str] = ()
    summary: Mapping[str, Any] = field(default_factory=dict)
    extra_metrics: Mapping[str, float] = field(default_factory=dict)
    """The file's own figures, for what its requests cannot give (stored figures win)."""
    requests: Sequence[Mapping[str, Any]] = ()
    samples: Sequence[SampleIn] = ()
    log_lines: Sequence[str] = ()
    levels: Sequence[LevelInfo] = ()
