"""Which replica writes the ledgers: the holder of one Lease (``--writer-lease``). With one writer
the ledger writes do not conflict; the others forward to it (``forwarding``) at the address it
writes into the Lease.

The Lease picks the writer; it guards nothing. Two replicas that both believe they hold it (a
partition, a paused holder that wakes up) are still correct, because the ledger's preconditions
decide; they only conflict again. So expiry is judged the way client-go's leader election judges it,
by how long this replica has seen the record unchanged on its own monotonic clock, never by the
timestamps another host wrote.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("gpuquota.quota")
# How long a holder that stops renewing stays the writer in the others' eyes. Until then they keep
# forwarding to it; a holder that is gone refuses their connections at once, and they decide
# themselves meanwhile, so a short duration buys a quick hand-over, not availability.
LEASE_DURATION_SECONDS = 4
# How often the holder renews and the others read the Lease: several renewals fit in one duration,
# so one slow write does not hand the Lease over.
RENEW_EVERY_SECONDS = 1.0
# Where the holder says how to reach it ("host:port" of its peer listener).
ADDRESS_ANNOTATION = "gpuquota.koord-gpuquota.io/peer-address"
# Bounds each Lease request, so a hung API server cannot stop the renewals of a later round.
REQUEST_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class LeaseRecord:
    """What the election needs of a stored Lease."""

    holder: str  # "" when released
    address: str  # the holder's peer listener
    duration_seconds: float
    version: str  # resourceVersion: the precondition of the next write, and what "unchanged" means
    transitions: int
    acquired: str = ""  # acquireTime, kept by renewals

    @classmethod
    def from_object(cls, body: dict[str, Any]) -> LeaseRecord:
        spec = body.get("spec") or {}
        metadata = body.get("metadata") or {}
        duration = spec.get("leaseDurationSeconds")
        return cls(holder=str(spec.get("holderIdentity") or ""),
                   address=str((metadata.get("annotations") or {}).get(ADDRESS_ANNOTATION, "")),
                   duration_seconds=float(duration) if isinstance(duration, int) and duration > 0
                   else float(LEASE_DURATION_SECONDS),
                   version=str(metadata.get("resourceVersion", "")),
                   transitions=int(spec.get("leaseTransitions") or 0),
                   acquired=str(spec.get("acquireTime") or ""))


class Step(enum.Enum):
    CREATE = "create"  # no Lease yet
    RENEW = "renew"  # this replica holds it
    TAKE = "take"  # released, or its holder stopped renewing
    FOLLOW = "follow"  # another replica holds it


def next_step(record: LeaseRecord | None, identity: str, expired: bool) -> Step:
    """What this replica does with the Lease as read; ``expired``: unchanged for longer than its duration."""
    if record is None:
        return Step.CREATE
    if record.holder == identity:
        return Step.RENEW
    if not record.holder or expired:
        return Step.TAKE
    return Step.FOLLOW


def _micro_time(moment: float) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class WriterLease:
    """This replica's part in the election of the ledger writer; ``run`` in a thread of its own."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, identity: str, address: str, *,
                 monotonic: Callable[[], float] = time.monotonic, clock: Callable[[], float] = time.time) -> None:
        # Any: with _preload_content=False the client returns the raw response, decoded here.
        self.coordination: Any = client.CoordinationV1Api(api)
        self.namespace, self.name = namespace, name
        self.identity, self.address = identity, address
        self.monotonic, self.clock = monotonic, clock
        self._lock = threading.Lock()
        self._record: LeaseRecord | None = None
        self._observed_at = -float("inf")  # monotonic time the record was last seen to change
        self._held_until = -float("inf")  # monotonic end of this replica's last successful renewal's duration

    def holds(self) -> bool:
        """Whether this replica wrote the Lease as its holder less than a duration ago."""
        with self._lock:
            return self.monotonic() < self._held_until

    def writer_elsewhere(self) -> str | None:
        """The address of another replica holding the Lease, or None: this replica holds it, nobody
        does, or the holder has not renewed for a duration (this replica then decides itself)."""
        with self._lock:
            record = self._record
            if record is None or not record.holder or record.holder == self.identity or not record.address:
                return None
            return None if self._unrenewed(record, self.monotonic()) else record.address

    def _unrenewed(self, record: LeaseRecord, now: float) -> bool:
        """Whether ``record`` has stood unchanged for its whole duration by this replica's clock (lock held)."""
        return now >= self._observed_at + record.duration_seconds

    def run(self, stop: threading.Event, after_round: Callable[[], object] = lambda: None) -> None:
        """Step every RENEW_EVERY_SECONDS until ``stop``; ``after_round``: told after each round (the
        role gauge, ``forwarding.SingleWriter.report_role``)."""
        while True:
            try:
                self.step()
            except Exception as error:  # the API down, a bad object: try again next round, never die
                log.warning("writer lease %s/%s: %s: %s", self.namespace, self.name, type(error).__name__, error)
            after_round()
            if stop.wait(RENEW_EVERY_SECONDS):
                return

    def step(self) -> None:
        """One round: read the Lease, then create, renew or take it, or follow its holder."""
        record = self._read()
        now = self.monotonic()
        with self._lock:
            if record is not None and (self._record is None or record.version != self._record.version):
                self._observed_at = now
            self._record = record
            expired = record is not None and self._unrenewed(record, now)
        step = next_step(record, self.identity, expired)
        if step is Step.FOLLOW:
            return
        started = self.monotonic()
        body = self._body(record, taking=step is not Step.RENEW)
        try:
            if step is Step.CREATE:
                written = self.coordination.create_namespaced_lease(
                    self.namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_SECONDS)
            else:
                written = self.coordination.replace_namespaced_lease(
                    self.name, self.namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except ApiException as error:
            if error.status in (409, 422):  # another replica wrote it first: read again next round
                return
            raise
        stored = LeaseRecord.from_object(orjson.loads(written.data))
        with self._lock:
            if step is not Step.RENEW:
                log.info("writer lease %s/%s: this replica (%s, %s) writes the ledgers now", self.namespace,
                         self.name, self.identity, self.address)
            self._record, self._observed_at = stored, self.monotonic()
            # Counted from before the write: the others may have seen it from then on.
            self._held_until = started + stored.duration_seconds

    def release(self) -> None:
        """On a clean stop: give the Lease up at once, so another replica takes it within one round."""
        with self._lock:
            record = self._record if self.monotonic() < self._held_until else None
            self._held_until = -float("inf")
        if record is None or record.holder != self.identity:
            return
        body = self._body(record, taking=False)
        body["spec"]["holderIdentity"] = ""
        body["metadata"]["annotations"] = {ADDRESS_ANNOTATION: ""}
        try:
            self.coordination.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False,
                                                       _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except Exception as error:  # it expires by itself within one duration
            log.warning("writer lease %s/%s: not released: %s: %s", self.namespace, self.name,
                        type(error).__name__, error)

    def _read(self) -> LeaseRecord | None:
        try:
            response = self.coordination.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                               _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return LeaseRecord.from_object(orjson.loads(response.data))

    def _body(self, record: LeaseRecord | None, *, taking: bool) -> dict[str, Any]:
        now = _micro_time(self.clock())
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                    "annotations": {ADDRESS_ANNOTATION: self.address}}
        spec: dict[str, Any] = {"holderIdentity": self.identity, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                                "renewTime": now}
        if record is not None:
            metadata["resourceVersion"] = record.version  # the precondition: nobody wrote it since
            spec["leaseTransitions"] = record.transitions + (1 if taking else 0)
        else:
            spec["leaseTransitions"] = 0
        spec["acquireTime"] = now if taking or record is None or not record.acquired else record.acquired
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
