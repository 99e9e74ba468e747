"""Live mode: list+watch pods and ElasticQuotas into a QuotaState, with raw JSON decoding.

Each kind runs its own loop: list (full replace), then watch from the list's resourceVersion;
410 Gone or any error leads to a re-list after a bounded backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from kubernetes import client, config

from .quota_state import QuotaState

log = logging.getLogger("gpuquota.quota")
EQ_GROUP, EQ_VERSION, EQ_PLURAL = "scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas"
WATCH_SECONDS = 300


def api_client(kubeconfig: Path | None, context: str | None) -> Any:
    if kubeconfig is None:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    return config.new_client_from_config(config_file=str(kubeconfig), context=context)  # type: ignore[no-untyped-call]


def _lister(api: Any, kind: str) -> Callable[..., Any]:
    if kind == "Pod":
        return client.CoreV1Api(api).list_pod_for_all_namespaces
    custom = client.CustomObjectsApi(api)
    return lambda **kw: custom.list_cluster_custom_object(EQ_GROUP, EQ_VERSION, EQ_PLURAL, **kw)


def sync_kind(state: QuotaState, api: Any, kind: str, stop: threading.Event) -> None:
    lister = _lister(api, kind)
    backoff = 0.5
    while not stop.is_set():
        try:
            listed = orjson.loads(lister(_preload_content=False).data)
            for item in listed.get("items", []):
                item.setdefault("kind", kind)
            state.replace_kind(kind, listed.get("items", []))
            version = listed["metadata"]["resourceVersion"]
            backoff = 0.5
            while not stop.is_set():
                version = _watch_once(state, lister, kind, version)
        except _Gone:
            continue
        except Exception as error:  # any failure: log, back off, re-list
            log.warning("quota sync of %s failed, re-listing in %.1fs: %s", kind, backoff, error)
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)


class _Gone(Exception):
    pass


def _watch_once(state: QuotaState, lister: Callable[..., Any], kind: str, version: str) -> str:
    response = lister(watch=True, resource_version=version, allow_watch_bookmarks=True,
                      timeout_seconds=WATCH_SECONDS, _preload_content=False)
    try:
        for line in response.stream_lines() if hasattr(response, "stream_lines") else _lines(response):
            if not line.strip():
                continue
            event = orjson.loads(line)
            obj = event.get("object", {})
            if event.get("type") == "ERROR":
                if obj.get("code") == 410:
                    raise _Gone()
                raise RuntimeError(f"watch error: {obj.get('message')}")
            version = obj.get("metadata", {}).get("resourceVersion", version)
            if event.get("type") != "BOOKMARK":
                state.apply_event(kind, event["type"], obj)
    finally:
        response.release_conn()
    return version


def _lines(response: Any) -> Any:
    buffer = b""
    for chunk in response.stream(65536):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line
    if buffer:
        yield buffer


def start_live_sync(state: QuotaState, kubeconfig: Path | None, context: str | None) -> threading.Event:
    stop = threading.Event()
    api = api_client(kubeconfig, context)
    for kind in ("Pod", "ElasticQuota"):
        threading.Thread(target=sync_kind, args=(state, api, kind, stop), daemon=True, name=f"sync-{kind}").start()
    return stop
