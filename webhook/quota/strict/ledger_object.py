"""The ledger ConfigMap as the apiserver holds it: the body of a write and what a read holds, the
create-or-replace (the registry's too), its creation time, and the two listings the store needs (the
trees that have a ledger, the newest pod version).

One ConfigMap per quota tree, ``gpuquota-ledger-<tree>`` (``gpuquota_core.shared_ledger`` has the
data's format), labelled with its tree so a listing finds every replica's, and kept by a finalizer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import orjson

from gpuquota_core import shared_ledger
from gpuquota_core.shared_ledger import MANAGED_BY, MANAGED_BY_LABEL, MANAGED_SELECTOR, TREE_LABEL
from webhook.quota.pod_versions import resource_version

FIELD_MANAGER = "gpuquota-webhook"
# Keeps a deleted ledger object readable, with everything it held, until that has expired: a replica
# that never saw the object then still finds it (terminating) and holds the tree, instead of finding
# nothing and starting an empty ledger while other replicas admit from what the old one held.
LEDGER_FINALIZER = "gpuquota.koord-gpuquota.io/ledger"


def ledger_body(namespace: str, tree_root: str, stored: Iterable[shared_ledger.StoredReservation], hold: float,
                counted_through: int, *, release: bool, deleted_at: str | None) -> dict[str, Any]:
    """The object a create or replace sends; ``release`` drops the finalizer, ``deleted_at`` keeps a
    deleted object's deletionTimestamp (it cannot be taken back)."""
    labels = {MANAGED_BY_LABEL: MANAGED_BY}
    if len(tree_root) <= 63:
        labels[TREE_LABEL] = tree_root
    metadata: dict[str, Any] = {"name": shared_ledger.ledger_object_name(tree_root), "namespace": namespace,
                                "labels": labels, "finalizers": [] if release else [LEDGER_FINALIZER]}
    if deleted_at is not None:
        metadata["deletionTimestamp"] = deleted_at
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "data": shared_ledger.encode(stored, hold, counted_through)}


def ledger_contents(body: dict[str, Any]) -> tuple[shared_ledger.Stored, float, int]:
    """What a read object holds: its reservations, the hold it records (0: none) and how far its
    readers' pod watches must have got; LedgerFormatError when it cannot be read."""
    data = body.get("data") or {}
    if shared_ledger.LEDGER_DATA_KEY not in data:  # every write stores it, an empty ledger too
        raise shared_ledger.LedgerFormatError(f"{shared_ledger.LEDGER_DATA_KEY} is missing")
    return shared_ledger.decode(data), shared_ledger.recovering_until(data), shared_ledger.pods_counted_through(data)


def put_config_map(core: Any, body: dict[str, Any], version: str) -> dict[str, Any]:
    """Create the ConfigMap ``body`` (``version`` ""), or replace it if still at ``version``; the stored
    metadata. ApiException as the apiserver answered (409: a conflict). The ledgers' writes and the
    registry's (``registry``) both go through it."""
    metadata = body["metadata"]
    if version:
        metadata["resourceVersion"] = version
        response = core.replace_namespaced_config_map(metadata["name"], metadata["namespace"], body,
                                                      field_manager=FIELD_MANAGER, _preload_content=False)
    else:
        response = core.create_namespaced_config_map(metadata["namespace"], body, field_manager=FIELD_MANAGER,
                                                     _preload_content=False)
    return dict(orjson.loads(response.data)["metadata"])


def created_at(metadata: dict[str, Any]) -> float:
    """An object's creationTimestamp in wall-clock seconds, rounded up (it is kept to the second)."""
    try:
        stamp = datetime.strptime(str(metadata["creationTimestamp"]), "%Y-%m-%dT%H:%M:%SZ")
    except (KeyError, ValueError):
        return time.time()  # unknown: no later than now
    return stamp.replace(tzinfo=UTC).timestamp() + 1.0


def ledger_trees(core: Any, namespace: str) -> list[str]:
    """The quota trees that have a ledger object, from their label (any replica may have made them)."""
    listed = orjson.loads(core.list_namespaced_config_map(namespace, label_selector=MANAGED_SELECTOR,
                                                          _preload_content=False).data)
    return sorted(str(item["metadata"]["labels"][TREE_LABEL]) for item in listed.get("items", [])
                  if TREE_LABEL in (item["metadata"].get("labels") or {}))


def newest_pod_version(core: Any) -> int:
    """The highest resourceVersion of the pods that exist (a consistent, paged list): every watch
    that has got that far has shown each of them, so it counts every pod whose reservation an
    unreadable ledger may have dropped."""
    newest, token = 0, None
    while True:
        page = orjson.loads(core.list_pod_for_all_namespaces(limit=500, _continue=token, _preload_content=False).data)
        for item in page.get("items", []):
            newest = max(newest, resource_version((item.get("metadata") or {}).get("resourceVersion")))
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return newest
