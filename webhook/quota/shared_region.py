"""The memory the quota service shares with its webhook workers: a file mapped by every process.

Layout (little-endian), all of it guarded by ``state_mutex`` except ``alive_mutex``:

- a header: the two mutexes, the tree generation the totals belong to (0: workers must ask the
  service), the reservation ring's head (written by workers) and tail (by the service), how many
  reservations the service's ledger holds and the most one caller may hold, and a repair flag
  (set when a process died holding the lock: the totals may be half-written);
- the totals: one signed 128-bit count of nano-units per (quota, limited resource) slot, watched
  usage plus reservations, written by the service and raised by workers as they admit;
- the ring: reservations workers made, each one JSON frame, which the service moves into its
  ledger before it next reads or changes anything.

The tree the slots belong to is a JSON file beside it (``tree_path``), replaced whole when the
generation changes; see webhook.quota.snapshot.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import orjson

from webhook.quota.robust_mutex import MUTEX_BYTES, RobustMutex

MAGIC = b"GQS1"
_HEADER = struct.Struct("<4sIIII")  # magic, version, slot capacity, ring capacity, ring slot size
_U64 = struct.Struct("<Q")
_FRAME = struct.Struct("<I")
_STATE_MUTEX, _ALIVE_MUTEX = 0, MUTEX_BYTES
_FIXED = 2 * MUTEX_BYTES
_GENERATION, _HEAD, _TAIL, _HELD, _MAX_HELD, _REPAIR = (_FIXED + _HEADER.size + 8 * i for i in range(6))
_SLOTS_AT = 4096
SLOT_BYTES = 16
MAX_SLOT_VALUE = 2 ** (8 * SLOT_BYTES - 1) - 1  # a signed 128-bit total
DEFAULT_SLOT_CAPACITY = 65536  # e.g. 2,000 quotas limiting 32 resources each; 1 MiB
DEFAULT_RING_CAPACITY = 1024
DEFAULT_RING_SLOT_BYTES = 2048  # a reservation frame; a larger one goes to the service instead


class SharedRegion:
    def __init__(self, path: Path, region: mmap.mmap) -> None:
        self.path = path
        self._map = region
        magic, _version, self.slot_capacity, self.ring_capacity, self.ring_slot_bytes = _HEADER.unpack_from(
            region, _FIXED)
        if magic != MAGIC:
            raise ValueError(f"{path} is not a gpuquota shared region")
        self._ring_at = _SLOTS_AT + self.slot_capacity * SLOT_BYTES
        self.state_mutex = RobustMutex(region, _STATE_MUTEX)
        self.alive_mutex = RobustMutex(region, _ALIVE_MUTEX)

    @property
    def tree_path(self) -> Path:
        return self.tree_path_of(self.path)

    @staticmethod
    def tree_path_of(region_path: Path) -> Path:
        return region_path.with_name(region_path.name + ".tree.json")

    @staticmethod
    def files_of(region_path: Path) -> tuple[Path, ...]:
        """Every file a region at ``region_path`` may leave: itself, its tree, a tree being written."""
        tree = SharedRegion.tree_path_of(region_path)
        return region_path, tree, _being_written(tree)

    @classmethod
    def create(cls, path: Path, max_held: int, slot_capacity: int = DEFAULT_SLOT_CAPACITY,
               ring_capacity: int = DEFAULT_RING_CAPACITY,
               ring_slot_bytes: int = DEFAULT_RING_SLOT_BYTES) -> SharedRegion:
        """The quota service's side; the caller then holds ``alive_mutex`` for its whole life."""
        size = _SLOTS_AT + slot_capacity * SLOT_BYTES + ring_capacity * ring_slot_bytes
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(descriptor, size)
            region = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)
        # Mutexes first, magic last: a worker that maps the file early sees no magic and waits.
        RobustMutex(region, _STATE_MUTEX).initialise()
        RobustMutex(region, _ALIVE_MUTEX).initialise()
        _U64.pack_into(region, _MAX_HELD, max_held)
        _HEADER.pack_into(region, _FIXED, MAGIC, 1, slot_capacity, ring_capacity, ring_slot_bytes)
        return cls(path, region)

    @classmethod
    def open(cls, path: Path) -> SharedRegion | None:
        """A worker's side: None while the service has not created it yet."""
        try:
            descriptor = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(descriptor).st_size
            if size < _SLOTS_AT:
                return None
            region = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)
        try:
            return cls(path, region)
        except ValueError:
            return None

    # -- header (state_mutex held) ---------------------------------------------------------

    def _get(self, offset: int) -> int:
        value: int = _U64.unpack_from(self._map, offset)[0]
        return value

    def _set(self, offset: int, value: int) -> None:
        _U64.pack_into(self._map, offset, value)

    @property
    def generation(self) -> int:
        return self._get(_GENERATION)

    @generation.setter
    def generation(self, value: int) -> None:
        self._set(_GENERATION, value)

    @property
    def reservations_held(self) -> int:
        return self._get(_HELD)

    @reservations_held.setter
    def reservations_held(self, value: int) -> None:
        self._set(_HELD, value)

    @property
    def max_held(self) -> int:
        return self._get(_MAX_HELD)

    @property
    def needs_repair(self) -> bool:
        return self._get(_REPAIR) != 0

    @needs_repair.setter
    def needs_repair(self, value: bool) -> None:
        self._set(_REPAIR, 1 if value else 0)

    # -- totals ----------------------------------------------------------------------------

    def read_slot(self, slot: int) -> int:
        offset = _SLOTS_AT + slot * SLOT_BYTES
        return int.from_bytes(self._map[offset:offset + SLOT_BYTES], "little", signed=True)

    def write_slot(self, slot: int, value: int) -> None:
        """Raises OverflowError for a value beyond 128 bits (nothing is written then)."""
        if not 0 <= slot < self.slot_capacity:
            raise IndexError(f"slot {slot} outside the region's {self.slot_capacity}")
        offset = _SLOTS_AT + slot * SLOT_BYTES
        self._map[offset:offset + SLOT_BYTES] = value.to_bytes(SLOT_BYTES, "little", signed=True)

    # -- reservation ring ------------------------------------------------------------------

    def pending(self) -> int:
        return self._get(_HEAD) - self._get(_TAIL)

    def push(self, message: Any) -> bool:
        """Append one frame; False when the ring is full or the frame too large for a ring slot."""
        body = orjson.dumps(message)
        head = self._get(_HEAD)
        if head - self._get(_TAIL) >= self.ring_capacity or _FRAME.size + len(body) > self.ring_slot_bytes:
            return False
        offset = self._ring_at + (head % self.ring_capacity) * self.ring_slot_bytes
        _FRAME.pack_into(self._map, offset, len(body))
        self._map[offset + _FRAME.size:offset + _FRAME.size + len(body)] = body
        self._set(_HEAD, head + 1)  # last: a writer that dies before this line left nothing behind
        return True

    def drain(self) -> list[Any]:
        """Every frame pushed since the last drain, oldest first."""
        tail, head = self._get(_TAIL), self._get(_HEAD)
        messages = []
        for index in range(tail, head):
            offset = self._ring_at + (index % self.ring_capacity) * self.ring_slot_bytes
            (length,) = _FRAME.unpack_from(self._map, offset)
            messages.append(orjson.loads(self._map[offset + _FRAME.size:offset + _FRAME.size + length]))
        self._set(_TAIL, head)
        return messages

    # -- tree ------------------------------------------------------------------------------

    def write_tree(self, document: Any) -> None:
        """Replace the tree file whole (a worker reading it sees the old one or the new one)."""
        temporary = _being_written(self.tree_path)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # like the region
        with os.fdopen(descriptor, "wb") as out:
            out.write(orjson.dumps(document))
        temporary.replace(self.tree_path)

    def read_tree(self) -> Any | None:
        try:
            return orjson.loads(self.tree_path.read_bytes())
        except FileNotFoundError:
            return None


def _being_written(path: Path) -> Path:
    return path.with_name(path.name + ".new")
