"""Checked values for the importers: each function takes a value from a parsed JSON file and
returns it converted, or raises :class:`ImportProblem` with a one-line message that names the
field (``ttfts[3]: inf is not a finite number``). Nothing here recurses: a file nested 100,000
levels deep is refused by the JSON reader, and anything kept is at most ``MAX_DEPTH`` deep.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from engine_adapters.config import MAX_ENGINE_TOKENS

MAX_DEPTH = 64
"""Deepest nesting kept from a file (settings, summaries); deeper is refused, never recursed into."""
MAX_INT = 2**63 - 1
"""SQLite integers are signed 64-bit."""
MAX_MS = 1e9
"""A latency above 11.6 days is not a measurement."""
MAX_EPOCH_S = 1e11
"""Wall-clock times: until the year 5138."""
MAX_MONO_S = 1e12
MAX_LEVEL_INDEX = 100_000
MAX_COUNT = 10**12


class ImportProblem(ValueError):
    """A value that cannot be imported; the message names the field."""


# --- checked values --------------------------------------------------------------------------

def show(value: Any) -> str:
    """A value as a message shows it: short, one line, in the file's own (JSON) words; a list or
    an object by its kind, which is what a message about a wrong type needs."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, int) and abs(value) >= 10**24:
        return f"a {len(str(abs(value)))}-digit integer"
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def key_name(key: Any) -> str:
    """A key of the file as part of a field name (quoted when it is not a plain word)."""
    text = str(key)
    return text if re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", text) else json.dumps(text[:64])


def real(value: Any, field: str, lo: float, hi: float, scale: float = 1.0) -> float | None:
    """None stays None (missing); anything else must be a finite number, within [lo, hi] once
    multiplied by ``scale`` (seconds -> milliseconds)."""
    if value.__class__ is float and lo <= value * scale <= hi:  # the common case (NaN fails ``<=``)
        return value * scale  # type: ignore[no-any-return]
    if value is None:
        return None
    if value.__class__ is not float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ImportProblem(f"{field}: expected a number, got {show(value)}")
        if isinstance(value, int) and abs(value) > MAX_INT:
            raise ImportProblem(f"{field}: {show(value)} is out of range")
    x = float(value)
    if not math.isfinite(x):
        raise ImportProblem(f"{field}: {show(value)} is not a finite number")
    x *= scale
    if not lo <= x <= hi:
        raise ImportProblem(f"{field}: {show(value)} is out of range")
    return x


_NUMBER_TYPES = frozenset({float, int})


def reals(items: Any, field: str, lo: float, hi: float, scale: float = 1.0) -> list[float]:
    """A list of numbers (ITLs, sample times); a missing list is empty, a null item is refused."""
    items = as_list(items, field)
    # The bulk of a file (every ITL) is checked at C speed: only numbers, a finite sum (no NaN or
    # infinity), and the extremes in range (``scale`` is positive). Anything else is found below.
    if not items:
        return items
    if set(map(type, items)) <= _NUMBER_TYPES:
        try:
            finite = math.isfinite(math.fsum(items))
        except OverflowError:  # a 400-digit integer
            finite = False
        if finite and lo <= min(items) * scale and max(items) * scale <= hi:
            return items if scale == 1.0 else [x * scale for x in items]
    out = []
    for i, x in enumerate(items):
        if x is None:
            raise ImportProblem(f"{field}[{i}]: expected a number, got null")
        out.append(real(x, f"{field}[{i}]", lo, hi, scale))
    return out  # type: ignore[return-value]


def count(value: Any, field: str, hi: int) -> int | None:
    """A whole number in [0, hi] (token counts, level indexes); None when missing."""
    if value.__class__ is int and 0 <= value <= hi:  # the common case
        return value  # type: ignore[no-any-return]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ImportProblem(f"{field}: expected a whole number, got {show(value)}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ImportProblem(f"{field}: {show(value)} is not a whole number")
    if not 0 <= value <= hi:
        raise ImportProblem(f"{field}: {show(value)} is out of range (0 to {hi:,})")
    return int(value)


def metric(value: Any, field: str) -> int | float | None:
    """A figure from a file's own summary: kept as it is when it is a finite number, left out
    when it is not a number or not finite (NaN for 'no data'), refused when it is out of range."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            raise ImportProblem(f"{field}: {show(value)} is out of range")
        return value
    return value if math.isfinite(value) else None


def as_text(value: Any, field: str, default: str = "") -> str:
    if value is None:
        return default
    if isinstance(value, str):
        return value
    if isinstance(value, bool | float) or (isinstance(value, int) and abs(value) <= MAX_INT):
        return str(value)
    raise ImportProblem(f"{field}: expected text, got {show(value)}")


def as_list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ImportProblem(f"{field}: expected a list, got {show(value)}")
    return value


def as_object(value: Any, field: str, *, required: bool = False) -> Mapping[str, Any]:
    """An object of the file's structure (a benchmark, its metrics, a distribution): a missing one
    is empty unless ``required``; any other type is refused, naming the field and what it is. A
    list where an object belongs is another tool's or version's layout, and reading it as empty
    would import a run without its figures."""
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise ImportProblem(f"{field}: expected an object, got {show(value)}")
    return value


def json_value(value: Any, field: str) -> Any:
    """Any JSON value, checked without recursion: nested at most MAX_DEPTH deep, integers within
    the store's range. Paths are built only while they are short enough to print."""
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ImportProblem(f"{path}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, Mapping):
            stack.extend((v, _child(path, f".{key_name(k)}", depth), depth + 1) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, _child(path, f"[{i}]", depth), depth + 1) for i, v in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_INT:
            raise ImportProblem(f"{path}: {show(node)} is out of range")
    return value


def _child(path: str, step: str, depth: int) -> str:
    return path + step if depth < 4 else path if path.endswith("…") else path + step + "…"


def json_object(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ImportProblem(f"{field}: expected an object, got {show(value)}")
    return dict(json_value(value, field))


def summary_map(value: Any, field: str) -> dict[str, Any]:
    """A summary: figures checked as :func:`_metric` (non-finite ones left out), the rest as JSON."""
    out: dict[str, Any] = {}
    for key, v in json_object(value, field).items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            if (m := metric(v, f"{field}.{key_name(key)}")) is not None:
                out[key] = m
        else:
            out[key] = v
    return out


def parse_date(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    for fmt in ("%Y%m%d-%H%M%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"):
        try:
            return datetime.strptime(text[:19], fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


def error_text(value: Any, field: str) -> str | None:
    """A request's error: its text (a structured error as compact JSON); None when it succeeded."""
    if value is None or value == "" or value is False:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(json_value(value, field), default=str)[:2000]


def request_record(where: str | Mapping[str, str], *, level: Any = 0, start_wall: Any = None, ttft_ms: Any = None,
             e2e_ms: Any = None, input_tokens: Any = None, output_tokens: Any = None, itl_ms: Any = None,
             error: Any = None, scale: float = 1.0, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One request record with every field checked (latencies times ``scale`` in ms). ``where``
    names the fields in messages: a prefix (``requests[3].``) or the file's name per field."""
    try:  # checked under the record's own key names; the file's names only for a message
        return {
            **(extra or {}),
            "level": count(level, "level", MAX_LEVEL_INDEX),
            "start_wall": real(start_wall, "start_wall", 0.0, MAX_EPOCH_S),
            "ttft_ms": real(ttft_ms, "ttft_ms", 0.0, MAX_MS, scale),
            "e2e_ms": real(e2e_ms, "e2e_ms", 0.0, MAX_MS, scale),
            "input_tokens": count(input_tokens, "input_tokens", MAX_ENGINE_TOKENS),
            "output_tokens": count(output_tokens, "output_tokens", MAX_ENGINE_TOKENS),
            "itl_ms": reals(itl_ms, "itl_ms", 0.0, MAX_MS, scale),
            "error": error_text(error, "error"),
        }
    except ImportProblem as exc:
        key, rest = _KEY_RE.match(str(exc)).groups()  # type: ignore[union-attr]
        name = where.get(key, key) if isinstance(where, Mapping) else f"{where}{key}"
        raise ImportProblem(name + rest) from None


_KEY_RE = re.compile(r"([a-z0-9_]+)(.*)", re.DOTALL)
