"""Escrow: room the writer takes in the ledger for pods it has not admitted yet (docs/design.md,
"Escrow", has the invariant and the sizes).

A ledger write that admits a pod may also take room for up to ``escrow_most_pods`` more pods of its
shape (quota chain and request). For ``ESCROW_WINDOW_SECONDS`` the writer admits pods of that shape
from it without writing; once it is spent, its next write replaces the entry by a reservation per
pod admitted from it. Here: which pods an escrow may admit (:func:`escrow_shape`), how much room one
takes (:func:`escrow_room`, :func:`take_escrow`), what a closed one leaves in the ledger
(:class:`SettleEscrow`), one tree's escrows at this replica (:class:`EscrowBook`), and the journal.

The journal (:class:`EscrowJournal`): a quota service killed inside its replica, the common crash,
takes the memory of what its escrows admitted with it, and their entries would hold their room for
the window and a whole TTL. So before an escrow admission is answered the writer appends it to a
file beside its socket; the service its master starts next reads it and takes its predecessor's
entries back, each replaced by the pods journalled from it. A write(2) outlives the process (the
page cache is the kernel's), so no fsync is needed: only a replica that vanished whole loses the
journal, and its entries wait for their TTL, as they must.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import orjson

from gpuquota_core import shared_ledger
from gpuquota_core.gang import names_gang
from gpuquota_core.ledger import Reservation, ReservationLedger
from gpuquota_core.pod_admission import PodAdmission
from gpuquota_core.quantity import Quantity
from gpuquota_core.quota_decision import PodQuotaRequest, decide
from gpuquota_core.resources import ResourceList
from webhook.quota.state import QuotaView

# How long a replica admits from room it took, the most pods one escrow holds room for, and the
# share of what is free for a shape one escrow may take. The share keeps most of the free room for
# the other replicas and makes escrow stop as a quota nears its limit, where every pod is then
# written on its own; the short window gives back what a replica did not use.
ESCROW_WINDOW_SECONDS = 0.5
DEFAULT_ESCROW_MOST_PODS = 32
ESCROW_SHARE = 4

log = logging.getLogger("gpuquota.quota")
JOURNAL_NAME = "escrow.journal"
# Past this size the journal is started afresh at the next moment nothing is owed in it.
COMPACT_BYTES = 4 * 1024 * 1024

ShapeKey = tuple[tuple[str, ...], tuple[tuple[str, Fraction], ...]]


@dataclass(frozen=True, slots=True)
class EscrowShape:
    """What a CREATE would charge: its quota chain (leaf first) and its whole request at each.

    Strict accounting admits a CREATE from room held in escrow only when the room was granted for
    pods of exactly this shape, under the same quota tree (``tree_version``).
    """

    quotas: tuple[str, ...]
    requests: tuple[tuple[str, Fraction], ...]  # sorted; exact amounts
    tree_version: int

    def key(self) -> ShapeKey:
        return self.quotas, self.requests

    def resources(self, count: int = 1) -> ResourceList:
        return {name: Quantity.of(amount * count) for name, amount in self.requests}


@dataclass
class Escrow:
    """Room this replica holds in the ledger for pods of one shape, and the pods admitted from it."""

    entry_key: str
    shape: EscrowShape  # the pods it admits, under the tree version it was taken in
    count: int
    admits_until: float  # wall clock; the entry itself expires one reservation TTL later
    admitted: list[Reservation] = field(default_factory=list)
    open: bool = True

    def admits(self, shape: EscrowShape, now: float) -> bool:
        return self.open and shape == self.shape and len(self.admitted) < self.count and now < self.admits_until

    def spent(self, now: float, tree_version: int) -> bool:
        """Nothing more can be admitted from it: time to write what it admitted and give back the rest."""
        return len(self.admitted) >= self.count or now >= self.admits_until or tree_version != self.shape.tree_version


def escrow_shape(view: QuotaView, admission: PodAdmission,
                 requests: tuple[PodQuotaRequest, PodQuotaRequest | None]) -> EscrowShape | None:
    """The shape of a plain CREATE that room held in escrow could admit, or None.

    None for everything a decision treats specially: UPDATEs, dry runs, pods without a quota
    or naming one that does not exist or is a parent, gpu-memory without a model mapping, and
    gang members, whose admission opens or draws from their gang's reservation in the same write.
    ``requests``: the admission's ``quota_requests``.
    """
    if admission.operation != "CREATE" or admission.dry_run or admission.unknown_gpu_memory:
        return None
    if admission.gang_annotations or names_gang(admission.labels, {}):
        return None
    new, old = requests
    if old is not None or not new.requests or not view.synced:
        return None
    resolution = view.tree.resolve(new.namespace, new.quota_label)
    leaf = view.tree.quotas.get(resolution.quota) if resolution.quota is not None else None
    if leaf is None or leaf.is_parent or resolution.rule == "label-not-found":
        return None
    chain = tuple(q.name for q in view.tree.chain(leaf.name))
    amounts = tuple(sorted((name, quantity.amount) for name, quantity in new.requests.items()))
    return EscrowShape(chain, amounts, view.tree_version)


def escrow_room(view: QuotaView, new: PodQuotaRequest, shape: EscrowShape, holding: ReservationLedger,
                most: int) -> int:
    """How many more pods of ``shape`` fit (at most ``most``) on top of what ``holding`` holds.

    The same decision as an admission's (``new``: its request), for ``count`` times the pod's
    request: the quotas of the chain, their limits, what the watch counts and the reservations of
    ``holding`` (the judgement's, with the batch's reservations added).
    """
    if shape.tree_version != view.tree_version or not view.synced:
        return 0

    def fits(count: int) -> bool:
        scaled = dataclasses.replace(new, requests=shape.resources(count))
        return decide(view.tree, view.usage, holding, scaled).allowed

    low, high = 0, most  # fits(low) holds; find the largest count that fits
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def take_escrow(shape: EscrowShape, room: int, replica: str, ids: Iterator[int], now: float, window: float,
                ttl_seconds: float) -> tuple[Escrow, shared_ledger.StoredReservation] | None:
    """An escrow for ``shape`` sized to its share of ``room`` (pods of that shape that fit), and its
    ledger entry, keyed by the next of ``ids``; None when the share is not even one pod."""
    count = room // ESCROW_SHARE
    if count <= 0:
        return None
    entry_key = f"{shared_ledger.ESCROW_KEY_PREFIX}{replica}/{next(ids)}"
    entry = Reservation(entry_key, "escrow", shape.quotas, shape.resources(count), now + window + ttl_seconds)
    return Escrow(entry_key, shape, count, now + window), shared_ledger.StoredReservation(entry, replica, now)


@dataclass(frozen=True)
class SettleEscrow:
    """The ledger edit that replaces an escrow's entry by a reservation per pod admitted from it (those
    not expired). ``taken_back``: the escrow of a previous process of this replica, with the pods it
    journalled (:class:`EscrowJournal`); replaced only while its entry is still there, since that
    process may have settled it itself, and its pods' reservations been confirmed or withdrawn since."""

    entry_key: str
    admitted: tuple[shared_ledger.StoredReservation, ...]
    taken_back: bool = False

    def apply(self, keep: shared_ledger.Stored, now: float) -> None:
        if self.taken_back and self.entry_key not in keep:
            return
        keep.pop(self.entry_key, None)
        keep.update({item.reservation.pod_key: item for item in self.admitted if item.reservation.expires_at > now})


def settle_edit(escrow: Escrow, replica: str, ttl_seconds: float) -> SettleEscrow:
    """The edit that settles a closed escrow of this process."""
    return SettleEscrow(escrow.entry_key, tuple(
        shared_ledger.StoredReservation(reservation, replica, reservation.expires_at - ttl_seconds)
        for reservation in escrow.admitted))


def lent_out(stored: Mapping[str, shared_ledger.StoredReservation], replica: str) -> dict[str, str]:
    """Every escrow entry of another replica (or of an earlier process of this one), by entry key,
    with the replica that holds it. Nobody waits for one: a writer that is alive gives its escrow
    back within a window, and one that died never does (pods may have been admitted from it, so it
    holds its room until it expires)."""
    return {key: item.replica for key, item in stored.items()
            if shared_ledger.is_escrow(key) and item.replica != replica}


class EscrowBook:
    """One tree's escrows at this replica: the open ones, by shape, and the closed ones whose pods
    the tree's next successful write records. Guarded by the caller (the tree's queue lock):
    admissions take from it and the committer closes and settles it."""

    def __init__(self) -> None:
        self.open: dict[ShapeKey, Escrow] = {}
        self.settling: list[Escrow] = []

    def admit(self, shape: EscrowShape, reservation: Reservation, now: float) -> Escrow | None:
        """Admit a pod of ``shape`` from its open escrow, without a write; the escrow, None when it has no room."""
        escrow = self.open.get(shape.key())
        if escrow is None or not escrow.admits(shape, now):
            return None
        escrow.admitted.append(reservation)
        return escrow

    def owed(self) -> bool:
        """Whether an escrow is open or waits to be settled."""
        return bool(self.open) or bool(self.settling)

    def close(self, now: float, tree_version: int, only_spent: bool) -> bool:
        """Close the open escrows (only the spent ones under ``tree_version``, or all) for the next
        write to settle; whether it closed any. Nothing is admitted from an escrow once closed."""
        closing = [key for key, escrow in self.open.items() if not only_spent or escrow.spent(now, tree_version)]
        for key in closing:
            escrow = self.open.pop(key)
            escrow.open = False
            self.settling.append(escrow)
        return bool(closing)

    def due(self, now: float, tree_version: int) -> bool:
        """Whether a write is owed: closed escrows to settle, or open ones spent."""
        return bool(self.settling) or any(escrow.spent(now, tree_version) for escrow in self.open.values())

    def written(self, settled: list[Escrow], taken: Escrow | None) -> None:
        """A write stored ``settled`` and, if any, the new escrow ``taken``, which opens now."""
        self.settling = [escrow for escrow in self.settling if escrow not in settled]
        if taken is not None:
            self.open[taken.shape.key()] = taken


def journal_path(socket_path: Path) -> Path:
    return socket_path.parent / JOURNAL_NAME


class EscrowJournal:
    """Append-only lines: ``{"took": key, "tree": root}`` and ``{"from": key, "tree": root, "data": ...}``."""

    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: no journal (the tests, or a service without a private directory)
        self._lock = threading.Lock()
        self._size = 0

    def took(self, tree_root: str, entry_key: str) -> None:
        self._append({"took": entry_key, "tree": tree_root})

    def admitted(self, tree_root: str, entry_key: str, reservation: shared_ledger.StoredReservation) -> None:
        data = shared_ledger.encode([reservation])[shared_ledger.LEDGER_DATA_KEY]
        self._append({"from": entry_key, "tree": tree_root, "data": data})

    def _append(self, line: dict[str, str]) -> None:
        if self.path is None:
            return
        text = orjson.dumps(line) + b"\n"
        with self._lock, self.path.open("ab") as journal:
            journal.write(text)
            self._size += len(text)

    def compact_if_idle(self, owed: bool) -> None:
        """Start afresh once the journal is large and no escrow of this process was open or unsettled
        (``owed`` False). An escrow taken meanwhile loses its "took" line, and a successor then leaves
        it to expire rather than take back less than it admitted."""
        if self.path is None or owed or self._size < COMPACT_BYTES:
            return
        with self._lock:
            self.path.write_bytes(b"")
            self._size = 0

    def take_over(self) -> dict[str, dict[str, list[shared_ledger.StoredReservation]]]:
        """What a predecessor's journal says, per tree and escrow entry: the reservations of the pods
        admitted from it; then the journal is this process's, started afresh. A line that does not
        read (cut short by the kill) is skipped: its answer never left."""
        if self.path is None or not self.path.exists():
            return {}
        entries: dict[str, dict[str, list[shared_ledger.StoredReservation]]] = {}
        for raw in self.path.read_bytes().splitlines():
            try:
                line = orjson.loads(raw)
                tree = str(line["tree"])
                if "took" in line:
                    entries.setdefault(tree, {})[str(line["took"])] = []
                elif str(line["from"]) in entries.get(tree, {}):
                    entries[tree][str(line["from"])].extend(
                        shared_ledger.decode({shared_ledger.LEDGER_DATA_KEY: str(line["data"])}).values())
                # An admission from an entry whose "took" line is not there: the journal was compacted
                # after the entry was taken, so what it admitted is not all here, and the entry is left
                # to expire.
            except (orjson.JSONDecodeError, KeyError, TypeError, shared_ledger.LedgerFormatError):
                continue
        with self._lock:
            self.path.write_bytes(b"")
            self._size = 0
        if entries:
            log.info("strict accounting: taking back %d escrow entries a previous quota service of this replica "
                     "took, with the %d pods it admitted from them", sum(map(len, entries.values())),
                     sum(len(admitted) for tree in entries.values() for admitted in tree.values()))
        return entries
