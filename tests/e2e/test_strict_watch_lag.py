"""Strict accounting through the real apiserver when one replica's pod watch lags behind the ledger.

Two replicas in this process share the ledger ConfigMap of one quota: the writer with a live list
and watch, the lagging one with a single list made before any pod existed (a replica paused, or
re-listing). The writer drops a pod's reservation once its own watch counts the pod; the lagging
replica must not decide on that ledger until its own list or watch has shown the pod, or it would
admit past the room. The resourceVersions compared are the apiserver's own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from clusterhelpers import QUOTA_LABEL, RATIO, create_quota, eventually
from controlplane import Api
from kubernetes.client import CoreV1Api

from gpuquota_core import shared_ledger
from gpuquota_core.pod_admission import PodAdmission, Verdict
from gpuquota_core.quantity import Quantity
from webhook.admission.status import status_of
from webhook.quota.cluster_state import list_into, lister_for, start_live_sync
from webhook.quota.state import KINDS, QuotaState
from webhook.quota.strict.accounting import StrictAccounting, strict_parts


@pytest.fixture
def writer_state(api: Api, elasticquota_crd: object) -> Iterator[QuotaState]:
    state = QuotaState()
    stop = start_live_sync(state, api.client)
    eventually(lambda: state.ready()[0], "the writer's first full sync")
    yield state
    stop.set()


def one_share_pod(name: str, quota: str) -> dict[str, Any]:
    gpu = {"koordinator.sh/gpu-core": "100", RATIO: "100"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {QUOTA_LABEL: quota}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/infer:1",
                                     "resources": {"requests": gpu, "limits": gpu}}]}}


def test_a_replica_whose_pod_watch_lags_waits_for_it_instead_of_admitting_past_the_room(
        api: Api, namespace: str, writer_state: QuotaState, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("webhook.quota.strict.committer.RETRY_BUDGET_SECONDS", 0.5)
    quota = f"team-{namespace}"
    create_quota(api, namespace, quota, {RATIO: "200"})  # room for two pods of 100
    eventually(lambda: quota in writer_state.tree.quotas, "the writer knows the quota")

    lagging_state = QuotaState()
    for kind in KINDS:  # one list, before any pod exists, and no watch after it
        list_into(lagging_state, lister_for(api.client, kind), kind)
    assert quota in lagging_state.tree.quotas

    skew = [0.0]  # the replicas' wall clock, moved past the settle time instead of waiting it out

    def clock() -> float:
        return time.time() + skew[0]

    def replica(state: QuotaState, name: str) -> StrictAccounting:
        return strict_parts(state, CoreV1Api(api.client), namespace, replica=name, clock=clock,
                            escrow_most_pods=0).accounting

    writer, lagging = replica(writer_state, "writer"), replica(lagging_state, "lagging")

    def admit(accounting: StrictAccounting, pod: str) -> Verdict:
        return accounting.admit_pod(PodAdmission(
            uid=f"adm-{pod}", operation="CREATE", namespace=namespace, name=pod, pod_uid="",
            labels={QUOTA_LABEL: quota}, canonical_requests={RATIO: "100"}))

    assert admit(writer, "p1").allowed
    created = api.core.create_namespaced_pod(namespace, one_share_pod("p1", quota))
    eventually(lambda: writer_state.usage.used(quota).get(RATIO) == Quantity.parse("100"),
               "the writer's watch counts p1")
    skew[0] += shared_ledger.DEFAULT_SETTLE_SECONDS
    assert admit(writer, "p2").allowed

    ledger = api.core.read_namespaced_config_map(shared_ledger.ledger_object_name(quota), namespace)
    assert set(shared_ledger.decode(ledger.data)) == {f"{namespace}/p2"}  # p1's reservation dropped ...
    # ... as of the resourceVersion the apiserver gave p1, which every deciding replica must reach.
    assert shared_ledger.pods_counted_through(ledger.data) == int(created.metadata.resource_version)

    refused = admit(lagging, "p3")
    assert not refused.allowed and status_of(refused.reason) == 503 and refused.reason == "LedgerUnavailable"
    assert "watch of pods has not caught up" in refused.message and created.metadata.resource_version in refused.message

    list_into(lagging_state, lister_for(api.client, "Pod"), "Pod")  # caught up: a fresh list shows p1
    refused = admit(lagging, "p3")
    assert not refused.allowed and refused.reason == "QuotaExceeded", refused.message  # p1 and p2 fill the room
