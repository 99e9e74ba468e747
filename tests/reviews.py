"""AdmissionReview bodies for tests, built the way the API server builds them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

REVIEW_API_VERSION = "admission.k8s.io/v1"


def pod(name: str = "trainer-0", namespace: str = "team-vision", *,
        containers: list[dict[str, Any]] | None = None, labels: Mapping[str, str] | None = None,
        resources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A pod with one container ``main`` asking for ``resources`` as requests and limits alike."""
    if containers is None:
        amounts = dict(resources or {})
        containers = [{"name": "main", "image": "registry.example/train:1",
                       "resources": {"requests": dict(amounts), "limits": dict(amounts)}}]
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": containers}}


def review(obj: Mapping[str, Any] | None, *, operation: str = "CREATE", old: Mapping[str, Any] | None = None,
           kind: str = "Pod", group: str = "", version: str = "v1", resource: str = "pods",
           dry_run: bool = False, uid: str | None = None) -> dict[str, Any]:
    metadata = (obj or old or {}).get("metadata", {})
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "namespace": metadata.get("namespace", ""),
        "name": metadata.get("name", ""),
        "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
    }
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "request": request}


def body(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document).encode()
