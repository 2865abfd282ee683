"""One timeline for everything a run produces: telemetry samples, request records, engine
phases and log lines, run status. Publishers never block; each subscriber has its own bounded
buffer (oldest items dropped and counted when a slow subscriber falls behind).

Subscribers: the runner, the run store (batched writes), the GUI (drained by a QTimer), the CLI.

Event kinds and payloads (JSON-able dicts) -- the contract between runner, store and GUI:
- ``run_started``: run_id, name, tags, config (RunConfig as JSON dict), engine_kind, model,
  argv (list or None when attached to an endpoint), env (secrets masked), engine_version,
  hardware (HardwareInfo dict), endpoint
- ``phase``: phase, detail            - ``log``: line
- ``engine_ready``: base_url, startup_s, kv_cache (dict), feature_checks (list of dicts)
- ``level_started``: index, label, concurrency / rate_rps
- ``request``: one request record (see app.load): level, ttft_ms, itl_ms list, e2e_ms, tokens, error...
- ``level_finished``: index, summary (dict of metrics)
- ``progress``: done, errors, output_tok_per_s, ...
- ``run_finished``: run_id, status (completed|failed|cancelled|interrupted), reason, summary
- ``telemetry_support``: once per telemetry source: source (``gpu<i>``, ``gpu`` when there is no
  NVIDIA GPU, ``host``, ``engine``), available, supported (value names), unsupported
  ({name: reason}), detail (see app.telemetry.collector)
- ``notice``: source, message (a new condition, reported once: endpoint unreachable, counters reset)
Sample sources: ``gpu<i>``, ``host``, ``engine``, ``client``; value names carry their units
(``memory_used_bytes``, ``gpu_util_pct``, ``kv_cache_usage_pct``, ``generation_tok_per_s``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def now() -> tuple[float, float]:
    """(monotonic, wall) clock pair: monotonic orders and spaces samples, wall dates them."""
    return time.monotonic(), time.time()


@dataclass(frozen=True, slots=True)
class Sample:
    """Values one sampler read at one instant. Names carry units: ``memory_used_bytes``,
    ``gpu_util_pct``, ``generation_tok_per_s``. ``source`` is e.g. ``gpu0``, ``host``, ``engine``,
    ``client``."""

    source: str
    t_mono: float
    t_wall: float
    values: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Event:
    """Anything else on the timeline: ``kind`` is e.g. ``phase``, ``log``, ``request``,
    ``level``, ``run_status``, ``notice``; ``payload`` is kind-specific (JSON-able)."""

    kind: str
    t_mono: float
    t_wall: float
    payload: Any = None


Item = Sample | Event


@dataclass
class Subscription:
    """A bounded mailbox. ``drain`` hands over what arrived since the last drain."""

    maxlen: int
    accepts: Callable[[Item], bool]
    _items: deque[Item] = field(init=False)
    dropped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _has_items: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._items = deque(maxlen=self.maxlen)
        self._has_items = threading.Condition(self._lock)

    def put(self, item: Item) -> None:
        with self._lock:
            if len(self._items) == self.maxlen:
                self.dropped += 1
            self._items.append(item)
            self._has_items.notify()

    def drain(self, max_items: int | None = None, timeout_s: float | None = None) -> list[Item]:
        """Take up to ``max_items`` (all if None); wait up to ``timeout_s`` for the first one."""
        with self._lock:
            if not self._items and timeout_s:
                self._has_items.wait(timeout_s)
            if max_items is None or max_items >= len(self._items):
                out = list(self._items)
                self._items.clear()
                return out
            return [self._items.popleft() for _ in range(max_items)]

    def __len__(self) -> int:
        return len(self._items)


class Bus:
    """Thread-safe publish/subscribe with bounded per-subscriber buffers."""

    def __init__(self) -> None:
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()

    def subscribe(self, maxlen: int = 100_000, kinds: Iterable[str] | None = None,
                  sources: Iterable[str] | None = None) -> Subscription:
        """``kinds`` filters events (``"sample"`` selects samples); ``sources`` filters samples."""
        kind_set = set(kinds) if kinds is not None else None
        source_set = set(sources) if sources is not None else None

        def accepts(item: Item) -> bool:
            if isinstance(item, Sample):
                return (kind_set is None or "sample" in kind_set) and (source_set is None or item.source in source_set)
            return kind_set is None or item.kind in kind_set

        sub = Subscription(maxlen, accepts)
        with self._lock:
            self._subs = [*self._subs, sub]
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs = [s for s in self._subs if s is not sub]

    def publish(self, item: Item) -> None:
        for sub in self._subs:  # copy-on-write list: no lock needed to iterate
            if sub.accepts(item):
                sub.put(item)

    def sample(self, source: str, values: Mapping[str, float], t: tuple[float, float] | None = None) -> Sample:
        t_mono, t_wall = t or now()
        item = Sample(source, t_mono, t_wall, values)
        self.publish(item)
        return item

    def event(self, kind: str, payload: Any = None) -> Event:
        t_mono, t_wall = now()
        item = Event(kind, t_mono, t_wall, payload)
        self.publish(item)
        return item
