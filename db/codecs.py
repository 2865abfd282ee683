"""How a run's requests are packed into blobs: their fields as columns, their per-token
latencies apart (telemetry and the log: ``db.series``; the containers: ``db.frames``).

A run of 100,000 requests of 63 tokens and 36,000 samples (``benchmarks/store.py``) takes about
9 MiB with its telemetry, 34 MiB before these codecs. Numbers are stored as integers where that
is exact enough, delta-encoded where they grow steadily, split into byte planes and compressed.

What is kept, exactly or to what precision:

- request times (``start_wall``, ``ttft_ms``, ``e2e_ms`` and any other ``*_ms``/``*_s`` field) and
  sample times: to the microsecond;
- inter-token latencies: to the microsecond below 1.024 ms, above it to 10 significant bits (at
  most 0.1% off: 8 to 16 µs at 16 ms), which is finer than a client's own timing jitter. This is
  what brings the size down: measured latencies are noise in their low bits, and each bit kept
  costs 100,000 x 63 bits per run. Latencies that are whole microseconds (typed in, or rounded by
  the tool that measured them) are kept exactly;
- token counts, telemetry values and any other number: exactly; other fields: as JSON.

Every blob carries a checksum (zlib's, or a CRC-32): damaged bytes raise :class:`DamagedData`
instead of being read as numbers.
"""

from __future__ import annotations

import functools
import math
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from db.errors import DamagedData, StoreError
from db.frames import (
    EXACT_LIMIT,
    MISSING,
    Frame,
    Missing,
    decode_frame,
    narrow,
    planes,
    squeeze,
    unplanes,
    unsqueeze,
)

ITL_SIGNIFICANT_BITS = 10
"""Inter-token latencies keep this many significant bits of their microseconds (see above)."""

_INT_LIMIT = 2**62  # stored integers stay below this (zigzag encoding doubles them)
_ITL_VERSION = 1
_ITL_HEADER = struct.Struct("<BBBBII")  # version, lossy, itemsize, significant bits, n, exceptions
_CRC = struct.Struct("<I")
_NONE = type(None)

# --- request fields ------------------------------------------------------------------------------

REQUEST_ALIASES: dict[str, tuple[str, ...]] = {
    "start_wall": ("start_wall_s", "t_start_wall", "started_at", "start_time", "t_wall"),
    "e2e_ms": ("latency_ms",),
    "input_tokens": ("prompt_tokens",),
    "output_tokens": ("completion_tokens", "tokens"),
    "level": ("level_index",),
}
"""Other names under which request records (imports, older payloads) carry the stored fields."""
KNOWN_REQUEST_KEYS = frozenset({"level", "start_wall", "ttft_ms", "e2e_ms", "input_tokens", "output_tokens",
                                "itl_ms", "error", "seq", "ok", "run_id"}
                               | {k for keys in REQUEST_ALIASES.values() for k in keys})
"""Fields a request record maps onto the stored columns (or drops); the rest are kept as extras."""

# column name, kind ("i" integer, "t" time), microseconds per unit, delta-encoded
_CORE = (("level", "i", 1.0, False), ("start_wall", "t", 1e6, True), ("ttft_ms", "t", 1e3, False),
         ("e2e_ms", "t", 1e3, False), ("input_tokens", "i", 1.0, False), ("output_tokens", "i", 1.0, False),
         ("itl_n", "i", 1.0, False))
_CORE_NAMES = tuple(c[0] for c in _CORE)


def finite(value: Any) -> float | None:
    """A finite float from a number or numeric text; None for anything else (bool included)."""
    if value is None or value.__class__ is bool:
        return None
    if value.__class__ is float:
        return value if value - value == 0.0 else None  # finite
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if math.isfinite(out) else None


def _time_scale(name: str) -> float | None:
    """Microseconds per unit for a field named with a time unit."""
    if name.endswith("_ms"):
        return 1e3
    if name.endswith("_s"):
        return 1e6
    return None


# --- per-token latencies --------------------------------------------------------------------------

def encode_itl(ms: np.ndarray, *, exact: bool | None = None) -> bytes:
    """Latencies in milliseconds. ``exact``: keep whole microseconds (default: when every value
    is one); otherwise 10 significant bits (module docstring). Negative, non-finite and huge
    values are kept as they are, beside the codes. This runs for every flush of every run."""
    ms = np.asarray(ms, np.float64)
    n = ms.size
    us = ms * 1000.0
    if n and not (us.min() >= 0.0 and us.max() < EXACT_LIMIT):  # NaN fails both
        odd = np.flatnonzero(~(np.isfinite(us) & (us >= 0.0) & (us < EXACT_LIMIT)))
        us[odd] = 0.0
    else:
        odd = np.empty(0, np.int64)
    whole = np.rint(us)
    if exact is None:
        fitted = ms if not odd.size else np.where(np.isin(np.arange(n), odd), 0.0, ms)
        exact = bool(np.array_equal(whole[:8] / 1000.0, fitted[:8]) and np.array_equal(whole / 1000.0, fitted))
    bits = ITL_SIGNIFICANT_BITS
    if exact:
        codes = whole.astype(np.int64)
    else:
        shift = np.frexp(whole)[1]  # bit length of the microseconds
        shift -= bits
        np.maximum(shift, 0, out=shift)
        codes = np.rint(np.ldexp(us, -shift)).astype(np.int64)  # mantissa, plus the shift above it:
        codes += shift.astype(np.int64) << (bits - 1)  # codes grow with the value
    u = narrow(codes.view(np.uint64))
    raw = planes(u)
    parts = [_ITL_HEADER.pack(_ITL_VERSION, 0 if exact else 1, u.itemsize, bits, n, odd.size),
             odd.astype("<u4").tobytes(), ms[odd].astype("<f8").tobytes()]
    parts.extend(squeeze(raw[i * n:(i + 1) * n], huffman=not exact) for i in range(u.itemsize))
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


@dataclass
class _ItlParts:
    lossy: bool
    width: int
    bits: int
    n: int
    odd: np.ndarray
    odd_values: np.ndarray
    planes: list[bytes]


def _itl_parts(blob: bytes) -> _ItlParts:
    """A latency blob checked and unpacked down to its byte planes."""
    try:
        view = memoryview(blob)
        if len(blob) < _ITL_HEADER.size + 4 or _CRC.unpack_from(view, len(blob) - 4)[0] != zlib.crc32(view[:-4]):
            raise DamagedData("latency checksum mismatch")
        version, lossy, width, bits, n, n_odd = _ITL_HEADER.unpack_from(view)
        if version != _ITL_VERSION or width not in (1, 2, 4, 8):
            raise DamagedData(f"unknown latency codec {version}/{width}")
        at = _ITL_HEADER.size
        odd = np.frombuffer(view[at:at + 4 * n_odd], "<u4").astype(np.int64)
        at += 4 * n_odd
        odd_values = np.frombuffer(view[at:at + 8 * n_odd], "<f8")
        at += 8 * n_odd
        found = []
        for _ in range(width):
            plane, at = unsqueeze(view, at, n)
            found.append(plane)
        if at != len(blob) - 4:
            raise DamagedData("latency blob length mismatch")
        return _ItlParts(bool(lossy), width, bits, n, odd, odd_values, found)
    except (zlib.error, ValueError, IndexError, struct.error) as exc:
        raise DamagedData(f"undecodable latencies: {exc}") from None


@functools.cache
def _itl_table(bits: int) -> np.ndarray:
    """Milliseconds for every 16-bit code with ``bits`` significant bits (decoding is one lookup)."""
    codes = np.arange(1 << 16, dtype=np.int64)
    shift = np.maximum((codes >> (bits - 1)) - 1, 0)
    return np.ldexp((codes - (shift << (bits - 1))).astype(np.float64), shift.astype(np.int32)) / 1000.0


def decode_itl(blob: bytes) -> np.ndarray:
    """Latencies in milliseconds (float64)."""
    return decode_itl_all([blob])


def decode_itl_all(blobs: Sequence[bytes]) -> np.ndarray:
    """Several chunks' latencies back to back, decoded together (a run has hundreds of chunks)."""
    parts = [_itl_parts(blob) for blob in blobs]
    out = np.empty(sum(p.n for p in parts))
    first = at = 0
    while first < len(parts):
        kind = (parts[first].lossy, parts[first].width, parts[first].bits)
        last = first
        while last < len(parts) and (parts[last].lossy, parts[last].width, parts[last].bits) == kind:
            last += 1
        group = parts[first:last]
        lossy, width, bits = kind
        n = sum(p.n for p in group)
        raw = b"".join(b"".join(p.planes[i] for p in group) for i in range(width))
        codes = unplanes(raw, width, n)
        if lossy and width <= 2:
            values = _itl_table(bits)[codes]
        elif lossy:
            wide = codes.astype(np.int64)
            shift = np.maximum((wide >> (bits - 1)) - 1, 0)
            values = np.ldexp((wide - (shift << (bits - 1))).astype(np.float64), shift.astype(np.int32)) / 1000.0
        else:
            values = codes / 1000.0
        out[at:at + n] = values
        offset = at
        for p in group:
            if p.odd.size:
                out[offset + p.odd] = p.odd_values
            offset += p.n
        at += n
        first = last
    return out


# --- request chunks -------------------------------------------------------------------------------

@dataclass
class EncodedRequests:
    """A batch of request records as one ``request_chunks`` row."""

    n: int
    end_wall: float | None
    """When the batch's last request ended (wall clock), for runs whose writer died."""
    columns: bytes
    itl: bytes


def _transpose(records: Sequence[Mapping[str, Any]]) -> dict[str, Sequence[Any]]:
    """Field -> values per record (``MISSING`` where a record lacks it). Records with the same
    fields in the same order (what the runner sends) take the fast path."""
    first = tuple(records[0])
    if all(tuple(rec) == first for rec in records):
        return dict(zip(first, zip(*(rec.values() for rec in records), strict=True), strict=True))
    keys: dict[str, None] = {}
    for rec in records:
        keys.update(dict.fromkeys(rec))
    return {k: [rec.get(k, MISSING) for rec in records] for k in keys}


def _states(values: Sequence[Any], kinds: set[type]) -> np.ndarray | None:
    """Per row 0 (absent), 1 (None) or 2 (a value); None when every row has a value."""
    if Missing in kinds:
        return np.array([0 if v is MISSING else 1 if v is None else 2 for v in values], np.uint8)
    if _NONE in kinds:
        return np.array([v is not None for v in values], np.uint8) + 1
    return None


def _field(cols: Mapping[str, Sequence[Any]], name: str, n: int) -> Sequence[Any]:
    """A stored field's values (None where absent), from its aliases where a record has no value
    under its name."""
    values: Sequence[Any] = cols.get(name) or (None,) * n
    kinds = {v.__class__ for v in values}
    if Missing in kinds:
        values = [None if v is MISSING else v for v in values]
    if _NONE in kinds or Missing in kinds:
        for alias in REQUEST_ALIASES.get(name, ()):
            if alias in cols:
                values = [(None if a is MISSING else a) if v is None else v
                          for v, a in zip(values, cols[alias], strict=True)]
    return values


def _core_numbers(name: str, values: Sequence[Any], kinds: set[type]) -> np.ndarray:
    """A stored field's values as float64 (NaN: none, not a finite number, or a bool)."""
    if kinds <= {float, int, _NONE}:
        try:
            out = np.array(values, np.float64)
        except OverflowError:
            raise StoreError(f"request field {name} holds a number too large to store") from None
    else:
        out = np.array([np.nan if (f := finite(v)) is None else f for v in values], np.float64)
    out[~np.isfinite(out)] = np.nan
    return out


def _itl_values(lists: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per-request counts and all latencies back to back."""
    try:
        counts = np.array([0 if v is None or v is MISSING else len(v) for v in lists], np.int64)
    except TypeError:
        raise StoreError("request field itl_ms must be a list of numbers") from None
    total = int(counts.sum())
    present = [v for v in lists if v is not None and v is not MISSING]
    try:
        flat = np.fromiter(chain.from_iterable(present), np.float64, total)
    except (TypeError, ValueError, OverflowError):
        flat = np.empty(total)
        for i, x in enumerate(chain.from_iterable(present)):
            if x is None:
                flat[i] = np.nan
                continue
            value = finite(x)
            if value is None and not (x.__class__ is float or isinstance(x, np.floating)):
                raise StoreError(f"request field itl_ms holds {str(x)[:40]!r}, not a number") from None
            flat[i] = float(x) if value is None else value
    return counts, flat


def _errors(cols: Mapping[str, Sequence[Any]], n: int, mask: Callable[[str], str]) -> list[list[Any]]:
    """``[[row, text], ...]`` for the failed requests: the record's error, else its kind when it
    says it did not succeed."""
    errors = cols.get("error") or (None,) * n
    oks = cols.get("ok") or (None,) * n
    if errors.count(None) == n and False not in oks:
        return []
    kinds = cols.get("error_kind") or (None,) * n
    out = []
    for i, (error, ok, kind) in enumerate(zip(errors, oks, kinds, strict=True)):
        if error is MISSING or error is None or error == "" or error is False:
            if ok is not False:
                continue
            error = (None if kind is MISSING else kind) or "failed"
        out.append([i, mask(str(error))])
    return out


def _constant(values: Sequence[Any], kinds: set[type]) -> bool:
    return len(kinds) == 1 and Missing not in kinds and values.count(values[0]) == len(values)


def _extra_column(frame: Frame, name: str, values: Sequence[Any]) -> None:
    """A field beyond the stored ones: integers, times or floats in binary, the rest as JSON."""
    kinds = {v.__class__ for v in values}
    if _constant(values, kinds):
        frame.add_const(name, values[0])
        return
    numeric = kinds - {_NONE, Missing}
    if numeric and numeric <= {int, float}:
        states = _states(values, kinds)
        plain = values if states is None else [v if s == 2 else 0 for v, s in zip(values, states, strict=True)]
        if numeric == {int}:
            try:
                ints = np.array(plain, np.int64)
            except OverflowError:
                ints = None
            if ints is not None and np.abs(ints).max() < _INT_LIMIT:
                steps = ints[1:] - ints[:-1]
                frame.add_ints(name, "i", ints, states, delta=bool(np.abs(steps).max(initial=0) * 4
                                                                    < np.abs(ints).max()))
                return
        elif numeric == {float} or all(abs(v) < EXACT_LIMIT for v in plain):
            numbers = np.array(plain, np.float64)
            scale = _time_scale(name)
            present = numbers if states is None else numbers[states == 2]
            frame.add_numbers(name, numbers, states, scale,
                              delta=scale is not None and bool((present[1:] >= present[:-1]).all()))
            return
    states = _states(values, kinds) if Missing in kinds else None
    frame.add_json(name, list(values) if states is None else [v for v in values if v is not MISSING], states)


def encode_requests(records: Sequence[Mapping[str, Any]], mask: Callable[[str], str] = str,
                    *, exact_itl: bool | None = None) -> EncodedRequests:
    """Request records (the runner's payload; a few aliases accepted, see ``REQUEST_ALIASES``)
    as a chunk: the stored fields and any others as columns, per-token latencies apart.
    ``mask`` hides secrets in error texts."""
    n = len(records)
    if n == 0:
        raise ValueError("no records")
    cols = _transpose(records)
    frame = Frame()
    counts, flat = _itl_values(cols.get("itl_ms") or (None,) * n)
    start_wall = e2e_ms = np.full(n, np.nan)
    for name, kind, scale, delta in _CORE:
        if name == "itl_n":
            if counts.min() == counts.max():
                frame.add_const(name, int(counts[0]))
            else:
                frame.add_ints(name, kind, counts, None)
            continue
        raw = _field(cols, name, n)
        kinds = {v.__class__ for v in raw}
        values = _core_numbers(name, raw, kinds)
        if name == "start_wall":
            start_wall = values
        elif name == "e2e_ms":
            e2e_ms = values
        if kind == "i":
            values = np.trunc(values)
        scaled = values * scale
        missing = np.isnan(scaled)
        if missing.any():
            scaled[missing] = 0.0
        if np.abs(scaled).max() >= EXACT_LIMIT:
            row = int(np.argmax(np.abs(scaled) >= EXACT_LIMIT))
            raise StoreError(f"request {row}: {name} {values[row]:g} is out of range")
        if _constant(raw, kinds):
            first = float(values[0])
            frame.add_const(name, None if math.isnan(first) else
                            int(first) if kind == "i" else float(np.rint(first * scale)) / scale)
            continue
        states = np.where(missing, 1, 2).astype(np.uint8) if missing.any() else None
        frame.add_ints(name, kind, np.rint(scaled).astype(np.int64), states, scale, delta)
    for name, column in cols.items():
        if name not in KNOWN_REQUEST_KEYS:
            _extra_column(frame, name, column)
    ends = start_wall + np.nan_to_num(e2e_ms) / 1000.0
    end_wall = float(np.nanmax(ends)) if np.isfinite(ends).any() else None
    meta = {"n": n, "errors": _errors(cols, n, mask)}
    return EncodedRequests(n, end_wall, frame.encode(meta), encode_itl(flat, exact=exact_itl))


@dataclass
class RequestColumns:
    """A chunk's stored fields: float64 columns (NaN: no value), latencies per request
    (``itl_n``) and the errors of the failed ones by row."""

    n: int
    columns: dict[str, np.ndarray]
    errors: dict[int, str]


def decode_requests(blob: bytes) -> RequestColumns:
    meta, cols = decode_frame(blob, lambda name: name in _CORE_NAMES)
    missing = [name for name in _CORE_NAMES if name not in cols]
    if missing:
        raise DamagedData(f"request chunk without {', '.join(missing)}")
    out = {}
    n = int(meta["n"])
    for name in _CORE_NAMES:
        col = cols[name]
        if col.kind == "c":
            value = col.values[0] if n else None
            out[name] = np.full(n, np.nan if value is None else float(value))
        else:
            out[name] = np.asarray(col.values)
    return RequestColumns(n, out, {int(i): str(text) for i, text in meta.get("errors", [])})


def decode_extras(blob: bytes) -> list[dict[str, Any]]:
    """Per request, the fields beyond the stored ones (an empty dict when there were none)."""
    meta, cols = decode_frame(blob, lambda name: name not in _CORE_NAMES)
    n = int(meta["n"])
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for name, col in cols.items():
        values = col.values
        convert = int if col.kind == "i" else float if col.kind in ("t", "f") else None
        for i in range(n):
            if col.states is not None and col.states[i] != 2:
                if col.states[i] == 1:
                    out[i][name] = None
                continue
            out[i][name] = values[i] if convert is None else convert(values[i])
    return out
