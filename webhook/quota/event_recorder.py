"""Aggregation and rate limiting of Events, so a crash-looping controller cannot flood etcd: pure.

The behaviour follows what client-go's event recorder does for controllers, in three layers:

1. *Similar events are combined.* Per target and reason, the first ``similar_limit`` distinct
   messages within ``similar_window`` seconds are kept apart; any further distinct message is
   folded into one event whose message says ``(combined from similar events): <latest>``.
2. *Identical events are counted, not repeated.* Occurrences of one (target, reason, message) wait
   in one pending entry and are written as one event whose ``count`` grows.
3. *Writes are rate-limited.* A token bucket per target (burst ``object_burst``, one token per
   ``1 / object_refill_per_second`` seconds) and one for the whole process bound how often the API
   server is written. Unlike client-go, which drops what its filter refuses, an occurrence that
   finds no token stays counted in its pending entry and goes out with the next write: the count is
   exact, only its updates are spaced out.

Memory is bounded too: at most ``max_pending`` entries wait (a new one beyond that is dropped and
reported so) and the per-target state is an LRU of ``max_targets``.

No clock is read here: every call takes ``now`` (seconds), so tests drive it with a fake clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from gpuquota_core.events import ObjectRef

COMBINED_PREFIX = "(combined from similar events): "
# client-go's spam filter: a burst of 25 per object, then one event every 5 minutes.
OBJECT_BURST = 25
OBJECT_REFILL_PER_SECOND = 1 / 300
# The whole process: at most this many writes a second after the burst (two requests at most each).
GLOBAL_BURST = 50
GLOBAL_REFILL_PER_SECOND = 5.0
# client-go's aggregator: 10 distinct messages within 10 minutes, then combined.
SIMILAR_LIMIT = 10
SIMILAR_WINDOW_SECONDS = 600.0
MAX_PENDING = 1024
MAX_TARGETS = 4096


@dataclass(slots=True)
class TokenBucket:
    capacity: float
    refill_per_second: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, capacity: float, refill_per_second: float, now: float) -> TokenBucket:
        return cls(capacity, refill_per_second, capacity, now)

    def available(self, now: float) -> float:
        # max(): a clock that stepped back refills nothing rather than draining the bucket.
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.capacity, self.tokens + elapsed * self.refill_per_second)
        self.updated = max(self.updated, now)
        return self.tokens

    def take(self, now: float) -> bool:
        if self.available(now) < 1:
            return False
        self.tokens -= 1
        return True


@dataclass(frozen=True, slots=True)
class EventKey:
    """What makes two occurrences the same event: the aggregation unit (and the Event's name)."""

    target: ObjectRef
    reason: str
    message: str  # COMBINED_PREFIX for the combined event of a target and reason


@dataclass(slots=True)
class _Pending:
    text: str  # the message to write (for a combined event: the prefix and the latest message)
    count: int
    first: float
    last: float


@dataclass(frozen=True, slots=True)
class EventWrite:
    """``count`` new occurrences of ``key`` to add to its Event, seen from ``first`` to ``last``."""

    key: EventKey
    message: str
    count: int
    first: float
    last: float


@dataclass(slots=True)
class _Similar:
    started: float
    messages: set[str] = field(default_factory=set)


class EventRecorder:
    def __init__(self, now: float, *, object_burst: float = OBJECT_BURST,
                 object_refill_per_second: float = OBJECT_REFILL_PER_SECOND, global_burst: float = GLOBAL_BURST,
                 global_refill_per_second: float = GLOBAL_REFILL_PER_SECOND, similar_limit: int = SIMILAR_LIMIT,
                 similar_window: float = SIMILAR_WINDOW_SECONDS, max_pending: int = MAX_PENDING,
                 max_targets: int = MAX_TARGETS) -> None:
        self.object_burst = object_burst
        self.object_refill = object_refill_per_second
        self.similar_limit = similar_limit
        self.similar_window = similar_window
        self.max_pending = max_pending
        self.max_targets = max_targets
        self.global_bucket = TokenBucket.full(global_burst, global_refill_per_second, now)
        self._buckets: OrderedDict[ObjectRef, TokenBucket] = OrderedDict()
        self._similar: OrderedDict[tuple[ObjectRef, str], _Similar] = OrderedDict()
        self._pending: OrderedDict[EventKey, _Pending] = OrderedDict()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def observe(self, target: ObjectRef, reason: str, message: str, now: float) -> bool:
        """Count one occurrence; False when it had to be dropped (too many distinct events waiting)."""
        key = self._key(target, reason, message, now)
        text = COMBINED_PREFIX + message if key.message == COMBINED_PREFIX else message
        entry = self._pending.get(key)
        if entry is not None:
            entry.count += 1
            entry.last = now
            entry.text = text
            return True
        if len(self._pending) >= self.max_pending:
            return False
        self._pending[key] = _Pending(text, 1, now, now)
        return True

    def _key(self, target: ObjectRef, reason: str, message: str, now: float) -> EventKey:
        group_key = (target, reason)
        group = self._similar.get(group_key)
        if group is None or now - group.started > self.similar_window:
            group = _Similar(now)
            self._similar[group_key] = group
            if len(self._similar) > self.max_targets:
                self._similar.popitem(last=False)
        self._similar.move_to_end(group_key)
        if message in group.messages:
            return EventKey(target, reason, message)
        if len(group.messages) < self.similar_limit:
            group.messages.add(message)
            return EventKey(target, reason, message)
        return EventKey(target, reason, COMBINED_PREFIX)

    def due(self, now: float) -> list[EventWrite]:
        """The writes the rate limits allow now, oldest pending first; the rest keep waiting."""
        writes: list[EventWrite] = []
        for key in list(self._pending):
            if self.global_bucket.available(now) < 1:
                break
            if not self._bucket(key.target, now).take(now):
                continue  # this target is over its budget; others may still be written
            self.global_bucket.take(now)
            entry = self._pending.pop(key)
            writes.append(EventWrite(key, entry.text, entry.count, entry.first, entry.last))
        return writes

    def _bucket(self, target: ObjectRef, now: float) -> TokenBucket:
        bucket = self._buckets.get(target)
        if bucket is None:
            bucket = self._buckets[target] = TokenBucket.full(self.object_burst, self.object_refill, now)
            if len(self._buckets) > self.max_targets:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(target)
        return bucket
