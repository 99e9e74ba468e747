"""The one eviction rule of the per-shape caches (rewrites, pod requests, GPU checks, audit verdicts).

Each cache remembers a pure function's answer by a key that covers everything the function reads.
Replicas of a workload share a key, so a cluster's working set is a few hundred entries; a full
cache is simply emptied, which is crude but bounded and refills at once. One class, so the bound
and the rule are the same everywhere and stated once.
"""

from __future__ import annotations

from typing import Generic, TypeVar

Value = TypeVar("Value")

DEFAULT_SIZE = 4096


class BoundedMemo(Generic[Value]):
    __slots__ = ("_entries", "_size")

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self._entries: dict[object, Value] = {}
        self._size = size

    def get(self, key: object) -> Value | None:
        return self._entries.get(key)

    def remember(self, key: object, value: Value) -> Value:
        if len(self._entries) >= self._size:
            self._entries.clear()
        self._entries[key] = value
        return value
