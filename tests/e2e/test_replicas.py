"""Three webhook replicas behind HAProxy, strict accounting: never more than the quota.

The apiserver calls the webhook through a real round-robin TCP load balancer (HAProxy, TLS passed
through), so a burst of pod creates spreads over three ``gpuquota serve`` processes, each with its
own cache and quota service. Only the shared ledger keeps them from each admitting the same room.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from admissionchain import delete_webhook_configurations, local_webhook_configurations, register_webhook_configurations
from clusterhelpers import QUOTA_LABEL, RATIO, admits_quota, create_quota, eventually, whole_card_pod
from controlplane import LOOPBACK, Api
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from loadbalancer import HAProxy, start_replicas_behind_haproxy
from prometheus_client.parser import text_string_to_metric_families
from reviews import pod, review
from webhookproc import WebhookProcess, post_review

from gpuquota_core import shared_ledger

TEST_LABEL = "gpuquota.koord-gpuquota.io/replicas-test"
# The session's own webhook (local accounting) must not see these namespaces: it would cap the
# burst by itself and hide what the replicas do.
IGNORE_LABEL = "gpuquota.koord-gpuquota.io/ignore"
RESERVATION_TTL = 5
ROOM_PODS, BURST = 50, 200
DEADLINE = 60.0


@dataclass
class Replicas:
    servers: list[WebhookProcess]
    balancer: HAProxy
    ledger_namespace: str
    selector_value: str


@contextlib.contextmanager
def started_replicas(api: Api, kubeconfig_path: Path, base: Path, *extra_args: str) -> Iterator[Replicas]:
    """Three strict replicas behind HAProxy, with their own ledger namespace and webhook configurations."""
    ledger_namespace = f"ledger-{uuid.uuid4().hex[:6]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ledger_namespace)))
    servers: list[WebhookProcess] = []
    serve_args = ["--kubeconfig", str(kubeconfig_path), "--workers", "1", "--threads", "8", "--accounting", "strict",
                  "--ledger-namespace", ledger_namespace, "--reservation-ttl", str(RESERVATION_TTL), *extra_args]
    balancer: HAProxy | None = None
    documents: list[dict[str, Any]] = []
    try:
        servers, balancer = start_replicas_behind_haproxy(base, serve_args)
        value = uuid.uuid4().hex[:8]
        documents = local_webhook_configurations(balancer.url, servers[0].ca_bundle, name_suffix=f"-replicas-{value}",
                                                 namespace_selector={"matchLabels": {TEST_LABEL: value}})
        register_webhook_configurations(api, documents)
        yield Replicas(servers, balancer, ledger_namespace, value)
    finally:
        delete_webhook_configurations(api, documents)
        if balancer is not None:
            balancer.stop()
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def replicas(api: Api, kubeconfig_path: Path, elasticquota_crd: object, canonical_gpu_node: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    with started_replicas(api, kubeconfig_path, tmp_path_factory.mktemp("replicas")) as started:
        yield started


def burst_namespace(api: Api, replicas: Replicas) -> tuple[str, str]:
    """A namespace only the replicas see, with a quota of room for ROOM_PODS one-card pods."""
    namespace = f"burst-{uuid.uuid4().hex[:6]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
        name=namespace, labels={TEST_LABEL: replicas.selector_value, IGNORE_LABEL: "true"})))
    quota = f"room-{namespace}"
    create_quota(api, namespace, quota, {RATIO: str(100 * ROOM_PODS)})
    for server in replicas.servers:
        if server.alive():
            eventually(lambda s=server: admits_quota(s, namespace, quota), f"replica {server.port} sees {quota}",
                       DEADLINE)
    # And the apiserver calls the replicas for this namespace (it picks configurations up asynchronously).
    eventually(lambda: _mutated(api, namespace, quota), "the apiserver calls the replicas", DEADLINE)
    return namespace, quota


def _mutated(api: Api, namespace: str, quota: str) -> bool:
    stored = api.core.create_namespaced_pod(namespace, whole_card_pod("probe", quota), dry_run="All")
    return "koordinator.sh/gpu-core" in (stored.spec.containers[0].resources.requests or {})


def create_burst(api: Api, namespace: str, quota: str, during: Callable[[int], None] | None = None
                 ) -> list[str | None]:
    """BURST concurrent creates; None for a stored pod, else the apiserver's refusal message."""
    def create(index: int) -> str | None:
        if during is not None:
            during(index)
        try:
            api.core.create_namespaced_pod(namespace, whole_card_pod(f"p{index}", quota))
        except ApiException as error:
            return str(json.loads(error.body)["message"])
        return None

    with ThreadPoolExecutor(max_workers=32) as pool:
        return list(pool.map(create, range(BURST)))


def stored_pods(api: Api, namespace: str) -> int:
    return len(api.core.list_namespaced_pod(namespace).items)


@pytest.mark.parametrize("round_", [1, 2, 3])
def test_burst_through_three_replicas_stores_exactly_the_room(api: Api, replicas: Replicas, round_: int) -> None:
    namespace, quota = burst_namespace(api, replicas)
    results = create_burst(api, namespace, quota)
    refusals = [message for message in results if message is not None]
    assert stored_pods(api, namespace) == ROOM_PODS == results.count(None)
    assert len(refusals) == BURST - ROOM_PODS
    quota_message = f"exceeded quota: {namespace}/{quota}, requested: {RATIO}=100, "
    others = Counter(message[:160] for message in refusals if quota_message not in message)
    assert not others, f"refusals other than the quota's: {others}"
    # Every replica's gauges show the stored pods once its watch has seen them; strict accounting
    # keeps reservations in the ledger objects, so no replica claims a reserved figure.
    for server in replicas.servers:
        eventually(lambda s=server: _quota_gauges(s, quota) == {("gpuquota_quota_used", RATIO): 100 * ROOM_PODS,
                                                                ("gpuquota_quota_limit", RATIO): 100 * ROOM_PODS},
                   f"replica {server.port} exports the quota's usage", DEADLINE)
    assert sum(_ledger_writes_ok(server) for server in replicas.servers) >= 1
    # Without a writer Lease every replica decides in the degraded mode: escrow lives at a writer
    # only, so every admitted pod was written with its own batch.
    assert sum(_escrow_admissions(server) for server in replicas.servers) == 0


def _scraped(server: WebhookProcess) -> list[Any]:
    status, text = server.get("/metrics")
    assert status == 200, text
    return [sample for family in text_string_to_metric_families(text.decode()) for sample in family.samples]


def _ledger_writes_ok(server: WebhookProcess) -> float:
    return sum(sample.value for sample in _scraped(server)
               if sample.name == "gpuquota_ledger_writes_total" and sample.labels["result"] == "ok")


def _escrow_admissions(server: WebhookProcess) -> float:
    return sum(sample.value for sample in _scraped(server)
               if sample.name == "gpuquota_ledger_escrow_admissions_total")


def _quota_gauges(server: WebhookProcess, quota: str) -> dict[tuple[str, str], float]:
    return {(sample.name, sample.labels["resource"]): sample.value for sample in _scraped(server)
            if sample.name.startswith("gpuquota_quota_") and sample.labels.get("quota") == quota}


def test_replica_killed_mid_burst_never_over_admits_and_its_room_comes_back(api: Api, replicas: Replicas) -> None:
    namespace, quota = burst_namespace(api, replicas)
    victim = replicas.servers[2]
    killed = threading.Event()

    def kill_at_a_quarter(index: int) -> None:
        if index == BURST // 4 and not killed.is_set():
            killed.set()
            victim.kill()

    results = create_burst(api, namespace, quota, during=kill_at_a_quarter)
    assert killed.is_set() and not victim.alive()
    stored = stored_pods(api, namespace)
    assert stored == results.count(None) and stored <= ROOM_PODS
    # Reservations of admissions whose pods never landed (the dead replica's included) expire and
    # the reconciler drops them: the ledger empties and the whole remaining room is usable again.
    name = shared_ledger.ledger_object_name(quota)

    def ledger_empty() -> bool:
        data = api.core.read_namespaced_config_map(name, replicas.ledger_namespace).data
        return not shared_ledger.decode(data)

    eventually(ledger_empty, "the reconciler emptied the ledger", DEADLINE)
    rest = [f"rest{i}" for i in range(ROOM_PODS - stored)]
    for pod_name in rest:
        api.core.create_namespaced_pod(namespace, whole_card_pod(pod_name, quota))
    with pytest.raises(ApiException) as refused:
        api.core.create_namespaced_pod(namespace, whole_card_pod("one-too-many", quota))
    assert f"exceeded quota: {namespace}/{quota}, " in json.loads(refused.value.body)["message"]
    assert stored_pods(api, namespace) == ROOM_PODS


# --- One writer: the holder of the writer Lease decides, the other replicas forward to it ---------

WRITER_LEASE = "ledger-writer"


@pytest.fixture
def single_writer(api: Api, kubeconfig_path: Path, elasticquota_crd: object, canonical_gpu_node: str,
                  tmp_path: Path) -> Iterator[Replicas]:
    """The shipped shape: three replicas with --writer-lease, each listener on a port of its own."""
    with started_replicas(api, kubeconfig_path, tmp_path, "--writer-lease", WRITER_LEASE, "--peer-address", LOOPBACK,
                          "--peer-port", "0") as started:
        eventually(lambda: _roles(started) == {"writer": 1, "forwarding": 2},
                   "one replica holds the writer Lease and the others forward to it", DEADLINE)
        yield started


def _role(server: WebhookProcess) -> str | None:
    held = [sample.labels["role"] for sample in _scraped(server)
            if sample.name == "gpuquota_ledger_writer_role" and sample.value == 1]
    return held[0] if len(held) == 1 else None


def _roles(replicas: Replicas) -> dict[str | None, int]:
    return dict(Counter(_role(server) for server in replicas.servers if server.alive()))


def _writer(replicas: Replicas) -> WebhookProcess:
    (writer,) = [server for server in replicas.servers if server.alive() and _role(server) == "writer"]
    return writer


def _counted(server: WebhookProcess, name: str, label: str, value: str) -> float:
    return sum(sample.value for sample in _scraped(server) if sample.name == name and sample.labels.get(label) == value)


def _lease(api: Api, replicas: Replicas) -> k8s.V1Lease:
    return k8s.CoordinationV1Api(api.core.api_client).read_namespaced_lease(WRITER_LEASE, replicas.ledger_namespace)


def _identity(server: WebhookProcess) -> str:
    # The quota service names itself after the host and its server's gunicorn master.
    return f"{socket.gethostname()}/{server.pid}"


def test_with_a_writer_lease_only_its_holder_writes_and_the_burst_stores_exactly_the_room(
        api: Api, single_writer: Replicas) -> None:
    writer = _writer(single_writer)
    lease = _lease(api, single_writer)
    assert lease.spec.holder_identity == _identity(writer)
    namespace, quota = burst_namespace(api, single_writer)
    results = create_burst(api, namespace, quota)
    refusals = [message for message in results if message is not None]
    assert stored_pods(api, namespace) == ROOM_PODS == results.count(None)
    quota_message = f"exceeded quota: {namespace}/{quota}, requested: {RATIO}=100, "
    assert len(refusals) == BURST - ROOM_PODS
    assert not Counter(message[:160] for message in refusals if quota_message not in message)
    forwarders = [server for server in single_writer.servers if server is not writer]
    # Round robin spread the calls; the other two sent theirs to the writer and wrote nothing.
    for server in forwarders:
        assert _counted(server, "gpuquota_ledger_forwarded_admissions_total", "result", "forwarded") >= 1
        assert _counted(server, "gpuquota_ledger_forwarded_admissions_total", "result", "decided_here") == 0
        assert sum(_counted(server, "gpuquota_ledger_writes_total", "result", result)
                   for result in ("ok", "conflict", "error")) == 0
    assert _ledger_writes_ok(writer) >= 1
    # Some were admitted from room the writer held in escrow (no write of their own), and still no
    # more than the room was stored.
    assert _escrow_admissions(writer) >= 1


def test_the_writer_killed_mid_burst_is_replaced_and_nothing_is_over_admitted(api: Api, single_writer: Replicas
                                                                              ) -> None:
    namespace, quota = burst_namespace(api, single_writer)
    victim = _writer(single_writer)
    transitions = _lease(api, single_writer).spec.lease_transitions
    killed = threading.Event()

    def kill_at_a_quarter(index: int) -> None:
        if index == BURST // 4 and not killed.is_set():
            killed.set()
            victim.kill()  # the whole process tree: the Lease is not given up, it expires

    results = create_burst(api, namespace, quota, during=kill_at_a_quarter)
    assert killed.is_set() and not victim.alive()
    stored = stored_pods(api, namespace)
    assert stored == results.count(None) and stored <= ROOM_PODS
    # Another replica takes the Lease once it expires, and the last one forwards to it.
    eventually(lambda: _roles(single_writer) == {"writer": 1, "forwarding": 1}, "a survivor holds the Lease", DEADLINE)
    successor = _writer(single_writer)
    lease = _lease(api, single_writer)
    assert lease.spec.holder_identity == _identity(successor) != _identity(victim)
    assert lease.spec.lease_transitions == transitions + 1
    (forwarder,) = [server for server in single_writer.servers if server.alive() and server is not successor]
    # What the dead writer reserved for pods that never landed expires; then the whole room left is
    # usable, exactly: the last pod that fits is stored and the next is refused for the quota.
    name = shared_ledger.ledger_object_name(quota)

    def ledger_empty() -> bool:
        return not shared_ledger.decode(api.core.read_namespaced_config_map(name, single_writer.ledger_namespace).data)

    eventually(ledger_empty, "the new writer's reconciler emptied the ledger", DEADLINE)
    for index in range(ROOM_PODS - stored):
        api.core.create_namespaced_pod(namespace, whole_card_pod(f"rest{index}", quota))
    with pytest.raises(ApiException) as refused:
        api.core.create_namespaced_pod(namespace, whole_card_pod("one-too-many", quota))
    assert f"exceeded quota: {namespace}/{quota}, " in json.loads(refused.value.body)["message"]
    assert stored_pods(api, namespace) == ROOM_PODS
    # The last replica asks the new writer: a review sent to it (a dry run) is forwarded and answered.
    document = review(pod("probe", namespace, labels={QUOTA_LABEL: quota}, resources={RATIO: "100"}), dry_run=True)
    forwarded = _counted(forwarder, "gpuquota_ledger_forwarded_admissions_total", "result", "forwarded")
    answer = post_review(forwarder, "/validate-pods", document)
    assert f"exceeded quota: {namespace}/{quota}, " in answer["status"]["message"]
    assert _counted(forwarder, "gpuquota_ledger_forwarded_admissions_total", "result", "forwarded") == forwarded + 1


def test_a_writer_stopped_cleanly_gives_the_lease_up_before_it_exits(api: Api, single_writer: Replicas) -> None:
    writer = _writer(single_writer)
    assert writer.stop() == 0
    # Released on the way out (holder emptied), or already taken by another replica: never left to expire.
    assert _lease(api, single_writer).spec.holder_identity != _identity(writer)
    eventually(lambda: _roles(single_writer) == {"writer": 1, "forwarding": 1}, "a survivor holds the Lease", DEADLINE)
