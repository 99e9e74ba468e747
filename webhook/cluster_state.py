"""Live mode: list+watch pods and ElasticQuotas into a QuotaState, with raw JSON decoding.

Each kind runs its own loop: list (full replace), then watch from the list's resourceVersion,
again and again; a 410 Gone re-lists at once, any other error re-lists after a bounded backoff.
While it fails the state keeps answering from what it last saw (``QuotaState.sync_failed``)
until the staleness bound makes ``/readyz`` fail.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes import client

from . import quota_metrics as metrics
from .quota_state import KINDS, QuotaState

log = logging.getLogger("gpuquota.quota")
EQ_GROUP, EQ_VERSION, EQ_PLURAL = "scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas"
# The server ends each watch after this long and the loop starts the next one from the last
# resourceVersion seen: a quiet way to notice a silently dead connection.
WATCH_SECONDS = 300
MAX_BACKOFF_SECONDS = 30.0

Lister = Callable[..., Any]


def lister_for(api: client.ApiClient, kind: str) -> Lister:
    if kind == "Pod":
        return client.CoreV1Api(api).list_pod_for_all_namespaces
    custom = client.CustomObjectsApi(api)
    return lambda **kw: custom.list_cluster_custom_object(EQ_GROUP, EQ_VERSION, EQ_PLURAL, **kw)


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): only a new list can continue."""


def sync_kind(state: QuotaState, lister: Lister, kind: str, stop: threading.Event,
              watch_seconds: int = WATCH_SECONDS, initial_backoff: float = 0.5) -> None:
    backoff = initial_backoff
    reason = "initial"
    while not stop.is_set():
        try:
            metrics.RELISTS.labels(kind, reason).inc()
            listed = orjson.loads(lister(_preload_content=False).data)
            items = listed.get("items") or []
            for item in items:
                item.setdefault("kind", kind)
            state.replace_kind(kind, items)
            version = listed["metadata"]["resourceVersion"]
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


def watch_once(state: QuotaState, lister: Lister, kind: str, version: str,
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


def start_live_sync(state: QuotaState, api: client.ApiClient, watch_seconds: int = WATCH_SECONDS) -> threading.Event:
    stop = threading.Event()
    for kind in KINDS:
        threading.Thread(target=sync_kind, args=(state, lister_for(api, kind), kind, stop, watch_seconds),
                         daemon=True, name=f"sync-{kind}").start()
    return stop
