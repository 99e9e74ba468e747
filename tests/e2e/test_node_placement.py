"""The rewrite looks at the nodes, through the real apiserver: the live webhook watches the Nodes.

The session's webhook runs with the default ``rewrite: auto`` and the session's canonical node
(``canonical_gpu_node``). A Node this test writes runs only the vendor device plugin; a pod pinned
to it by nodeSelector must be stored with ``nvidia.com/gpu`` as written (rewritten, no node it can
reach could take it), say why in the response's Warning header, and still count against its
ElasticQuota in canonical units. A pod without constraints can reach the canonical node and is
rewritten. Then the same with servers running as a ServiceAccount bound to the shipped ClusterRole
(it may list and watch nodes), and to the role before it (it may not: the node list never
completes, and requests are left as written, saying so).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from admissionchain import delete_webhook_configurations, local_webhook_configurations, register_webhook_configurations
from clusterhelpers import QUOTA_LABEL, admits_quota, create_quota, eventually
from controlplane import Api, GpuNodeFactory
from kubernetes import client as k8s
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


# -- the webhook under the project's own ClusterRole ----------------------------------------------
# The server runs as a ServiceAccount bound to manifests/base/rbac.yaml's gpuquota-webhook role
# (a token from the TokenRequest API in its kubeconfig), so what the role grants is what it gets.

RBAC = Path(__file__).resolve().parents[2] / "manifests" / "base" / "rbac.yaml"
IGNORE_LABEL = "gpuquota.koord-gpuquota.io/ignore"


def webhook_role() -> dict[str, Any]:
    documents = [doc for doc in yaml.safe_load_all(RBAC.read_text(encoding="utf-8")) if doc]
    role: dict[str, Any] = next(d for d in documents if d["kind"] == "ClusterRole"
                                and d["metadata"]["name"] == "gpuquota-webhook")
    return role


@contextlib.contextmanager
def served_as(api: Api, kubeconfig_path: Path, work: Path, role: dict[str, Any],
              namespace: str) -> Iterator[WebhookProcess]:
    """``gpuquota serve`` in live mode as a ServiceAccount holding ``role``, called for ``namespace`` only."""
    name = f"gpuquota-{namespace}"
    api.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac = k8s.RbacAuthorizationV1Api(api.core.api_client)
    rbac.create_cluster_role({**role, "metadata": {"name": name}})
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    token = api.core.create_namespaced_service_account_token(
        name, namespace, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                          "spec": {"audiences": [], "expirationSeconds": 3600}}).status.token
    kubeconfig = yaml.safe_load(kubeconfig_path.read_text(encoding="utf-8"))
    kubeconfig["users"] = [{"name": "admin", "user": {"token": token}}]
    (work / "kubeconfig").write_text(yaml.safe_dump(kubeconfig), encoding="utf-8")
    server = WebhookProcess(work / "webhook", serve_args=["--kubeconfig", str(work / "kubeconfig"), "--workers", "1"])
    documents = local_webhook_configurations(server.url, "", name_suffix=f"-{namespace}",
                                             namespace_selector={"matchLabels": {
                                                 "kubernetes.io/metadata.name": namespace}})
    try:
        server.start()
        for document in documents:
            for webhook in document["webhooks"]:
                webhook["clientConfig"]["caBundle"] = server.ca_bundle
        register_webhook_configurations(api, documents)
        yield server
    finally:
        delete_webhook_configurations(api, documents)
        server.stop()
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


@pytest.fixture
def isolated_namespace(api: Api) -> str:
    """A namespace the session's webhook skips (opt-out label), for a server of the test's own."""
    name = f"rbac-{uuid.uuid4().hex[:8]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={IGNORE_LABEL: "true"})))
    return name


def test_under_the_shipped_role_the_webhook_sees_the_nodes(
        api: Api, kubeconfig_path: Path, elasticquota_crd: object, canonical_gpu_node: str,
        vendor_only_node: tuple[str, str], isolated_namespace: str, tmp_path: Path) -> None:
    node, pool = vendor_only_node
    left = (f"gpuquota left nvidia.com/gpu as written: none of the 1 node(s) this pod can be scheduled on ({node}) "
            f"advertises {CORE}, {RATIO}")
    with served_as(api, kubeconfig_path, tmp_path, webhook_role(), isolated_namespace):
        eventually(lambda: left in create(api, isolated_namespace, gpu_pod("probe", nodeSelector={"pool": pool}),
                                          dry_run=True)[1], "the webhook, as its ServiceAccount, sees the nodes",
                   DEADLINE)
        stored, _ = create(api, isolated_namespace, gpu_pod("free"))

    assert stored["spec"]["containers"][0]["resources"]["requests"] == {CORE: "100", RATIO: "100"}


def test_before_the_nodes_are_listed_requests_are_left_as_written(
        api: Api, kubeconfig_path: Path, elasticquota_crd: object, canonical_gpu_node: str,
        isolated_namespace: str, tmp_path: Path) -> None:
    # The role of the version before the node view: pods and quotas, no nodes. The node list never
    # completes, so the webhook never learns what any node advertises.
    role = webhook_role()
    role["rules"] = [{**rule, "resources": [r for r in rule["resources"] if r != "nodes"]} for rule in role["rules"]]
    not_listed = (f"gpuquota left nvidia.com/gpu as written: the webhook has not listed the cluster's nodes yet, so "
                  f"it cannot tell whether a node this pod can reach advertises {CORE}, {RATIO}")
    with served_as(api, kubeconfig_path, tmp_path, role, isolated_namespace) as server:
        eventually(lambda: not_listed in create(api, isolated_namespace, gpu_pod("probe"), dry_run=True)[1],
                   "the apiserver calls the webhook for the namespace", DEADLINE)
        stored, warning = create(api, isolated_namespace, gpu_pod("free"))
        # What docs/deploy.md tells operators to look for.
        assert "quota sync of Node failed" in server.log_path.read_text(encoding="utf-8", errors="replace")

    assert not_listed in warning
    assert stored["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}
