"""One timeline for everything a run produces: telemetry samples, request records, engine
phases and log lines, run status. Publishers never block; each subscriber has its own bounded
buffer (oldest items dropped and counted when a slow subscriber falls behind).

Subscribers: the run store (``app.recording``, batched writes), the GUI (drained by a QTimer),
the CLI. What travels here -- :class:`Sample` and :class:`Event` with a typed payload, one class
per kind -- is defined in :mod:`app.events`, which documents the order of a run.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from app.events import AnyEvent, Event, EventPayload, Item, Sample, now

__all__ = ["Bus", "Event", "Item", "Sample", "Subscription", "now"]


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

    def wake(self) -> None:
        """End a ``drain`` waiting for its first item now (it hands over what there is)."""
        with self._lock:
            self._has_items.notify_all()

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

    def subscribe(self, maxlen: int = 100_000, kinds: Iterable[type[Sample] | type[EventPayload]] | None = None,
                  sources: Iterable[str] | None = None) -> Subscription:
        """``kinds`` filters by type: :class:`Sample` and event classes (``PhaseChanged``, ...);
        ``sources`` filters samples."""
        kind_set = set(kinds) if kinds is not None else None
        source_set = set(sources) if sources is not None else None

        def accepts(item: Item) -> bool:
            if isinstance(item, Sample):
                return (kind_set is None or Sample in kind_set) and (source_set is None or item.source in source_set)
            return kind_set is None or type(item.payload) in kind_set

        sub = Subscription(maxlen, accepts)
        with self._lock:
            self._subs = [*self._subs, sub]
        return sub

    def attach(self, sub: Subscription) -> None:
        """Feed an existing subscription from this bus too: one face (the CLI's console) follows
        the buses of a campaign's slots through one mailbox."""
        with self._lock:
            if sub not in self._subs:
                self._subs = [*self._subs, sub]

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

    def emit(self, payload: AnyEvent, t: tuple[float, float] | None = None) -> Event:
        """Publish one typed event, stamped now (or at ``t``)."""
        t_mono, t_wall = t or now()
        item = Event(t_mono, t_wall, payload)
        self.publish(item)
        return item
