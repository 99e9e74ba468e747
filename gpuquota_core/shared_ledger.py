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
drops it from the object only once it expired, or was confirmed ``settle_seconds`` ago; a write
that drops confirmed ones records the pod resourceVersion their pods were shown at
(``PODS_COUNTED_THROUGH_KEY``), and no replica decides on that copy before its own watch has got
that far.

An escrow entry (``ESCROW_KEY_PREFIX``) is room one replica took for pods it has not admitted yet;
docs/design.md states the rules that keep it as safe as a reservation per pod.

The whole object is rewritten on every write and read back after every conflict, so its size is
paid by the API server and every replica on each of them. Pods admitted alike (same replica,
caller, quota chain and request, charging that request everywhere, the same TTL) are therefore
stored as one group entry (``GROUP_KEY_PREFIX``) listing each pod's key, uids and admission time,
instead of one full entry each. A group entry is also a valid plain entry: it holds the sum of its
pods' requests until the last of them expires, so a replica that reads only plain entries (an
earlier release, during a rolling update) counts at least the room the pods hold, never less.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .ledger import GangReservation, Reservation, ReservationLedger
from .quantity import Quantity, QuantityError
from .quota_tree import QuotaTree
from .resources import ResourceList
from .usage_index import UsageIndex

LEDGER_DATA_KEY = "reservations.json"
# Set when a replica found the object deleted: until then (wall-clock seconds) reservations that
# only the deleted object held may still be unexpired, and no replica admits into this tree.
RECOVERING_UNTIL_KEY = "recoveringUntil"
# The pod resourceVersion a replica's own watch must have reached before it decides on this copy:
# reservations were dropped from it because the writer's watch counted their pods at or below it.
PODS_COUNTED_THROUGH_KEY = "podsCountedThrough"
LEDGER_NAME_PREFIX = "gpuquota-ledger-"
DEFAULT_SETTLE_SECONDS = 5.0
# Entries whose key starts so hold room in escrow for the replica that wrote them, not for one pod
# (no namespace/name starts with "~"). Stored like a reservation that no pod ever confirms, so every
# replica, one of an earlier release included, counts the whole of it until it expires.
ESCROW_KEY_PREFIX = "~escrow/"
# A gang's reservation (gpuquota_core.gang): ``~gang/<namespace>/<name>``. Read as a plain entry (by
# a release that knows no gangs) it holds the gang's whole need until it expires: never less than
# what the gang reservation holds, which is all the invariant needs.
GANG_KEY_PREFIX = "~gang/"
GROUP_KEY_PREFIX = "~pods/"
# Every ledger object carries these labels: readers (gpuquota snapshot, the reconciler) list the
# objects by MANAGED_SELECTOR, and learn each one's tree from TREE_LABEL.
MANAGED_BY_LABEL, MANAGED_BY = "app.kubernetes.io/managed-by", "koord-gpuquota"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
# Quota names are DNS subdomains (up to 253 characters); label values stop at 63, so a tree root
# longer than that cannot be named in a label and is reconciled only when admissions write to it.
TREE_LABEL = "gpuquota.koord-gpuquota.io/quota-tree"
# One object beside the ledgers lists the trees whose ledger was created and not yet let go through
# its finalizer. A replica that finds no ledger for a tree it never read cannot tell a new tree from
# one whose ledger was removed without its finalizer (by hand, or a restore from an older backup);
# the list tells it, and it holds a listed tree as it would hold one it saw deleted. Its name does
# not start with LEDGER_NAME_PREFIX, so nothing reads it as a ledger.
REGISTRY_OBJECT_NAME = "gpuquota-ledgers"
REGISTRY_DATA_KEY = "trees.json"


class LedgerFormatError(ValueError):
    """The stored ledger cannot be read (hand-edited, or written by an incompatible version)."""


@dataclass(frozen=True, slots=True)
class StoredReservation:
    reservation: Reservation
    replica: str  # which webhook replica wrote it, for operators reading the object
    admitted_at: float  # wall-clock seconds
    # Set on a gang's entry: the reservation as a gang's (``reservation`` then holds its whole need
    # under the key ``~gang/<namespace>/<name>``, as a release that knows no gangs reads it).
    gang: GangReservation | None = None


Stored = dict[str, StoredReservation]  # a ledger object's entries, by key


def gang_key(gang: str) -> str:
    return f"{GANG_KEY_PREFIX}{gang}"


def stored_gang(gang: GangReservation, replica: str, admitted_at: float) -> StoredReservation:
    """A gang reservation as the shared ledger stores it."""
    plain = Reservation(gang_key(gang.gang), gang.admission_uid, gang.quotas, dict(gang.need), gang.expires_at)
    return StoredReservation(plain, replica, admitted_at, gang)


def opened_gangs(holding: ReservationLedger, stored: Mapping[str, StoredReservation],
                 replica: str, now: float) -> list[StoredReservation]:
    """The gang reservations a batch judged on ``holding`` opened, which ``stored`` lacks: written
    in the same write as the member that opened each, and withdrawn with it."""
    return [stored_gang(gang, replica, now) for gang in holding.gangs()
            if (existing := stored.get(gang_key(gang.gang))) is None or existing.gang != gang]


def tree_of(tree: QuotaTree, leaf: str) -> str:
    """The quota whose ledger object records reservations of pods charged to ``leaf``."""
    chain = tree.chain(leaf)
    return chain[-1].name if chain else leaf


def is_escrow(key: str) -> bool:
    return key.startswith(ESCROW_KEY_PREFIX)


def ledger_object_name(tree_root: str) -> str:
    # Quota names are DNS-1123 subdomains already, and so is the prefix.
    return f"{LEDGER_NAME_PREFIX}{tree_root}"[:253]


def encode(reservations: Iterable[StoredReservation], recovering_until: float = 0.0,
           pods_counted_through: int = 0) -> dict[str, str]:
    entries: dict[str, dict[str, object]] = {}
    groups: dict[tuple[object, ...], list[StoredReservation]] = {}
    # Members of one decoded group share their request map: format it once (alive for this call).
    request_texts: dict[int, tuple[tuple[str, str], ...]] = {}
    for stored in reservations:
        r = stored.reservation
        if r.pod_key.startswith("~") or _charges_text(r) or r.gang:
            entries[r.pod_key] = _entry(stored)
        else:
            text = request_texts.get(id(r.requests))
            if text is None:
                text = request_texts[id(r.requests)] = tuple(_text(r.requests).items())
            alike = (stored.replica, r.caller, r.quotas, text, round(r.expires_at - stored.admitted_at, 3))
            groups.setdefault(alike, []).append(stored)
    for members in groups.values():
        if len(members) == 1:
            entries[members[0].reservation.pod_key] = _entry(members[0])
            continue
        members.sort(key=lambda m: m.reservation.pod_key)
        key = f"{GROUP_KEY_PREFIX}{members[0].replica}/{members[0].reservation.pod_key}"
        while key in entries:  # only if an entry of an earlier write kept this name
            key += "+"
        entries[key] = _group_entry(members)
    data = {LEDGER_DATA_KEY: json.dumps(entries, separators=(",", ":"), sort_keys=True)}
    if recovering_until:
        data[RECOVERING_UNTIL_KEY] = f"{recovering_until:.3f}"
    if pods_counted_through:
        data[PODS_COUNTED_THROUGH_KEY] = str(pods_counted_through)
    return data


def _entry(stored: StoredReservation) -> dict[str, object]:
    r = stored.reservation
    entry = _plain_entry(stored)
    if r.gang:
        entry["gang"] = r.gang
    if stored.gang is not None:
        entry["gangReservation"] = {"gang": stored.gang.gang, "minMembers": stored.gang.min_members,
                                    "podGroup": stored.gang.pod_group}
    return entry


def _plain_entry(stored: StoredReservation) -> dict[str, object]:
    r = stored.reservation
    return {
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


def _group_entry(members: list[StoredReservation]) -> dict[str, object]:
    """One entry for pods admitted alike; read as a plain entry, it holds all of their room."""
    first = members[0]
    r = first.reservation
    # Each member's expiry is read back as its admission time (to the millisecond, as stored) plus
    # this: rounded up, so that no pod's room is read back as expiring earlier than it was stored.
    ttl = max(math.ceil((m.reservation.expires_at - round(m.admitted_at, 3)) * 1000 - 1e-6) for m in members) / 1000
    return {
        "admission": "",
        "podUID": "",
        "quotas": list(r.quotas),
        "requests": _text({name: amount.scaled(len(members)) for name, amount in r.requests.items()}),
        "charges": {},
        "admittedAt": round(min(m.admitted_at for m in members), 3),
        "expiresAt": round(max(m.reservation.expires_at for m in members), 3),
        "replica": first.replica,
        "caller": r.caller,
        "pods": {
            "requests": _text(r.requests),
            "ttl": ttl,
            "each": [[m.reservation.pod_key, m.reservation.admission_uid, m.reservation.pod_uid,
                      round(m.admitted_at, 3)] for m in members],
        },
    }


def recovering_until(data: Mapping[str, str] | None) -> float:
    """The end of the hold a replica set after finding the object deleted (0: none)."""
    raw = (data or {}).get(RECOVERING_UNTIL_KEY)
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        raise LedgerFormatError(f"{RECOVERING_UNTIL_KEY} is not a time: {raw!r}") from None


def pods_counted_through(data: Mapping[str, str] | None) -> int:
    """The pod resourceVersion a reader's watch must have reached to decide on this copy (0: none)."""
    raw = (data or {}).get(PODS_COUNTED_THROUGH_KEY)
    if not raw:
        return 0
    if not (raw.isascii() and raw.isdigit()):  # isdigit alone admits digits int() does not read
        raise LedgerFormatError(f"{PODS_COUNTED_THROUGH_KEY} is not a resourceVersion: {raw!r}")
    return int(raw)


def encode_registry(trees: Iterable[str]) -> dict[str, str]:
    return {REGISTRY_DATA_KEY: json.dumps(sorted(set(trees)))}


def decode_registry(data: Mapping[str, str] | None) -> set[str]:
    """The trees the registry lists; LedgerFormatError when it is not a list of tree names."""
    raw = (data or {}).get(REGISTRY_DATA_KEY)
    if raw is None:
        raise LedgerFormatError(f"{REGISTRY_DATA_KEY} is missing")
    try:
        trees = json.loads(raw)
    except ValueError as error:
        raise LedgerFormatError(f"{REGISTRY_DATA_KEY} is not JSON: {error}") from None
    if not isinstance(trees, list) or not all(isinstance(tree, str) and tree for tree in trees):
        raise LedgerFormatError(f"{REGISTRY_DATA_KEY} is not a list of quota tree names")
    return set(trees)


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
        for key, entry in entries.items():
            if "pods" in entry:
                for stored in _group_members(entry):
                    result[stored.reservation.pod_key] = stored
                continue
            reservation = Reservation(
                pod_key=str(key),
                admission_uid=str(entry["admission"]),
                quotas=tuple(str(q) for q in entry["quotas"]),
                requests=_quantities(entry["requests"]),
                expires_at=float(entry["expiresAt"]),
                pod_uid=str(entry.get("podUID", "")),
                charges={str(q): _quantities(c) for q, c in entry["charges"].items()},
                caller=str(entry.get("caller", "")),
                gang=str(entry.get("gang", "")),
            )
            gang = _gang_of_entry(reservation, entry.get("gangReservation"))
            result[reservation.pod_key] = StoredReservation(reservation, str(entry.get("replica", "")),
                                                            float(entry["admittedAt"]), gang)
        return result
    except (ValueError, KeyError, TypeError, AttributeError, QuantityError) as error:
        raise LedgerFormatError(f"{LEDGER_DATA_KEY} is not a reservation ledger: {error}") from None


def _gang_of_entry(reservation: Reservation, raw: object) -> GangReservation | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not reservation.pod_key.startswith(GANG_KEY_PREFIX):
        raise ValueError(f"entry {reservation.pod_key!r} has a gang reservation that cannot be read")
    minimum = raw["minMembers"]
    if not isinstance(minimum, int) or minimum < 1:
        raise ValueError(f"gang reservation {reservation.pod_key!r} has no minimum of members")
    return GangReservation(str(raw["gang"]), reservation.admission_uid, reservation.quotas,
                           reservation.requests, minimum, reservation.expires_at, bool(raw.get("podGroup")))


def _group_members(entry: Mapping[str, Any]) -> list[StoredReservation]:
    group = entry["pods"]
    if not isinstance(group, dict):
        raise TypeError(f"pods of a group entry is {type(group).__name__}, not an object")
    quotas = tuple(str(q) for q in entry["quotas"])
    requests = _quantities(group["requests"])
    ttl = float(group["ttl"])
    replica, caller = str(entry.get("replica", "")), str(entry.get("caller", ""))
    members = []
    for pod_key, admission_uid, pod_uid, admitted_at in group["each"]:
        if not isinstance(pod_key, str) or pod_key.startswith("~"):
            raise ValueError(f"group member {pod_key!r} is not a pod")
        reservation = Reservation(pod_key, str(admission_uid), quotas, requests,
                                  float(admitted_at) + ttl, str(pod_uid), {}, caller)
        members.append(StoredReservation(reservation, replica, float(admitted_at)))
    return members


def confirmed(stored: StoredReservation, usage: UsageIndex) -> bool:
    """Whether this replica's own watch already counts the pod the reservation was made for."""
    r = stored.reservation
    record = usage.get(r.pod_key)
    return record is not None and r.confirmed_by(record.uid, usage.charged_to(r.pod_key), record.requests)


def holding_room(stored: Mapping[str, StoredReservation], usage: UsageIndex, now: float,
                 ttl_seconds: float) -> ReservationLedger:
    """A ledger of the stored reservations that still take room as this replica sees the cluster.

    A gang's entry holds its need less what its members take, as this replica counts them."""
    ledger = ReservationLedger(ttl_seconds, members_stored=usage.gang_members)
    for item in stored.values():
        if item.reservation.expires_at <= now:
            continue
        if item.gang is not None:
            ledger.open_gang(item.gang)
        elif not confirmed(item, usage):
            ledger.hold(item.reservation)
    return ledger


def pruned(stored: Mapping[str, StoredReservation], usage: UsageIndex, now: float,
           settle_seconds: float = DEFAULT_SETTLE_SECONDS) -> dict[str, StoredReservation]:
    """The reservations worth keeping in the object: not expired, not long confirmed; a gang's, until
    the watch shows its minimum of members stored."""
    return {key: item for key, item in stored.items()
            if item.reservation.expires_at > now
            and not (confirmed(item, usage) and now - item.admitted_at >= settle_seconds)
            and not (item.gang is not None and usage.gang_members(item.gang.gang)[0] >= item.gang.min_members)}


def _text(resources: Mapping[str, Quantity]) -> dict[str, str]:
    return {name: str(quantity) for name, quantity in sorted(resources.items())}


def _quantities(raw: Mapping[str, str]) -> ResourceList:
    return {str(name): Quantity.parse(str(value)) for name, value in raw.items()}
