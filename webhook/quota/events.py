"""Kubernetes Events for refused and would-be-refused pods: who writes them, and how.

Design: one writer per server instance, the quota service process.

- A worker decides that an admission deserves an event (:func:`gpuquota_core.events.pod_event`)
  and hands it to its :class:`EventForwarder`: a non-blocking put into a bounded queue. A thread
  of that worker sends what queued up, in batches, over the quota service's socket. Admission
  never waits for any of it; a full queue drops the event and counts it.
- The quota service (:class:`EventService`) resolves the target (the pod's controller, else the
  ElasticQuota the pod resolves to in the tree it already holds, else the namespace), aggregates
  and rate-limits (:mod:`webhook.quota.event_recorder`) and writes, from one thread with its own queue.

Why there and not a client in every worker: aggregation and rate limits only work where every
occurrence is seen, and the service is the one process per instance that already holds the API
credentials, the quota tree (for the target) and the watch; workers hold no API client at all.
With N workers each writing, a crash-looping controller would get N events and N times the budget.

The API is core/v1 Event with ``count``, ``firstTimestamp`` and ``lastTimestamp``: what
``kubectl describe`` shows as ``(x12 over 5m)`` and what ``kubectl get events --field-selector
involvedObject.name=...`` selects. Each Event's name is derived from what it aggregates (target,
reason, message), so every replica, and this process after a restart, updates the same object:
a create that finds it already there reads its count and adds to it with a resourceVersion
precondition (a lost race is read again, never double counted or overwritten).

Offline (``--state``) there is no API server: the service logs each aggregated event instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from prometheus_client import Counter

from gpuquota_core.events import EVENT_TYPE, REPORTING_COMPONENT, ObjectRef, PodEvent, namespace_target
from webhook.quota.event_recorder import EventKey, EventRecorder, EventWrite

log = logging.getLogger("gpuquota.events")


# -- how a worker hands an event to the service over the socket -----------------------------------

def event_to_wire(event: PodEvent) -> dict[str, Any]:
    owner = event.owner
    return {"reason": event.reason, "message": event.message, "namespace": event.namespace,
            "quota_label": event.quota_label,
            "owner": None if owner is None else [owner.api_version, owner.kind, owner.name, owner.uid]}


def event_from_wire(raw: object) -> PodEvent:
    """The event a worker sent; ValueError for anything else (the service drops it)."""
    if not isinstance(raw, Mapping):
        raise ValueError("an event must be an object")
    texts = [raw.get(key) for key in ("reason", "message", "namespace", "quota_label")]
    if not all(isinstance(text, str) for text in texts):
        raise ValueError("an event needs reason, message, namespace and quota_label as strings")
    reason, message, namespace, quota_label = (str(text) for text in texts)
    owner_raw = raw.get("owner")
    owner = None
    if owner_raw is not None:
        if not (isinstance(owner_raw, list) and len(owner_raw) == 4 and all(isinstance(v, str) for v in owner_raw)):
            raise ValueError("an event's owner must be [apiVersion, kind, name, uid]")
        owner = ObjectRef(owner_raw[0], owner_raw[1], owner_raw[2], namespace, owner_raw[3])
    return PodEvent(reason, message, namespace, quota_label, owner)

EVENTS = Counter(
    "gpuquota_events",
    "Pod refusals and would-deny decisions reported as Kubernetes Events, by event reason and result: "
    "created or updated (carried by a write of a new or existing Event), logged (offline), "
    "failed (the API server refused the write), dropped (a full queue or too many pending events).",
    ["reason", "result"],
)
DROPPED = Counter(
    "gpuquota_events_dropped",
    "Occurrences of events dropped before reaching the API server (full queue, too many pending).",
)

# The worker's queue, and the service's: bounded so a flood costs memory only up to here.
WORKER_QUEUE = 1000
SERVICE_QUEUE = 10_000
BATCH = 200
# How often the service looks whether a rate-limited event may now be written.
FLUSH_SECONDS = 1.0
KNOWN_EVENTS = 4096
WRITE_ATTEMPTS = 3


def count_dropped(reason: str, occurrences: int = 1) -> None:
    DROPPED.inc(occurrences)
    EVENTS.labels(reason, "dropped").inc(occurrences)


# -- the worker's side -----------------------------------------------------------------------------

class EventSender(Protocol):
    def record_events(self, events: list[dict[str, Any]]) -> int: ...


class EventForwarder:
    """Queues a worker's events and sends them to the quota service from a thread of its own."""

    def __init__(self, sender: EventSender, capacity: int = WORKER_QUEUE) -> None:
        self.sender = sender
        self.capacity = capacity
        self._queue: queue.Queue[PodEvent] = queue.Queue(capacity)
        self._pid = 0
        self._lock = threading.Lock()

    def report(self, event: PodEvent) -> None:
        if self._pid != os.getpid():
            self._start()  # first use in this process (threads do not survive a fork)
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            count_dropped(event.reason)

    def _start(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            self._queue = queue.Queue(self.capacity)
            threading.Thread(target=self._run, args=(self._queue,), daemon=True, name="event-forwarder").start()
            self._pid = os.getpid()

    def _run(self, pending: queue.Queue[PodEvent]) -> None:
        while True:
            batch = [pending.get()]
            with contextlib.suppress(queue.Empty):
                while len(batch) < BATCH:
                    batch.append(pending.get_nowait())
            try:
                self.sender.record_events([event_to_wire(event) for event in batch])
            except (OSError, ValueError) as error:
                log.warning("events: cannot hand %d event(s) to the quota service: %s", len(batch), error)
                for event in batch:
                    count_dropped(event.reason)


# -- the quota service's side ----------------------------------------------------------------------

class EventSink(Protocol):
    def write(self, write: EventWrite) -> str:
        """Write one aggregated event; the result label: created, updated, logged or failed."""
        ...


def event_name(key: EventKey) -> str:
    """A name derived from what the Event aggregates: the same for every writer, any time."""
    target = key.target
    identity = "\0".join((target.api_version, target.kind, target.namespace, target.name, target.uid,
                          key.reason, key.message))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    # A target name is a DNS subdomain of at most 253 characters; so is the result.
    return f"{target.name[:253 - 17]}.{digest}"


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_namespace(target: ObjectRef) -> str:
    # A namespaced target's events live beside it; a cluster-scoped one's in default.
    return target.namespace or "default"


def event_body(write: EventWrite, instance: str) -> dict[str, Any]:
    key = write.key
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name(key), "namespace": event_namespace(key.target),
                     "labels": {"app.kubernetes.io/name": REPORTING_COMPONENT}},
        "involvedObject": key.target.as_involved_object(),
        "reason": key.reason, "message": write.message, "type": EVENT_TYPE,
        "count": write.count, "firstTimestamp": _timestamp(write.first), "lastTimestamp": _timestamp(write.last),
        "source": {"component": REPORTING_COMPONENT, "host": instance},
        "reportingComponent": REPORTING_COMPONENT, "reportingInstance": instance,
    }


class LogSink:
    """Offline mode: no API server to write to; the aggregated event goes to the log."""

    def write(self, write: EventWrite) -> str:
        key = write.key
        log.info("%s", orjson.dumps({"event": "kubernetes_event", "written": False, "reason": key.reason,
                                     "involvedObject": key.target.as_involved_object(), "count": write.count,
                                     "message": write.message}).decode())
        return "logged"


@dataclass(slots=True)
class _Known:
    count: int
    resource_version: str


class ApiEventSink:
    """core/v1 Events through the API server; remembers each Event's count and resourceVersion."""

    def __init__(self, api: Any, instance: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.instance = instance
        self._known: OrderedDict[str, _Known] = OrderedDict()

    def write(self, write: EventWrite) -> str:
        from kubernetes.client.exceptions import ApiException

        name, namespace = event_name(write.key), event_namespace(write.key.target)
        known = self._known.get(name)
        for _ in range(WRITE_ATTEMPTS):
            try:
                if known is None:
                    stored = self._call(self.core.create_namespaced_event, namespace, event_body(write, self.instance))
                    self._remember(name, stored)
                    return "created"
                patch = {"metadata": {"resourceVersion": known.resource_version},
                         "count": known.count + write.count, "message": write.message,
                         "lastTimestamp": _timestamp(write.last),
                         "source": {"component": REPORTING_COMPONENT, "host": self.instance},
                         "reportingInstance": self.instance}
                stored = self._call(self.core.patch_namespaced_event, name, namespace, patch,
                                    _content_type="application/merge-patch+json")
                self._remember(name, stored)
                return "updated"
            except ApiException as error:
                if error.status == 409:  # it exists (create), or someone else updated it (patch)
                    known = self._read(name, namespace)
                elif error.status == 404:  # expired (the API server's event TTL) since we wrote it
                    known = None
                else:
                    log.warning("events: cannot write event %s/%s: %s %s", namespace, name, error.status,
                                error.reason)
                    return "failed"
            except Exception as error:  # the network; never let the writer thread die
                log.warning("events: cannot write event %s/%s: %s: %s", namespace, name,
                            type(error).__name__, error)
                return "failed"
        self._known.pop(name, None)
        return "failed"

    @staticmethod
    def _call(method: Callable[..., Any], *args: Any, **options: Any) -> dict[str, Any]:
        response = method(*args, _preload_content=False, _request_timeout=10, **options)
        stored: dict[str, Any] = orjson.loads(response.data)
        return stored

    def _read(self, name: str, namespace: str) -> _Known | None:
        from kubernetes.client.exceptions import ApiException

        try:
            stored = self._call(self.core.read_namespaced_event, name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return _Known(int(stored.get("count") or 1), str(stored["metadata"]["resourceVersion"]))

    def _remember(self, name: str, stored: dict[str, Any]) -> None:
        self._known[name] = _Known(int(stored.get("count") or 1), str(stored["metadata"]["resourceVersion"]))
        self._known.move_to_end(name)
        if len(self._known) > KNOWN_EVENTS:
            self._known.popitem(last=False)


# target of an ownerless pod: (namespace, quota label) -> the quota it resolves to, or None.
QuotaOf = Callable[[str, str], ObjectRef | None]


class EventService:
    """The quota service's event writer: one bounded queue, one thread, the recorder, a sink."""

    def __init__(self, sink: EventSink, quota_of: QuotaOf, *, clock: Callable[[], float] = time.time,
                 capacity: int = SERVICE_QUEUE, recorder: EventRecorder | None = None,
                 polled: Callable[[], list[PodEvent]] = list) -> None:
        self.sink = sink
        self.quota_of = quota_of
        # Events of the quota service's own (a gang left partly admitted), asked for at every step.
        self.polled = polled
        self.clock = clock
        self.recorder = recorder or EventRecorder(clock())
        self._queue: queue.Queue[PodEvent] = queue.Queue(capacity)

    def submit(self, raw_events: object) -> int:
        """Called from the service's socket loop: never blocks. Returns how many were taken."""
        if not isinstance(raw_events, list):
            return 0
        taken = 0
        for raw in raw_events:
            try:
                event = event_from_wire(raw)
            except ValueError as error:
                log.warning("events: ignoring a malformed event from a worker: %s", error)
                continue
            try:
                self._queue.put_nowait(event)
                taken += 1
            except queue.Full:
                count_dropped(event.reason)
        return taken

    def target_of(self, event: PodEvent) -> ObjectRef:
        if event.owner is not None:
            return event.owner
        return self.quota_of(event.namespace, event.quota_label) or namespace_target(event.namespace)

    def step(self, wait: float = 0.0) -> None:
        """Take what arrived (waiting up to ``wait`` seconds for the first), then write what is due."""
        try:
            first = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
        except queue.Empty:
            first = None
        arrived = [first] if first is not None else []
        with contextlib.suppress(queue.Empty):
            while len(arrived) < SERVICE_QUEUE:
                arrived.append(self._queue.get_nowait())
        arrived.extend(self.polled())
        now = self.clock()
        for event in arrived:
            if not self.recorder.observe(self.target_of(event), event.reason, event.message, now):
                count_dropped(event.reason)
        for write in self.recorder.due(now):
            result = self.sink.write(write)
            EVENTS.labels(write.key.reason, result).inc(write.count)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.step(FLUSH_SECONDS)
            except Exception:
                log.exception("events: writer step failed")

    def start(self) -> threading.Event:
        stop = threading.Event()
        threading.Thread(target=self.run, args=(stop,), daemon=True, name="event-writer").start()
        return stop


def reporting_instance() -> str:
    """The pod's name in a cluster (its hostname), the host's name elsewhere."""
    return socket.gethostname()
