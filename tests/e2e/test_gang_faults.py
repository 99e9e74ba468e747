"""Gangs across the shipped shape's replicas while the ledger's writer dies: still one gang whole.

Three strict replicas with the writer Lease behind HAProxy. Two gangs of eight one-card pods race
into room for ten, each create retried as a controller retries it (the webhook's retryable 503s, and
the apiserver's failed calls while a replica goes away), and the writer is SIGKILLed in the middle.
The gang reservation lives in the shared ledger, so whoever decides after the writer (a forwarder
deciding itself, then the next holder) reads it: one gang is stored whole, no member of the other,
and nothing is stored past the room.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from clusterhelpers import QUOTA_LABEL, RATIO, admits_quota, create_quota, eventually
from controlplane import LOOPBACK, Api
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from webhookproc import WebhookProcess

from gpuquota_core.gang import GANG_MIN_ANNOTATION, GANG_NAME_ANNOTATION
from tests.e2e.test_replicas import IGNORE_LABEL, TEST_LABEL, Replicas, started_replicas

MEMBERS = 8
ROOM_CARDS = 10
DEADLINE = 60.0
WRITER_LEASE = "gang-ledger-writer"


@pytest.fixture
def shipped_replicas(api: Api, kubeconfig_path: Path, elasticquota_crd: object, canonical_gpu_node: str,
                     tmp_path: Path) -> Iterator[Replicas]:
    with started_replicas(api, kubeconfig_path, tmp_path, "--writer-lease", WRITER_LEASE, "--peer-address", LOOPBACK,
                          "--peer-port", "0") as started:
        eventually(lambda: holder(api, started) is not None, "one replica holds the writer Lease", DEADLINE)
        yield started


def holder(api: Api, replicas: Replicas) -> WebhookProcess | None:
    """The replica whose quota service holds the writer Lease (its identity is the host and the master)."""
    try:
        lease = k8s.CoordinationV1Api(api.core.api_client).read_namespaced_lease(WRITER_LEASE,
                                                                                 replicas.ledger_namespace)
    except ApiException:
        return None
    for server in replicas.servers:
        if server.alive() and lease.spec.holder_identity == f"{socket.gethostname()}/{server.pid}":
            return server
    return None


def member(name: str, gang: str, quota: str) -> dict[str, object]:
    gpu = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {QUOTA_LABEL: quota, "app": gang},
                         "annotations": {GANG_NAME_ANNOTATION: gang, GANG_MIN_ANNOTATION: str(MEMBERS)}},
            "spec": {"containers": [{"name": "worker", "image": "registry.example/train:1",
                                     "resources": {"requests": gpu, "limits": gpu}}]}}


def create_as_a_controller_would(api: Api, namespace: str, pod: dict[str, object]) -> str:
    """"" once stored; the message of a refusal for the quota; any other failure (a retryable 503 of
    the webhook, the apiserver unable to call it) is retried, as a Job controller retries a create."""
    end = time.monotonic() + DEADLINE
    while True:
        try:
            api.core.create_namespaced_pod(namespace, pod)
        except ApiException as error:
            if error.status == 409:
                return ""  # an earlier attempt was stored after all (its answer was lost)
            message = str(json.loads(error.body).get("message", ""))
            if error.status == 403:
                return message
            if time.monotonic() >= end:
                raise AssertionError(f"no answer but retryable failures for {DEADLINE:.0f}s: {message}") from None
            time.sleep(0.2)  # a controller's retry backoff
            continue
        return ""


def test_two_gangs_racing_while_the_writer_is_killed_store_one_whole_and_nothing_of_the_other(
        api: Api, shipped_replicas: Replicas) -> None:
    namespace = f"gangs-{uuid.uuid4().hex[:6]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
        name=namespace, labels={TEST_LABEL: shipped_replicas.selector_value, IGNORE_LABEL: "true"})))
    quota = f"room-{namespace}"
    create_quota(api, namespace, quota, {RATIO: str(100 * ROOM_CARDS)})
    for server in shipped_replicas.servers:
        eventually(lambda s=server: admits_quota(s, namespace, quota), f"replica {server.port} sees {quota}", DEADLINE)
    victim = holder(api, shipped_replicas)
    assert victim is not None
    order = [(gang, index) for index in range(MEMBERS) for gang in ("gang-a", "gang-b")]
    started = threading.Semaphore(0)

    def create(pair: tuple[str, int]) -> tuple[str, str]:
        gang, index = pair
        started.release()
        return gang, create_as_a_controller_would(api, namespace, member(f"{gang}-{index}", gang, quota))

    with ThreadPoolExecutor(max_workers=len(order)) as pool:
        futures = [pool.submit(create, pair) for pair in order]
        for _ in range(3):
            started.acquire()
        victim.kill()  # mid-race: the Lease is not given up, it expires
        results = [future.result() for future in futures]

    stored = {gang: len(api.core.list_namespaced_pod(namespace, label_selector=f"app={gang}").items)
              for gang in ("gang-a", "gang-b")}
    assert sorted(stored.values()) == [0, MEMBERS], (stored, results)
    loser = "gang-a" if stored["gang-a"] == 0 else "gang-b"
    refusals = [message for gang, message in results if gang == loser]
    assert all(f"gang {namespace}/{loser} needs {RATIO}=800 (8 × 100) at {namespace}/{quota}; " in message
               for message in refusals), refusals
