"""Live mode: list+watch pods, ElasticQuotas and PodGroups into a QuotaState, and Nodes into the node view,
with raw JSON decoding.

Each kind runs its own loop: list (full replace), then watch from the list's resourceVersion,
again and again; a 410 Gone re-lists at once, any other error re-lists after a bounded backoff.
While it fails the state keeps answering from what it last saw (``QuotaState.sync_failed``)
until the staleness bound makes ``/readyz`` fail.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuquota_core.gang import POD_GROUP_KIND, POD_GROUP_PLURAL
from gpuquota_core.quota_objects import ELASTICQUOTA_GROUP, ELASTICQUOTA_PLURAL, ELASTICQUOTA_VERSION
from kubeaccess.kube import list_pages
from webhook.quota import metrics
from webhook.quota.node_view import NODE_KIND, NodeState
from webhook.quota.state import KINDS, OPTIONAL_KINDS, QuotaState

log = logging.getLogger("gpuquota.quota")
# The server ends each watch after this long and the loop starts the next one from the last
# resourceVersion seen: a quiet way to notice a silently dead connection.
WATCH_SECONDS = 300
MAX_BACKOFF_SECONDS = 30.0
# Objects per list page: big enough that a 100k-pod cluster lists in 20 round trips, small enough
# that one decoded page stays a small part of the service's memory.
PAGE_SIZE = 5000
# A Node's JSON is many times a pod's (labels, images, conditions) and only a few labels, taints
# and GPU names of it are kept, so its pages are smaller: a page of Nodes as large as a pod page,
# decoded at once while the pods are still listing, was most of the quota service's peak memory
# (docs/benchmarks.md, "Mechanisms kept").
PAGE_SIZES = {NODE_KIND: 100}

Lister = Callable[..., Any]


class SyncTarget(Protocol):
    """What one kind's loop feeds: the quota state (pods, quotas) or the node view (nodes)."""

    def compact(self, kind: str, obj: Mapping[str, Any]) -> Any: ...

    def replace_compact(self, kind: str, items: Iterable[Any], version: str = "") -> None: ...

    def apply_event(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None: ...

    def sync_failed(self, kind: str) -> None: ...


def lister_for(api: client.ApiClient, kind: str) -> Lister:
    if kind == "Pod":
        return client.CoreV1Api(api).list_pod_for_all_namespaces
    if kind == NODE_KIND:
        return client.CoreV1Api(api).list_node
    custom = client.CustomObjectsApi(api)
    if kind == POD_GROUP_KIND:
        return lambda **kw: custom.list_cluster_custom_object(ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION,
                                                                 POD_GROUP_PLURAL, **kw)
    return lambda **kw: custom.list_cluster_custom_object(ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION,
                                                             ELASTICQUOTA_PLURAL, **kw)


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): only a new list can continue."""


def sync_kind(state: SyncTarget, lister: Lister, kind: str, stop: threading.Event,
              watch_seconds: int = WATCH_SECONDS, initial_backoff: float = 0.5, page_size: int = PAGE_SIZE) -> None:
    backoff = initial_backoff
    reason = "initial"
    while not stop.is_set():
        try:
            metrics.RELISTS.labels(kind, reason).inc()
            version = list_into(state, lister, kind, page_size)
            backoff = initial_backoff
            while not stop.is_set():
                version = watch_once(state, lister, kind, version, watch_seconds)
        except WatchExpired:
            reason = "gone"
            continue
        except Exception as error:  # any failure: log, back off, re-list
            reason = "error"
            state.sync_failed(kind)
            log.warning("quota sync of %s failed, re-listing in %.1fs: %s", kind, backoff, error)
            stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)


def list_into(state: SyncTarget, lister: Lister, kind: str, page_size: int = PAGE_SIZE) -> str:
    """List every object of ``kind`` page by page into ``state``; returns the list's resourceVersion.

    Each page is decoded, reduced to the few fields a decision needs and dropped before the next
    one is fetched, so the memory of a 100k-pod list is the compact records plus one page, not the
    whole decoded JSON. All pages come from one consistent snapshot (the continue token pins its
    resourceVersion); if the token expires (410) the list starts again.
    """
    compacted: list[Any] = []
    metadata: dict[str, Any] = {}
    try:
        for page in list_pages(lister, page_size):
            compacted.extend(state.compact(kind, item) for item in page.get("items") or [])
            del page["items"]
            metadata = page["metadata"]
    except ApiException as error:
        if error.status == 410:
            raise WatchExpired("the list's continue token expired") from None
        raise
    version = str(metadata["resourceVersion"])
    state.replace_compact(kind, compacted, version)
    return version


def watch_once(state: SyncTarget, lister: Lister, kind: str, version: str,
               watch_seconds: int = WATCH_SECONDS) -> str:
    """Apply one watch stream's events; returns the resourceVersion to continue from."""
    response = lister(watch=True, resource_version=version, allow_watch_bookmarks=True,
                      timeout_seconds=watch_seconds, _preload_content=False)
    try:
        for line in _lines(response):
            if not line.strip():
                continue
            event = orjson.loads(line)
            obj = event.get("object") or {}
            if event.get("type") == "ERROR":
                if obj.get("code") == 410:
                    raise WatchExpired(obj.get("message", "resourceVersion too old"))
                raise RuntimeError(f"watch error: {obj.get('message')}")
            version = (obj.get("metadata") or {}).get("resourceVersion", version)
            obj.setdefault("kind", kind)
            state.apply_event(kind, event["type"], obj)
    finally:
        response.release_conn()
    return version


def _lines(response: Any) -> Iterator[bytes]:
    buffer = b""
    for chunk in response.stream(65536):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line
    if buffer:
        yield buffer


def start_live_sync(state: QuotaState, api: client.ApiClient, watch_seconds: int = WATCH_SECONDS,
                    nodes: NodeState | None = None) -> threading.Event:
    """One loop per kind; with ``nodes``, Nodes too, and the thread that publishes their view."""
    stop = threading.Event()
    targets: list[tuple[SyncTarget, str]] = [(state, kind) for kind in (*KINDS, *OPTIONAL_KINDS)]
    if nodes is not None:
        targets.append((nodes, NODE_KIND))
        threading.Thread(target=nodes.publish_while, args=(stop,), daemon=True, name="node-view").start()
    for target, kind in targets:
        threading.Thread(target=sync_kind, args=(target, lister_for(api, kind), kind, stop, watch_seconds),
                         kwargs={"page_size": PAGE_SIZES.get(kind, PAGE_SIZE)}, daemon=True,
                         name=f"sync-{kind}").start()
    return stop
