"""Deployments through the webhook, a real kube-controller-manager and a real kube-scheduler.

Three Nodes stand for the layouts a Koordinator cluster mixes: one that runs only the NVIDIA
device plugin (``nvidia.com/gpu``), one that advertises only Koordinator's names, and one that
advertises both. The controller manager turns each Deployment into a ReplicaSet and pods, every
pod goes through the webhook as the ReplicaSet controller creates it, and the scheduler binds it
(``spec.nodeName``) only where the stored request fits. Nothing here starts a container: there is
no kubelet.

The session's other tests leave pending pods behind, and the scheduler would bind any of them that
fits these Nodes. So each test's Nodes carry a NoSchedule taint naming its namespace, and its pods
tolerate exactly that taint: the toleration widens where a pod may go, it constrains nothing.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from clusterhelpers import (
    QUOTA_LABEL,
    RATIO,
    create_quota,
    pods_of,
    scheduling_state,
    wait_until_bound,
    wait_until_unschedulable,
)
from controlplane import Api, GpuNodeFactory
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from webhookproc import WebhookProcess

from gpuquota_core.canonical import ORIGINAL_RESOURCES_ANNOTATION

GPU = "nvidia.com/gpu"
CORE = "koordinator.sh/gpu-core"
MEMORY = "koordinator.sh/gpu-memory"
CANONICAL_ONE = {CORE: "100", RATIO: "100"}
TAINT_KEY = "e2e.gpuquota.koord-gpuquota.io/scheduling"
HOSTNAME = "kubernetes.io/hostname"
DENIED_BY = 'admission webhook "gpu-quota.gpuquota.koord-gpuquota.io" denied the request: '
# Controller manager and scheduler each react within a second here; the margin is for a loaded
# 2-core CI machine running the webhook and the apiserver as well.
DEADLINE = 60.0
POLL_SECONDS = 0.2
# Node-aware rewriting decides from the webhook's watch of Nodes; a probe must pass this many times
# in a row, so that it is not one lucky worker that has seen the new Nodes.
PROBE_STREAK = 3


@dataclass(frozen=True)
class Cluster:
    namespace: str
    vendor_only: str
    canonical_only: str
    both: str
    toleration: dict[str, str]

    @property
    def canonical(self) -> set[str]:
        return {self.canonical_only, self.both}


def wait_until_webhook_rewrites_for(api: Api, cluster: Cluster, node: str) -> None:
    """Poll with dry-run pods pinned to ``node`` until the webhook rewrites them.

    A webhook that looks at Nodes rewrites such a pod only once its watch has seen ``node``
    advertise the canonical names; Nodes arrive in the order they were created, so the last one
    created stands for all of them.
    """
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "node-probe"},
             "spec": {"nodeSelector": {HOSTNAME: node}, "tolerations": [cluster.toleration],
                      "containers": [{"name": "main", "image": "registry.example/probe:1",
                                      "resources": {"limits": {GPU: "1"}}}]}}
    deadline = time.monotonic() + DEADLINE
    streak = 0
    while streak < PROBE_STREAK:
        answer = api.core.create_namespaced_pod(cluster.namespace, probe, dry_run="All")
        streak = streak + 1 if CORE in (answer.spec.containers[0].resources.requests or {}) else 0
        assert time.monotonic() < deadline, f"the webhook did not rewrite a pod pinned to {node} in {DEADLINE:.0f}s"
        if streak < PROBE_STREAK:
            time.sleep(POLL_SECONDS)  # polling a condition with a deadline


@pytest.fixture
def cluster(webhook_server: WebhookProcess, api: Api, namespace: str, gpu_node: GpuNodeFactory) -> Cluster:
    taint = {"key": TAINT_KEY, "value": namespace, "effect": "NoSchedule"}
    toleration = {"key": TAINT_KEY, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}
    names = Cluster(namespace, f"vendor-only-{namespace}", f"canonical-only-{namespace}", f"both-{namespace}",
                    toleration)
    room = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    koordinator = {CORE: "400", RATIO: "400", MEMORY: "320Gi"}
    gpu_node(names.vendor_only, {**room, GPU: "4"}, taints=[taint])
    gpu_node(names.both, {**room, GPU: "4", **koordinator}, taints=[taint])
    gpu_node(names.canonical_only, {**room, **koordinator}, taints=[taint])
    wait_until_webhook_rewrites_for(api, names, names.canonical_only)
    return names


@pytest.fixture
def apps(api: Api, namespace: str) -> Iterator[k8s.AppsV1Api]:
    """The apps API; the test's Deployments are deleted afterwards so their controllers stop retrying."""
    handle = k8s.AppsV1Api(api.client)
    yield handle
    handle.delete_collection_namespaced_deployment(namespace)


def deployment(name: str, cluster: Cluster, requests: Mapping[str, str], limits: Mapping[str, str], *,
               replicas: int = 1, quota: str | None = None,
               node_selector: Mapping[str, str] | None = None) -> dict[str, Any]:
    labels = {"app": name, **({QUOTA_LABEL: quota} if quota else {})}
    spec: dict[str, Any] = {
        "tolerations": [cluster.toleration],
        "containers": [{"name": "main", "image": "registry.example/train:1",
                        "resources": {"requests": dict(requests), "limits": dict(limits)}}],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}


def resources_of(pod: k8s.V1Pod) -> tuple[dict[str, str], dict[str, str]]:
    resources = pod.spec.containers[0].resources
    return dict(resources.requests or {}), dict(resources.limits or {})


def refusal(api: Api, namespace: str, pod: dict[str, Any]) -> tuple[int, str] | None:
    try:
        api.core.create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as error:
        return error.status, json.loads(error.body)["message"]
    return None


def wait_until_enforced(api: Api, cluster: Cluster, quota: str) -> None:
    """Poll (dry run: nothing reserved) until the webhook's watch has seen ``quota``.

    Until then a pod naming it is refused as naming no quota; after, a 3-card pod exceeds every
    quota here (at most two cards) while still fitting a Node, so nothing else refuses it first.
    """
    template = deployment("probe", cluster, {}, {GPU: "3"}, quota=quota)["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "quota-probe", **template["metadata"]},
           "spec": template["spec"]}
    deadline = time.monotonic() + DEADLINE
    while True:
        _, message = refusal(api, cluster.namespace, pod) or (0, "admitted")
        if message.startswith(DENIED_BY + f"exceeded quota: {cluster.namespace}/{quota},"):
            return
        assert time.monotonic() < deadline, f"quota {quota} not enforced after {DEADLINE:.0f}s: {message}"
        time.sleep(POLL_SECONDS)  # polling a condition with a deadline


def test_unconstrained_whole_card_deployment_is_rewritten_and_bound_to_canonical_nodes(
        api: Api, apps: k8s.AppsV1Api, cluster: Cluster) -> None:
    apps.create_namespaced_deployment(cluster.namespace, deployment("train", cluster, {GPU: "1"}, {GPU: "1"},
                                                                    replicas=2))

    pods = wait_until_bound(api, cluster.namespace, "train", 2)

    for pod in pods:
        assert resources_of(pod) == (CANONICAL_ONE, CANONICAL_ONE)
        assert ORIGINAL_RESOURCES_ANNOTATION in pod.metadata.annotations
        # Only a Node advertising the canonical names can take the rewritten request.
        assert pod.spec.node_name in cluster.canonical, scheduling_state(pod)


def test_deployment_pinned_to_a_vendor_only_node_is_left_as_written_bound_there_and_counted(
        api: Api, apps: k8s.AppsV1Api, cluster: Cluster) -> None:
    quota = f"pinned-{cluster.namespace}"
    create_quota(api, cluster.namespace, quota, {RATIO: "100"})
    wait_until_enforced(api, cluster, quota)
    pinned = deployment("legacy", cluster, {GPU: "1"}, {GPU: "1"}, quota=quota,
                        node_selector={HOSTNAME: cluster.vendor_only})
    apps.create_namespaced_deployment(cluster.namespace, pinned)

    (pod,) = wait_until_bound(api, cluster.namespace, "legacy", 1)

    assert pod.spec.node_name == cluster.vendor_only
    # Rewritten, it would ask for names no Node it can reach advertises, and never be bound.
    assert resources_of(pod) == ({GPU: "1"}, {GPU: "1"})
    assert ORIGINAL_RESOURCES_ANNOTATION not in (pod.metadata.annotations or {})
    # Still counted in canonical units: one card used of the quota's one.
    one_more = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "one-more", "labels": {QUOTA_LABEL: quota}},
                "spec": pinned["spec"]["template"]["spec"]}
    status, message = refusal(api, cluster.namespace, one_more) or (0, "admitted")
    assert status == 403
    assert message.startswith(DENIED_BY + f"exceeded quota: {cluster.namespace}/{quota}, requested: ")
    assert f"used: {RATIO}=100, limited: {RATIO}=100" in message


def test_deployment_scaled_past_its_quota_creates_exactly_the_room(
        api: Api, apps: k8s.AppsV1Api, cluster: Cluster) -> None:
    quota = f"team-{cluster.namespace}"
    create_quota(api, cluster.namespace, quota, {RATIO: "200"})
    wait_until_enforced(api, cluster, quota)
    apps.create_namespaced_deployment(cluster.namespace, deployment("serve", cluster, {GPU: "1"}, {GPU: "1"},
                                                                    quota=quota))
    wait_until_bound(api, cluster.namespace, "serve", 1)

    apps.patch_namespaced_deployment_scale("serve", cluster.namespace, {"spec": {"replicas": 4}})

    (replica_set,) = apps.list_namespaced_replica_set(cluster.namespace, label_selector="app=serve").items
    expected = "Error creating: " + DENIED_BY + f"exceeded quota: {cluster.namespace}/{quota}, requested: "
    deadline = time.monotonic() + DEADLINE
    while True:
        events = api.core.list_namespaced_event(
            cluster.namespace, field_selector=f"involvedObject.name={replica_set.metadata.name},reason=FailedCreate")
        messages = [event.message for event in events.items]
        if messages:
            break
        assert time.monotonic() < deadline, f"no FailedCreate event for {replica_set.metadata.name}"
        time.sleep(POLL_SECONDS)  # polling a condition with a deadline
    assert all(message.startswith(expected) for message in messages), messages
    assert all(f"limited: {RATIO}=200" in message for message in messages), messages

    # The ReplicaSet keeps asking; the room (two cards) is all it ever gets, and both are bound.
    pods = wait_until_bound(api, cluster.namespace, "serve", 2)
    assert {pod.spec.node_name for pod in pods} <= cluster.canonical
    replica_set = apps.read_namespaced_replica_set(replica_set.metadata.name, cluster.namespace)
    failure = {c.type: c for c in (replica_set.status.conditions or [])}.get("ReplicaFailure")
    assert failure is not None and failure.reason == "FailedCreate"
    assert failure.message.startswith(expected.removeprefix("Error creating: "))
    assert replica_set.spec.replicas == 4
    assert len(pods_of(api, cluster.namespace, "serve")) == 2


def test_cpu_only_deployment_with_a_zero_gpu_request_is_scheduled_untouched(
        api: Api, apps: k8s.AppsV1Api, cluster: Cluster) -> None:
    requests, limits = {"cpu": "500m", GPU: "0"}, {"cpu": "500m", GPU: "0"}
    apps.create_namespaced_deployment(cluster.namespace, deployment("web", cluster, requests, limits))

    (pod,) = wait_until_bound(api, cluster.namespace, "web", 1)

    assert resources_of(pod) == (requests, limits)
    assert ORIGINAL_RESOURCES_ANNOTATION not in (pod.metadata.annotations or {})
    assert pod.spec.node_name in {cluster.vendor_only, cluster.canonical_only, cluster.both}


def test_canonical_request_pinned_to_a_vendor_only_node_stays_pending_and_the_scheduler_says_why(
        api: Api, apps: k8s.AppsV1Api, cluster: Cluster) -> None:
    # What a blind rewrite does to a pinned pod: the scheduler finds no Node that has the names.
    apps.create_namespaced_deployment(cluster.namespace, deployment(
        "stranded", cluster, CANONICAL_ONE, CANONICAL_ONE, node_selector={HOSTNAME: cluster.vendor_only}))

    scheduled = wait_until_unschedulable(api, cluster.namespace, "stranded")

    assert scheduled.reason == "Unschedulable"
    assert "1 Insufficient koordinator.sh/gpu-core" in scheduled.message
    assert "1 Insufficient koordinator.sh/gpu-memory-ratio" in scheduled.message
    # Every other Node of the shared control plane (the session's own, those of this test) fails
    # the selector.
    listed = re.match(r"0/(\d+) nodes are available", scheduled.message)
    assert listed is not None, scheduled.message
    assert f"{int(listed[1]) - 1} node(s) didn't match Pod's node affinity/selector" in scheduled.message
