"""Only a replica that decides watches every pod (``--writer-lease``).

A replica that forwards its admissions to the ledger writer (``forwarding``) judges none of them: the
writer judges on its own watch. So its list and watch of pods stop, sparing the apiserver a watcher
and this replica every pod event, and it is ready without them. They start again the moment it must
decide, as the writer or in the degraded mode, and its decisions wait for that list (the committer's
watch gate, which also waits for the quota state to be synced). A replica that forwarded only a
moment ago keeps watching, so one whose writer cannot be asked for a while (paused, then replaced)
does not list again each time it tries the writer once more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from webhook.quota.cluster_state import WatchSwitch
from webhook.quota.state import QuotaState
from webhook.quota.strict.writer_lease import LEASE_DURATION_SECONDS

# How long a replica keeps its pods after it last decided: longer than a hand-over of the Lease (its
# duration, and a round to take it), within which a forwarder goes back and forth between forwarding
# and deciding here each time it tries a writer that cannot be asked.
LINGER_SECONDS = 2 * LEASE_DURATION_SECONDS


class PodWatch:
    """Turns the pod watch on while this replica decides (or decided within LINGER_SECONDS), off
    while it forwards; told every role ``forwarding.SingleWriter`` reports."""

    def __init__(self, state: QuotaState, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.monotonic = monotonic
        # Off until the first role is known: a replica that joins as a forwarder never lists pods.
        self.switch = WatchSwitch(state.forget_pods, on=False)
        state.want_pods(False)
        self._lock = threading.Lock()
        self._decided_at = -float("inf")
        self._wanted = False

    def role_is(self, role: str) -> None:
        now = self.monotonic()
        with self._lock:
            if role != "forwarding":
                self._decided_at = now
            wanted = now - self._decided_at < LINGER_SECONDS
            if wanted == self._wanted:
                return
            self._wanted = wanted
        self.state.want_pods(wanted)
        self.switch.set(wanted)
