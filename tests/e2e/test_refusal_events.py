"""Events for refused pods, where people look: written by the live webhook into the real apiserver.

A refused pod is never stored, so the event goes on its controller (a ReplicaSet here: created as
an object, with no controller-manager to act on it), else on the ElasticQuota it resolves to, else
on its namespace. Repeated refusals update one Event's count instead of adding Events.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusterhelpers import DENIED_BY, RATIO, create_quota, eventually, refusal, wait_until_enforced, whole_card_pod
from controlplane import Api
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families
from reviews import review
from webhookproc import REPO_ROOT, WebhookProcess, post_review

from gpuquota_core.events import ObjectRef
from webhook.quota.event_recorder import EventKey, EventWrite
from webhook.quota.events import ApiEventSink, event_name

COMPONENT = "koord-gpuquota"
EVENT_DEADLINE = 20.0


def events_on(api: Api, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    """Our Events whose involvedObject is ``kind``/``name``, as kubectl's field selector finds them
    (the controller manager runs in the e2e control plane and reports on the same objects)."""
    response = api.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}",
        _preload_content=False)
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return [item for item in items if item.get("reportingComponent") == "koord-gpuquota"]


def wait_for_count(api: Api, namespace: str, kind: str, name: str, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def counted() -> bool:
        found[:] = events_on(api, namespace, kind, name)
        return sum(event.get("count") or 1 for event in found) >= count

    eventually(counted, f"{count} occurrence(s) of events on {kind} {namespace}/{name}", EVENT_DEADLINE)
    return found


def create_replicaset(api: Api, namespace: str, name: str) -> dict[str, Any]:
    """A ReplicaSet object whose pods (made by the test, as its controller would) name it as owner.

    No replicas: the e2e control plane runs the real ReplicaSet controller, which must not make
    pods of its own here."""
    labels = {"app": name}
    body = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "main", "image": "registry.example/train:1"}]}}}}
    response = k8s.AppsV1Api(api.client).create_namespaced_replica_set(namespace, body, _preload_content=False)
    created: dict[str, Any] = json.loads(response.data)
    return created


def owned_pod(owner: dict[str, Any], quota: str, cards: int) -> dict[str, Any]:
    """A pod as the ReplicaSet controller writes one: generated name, controller reference."""
    pod = whole_card_pod("unused", quota, cards)
    metadata = pod["metadata"]
    del metadata["name"]
    metadata["generateName"] = f"{owner['metadata']['name']}-"
    metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                    "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                    "controller": True, "blockOwnerDeletion": True}]
    return pod


@pytest.fixture
def one_card_quota(webhook_server: WebhookProcess, api: Api, namespace: str) -> str:
    quota = f"team-{namespace}"
    create_quota(api, namespace, quota, {RATIO: "100"})
    wait_until_enforced(api, namespace, quota, 2)  # dry-run probes: they must leave no event
    return quota


def kubectl_describe(kubeconfig_path: Path, namespace: str, kind: str, name: str) -> str:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is needed on PATH for the e2e suite"
    result = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig_path), "-n", namespace, "describe", kind, name],
                            capture_output=True, text=True, timeout=60, check=True)
    return result.stdout


def test_refusals_of_a_controllers_pods_are_one_event_on_the_controller_with_a_count(
        api: Api, namespace: str, one_card_quota: str, kubeconfig_path: Path) -> None:
    owner = create_replicaset(api, namespace, "trainer-7d9f")
    refusals = [refusal(api, namespace, owned_pod(owner, one_card_quota, 2)) for _ in range(4)]
    assert all(r is not None and r[0] == 403 for r in refusals), refusals
    status_message = refusals[0]
    assert status_message is not None

    (event,) = wait_for_count(api, namespace, "ReplicaSet", "trainer-7d9f", 4)

    assert event["count"] == 4
    assert event["type"] == "Warning"
    assert event["reason"] == "GPUQuotaExceeded"
    assert event["message"] == "pod refused: " + status_message[1].removeprefix(DENIED_BY)
    assert event["involvedObject"] == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-7d9f",
                                       "namespace": namespace, "uid": owner["metadata"]["uid"]}
    assert event["source"]["component"] == COMPONENT
    assert event["reportingComponent"] == COMPONENT
    assert event["reportingInstance"]
    assert event["firstTimestamp"] <= event["lastTimestamp"]
    # The dry-run probes of the fixture wrote nothing: sideEffects NoneOnDryRun.
    quota_events = events_on(api, namespace, "ElasticQuota", one_card_quota)
    assert quota_events == []

    # Where the docs say to look.
    described = kubectl_describe(kubeconfig_path, namespace, "replicaset", "trainer-7d9f")
    assert re.search(r"Warning\s+GPUQuotaExceeded\s+.*\(x4 over .*\)\s+koord-gpuquota\s+pod refused: ", described), \
        described
    for selector in ("reason=GPUQuotaExceeded", "reportingComponent=koord-gpuquota", "type=Warning"):
        selected = api.core.list_namespaced_event(namespace, field_selector=selector).items
        assert [e.involved_object.name for e in selected] == ["trainer-7d9f"], selector

    # Later refusals keep adding to the same Event; a different message is an Event of its own.
    assert refusal(api, namespace, owned_pod(owner, one_card_quota, 2)) is not None
    assert refusal(api, namespace, owned_pod(owner, one_card_quota, 3)) is not None
    events = wait_for_count(api, namespace, "ReplicaSet", "trainer-7d9f", 6)
    assert sorted((e["count"], f"{RATIO}=300" in e["message"]) for e in events) == [(1, True), (5, False)]


def test_an_ownerless_pod_reports_on_its_elasticquota(api: Api, namespace: str, one_card_quota: str) -> None:
    quota = api.custom.get_namespaced_custom_object("scheduling.sigs.k8s.io", "v1alpha1", namespace,
                                                    "elasticquotas", one_card_quota)
    for name in ("alone-a", "alone-b"):
        assert refusal(api, namespace, whole_card_pod(name, one_card_quota, 2)) is not None

    (event,) = wait_for_count(api, namespace, "ElasticQuota", one_card_quota, 2)

    assert event["count"] == 2
    assert event["reason"] == "GPUQuotaExceeded"
    assert event["involvedObject"] == {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                                       "name": one_card_quota, "namespace": namespace,
                                       "uid": quota["metadata"]["uid"]}


def test_a_pod_naming_a_missing_quota_reports_on_its_namespace(api: Api, namespace: str,
                                                               one_card_quota: str) -> None:
    pod = whole_card_pod("unused", "no-such-quota", 1)
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "lost-"
    for _ in range(3):
        assert refusal(api, namespace, pod) is not None

    (event,) = wait_for_count(api, namespace, "Namespace", namespace, 3)

    assert event["count"] == 3
    assert event["reason"] == "GPUQuotaNotFound"
    # Each pod got its own generated name; the event names them by their common prefix.
    assert f"pod {namespace}/lost-* names ElasticQuota 'no-such-quota'" in event["message"]


# -- warn: the pod is admitted, and the event says what enforce would have refused -----------------

@pytest.fixture
def warn_server(api: Api, kubeconfig_path: Path, tmp_path: Path) -> Iterator[WebhookProcess]:
    """A second live server with QuotaExceeded in warn mode, sent reviews directly (not registered)."""
    config = tmp_path / "config.yaml"
    config.write_text("enforcement:\n  checks:\n    QuotaExceeded: warn\n", encoding="utf-8")
    server = WebhookProcess(tmp_path / "warn", serve_args=["--kubeconfig", str(kubeconfig_path), "--workers", "2",
                                                           "--config", str(config)])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_warn_mode_reports_a_would_deny_event(api: Api, namespace: str, warn_server: WebhookProcess,
                                              elasticquota_crd: object) -> None:
    quota = f"warned-{namespace}"
    create_quota(api, namespace, quota, {RATIO: "100"})
    owner = create_replicaset(api, namespace, "warned")
    pod = owned_pod(owner, quota, 2)
    pod["metadata"].update(name=f"warned-{uuid.uuid4().hex[:5]}", namespace=namespace)

    def warns(dry_run: bool) -> bool:
        response = post_review(warn_server, "/validate-pods", review(pod, dry_run=dry_run))
        assert response["allowed"] is True
        return any("would deny (QuotaExceeded" in w for w in response.get("warnings") or ())

    eventually(lambda: warns(dry_run=True), "the warn server sees the quota")
    assert warns(dry_run=False)

    (event,) = wait_for_count(api, namespace, "ReplicaSet", "warned", 1)

    assert event["reason"] == "WouldDenyGPUQuotaExceeded"
    assert event["type"] == "Warning"
    assert event["message"].startswith("pod admitted, enforcement warn (would deny): exceeded quota: "
                                       f"{namespace}/{quota}, requested: {RATIO}=200")
    assert event["count"] == 1
    status, text = warn_server.get("/metrics")
    assert status == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text.decode()) for s in family.samples}
    assert samples[("gpuquota_events_total",
                    (("reason", "WouldDenyGPUQuotaExceeded"), ("result", "created")))] == 1
    assert ("gpuquota_events_dropped_total", ()) in samples


@pytest.fixture
def webhook_role_user(api: Api, kubeconfig_path: Path) -> Iterator[k8s.ApiClient]:
    """A client acting as a user bound to the manifests' gpuquota-webhook ClusterRole, nothing more."""
    documents = yaml.safe_load_all((REPO_ROOT / "manifests/base/rbac.yaml").read_text(encoding="utf-8"))
    role = next(d for d in documents
                if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpuquota-webhook")
    name = f"gpuquota-webhook-events-{uuid.uuid4().hex[:6]}"
    role["metadata"] = {"name": name}
    rbac = k8s.RbacAuthorizationV1Api(api.client)
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}]})
    user = k8s_config.new_client_from_config(config_file=str(kubeconfig_path))
    user.set_default_header("Impersonate-User", name)
    try:
        yield user
    finally:
        user.close()
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def test_the_writer_needs_only_what_the_manifests_grant_and_survives_a_restart(
        api: Api, namespace: str, webhook_role_user: k8s.ApiClient) -> None:
    """ApiEventSink as the webhook's service account would run it: create, update, after a restart
    (a fresh sink knowing nothing) the same Event again, and a writer whose copy went stale."""
    target = ObjectRef("apps/v1", "ReplicaSet", "restarted", namespace, "uid-1")
    key = EventKey(target, "GPUQuotaExceeded", "pod refused: over")

    def write(sink: ApiEventSink, count: int, at: float) -> str:
        return sink.write(EventWrite(key, "pod refused: over", count, at, at))

    first = ApiEventSink(webhook_role_user, "replica-a")
    assert write(first, 2, 1_700_000_000.0) == "created"
    assert write(first, 1, 1_700_000_060.0) == "updated"
    after_restart = ApiEventSink(webhook_role_user, "replica-b")
    assert write(after_restart, 4, 1_700_000_120.0) == "updated"

    # The first writer's resourceVersion is stale now (as for two replicas): it re-reads, never overwrites.
    assert write(first, 1, 1_700_000_120.0) == "updated"

    (event,) = events_on(api, namespace, "ReplicaSet", "restarted")
    assert event["count"] == 8
    assert event["metadata"]["name"] == event_name(key)
    assert (event["firstTimestamp"], event["lastTimestamp"]) == ("2023-11-14T22:13:20Z", "2023-11-14T22:15:20Z")
    assert event["reportingInstance"] == "replica-a"
    # And nothing beyond events: the role cannot, say, delete them.
    with pytest.raises(ApiException) as refused:
        k8s.CoreV1Api(webhook_role_user).delete_namespaced_event(event_name(key), namespace)
    assert refused.value.status == 403
