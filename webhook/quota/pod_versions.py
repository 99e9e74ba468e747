"""How far this replica's list and watch of pods have got, in resourceVersions.

Strict accounting drops a reservation from the shared ledger once the writing replica's own watch
counts the pod. Another replica whose watch has not shown that pod yet (paused, slow, re-listing)
would then count it nowhere. So the write that drops it records the resourceVersion at which the
writer's watch showed the pod, and a replica decides on that copy of the ledger only once its own
watch has got at least that far (docs/design.md, "The ledger invariant of strict accounting").

resourceVersions of one resource compare as integers (Kubernetes' comparable resource versions,
stable since v1.35; always the etcd revision before that). One that does not parse as a positive
integer reads as 0, which asks nothing of anyone: the comparison is then simply not made.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

# How long the version a pod was first shown at is remembered by its key. A reservation is dropped
# from the ledger only after the settle time (seconds) and expires with its TTL (tens of seconds);
# a pod forgotten sooner than it is dropped only makes the recorded version higher than needed.
REMEMBER_SECONDS = 120.0


def resource_version(text: object) -> int:
    """A resourceVersion as an integer, 0 when it is not one (nothing to compare)."""
    # isascii: str.isdigit also admits digits int() does not read (superscripts).
    if isinstance(text, str) and text.isascii() and text.isdigit() and not text.startswith("0"):
        return int(text)
    return 0


class PodVersions:
    """The resourceVersions the pod list and watch delivered. Not thread-safe: the owner locks."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.seen_through = 0  # the highest resourceVersion delivered: the list's, an event's or a bookmark's
        # key -> (the version the pod was first shown at, when), oldest first
        self._recent: OrderedDict[str, tuple[int, float]] = OrderedDict()
        # Every pod not in _recent was delivered at or below this (by the list, or forgotten).
        self._older_through = 0

    def listed(self, version: str) -> None:
        """A full list at ``version``: every pod it holds was created at or below it."""
        listed_at = resource_version(version)
        self._recent.clear()
        self._older_through = max(self._older_through, listed_at)
        self.seen_through = max(self.seen_through, listed_at)

    def delivered(self, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (bookmarks included)."""
        metadata = obj.get("metadata") or {}
        version = resource_version(metadata.get("resourceVersion"))
        if not version:
            return
        self.seen_through = max(self.seen_through, version)
        key = f"{metadata.get('namespace')}/{metadata.get('name')}"
        if event_type == "DELETED":
            # A pod of the same name created later is another pod, shown at its own version.
            self._recent.pop(key, None)
        elif event_type == "ADDED":
            # Only the first sight: a later change of a pod the list or an earlier event showed
            # would record a higher version than needed, and remember a pod for every status update.
            self._recent[key] = (version, self._clock())
        self._forget_old()

    def shown_at_most(self, pod_key: str) -> int:
        """A resourceVersion at or above the one at which the list or watch first showed the pod."""
        shown = self._recent.get(pod_key)
        return shown[0] if shown is not None else self._older_through

    def _forget_old(self) -> None:
        cutoff = self._clock() - REMEMBER_SECONDS
        while self._recent:
            key, (version, since) = next(iter(self._recent.items()))
            if since >= cutoff:
                return
            del self._recent[key]
            self._older_through = max(self._older_through, version)
