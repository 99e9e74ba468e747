"""What one replica knows of one tree's ledger object: one record per tree, with its lifecycle.

The store (``store``) keeps one :class:`TreeLedger` per quota tree and moves it between phases as
reads and writes find the object:

- ``MISSING``: no object known to this replica (never read, or found missing and not listed).
- ``LISTED``: found missing while the registry of ledgers lists the tree: a ledger was lost, so the
  tree is held (the next phase) and the object recreated carrying what this replica knew.
- ``HELD``: refusing admissions until everything a lost, deleted or unreadable object may have held
  has expired (``held_until``, recorded in the object for every replica).
- ``LIVE``: read or written; ``copy`` is the object as last seen (the writer decides on it).
- ``REBUILDING``: found unreadable; this replica's next write replaces it.

The transitions are the methods; the store calls them under its lock, and does the I/O around them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gpuquota_core.shared_ledger import Stored


class Phase(enum.Enum):
    MISSING = "missing"
    LISTED = "listed"
    HELD = "held"
    LIVE = "live"
    REBUILDING = "rebuilding"


@dataclass
class TreeLedger:
    # The cached copy: (resourceVersion, reservations with the carried ones); None: read it again.
    copy: tuple[str, Stored] | None = None
    # The uid of the object last read or written, and what it held then; None: none known.
    known: tuple[str, Stored] | None = None
    # Reservations of a lost object not yet written back into a new one.
    carried: Stored = field(default_factory=dict)
    held_until: float = 0.0  # wall clock; 0: not held
    hold_cause: str = ""  # what the hold follows from, for refusals
    # Deleted, kept by its finalizer: when all it holds has expired, and its deletionTimestamp.
    terminating: tuple[float, str] | None = None
    rebuilding_until: float | None = None  # found unreadable, not yet written over: the end of its hold
    # The pod resourceVersion the object asks its readers' watches to have reached; only ever raised.
    pods_counted_through: int = 0
    listed: bool = False  # seen listed in the registry, or listed by this replica, since last found missing
    missing_judged: bool = False  # a missing object judged (and held) since one was last read or written

    def phase(self, now: float) -> Phase:
        if self.rebuilding_until is not None:
            return Phase.REBUILDING
        if now < self.held_until:
            return Phase.HELD
        if self.known is not None:
            return Phase.LIVE
        return Phase.LISTED if self.listed else Phase.MISSING

    def owes_rewrite(self) -> bool:
        """Whether this replica must write the object even with nothing new: reservations of a lost
        object wait to be put back, or it was found unreadable and not yet written over."""
        return bool(self.carried) or self.rebuilding_until is not None

    def hold(self, until: float, cause: str | None = None) -> None:
        self.held_until = max(self.held_until, until)
        if cause is not None:
            self.hold_cause = cause

    def carry(self, stored: Stored) -> None:
        """Keep what this replica last saw in a lost object, for its next write to put back."""
        self.carried.update({key: item for key, item in stored.items() if key not in self.carried})

    def lost(self, now: float, hold_until: float) -> int:
        """The object this replica knew is gone: carry what it held and hold the tree until
        ``hold_until`` (a tree already found missing keeps its first hold). How many it carries."""
        if self.terminating is not None and now >= self.terminating[0]:
            # Gone through its finalizer once everything it held had expired, but for the gang
            # reservations ``released`` carries: nothing was lost.
            self.terminating, self.copy, self.known = None, None, None
            self.missing_judged = True
            return 0
        self.terminating, self.copy = None, None
        known, self.known = self.known, None
        if known is None:
            return 0
        self.hold(hold_until, "was deleted")
        self.missing_judged = True
        self.carry(known[1])
        return len(self.carried) if known[1] else 0

    def lost_while_listed(self, now: float, hold_seconds: float) -> bool:
        """Missing though the registry lists the tree: removed without its finalizer. Held for one
        hold from now, once; whether this call started the hold."""
        self.listed = True
        if self.missing_judged:
            return False
        self.hold(now + hold_seconds, "was deleted")
        self.missing_judged = True
        return True

    def unreadable(self, now: float, hold_seconds: float, deleted_at: str | None) -> bool:
        """The object cannot be read: held until what it may have held has expired, and rebuilt by
        the next write; what this replica last read there goes back in. Whether this is news."""
        news = self.rebuilding_until is None
        if news:
            self.rebuilding_until = now + hold_seconds
            self.hold(now + hold_seconds, "could not be read and is being rebuilt")
        known, self.known = self.known, None
        if known is not None and known[1]:
            self.carry(known[1])
        if deleted_at and self.terminating is None:
            self.terminating = (self.rebuilding_until or now + hold_seconds, deleted_at)
        self.copy = None
        return news

    def read(self, uid: str, version: str, stored: Stored, held: float, counted_through: int,
             terminating: tuple[float, str] | None) -> tuple[str, Stored]:
        """The object read as ``stored``; the copy decisions use (with what is carried)."""
        self.known = (uid, stored)
        self.rebuilding_until = None  # another replica wrote it over first
        if terminating is not None:
            self.terminating = terminating
        self.hold(held)
        self.pods_counted_through = max(self.pods_counted_through, counted_through)
        self.missing_judged = False
        self.copy = (version, {**self.carried, **stored})
        return self.copy

    def written(self, uid: str, version: str, stored: Stored, counted_through: int) -> None:
        """A write of this replica stored ``stored``: what was carried is in it (or pruned on purpose)."""
        self.carried, self.rebuilding_until, self.missing_judged = {}, None, False
        self.pods_counted_through = counted_through
        self.known = (uid, stored)
        self.copy = (version, stored)

    def released(self, now: float) -> None:
        """The finalizer dropped: the apiserver removes the object, and nothing was lost with it.

        The object was let go once its pods' reservations had expired, not its gangs' (a gang waits
        minutes, and the whole tree would be held that long): the gang reservations still open are
        carried into the next object, so a gang part-way through its members keeps its room."""
        if self.known is not None:
            self.carry({key: item for key, item in self.known[1].items()
                        if item.gang is not None and item.reservation.expires_at > now})
        self.copy, self.known, self.rebuilding_until = None, None, None

    def hold_to_record(self, now: float) -> float:
        return self.held_until if self.held_until > now else 0.0
