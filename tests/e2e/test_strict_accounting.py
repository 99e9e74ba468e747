"""Strict accounting against a real apiserver: three replicas' states, one shared ledger object.

Each replica is a QuotaState with its own client, list+watch and StrictAccounting, as in three
quota service processes; the HAProxy test (test_replicas.py) runs the same through three real
webhook servers. Here the admissions are asked directly, so the numbers are exact and fast.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from clusterhelpers import PARENT_LABEL, QUOTA_LABEL, RATIO, create_quota, eventually
from controlplane import Api
from kubernetes.client import CoreV1Api

from gpuquota_core import shared_ledger
from gpuquota_core.pod_admission import PodAdmission
from kubeaccess.kube import connect
from webhook.admission.status import status_of
from webhook.quota.cluster_state import start_live_sync
from webhook.quota.state import QuotaState
from webhook.quota.strict.accounting import StrictAccounting, strict_parts


@dataclass
class Replica:
    state: QuotaState
    accounting: StrictAccounting  # no writer Lease here: each replica decides its own admissions, degraded
    stop: threading.Event


@dataclass
class World:
    namespace: str
    org: str
    leaves: tuple[str, str]
    replicas: list[Replica]
    clock: list[float]


@pytest.fixture
def world(api: Api, namespace: str, kubeconfig_path: Path, elasticquota_crd: object) -> Iterator[World]:
    # Room for 50 pods of one card in the parent; each leaf alone could take 40.
    org, leaves = f"org-{namespace}", (f"a-{namespace}", f"b-{namespace}")
    create_quota(api, namespace, org, {RATIO: "5000"})
    for leaf in leaves:
        create_quota(api, namespace, leaf, {RATIO: "4000"}, labels={PARENT_LABEL: org})
    clock = [time.time()]
    replicas = []
    for index in range(3):
        client = connect(str(kubeconfig_path), None)
        state = QuotaState()
        stop = start_live_sync(state, client)
        accounting = strict_parts(state, CoreV1Api(client), namespace, replica=f"replica-{index}",
                                  clock=lambda: clock[0]).accounting
        replicas.append(Replica(state, accounting, stop))
    for replica in replicas:
        eventually(lambda r=replica: r.state.ready()[0] and all(q in r.state.tree.quotas for q in (org, *leaves)),
                   "replica synced with the quota tree")
    yield World(namespace, org, leaves, replicas, clock)
    for replica in replicas:
        replica.stop.set()


def admission(world: World, name: str, leaf: str, ratio: str = "100", dry_run: bool = False) -> PodAdmission:
    return PodAdmission(uid="adm-" + name, operation="CREATE", namespace=world.namespace, name=name,
                        pod_uid="uid-" + name, labels={QUOTA_LABEL: leaf}, canonical_requests={RATIO: ratio},
                        dry_run=dry_run)


def stored_reservations(api: Api, world: World) -> dict[str, shared_ledger.StoredReservation]:
    config_map = api.core.read_namespaced_config_map(shared_ledger.ledger_object_name(world.org), world.namespace)
    return shared_ledger.decode(config_map.data)


def test_burst_over_three_replicas_admits_exactly_the_room(api: Api, world: World) -> None:
    def ask(index: int) -> bool:
        replica = world.replicas[index % 3]
        leaf = world.leaves[index % 2]
        return replica.accounting.admit_pod(admission(world, f"p{index}", leaf)).allowed

    with ThreadPoolExecutor(max_workers=30) as pool:
        results = list(pool.map(ask, range(200)))
    assert results.count(True) == 50
    # What was admitted is exactly what the shared object records (which replica won how much
    # of the room depends on how the batches fell).
    admitted = {f"{world.namespace}/p{index}" for index, allowed in enumerate(results) if allowed}
    assert set(stored_reservations(api, world)) == admitted
    # Labelled with its whole tree root, which is how the reconciler finds the object again.
    ledger = api.core.read_namespaced_config_map(shared_ledger.ledger_object_name(world.org), world.namespace)
    assert ledger.metadata.labels == {"app.kubernetes.io/managed-by": "koord-gpuquota",
                                      "gpuquota.koord-gpuquota.io/quota-tree": world.org}
    # Every replica now refuses, with the parent named: the room is gone for all of them.
    for number, replica in enumerate(world.replicas):
        verdict = replica.accounting.admit_pod(admission(world, f"late-{number}", world.leaves[0]))
        assert not verdict.allowed and status_of(verdict.reason) == 403
        assert verdict.message.startswith(f"exceeded quota: {world.namespace}/{world.org}, ")


def test_dry_run_never_writes_and_expired_reservations_are_released(api: Api, world: World) -> None:
    accounting = world.replicas[0].accounting
    assert accounting.admit_pod(admission(world, "dry", world.leaves[0], ratio="4000", dry_run=True)).allowed
    with pytest.raises(Exception, match="Not Found"):
        stored_reservations(api, world)
    assert accounting.admit_pod(admission(world, "ghost", world.leaves[0], ratio="4000")).allowed
    assert not world.replicas[1].accounting.admit_pod(admission(world, "x", world.leaves[1], ratio="2000")).allowed
    # "ghost" is never created (a later webhook refused it): once its TTL is over the next write drops it.
    world.clock[0] += 31
    assert world.replicas[2].accounting.admit_pod(admission(world, "real", world.leaves[1], ratio="2000")).allowed
    assert set(stored_reservations(api, world)) == {f"{world.namespace}/real"}


def test_ledger_that_cannot_be_written_refuses_instead_of_admitting(kubeconfig_path: Path, world: World) -> None:
    state = world.replicas[0].state
    broken = strict_parts(state, CoreV1Api(connect(str(kubeconfig_path), None)), "no-such-namespace").accounting
    verdict = broken.admit_pod(admission(world, "p", world.leaves[0]))
    assert not verdict.allowed and status_of(verdict.reason) == 503 and verdict.reason == "LedgerUnavailable"
    assert "cannot write ConfigMap no-such-namespace/gpuquota-ledger-" in verdict.message
