"""What one write does to a ledger, as values: edits applied to the copy the write was decided on.

A commit attempt never assembles the object it writes by hand. It turns what it decided (each
admission's reservation, each closed escrow, each withdrawal, a new escrow) into a list of edits
and applies them, in order, to the copy it read; the write carries that copy's resourceVersion as
its precondition. On a conflict the attempt is decided again from the fresh copy, edits and all:
nothing computed on the old copy is reused. A new kind of entry (one that a later admission draws
down, say) is a new edit here, applied at the writer like every other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuquota_core import shared_ledger
from webhook.quota.strict.withdrawals import Withdrawal, withdraw

Stored = dict[str, shared_ledger.StoredReservation]


@dataclass(frozen=True)
class Reserve:
    """Store ``item`` under its key: an admission's reservation, an escrow entry, or a gang's
    reservation (``gpuquota_core.gang``) opened by the member admitted in the same write, which is
    never edited afterwards: what it holds is read from it and the gang's members."""

    item: shared_ledger.StoredReservation

    def apply(self, keep: Stored, now: float) -> None:
        keep[self.item.reservation.pod_key] = self.item


@dataclass(frozen=True)
class Withdraw:
    """Take out an entry written for an admission whose "allowed" never left (``withdrawals``)."""

    withdrawal: Withdrawal

    def apply(self, keep: Stored, now: float) -> None:
        withdraw(keep, [self.withdrawal])


@dataclass(frozen=True)
class SettleEscrow:
    """Replace an escrow's entry by a reservation per pod admitted from it (those not expired).

    ``taken_back``: the escrow of a previous process of this replica, with the pods it journalled
    (``escrow.EscrowJournal``); replaced only while its entry is still there, since that process may
    have settled it itself, and its pods' reservations may have been confirmed or withdrawn since."""

    entry_key: str
    admitted: tuple[shared_ledger.StoredReservation, ...]
    taken_back: bool = False

    def apply(self, keep: Stored, now: float) -> None:
        if self.taken_back and self.entry_key not in keep:
            return
        keep.pop(self.entry_key, None)
        for item in self.admitted:
            if item.reservation.expires_at > now:
                keep[item.reservation.pod_key] = item


LedgerEdit = Reserve | Withdraw | SettleEscrow


def applied(base: Mapping[str, shared_ledger.StoredReservation], edits: Iterable[LedgerEdit], now: float) -> Stored:
    """A copy of ``base`` with ``edits`` applied in order (``base`` itself is left as read)."""
    keep = dict(base)
    for edit in edits:
        edit.apply(keep, now)
    return keep
