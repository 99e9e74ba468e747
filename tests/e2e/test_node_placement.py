"""The rewrite looks at the nodes, through the real apiserver: the live webhook watches the Nodes.

The session's webhook runs with the default ``rewrite: auto`` and the session's canonical node
(``canonical_gpu_node``). A Node this test writes runs only the vendor device plugin; a pod pinned
to it by nodeSelector must be stored with ``nvidia.com/gpu`` as written (rewritten, no node it can
reach could take it), say why in the response's Warning header, and still count against its
ElasticQuota in canonical units. A pod without constraints can reach the canonical node and is
rewritten.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from clusterhelpers import QUOTA_LABEL, admits_quota, create_quota, eventually
from controlplane import Api, GpuNodeFactory
from kubernetes.client.exceptions import ApiException
from webhookproc import WebhookProcess

from gpuquota_core.canonical import ORIGINAL_RESOURCES_ANNOTATION

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
DEADLINE = 30.0


def gpu_pod(name: str, **spec: Any) -> dict[str, Any]:
    gpu = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/train:1",
                                     "resources": {"requests": gpu, "limits": gpu}}], **spec}}


def create(api: Api, namespace: str, pod: dict[str, Any], dry_run: bool = False) -> tuple[dict[str, Any], str]:
    """The stored pod (as JSON) and the Warning headers of the create."""
    kwargs: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
    response = api.core.create_namespaced_pod(namespace, pod, _preload_content=False, **kwargs)
    assert response.status == 201
    return json.loads(response.data), str(response.headers.get("Warning") or "")


@pytest.fixture
def vendor_only_node(gpu_node: GpuNodeFactory) -> tuple[str, str]:
    """(node name, pool label value) of a node advertising nvidia.com/gpu and no koordinator.sh names."""
    pool = f"whole-{uuid.uuid4().hex[:8]}"
    name = f"gpu-{pool}"
    gpu_node(name, {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}, labels={"pool": pool})
    return name, pool


def test_a_pod_pinned_to_a_vendor_only_node_is_stored_as_written_and_still_counted(
        webhook_server: WebhookProcess, api: Api, namespace: str, vendor_only_node: tuple[str, str]) -> None:
    node, pool = vendor_only_node
    quota = f"q-{namespace}"
    create_quota(api, namespace, quota, {CORE: "100", RATIO: "100"})
    eventually(lambda: admits_quota(webhook_server, namespace, quota), "the webhook sees the quota", DEADLINE)
    pinned = {"nodeSelector": {"pool": pool}}
    left = (f"gpuquota left nvidia.com/gpu as written: none of the 1 node(s) this pod can be scheduled on ({node}) "
            f"advertises {CORE}, {RATIO}")
    # The node watch delivers the new node within moments; until then the pod reaches no node at all.
    eventually(lambda: left in create(api, namespace, gpu_pod("probe", **pinned), dry_run=True)[1],
               "the webhook's node view shows the vendor-only node", DEADLINE)

    first = gpu_pod("pinned-0", **pinned)
    first["metadata"]["labels"] = {QUOTA_LABEL: quota}
    stored, warning = create(api, namespace, first)

    assert left in warning
    requests = stored["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"nvidia.com/gpu": "1"}
    assert ORIGINAL_RESOURCES_ANNOTATION not in (stored["metadata"].get("annotations") or {})
    # Counted in canonical units all the same: the quota's one card is taken.
    second = gpu_pod("pinned-1", **pinned)
    second["metadata"]["labels"] = {QUOTA_LABEL: quota}
    with pytest.raises(ApiException) as refused:
        create(api, namespace, second)
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 403
    assert (f"exceeded quota: {namespace}/{quota}, requested: {CORE}=100,{RATIO}=100, "
            f"used: {CORE}=100,{RATIO}=100, limited: {CORE}=100,{RATIO}=100") in message


def test_a_pod_that_can_reach_a_canonical_node_is_rewritten(
        webhook_server: WebhookProcess, api: Api, namespace: str, vendor_only_node: tuple[str, str]) -> None:
    stored, warning = create(api, namespace, gpu_pod("free"))

    requests = stored["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {CORE: "100", RATIO: "100"}
    assert "gpuquota rewrote container" in warning and f"nvidia.com/gpu: 1 -> {CORE}: 100, {RATIO}: 100" in warning
