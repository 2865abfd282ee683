"""How a run's telemetry and engine log are packed: one raw chunk per source per flush while the
run records, one packed chunk per source once it finishes (times to the microsecond, values
exactly, in a ``db.frames`` frame), the log as zlib-compressed lines.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from db.codecs import finite
from db.errors import DamagedData, StoreError
from db.frames import Frame, decode_frame
from db.records import SampleIn, SeriesBlock

# --- telemetry ------------------------------------------------------------------------------------

@dataclass
class SampleRows:
    """One source's samples of one flush, as a ``sample_chunks`` row (raw float64, codec 0)."""

    source: str
    n: int
    names: list[str]
    t_mono: bytes
    t_wall: bytes
    data: bytes


def _sample_time(value: Any, what: str) -> float:
    number = finite(value)
    if number is None:
        raise StoreError(f"a telemetry sample's {what} {str(value)[:40]!r} is not a number")
    return number


def pack_samples(samples: Sequence[SampleIn | Any]) -> list[SampleRows]:
    """Group one flush's samples by source (names: the union of the keys seen). Stored raw: a
    flush is small, and ``compact_samples`` packs a finished run's samples per source."""
    by_source: dict[str, list[Any]] = {}
    for s in samples:
        by_source.setdefault(str(s.source), []).append(s)
    rows = []
    for source, items in by_source.items():
        names: dict[str, int] = {}
        for s in items:
            for key in s.values:
                names.setdefault(str(key), len(names))
        n = len(items)
        order = list(names)
        nan = math.nan
        try:  # the common case: plain numbers (None and missing names become NaN)
            data = np.array([[nan if (v := s.values.get(name)) is None else v for name in order] for s in items],
                            dtype="<f8").reshape(n, len(order))
        except (TypeError, ValueError, OverflowError):
            data = np.array([[nan if (v := finite(s.values.get(name))) is None else v for name in order]
                             for s in items], dtype="<f8").reshape(n, len(order))
        try:
            t_mono = np.array([s.t_mono for s in items], "<f8")
            t_wall = np.array([s.t_wall for s in items], "<f8")
            good = bool(np.isfinite(t_mono).all() and np.isfinite(t_wall).all())
        except (TypeError, ValueError, OverflowError):
            good = False
        if not good:
            t_mono = np.array([_sample_time(s.t_mono, "monotonic time") for s in items], "<f8")
            t_wall = np.array([_sample_time(s.t_wall, "wall time") for s in items], "<f8")
        rows.append(SampleRows(source, n, order, t_mono.tobytes(), t_wall.tobytes(), data.tobytes()))
    return rows


def encode_series(block: SeriesBlock) -> bytes:
    """A source's samples packed (codec 1): times to the microsecond, values exactly."""
    frame = Frame()
    frame.add_numbers("t_mono", block.t_mono.astype(np.float64), None, 1e6, delta=True)
    frame.add_numbers("t_wall", block.t_wall.astype(np.float64), None, 1e6, delta=True)
    for i in range(len(block.names)):
        frame.add_floats(str(i), np.ascontiguousarray(block.values[:, i], np.float64), None)
    return frame.encode({"n": int(block.t_mono.size), "k": len(block.names)}, level=1)


def _decode_series(data: bytes, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    _, cols = decode_frame(data)
    try:
        values = np.column_stack([cols[str(i)].values for i in range(k)]) if k else np.empty((n, 0))
        t_mono, t_wall = np.asarray(cols["t_mono"].values), np.asarray(cols["t_wall"].values)
    except KeyError as exc:
        raise DamagedData(f"telemetry chunk without column {exc}") from None
    if values.shape != (n, k) or t_mono.size != n:
        raise DamagedData("telemetry chunk of the wrong shape")
    return t_mono, t_wall, values


@dataclass
class SampleChunkRow:
    """A ``sample_chunks`` row as the codecs read it."""

    n: int
    names: list[str]
    t_mono: bytes
    t_wall: bytes
    data: bytes
    codec: int


def _raw_block(chunks: Sequence[SampleChunkRow]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw chunks with the same names, read as one block (a run has a chunk per second)."""
    n, k = sum(c.n for c in chunks), len(chunks[0].names)
    for c in chunks:
        if len(c.data) != 8 * c.n * k or len(c.t_mono) != 8 * c.n or len(c.t_wall) != 8 * c.n:
            raise DamagedData("telemetry chunk of the wrong size")
    return (np.frombuffer(b"".join(c.t_mono for c in chunks), "<f8"),
            np.frombuffer(b"".join(c.t_wall for c in chunks), "<f8"),
            np.frombuffer(b"".join(c.data for c in chunks), "<f8").reshape(n, k))


def merge_blocks(source: str, chunks: Sequence[SampleChunkRow]) -> SeriesBlock:
    """One source's ``sample_chunks`` rows (raw or packed) as one block in time order."""
    names: dict[str, int] = {}
    for c in chunks:
        for name in c.names:
            names.setdefault(name, len(names))
    total = sum(c.n for c in chunks)
    values = np.full((total, len(names)), np.nan)
    t_mono = np.empty(total)
    t_wall = np.empty(total)
    row = first = 0
    while first < len(chunks):
        c = chunks[first]
        last = first + 1
        if c.codec == 1:
            tm, tw, block = _decode_series(c.data, c.n, len(c.names))
        else:
            while last < len(chunks) and chunks[last].codec == 0 and chunks[last].names == c.names:
                last += 1
            tm, tw, block = _raw_block(chunks[first:last])
        cols = [names[nm] for nm in c.names]
        if cols == list(range(len(names))):
            values[row:row + tm.size] = block
        else:
            values[row:row + tm.size, cols] = block
        t_mono[row:row + tm.size] = tm
        t_wall[row:row + tm.size] = tw
        row += tm.size
        first = last
    order = np.argsort(t_mono, kind="stable")
    return SeriesBlock(source, list(names), t_mono[order], t_wall[order], values[order])


# --- engine log -----------------------------------------------------------------------------------

def encode_log(lines: Sequence[str]) -> bytes:
    return zlib.compress("\n".join(lines).encode("utf-8", "replace"), 6)


def decode_log(blob: bytes) -> list[str]:
    try:
        return zlib.decompress(blob).decode("utf-8", "replace").split("\n")
    except zlib.error as exc:
        raise DamagedData(f"undecodable log: {exc}") from None
