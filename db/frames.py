"""The containers the store's codecs write (``db.codecs``, ``db.series``): integer arrays as
byte planes (every value's first byte, then every second byte...: slowly changing high bytes then
cost almost nothing once compressed), planes compressed one by one, and frames: named columns
with a JSON description, compressed together under zlib's checksum.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from db.errors import DamagedData

EXACT_LIMIT = 2**52  # integers (microseconds, counts) that float64 and the codecs carry exactly
FRAME_VERSION = 1
LEN = struct.Struct("<I")
_JSON = json.JSONEncoder(default=str, separators=(",", ":"))  # json.dumps(default=) builds one per call
_FRAME_DICT = (  # what a frame's description usually says (zlib preset dictionary): never edit, frames need it
    b'{"n":100,"errors":[[0,"HTTP 500"]],"cols":[{"c":"level","k":"c","v":0},{"c":"start_wall","k":"t",'
    b'"d":1800000000000000,"w":4,"x":1000000.0},{"c":"ttft_ms","k":"t","w":4,"x":1000.0},{"c":"e2e_ms","k":"t",'
    b'"w":4,"x":1000.0},{"c":"input_tokens","k":"c","v":128},{"c":"output_tokens","k":"c","v":64},{"c":"itl_n",'
    b'"k":"c","v":63},{"c":"index","k":"i","d":0,"w":1},{"c":"conversation","k":"c","v":0},{"c":"turn","k":"c",'
    b'"v":0},{"c":"scheduled_s","k":"t","d":0,"w":4,"x":1000000.0},{"c":"start_s","k":"t","d":1000,"w":4,'
    b'"x":1000000.0},{"c":"queue_ms","k":"t","w":2,"x":1000.0},{"c":"tpot_ms","k":"t","w":2,"x":1000.0},'
    b'{"c":"input_tokens_counted","k":"c","v":128},{"c":"expected_output_tokens","k":"c","v":64},{"c":"chunks",'
    b'"k":"c","v":64},{"c":"tokens_source","k":"c","v":"usage"},{"c":"finish_reason","k":"c","v":"length"},'
    b'{"c":"error_kind","k":"c","v":null},{"c":"http_status","k":"c","v":200}]}'
)


class Missing:
    """A field a record does not have (unlike a field set to None)."""


MISSING = Missing()


# --- integer arrays as byte planes -----------------------------------------------------------------

_WIDTHS = ((0xFF, np.uint8), (0xFFFF, np.uint16), (0xFFFFFFFF, np.uint32))


def zigzag(v: np.ndarray) -> np.ndarray:
    """Signed to unsigned, small magnitudes to small numbers (|v| < 2**62)."""
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def unzigzag(u: np.ndarray) -> np.ndarray:
    u = u.astype(np.uint64)
    return (u >> np.uint64(1)).view(np.int64) ^ -(u & np.uint64(1)).view(np.int64)


def narrow(u: np.ndarray) -> np.ndarray:
    top = int(u.max()) if u.size else 0
    for limit, dtype in _WIDTHS:
        if top <= limit:
            return u.astype(dtype)
    return u


def planes(a: np.ndarray) -> bytes:
    """Byte-shuffled little-endian bytes: every value's first byte, then every second byte..."""
    if a.itemsize == 1:
        return a.tobytes()
    return a.astype(a.dtype.newbyteorder("<"), copy=False).view(np.uint8).reshape(a.size, a.itemsize).T.tobytes()


def unplanes(buf: bytes | memoryview, width: int, n: int) -> np.ndarray:
    planes = np.frombuffer(buf, np.uint8, count=n * width).reshape(width, n)
    if width == 1:
        return planes[0].copy()
    dtype = {2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    out = planes[0].astype(dtype)
    for k in range(1, width):
        out |= planes[k].astype(dtype) << dtype(8 * k)
    return out


# --- frames: a JSON description and byte-plane arrays, compressed together ----------------------

class Frame:
    """Columns for one blob. Kinds: ``c`` one value for every row (in the description), ``i``
    integers, ``t`` times as integer microseconds, ``f`` float64 bits, ``j`` JSON values (in the
    description). A column may carry a state per row (0 field absent, 1 None, 2 value) and be
    delta-encoded."""

    def __init__(self) -> None:
        self.cols: list[dict[str, Any]] = []
        self.parts: list[bytes] = []

    def _add(self, desc: dict[str, Any], states: np.ndarray | None, body: bytes) -> None:
        if states is not None:
            desc["s"] = 1
            self.parts.append(states.tobytes())
        self.cols.append(desc)
        self.parts.append(body)

    def add_const(self, name: str, value: Any) -> None:
        self.cols.append({"c": name, "k": "c", "v": value})

    def add_ints(self, name: str, kind: str, ints: np.ndarray, states: np.ndarray | None, scale: float = 1.0,
                 delta: bool = False) -> None:
        """``ints``: int64 (|values| < 2**62), anything where ``states`` says there is no value."""
        desc: dict[str, Any] = {"c": name, "k": kind}
        if delta and ints.size:
            if states is not None:  # carry the last value over gaps so that the deltas stay small
                idx = np.where(states == 2, np.arange(ints.size), 0)
                np.maximum.accumulate(idx, out=idx)
                ints = ints[idx]
            coded = np.empty_like(ints)
            coded[0] = 0
            np.subtract(ints[1:], ints[:-1], out=coded[1:])
            desc["d"] = int(ints[0])  # the first value; then the steps
            ints = coded
        u = narrow(zigzag(ints))
        desc["w"] = u.itemsize
        if kind == "t":
            desc["x"] = scale
        self._add(desc, states, planes(u))

    def add_floats(self, name: str, values: np.ndarray, states: np.ndarray | None) -> None:
        self._add({"c": name, "k": "f", "w": 8}, states, planes(np.ascontiguousarray(values, "<f8").view("<u8")))

    def add_json(self, name: str, values: list[Any], states: np.ndarray | None) -> None:
        """``values``: only the rows whose state is 2 (all rows without ``states``)."""
        self._add({"c": name, "k": "j", "v": values}, states, b"")

    def add_numbers(self, name: str, values: np.ndarray, states: np.ndarray | None, scale: float | None,
                    delta: bool = False) -> None:
        """Float values: as microseconds when they are times that fit, else as float64 bits."""
        if scale is not None:
            scaled = values * scale
            if states is not None:
                scaled[states != 2] = 0.0
            if np.isfinite(scaled).all() and np.abs(scaled).max(initial=0.0) < EXACT_LIMIT:
                self.add_ints(name, "t", np.rint(scaled).astype(np.int64), states, scale, delta)
                return
        self.add_floats(name, values, states)

    def encode(self, meta: Mapping[str, Any], level: int = 6) -> bytes:
        head = _JSON.encode({**meta, "cols": self.cols}).encode()
        coder = zlib.compressobj(level, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, _FRAME_DICT)
        return coder.compress(b"".join([bytes([FRAME_VERSION]), LEN.pack(len(head)), head, *self.parts])) + coder.flush()


@dataclass
class Column:
    kind: str
    values: np.ndarray | list[Any]
    """Numbers as float64 (NaN where no value) for numeric kinds; per-row values otherwise."""
    states: np.ndarray | None


def decode_frame(blob: bytes, wanted: Callable[[str], bool] | None = None) -> tuple[dict[str, Any],
                                                                                      dict[str, Column]]:
    """The frame's description and its columns (only those ``wanted`` when given)."""
    try:
        inflater = zlib.decompressobj(zdict=_FRAME_DICT)
        payload = inflater.decompress(blob)
        if not inflater.eof or inflater.unused_data:
            raise DamagedData("truncated frame")
        if payload[0] != FRAME_VERSION:
            raise DamagedData(f"unknown frame version {payload[0]}")
        (head_len,) = LEN.unpack_from(payload, 1)
        meta = json.loads(payload[5:5 + head_len])
        view = memoryview(payload)
        at = 5 + head_len
        n = int(meta["n"])
        out: dict[str, Column] = {}
        for col in meta["cols"]:
            states = None
            if col.get("s"):
                states = np.frombuffer(view[at:at + n], np.uint8)
                at += n
            kind = col["k"]
            size = n * col["w"] if kind in ("i", "t", "f") else 0
            body = view[at:at + size]
            at += size
            name = col["c"]
            if wanted is not None and not wanted(name):
                continue
            if kind == "c":
                out[name] = Column(kind, [col["v"]] * n, None)
                continue
            if kind == "j":
                values: Any = col["v"]
                if states is not None:
                    it = iter(values)
                    values = [next(it) if s == 2 else (None if s == 1 else MISSING) for s in states]
                if len(values) != n:
                    raise DamagedData(f"column {name} of {len(values)} rows in a frame of {n}")
                out[name] = Column(kind, values, states)
                continue
            u = unplanes(body, col["w"], n)
            if kind == "f":
                numbers = u.view("<f8").astype(np.float64)
            else:
                ints = unzigzag(u)
                if "d" in col:
                    ints = np.cumsum(ints)
                    ints += col["d"]
                numbers = ints / col["x"] if kind == "t" else ints.astype(np.float64)
            if states is not None:
                numbers[states != 2] = np.nan
            out[name] = Column(kind, numbers, states)
        if at != len(payload):
            raise DamagedData(f"frame of {len(payload)} bytes describes {at}")
        return meta, out
    except (zlib.error, ValueError, KeyError, TypeError, IndexError, struct.error, StopIteration) as exc:
        raise DamagedData(f"undecodable frame: {exc}") from None



# --- byte planes compressed one by one ------------------------------------------------------------

def squeeze(plane: bytes, huffman: bool) -> bytes:
    """One byte plane: constant (1 byte), Huffman- or deflate-coded, or raw if that is no smaller
    (noise: the low bytes of measured latencies)."""
    if not plane:
        return b"\x01"
    if len(plane) >= 1024:
        counts = np.bincount(np.frombuffer(plane, np.uint8), minlength=256)
        if counts.max() == len(plane):
            return b"\x00" + plane[:1]
        if huffman and counts.min() * 256 > len(plane) * 0.3:  # every byte value about equally common
            return b"\x01" + plane
    elif plane.count(plane[:1]) == len(plane):
        return b"\x00" + plane[:1]
    coder = zlib.compressobj(1 if huffman else 6, zlib.DEFLATED, -15, 8,
                             zlib.Z_HUFFMAN_ONLY if huffman else zlib.Z_DEFAULT_STRATEGY)
    packed = coder.compress(plane) + coder.flush()
    if len(packed) < len(plane):
        return b"\x02" + LEN.pack(len(packed)) + packed
    return b"\x01" + plane


def unsqueeze(view: memoryview, at: int, n: int) -> tuple[bytes, int]:
    tag = view[at]
    if tag == 0:
        return bytes(view[at + 1:at + 2]) * n, at + 2
    if tag == 1:
        return bytes(view[at + 1:at + 1 + n]), at + 1 + n
    if tag != 2:
        raise DamagedData(f"unknown latency plane {tag}")
    (size,) = LEN.unpack_from(view, at + 1)
    plane = zlib.decompress(view[at + 5:at + 5 + size], -15)
    if len(plane) != n:
        raise DamagedData("short latency plane")
    return plane, at + 5 + size
