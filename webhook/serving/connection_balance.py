"""Keeps the API server's kept-alive connections spread over the gunicorn workers.

Each worker listens on its own SO_REUSEPORT socket. The kernel hashes every new connection to one
of them, and the connection then stays with that worker for as long as it lives, which for the API
server's webhook client is as long as it keeps being used. With a handful of connections the hash
can put most of them on one worker: one core then serves all of them while the others idle
(see docs/benchmarks.md, "Mechanisms kept").

So every worker publishes how many connections it holds in a table the master maps before it
forks them, and a worker holding more than its share (the total over the workers, rounded up)
answers the request at hand with ``Connection: close``. The client opens a new connection for its
next request, which the kernel hashes afresh. A worker sheds at most one connection per
``SHED_INTERVAL_SECONDS``, and only once it has been over its share for that long, so the table
sees the reconnection before the next decision, and the price (one TLS handshake) is paid only
while the spread stays uneven.
"""

from __future__ import annotations

import mmap
import struct
import time
from collections.abc import Callable, Sequence

SHED_INTERVAL_SECONDS = 1.0
CHECK_INTERVAL = 0.1  # seconds between two looks at the table by one worker

_SLOT = struct.Struct("<II")  # in use (0/1), connections held


def over_share(mine: int, everyone: Sequence[int]) -> bool:
    """Whether a worker holding ``mine`` of the connections counted in ``everyone`` (its own
    included) holds more than the even share, rounded up.

    No slack above the share: an uneven spread serves clearly less than an even one, and with slack
    an uneven spread stays (docs/benchmarks.md, "Mechanisms kept"); evening it out costs a handshake or two.
    """
    workers, total = len(everyone), sum(everyone)
    if workers < 2:
        return False
    return mine > -(-total // workers)


class ConnectionTable:
    """One slot per worker in anonymous shared memory: created by the master, inherited by every
    worker it forks. Slots are handed out and taken back by the master alone (gunicorn's
    ``pre_fork`` and ``child_exit`` hooks, single-threaded); each worker writes only its own."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._map = mmap.mmap(-1, slots * _SLOT.size)  # MAP_SHARED | MAP_ANONYMOUS: kept across fork

    def claim(self) -> int | None:
        """A free slot, marked in use with no connections; None when all are taken."""
        for slot in range(self.slots):
            in_use, _ = _SLOT.unpack_from(self._map, slot * _SLOT.size)
            if not in_use:
                _SLOT.pack_into(self._map, slot * _SLOT.size, 1, 0)
                return slot
        return None

    def release(self, slot: int) -> None:
        _SLOT.pack_into(self._map, slot * _SLOT.size, 0, 0)

    def publish(self, slot: int, connections: int) -> None:
        _SLOT.pack_into(self._map, slot * _SLOT.size, 1, max(connections, 0))

    def held(self, slot: int) -> int:
        """What the worker in ``slot`` last published."""
        return int(_SLOT.unpack_from(self._map, slot * _SLOT.size)[1])

    def counts(self) -> list[int]:
        """Connections held by each worker with a slot (read without a lock: a count a moment old
        only delays a decision)."""
        held = []
        for slot in range(self.slots):
            in_use, connections = _SLOT.unpack_from(self._map, slot * _SLOT.size)
            if in_use:
                held.append(connections)
        return held


class Shedder:
    """A worker's side: publish its count, and decide whether to close the connection it just served.

    The decision runs on every answer, so it looks at the table at most every ``CHECK_INTERVAL``
    and otherwise costs one clock read. A worker must find itself over its share twice, at least
    ``SHED_INTERVAL_SECONDS`` apart, before it sheds: while a burst of new connections is being
    accepted the workers' counts disagree for a moment, and the first look would shed for nothing.
    """

    def __init__(self, table: ConnectionTable, slot: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.table, self.slot = table, slot
        self._clock = clock
        self._next_check = float("-inf")
        self._over_since: float | None = None

    def publish(self, connections: int) -> None:
        self.table.publish(self.slot, connections)

    def should_close(self) -> bool:
        """Whether the worker, by what it last published, should close the connection it just served."""
        now = self._clock()
        if now < self._next_check:
            return False
        self._next_check = now + CHECK_INTERVAL
        if not over_share(self.table.held(self.slot), self.table.counts()):
            self._over_since = None
            return False
        if self._over_since is None:
            self._over_since = now
        if now - self._over_since < SHED_INTERVAL_SECONDS:
            return False
        self._over_since = now  # still over after this one: the next shed waits another interval
        return True
