"""The escrow journal: what this quota service admitted from its escrows, kept for its successor.

An escrow admits pods in memory, without a write; its entry in the ledger holds their room until
its write settles it. A quota service killed inside its replica (the common crash) takes that
memory with it, and its entries would then hold their room until they expire: the window plus a
whole TTL. So before an escrow admission is answered, the writer appends one line here, in the
private directory beside its socket, which the service its master starts next reuses. A write(2)
survives the death of the process (the page cache is the kernel's), so no fsync is needed: only a
replica that vanished whole (its pod or node gone) loses the journal, and its entries wait for the
TTL, as they must.

The successor reads the journal when it starts and takes back each escrow entry its predecessor
took that is still in a ledger: replaced, in its next write of that tree, by a reservation per pod
journalled as admitted from it (``ledger_edits.TakeBackEscrow``). That is at least what the pods
admitted from it hold (an admission journalled whose answer never left only adds a reservation that
expires, or that its worker's report withdraws), so the invariant holds, and the room the escrow
did not use is back within a second or two of the restart instead of a TTL.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import orjson

from gpuquota_core import shared_ledger

log = logging.getLogger("gpuquota.quota")
JOURNAL_NAME = "escrow.journal"
# Past this size the journal is started afresh at the next moment nothing is owed in it.
COMPACT_BYTES = 4 * 1024 * 1024


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
