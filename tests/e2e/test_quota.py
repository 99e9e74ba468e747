"""Live quota state against a real kube-apiserver: list, watch and decide."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clusterhelpers import eventually
from kubernetes import client as k8s

from gpuquota_core.pod_admission import PodAdmission
from gpuquota_core.quota_objects import ELASTICQUOTA_GROUP as EQ_GROUP
from gpuquota_core.quota_objects import ELASTICQUOTA_PLURAL as EQ_PLURAL
from gpuquota_core.quota_objects import ELASTICQUOTA_VERSION as EQ_VERSION
from kubeaccess.kube import connect
from webhook.admission.status import status_of
from webhook.quota.cluster_state import start_live_sync
from webhook.quota.state import QuotaState

RATIO = "koordinator.sh/gpu-memory-ratio"
LABEL = "quota.scheduling.koordinator.sh/name"


@pytest.fixture
def live_state(kubeconfig_path: Path, elasticquota_crd: Any) -> Iterator[QuotaState]:
    state = QuotaState()
    stop = start_live_sync(state, connect(str(kubeconfig_path), None))
    eventually(lambda: state.ready()[0], "first full sync")
    yield state
    stop.set()


def admission(namespace: str, name: str, quota: str, ratio: str) -> PodAdmission:
    return PodAdmission(uid="uid-" + name, operation="CREATE", namespace=namespace, name=name, pod_uid="",
                        labels={LABEL: quota}, canonical_requests={RATIO: ratio})


def test_watched_pod_counts_and_exact_denial(api: Any, live_state: QuotaState, namespace: str) -> None:
    quota_name = f"q-{namespace}"
    api.custom.create_namespaced_custom_object(EQ_GROUP, EQ_VERSION, namespace, EQ_PLURAL, {
        "apiVersion": f"{EQ_GROUP}/{EQ_VERSION}", "kind": "ElasticQuota",
        "metadata": {"name": quota_name, "namespace": namespace}, "spec": {"max": {RATIO: "200"}}})
    eventually(lambda: live_state.tree.get(quota_name) is not None, "quota in the watch")
    api.core.create_namespaced_pod(namespace, k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="running", labels={LABEL: quota_name}),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="x", resources=k8s.V1ResourceRequirements(
            requests={RATIO: "100"}, limits={RATIO: "100"}))])))
    eventually(lambda: live_state.usage.get(f"{namespace}/running") is not None, "pod in the watch")
    verdict = live_state.admit_pod(admission(namespace, "next", quota_name, "200"))
    assert not verdict.allowed and status_of(verdict.reason) == 403
    assert verdict.message == (f"exceeded quota: {namespace}/{quota_name}, requested: {RATIO}=200, "
                               f"used: {RATIO}=100, limited: {RATIO}=200")
    assert live_state.admit_pod(admission(namespace, "small", quota_name, "100")).allowed
