"""The reservation ledger shared by several webhook replicas through one API object per quota tree.

Strict accounting (issue 7): before a replica admits a pod it records the reservation in a
ConfigMap with a resourceVersion precondition, so two replicas can never hand out the same room.
This module is the pure half: the stored format, which stored reservations still hold room from
one replica's point of view, and which may be dropped. The API calls live in webhook/.

One object per *tree* (the topmost quota below the root) because a pod charges its leaf and every
ancestor at once: one write must cover the whole chain, or two replicas could each pass a
different leaf into the same full parent.

A stored reservation keeps holding room until it expires, even after the pod shows up: another
replica's watch may lag behind, and only the replica whose own cache already counts the pod may
skip it. So each replica counts a stored reservation unless its own watch has confirmed it, and
drops it from the object only once it expired, or was confirmed ``settle_seconds`` ago.

An escrow entry (``ESCROW_KEY_PREFIX``) is room one replica took for pods it has not admitted yet;
docs/design.md states the rules that keep it as safe as a reservation per pod.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .ledger import Reservation, ReservationLedger
from .quantity import Quantity, QuantityError
from .quota_tree import QuotaTree
from .resources import ResourceList
from .usage_index import UsageIndex

LEDGER_DATA_KEY = "reservations.json"
# Set when a replica found the object deleted: until then (wall-clock seconds) reservations that
# only the deleted object held may still be unexpired, and no replica admits into this tree.
RECOVERING_UNTIL_KEY = "recoveringUntil"
LEDGER_NAME_PREFIX = "gpuquota-ledger-"
DEFAULT_SETTLE_SECONDS = 5.0
# Entries whose key starts so hold room in escrow for the replica that wrote them, not for one pod
# (no namespace/name starts with "~"). Stored like a reservation that no pod ever confirms, so every
# replica, one of an earlier release included, counts the whole of it until it expires.
ESCROW_KEY_PREFIX = "~escrow/"


class LedgerFormatError(ValueError):
    """The stored ledger cannot be read (hand-edited, or written by an incompatible version)."""


@dataclass(frozen=True, slots=True)
class StoredReservation:
    reservation: Reservation
    replica: str  # which webhook replica wrote it, for operators reading the object
    admitted_at: float  # wall-clock seconds


def tree_of(tree: QuotaTree, leaf: str) -> str:
    """The quota whose ledger object records reservations of pods charged to ``leaf``."""
    chain = tree.chain(leaf)
    return chain[-1].name if chain else leaf


def is_escrow(key: str) -> bool:
    return key.startswith(ESCROW_KEY_PREFIX)


def ledger_object_name(tree_root: str) -> str:
    # Quota names are DNS-1123 subdomains already, and so is the prefix.
    return f"{LEDGER_NAME_PREFIX}{tree_root}"[:253]


def encode(reservations: Iterable[StoredReservation], recovering_until: float = 0.0) -> dict[str, str]:
    entries = {}
    for stored in sorted(reservations, key=lambda s: s.reservation.pod_key):
        r = stored.reservation
        entries[r.pod_key] = {
            "admission": r.admission_uid,
            "podUID": r.pod_uid,
            "quotas": list(r.quotas),
            "requests": _text(r.requests),
            "charges": _charges_text(r),
            "admittedAt": round(stored.admitted_at, 3),
            "expiresAt": round(r.expires_at, 3),
            "replica": stored.replica,
            "caller": r.caller,
        }
    data = {LEDGER_DATA_KEY: json.dumps(entries, separators=(",", ":"), sort_keys=True)}
    if recovering_until:
        data[RECOVERING_UNTIL_KEY] = f"{recovering_until:.3f}"
    return data


def recovering_until(data: Mapping[str, str] | None) -> float:
    """The end of the hold a replica set after finding the object deleted (0: none)."""
    raw = (data or {}).get(RECOVERING_UNTIL_KEY)
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        raise LedgerFormatError(f"{RECOVERING_UNTIL_KEY} is not a time: {raw!r}") from None


def _charges_text(r: Reservation) -> dict[str, dict[str, str]]:
    """Per quota what the reservation holds there, or {} when that is its whole request everywhere.

    A CREATE charges every quota of its chain its whole request, and the object is rewritten on
    every strict admission, so repeating the request per quota made most of each entry. An empty
    map reads back as "the request, everywhere" (Reservation.charge_of) in every version that
    reads this format, so replicas of the previous release still count these entries right.
    """
    if all(r.charge_of(quota) == r.requests for quota in r.quotas):
        return {}
    return {quota: _text(r.charge_of(quota)) for quota in r.quotas}


def decode(data: Mapping[str, str] | None) -> dict[str, StoredReservation]:
    raw = (data or {}).get(LEDGER_DATA_KEY)
    if not raw:
        return {}
    try:
        entries = json.loads(raw)
        result = {}
        for pod_key, entry in entries.items():
            reservation = Reservation(
                pod_key=str(pod_key),
                admission_uid=str(entry["admission"]),
                quotas=tuple(str(q) for q in entry["quotas"]),
                requests=_quantities(entry["requests"]),
                expires_at=float(entry["expiresAt"]),
                pod_uid=str(entry.get("podUID", "")),
                charges={str(q): _quantities(c) for q, c in entry["charges"].items()},
                caller=str(entry.get("caller", "")),
            )
            result[reservation.pod_key] = StoredReservation(reservation, str(entry.get("replica", "")),
                                                            float(entry["admittedAt"]))
        return result
    except (ValueError, KeyError, TypeError, AttributeError, QuantityError) as error:
        raise LedgerFormatError(f"{LEDGER_DATA_KEY} is not a reservation ledger: {error}") from None


def confirmed(stored: StoredReservation, usage: UsageIndex) -> bool:
    """Whether this replica's own watch already counts the pod the reservation was made for."""
    r = stored.reservation
    record = usage.get(r.pod_key)
    return record is not None and r.confirmed_by(record.uid, usage.charged_to(r.pod_key), record.requests)


def holding_room(stored: Mapping[str, StoredReservation], usage: UsageIndex, now: float,
                 ttl_seconds: float) -> ReservationLedger:
    """A ledger of the stored reservations that still take room as this replica sees the cluster."""
    ledger = ReservationLedger(ttl_seconds)
    for item in stored.values():
        r = item.reservation
        if r.expires_at > now and not confirmed(item, usage):
            ledger.reserve(r.pod_key, r.admission_uid, r.quotas, r.requests, r.expires_at - ttl_seconds,
                           pod_uid=r.pod_uid, charges=r.charges, caller=r.caller)
    return ledger


def pruned(stored: Mapping[str, StoredReservation], usage: UsageIndex, now: float,
           settle_seconds: float = DEFAULT_SETTLE_SECONDS) -> dict[str, StoredReservation]:
    """The reservations worth keeping in the object: not expired, not long confirmed."""
    return {key: item for key, item in stored.items()
            if item.reservation.expires_at > now
            and not (confirmed(item, usage) and now - item.admitted_at >= settle_seconds)}


def _text(resources: Mapping[str, Quantity]) -> dict[str, str]:
    return {name: str(quantity) for name, quantity in sorted(resources.items())}


def _quantities(raw: Mapping[str, str]) -> ResourceList:
    return {str(name): Quantity.parse(str(value)) for name, value in raw.items()}
