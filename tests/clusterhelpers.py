"""Objects and waits the e2e tests share (not a test module).

Quota names are one cluster-wide tree in Koordinator, so tests put the namespace into them.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from controlplane import ELASTICQUOTA_GROUP, ELASTICQUOTA_PLURAL, ELASTICQUOTA_VERSION, Api
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from reviews import body, pod, review
from webhookproc import WebhookProcess

RATIO = "koordinator.sh/gpu-memory-ratio"
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
PARENT_LABEL = "quota.scheduling.koordinator.sh/parent"
POLL_SECONDS = 0.05
# What the apiserver puts before the webhook's own message when it refuses a request.
DENIED_BY = 'admission webhook "gpu-quota.gpuquota.koord-gpuquota.io" denied the request: '


def eventually(condition: Callable[[], bool], what: str, deadline: float = 20.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"not true after {deadline:.0f}s: {what}"
        time.sleep(POLL_SECONDS)  # polling a condition with a deadline


def create_quota(api: Api, namespace: str, name: str, max_: Mapping[str, str], *,
                 min_: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None) -> None:
    api.custom.create_namespaced_custom_object(ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace,
                                               ELASTICQUOTA_PLURAL, {
        "apiVersion": f"{ELASTICQUOTA_GROUP}/{ELASTICQUOTA_VERSION}", "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {"max": dict(max_), "min": dict(min_ or {})}})


def read_quota(api: Api, namespace: str, name: str) -> dict[str, Any]:
    quota: dict[str, Any] = api.custom.get_namespaced_custom_object(
        ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace, ELASTICQUOTA_PLURAL, name)
    return quota


def whole_card_pod(name: str, quota: str, cards: int = 1) -> dict[str, Any]:
    """A pod asking ``cards`` whole cards as nvidia.com/gpu, bound to ``quota`` by label."""
    gpu = {"nvidia.com/gpu": str(cards)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {QUOTA_LABEL: quota}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/train:1",
                                     "resources": {"requests": gpu, "limits": gpu}}]}}


def admits_quota(server: WebhookProcess, namespace: str, quota: str) -> bool:
    """Whether ``server``'s cache knows ``quota``: a dry-run review straight to it, reserving nothing."""
    document = review(pod("probe", namespace, labels={QUOTA_LABEL: quota}, resources={RATIO: "1"}), dry_run=True)
    request = urllib.request.Request(server.url + "/validate-pods", data=body(document),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5, context=server.ssl_context()) as response:
        return bool(json.loads(response.read())["response"]["allowed"])


def refusal(api: Api, namespace: str, pod: dict[str, Any], dry_run: str | None = None) -> tuple[int, str] | None:
    """The status and apiserver message that refuse creating ``pod``, or None when it is admitted."""
    try:
        api.core.create_namespaced_pod(namespace, pod, dry_run=dry_run)
    except ApiException as error:
        return error.status, json.loads(error.body)["message"]
    return None


def wait_until_enforced(api: Api, namespace: str, quota: str, cards: int, deadline: float = 20.0) -> None:
    """Poll with dry-run creates of a ``cards``-card pod (nothing reserved, no event) until one is
    refused: the webhook's watch has ``quota``."""
    eventually(lambda: refusal(api, namespace, whole_card_pod("probe", quota, cards), dry_run="All") is not None,
               f"quota {quota} enforced", deadline)


def refusal_reason(error: ApiException) -> str:
    """Why the apiserver refused a create, in a few words: the webhook's reason when its message names a known one
    (an outage of ours, or the apiserver's webhook call timing out), else the Status reason."""
    try:
        status = json.loads(error.body)
    except (TypeError, ValueError):
        return str(error.reason)
    message = str(status.get("message", ""))
    for known in ("LedgerUnavailable", "NotReady", "QuotaServiceDown", "context deadline exceeded", "timeout"):
        if known in message:
            return known
    return str(status.get("reason", "")) or message[:60]


# -- pods the controllers create and a scheduler binds ---------------------------------------

# Controller manager and scheduler each react within a second here; the margin is for a loaded
# 2-core CI machine running the webhook and the apiserver as well.
SCHEDULING_DEADLINE = 60.0
SCHEDULING_POLL_SECONDS = 0.2


def pods_of(api: Api, namespace: str, app: str) -> list[k8s.V1Pod]:
    return list(api.core.list_namespaced_pod(namespace, label_selector=f"app={app}").items)


def scheduling_state(pod: k8s.V1Pod) -> str:
    """Where ``pod`` is bound, or the scheduler's reason for not binding it (PodScheduled)."""
    if pod.spec.node_name:
        return f"{pod.metadata.name}: bound to {pod.spec.node_name}"
    conditions = {c.type: c for c in (pod.status.conditions or [])}
    scheduled = conditions.get("PodScheduled")
    if scheduled is None:
        return f"{pod.metadata.name}: Pending, not yet seen by the scheduler"
    return f"{pod.metadata.name}: Pending, {scheduled.reason}: {scheduled.message}"


def wait_until_bound(api: Api, namespace: str, app: str, count: int) -> list[k8s.V1Pod]:
    """The ``count`` pods of ``app`` once all exist and are bound; on timeout, why they are not."""
    deadline = time.monotonic() + SCHEDULING_DEADLINE
    while True:
        pods = pods_of(api, namespace, app)
        if len(pods) == count and all(pod.spec.node_name for pod in pods):
            return pods
        if time.monotonic() >= deadline:
            states = "; ".join(scheduling_state(pod) for pod in pods) or "no pods"
            raise AssertionError(f"{app}: expected {count} bound pods after {SCHEDULING_DEADLINE:.0f}s, have {states}")
        time.sleep(SCHEDULING_POLL_SECONDS)  # polling a condition with a deadline


def wait_until_unschedulable(api: Api, namespace: str, app: str) -> k8s.V1PodCondition:
    """The PodScheduled condition of ``app``'s single pod once the scheduler has given up on it."""
    deadline = time.monotonic() + SCHEDULING_DEADLINE
    while True:
        pods = pods_of(api, namespace, app)
        if len(pods) == 1:
            assert not pods[0].spec.node_name, scheduling_state(pods[0])
            conditions = {c.type: c for c in (pods[0].status.conditions or [])}
            scheduled = conditions.get("PodScheduled")
            if scheduled is not None and scheduled.status == "False":
                return scheduled
        assert time.monotonic() < deadline, (
            f"{app}: no unschedulable pod after {SCHEDULING_DEADLINE:.0f}s: "
            f"{'; '.join(scheduling_state(pod) for pod in pods) or 'no pods'}")
        time.sleep(SCHEDULING_POLL_SECONDS)  # polling a condition with a deadline
