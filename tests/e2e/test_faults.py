"""Faults under load: three strict replicas behind HAProxy, a burst of creates, and one part failing.

Each test runs a burst of concurrent pod creates through the real apiserver against a known room
(a parent quota with room for ROOM pods over two leaves of LEAF_ROOM each) while one fault
strikes, then asserts the three things a quota gate owes its users whatever failed:

- no quota is over-admitted: the pods the apiserver stored fit every leaf and the parent;
- nothing admitted is lost: every replica ends up counting every stored pod;
- the room is usable again: after the fault, creates fill exactly the room left, and one more is
  refused for the quota (not for an outage).

The faults need control over etcd and the apiserver, so the module runs its own control plane
(no scheduler: pods stay Pending, and Pending pods count). Figures: GPUQUOTA_FAULT_RUNS repeats
every test, GPUQUOTA_FAULT_REPORT names a JSON-lines file each run appends its figures to
(docs/reliability.md, bench/fault_figures.py).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from admissionchain import local_webhook_configurations, register_webhook_configurations, wait_until_webhook_is_called
from clusterhelpers import (
    PARENT_LABEL,
    QUOTA_LABEL,
    RATIO,
    admits_quota,
    create_quota,
    refusal_reason,
    whole_card_pod,
)
from controlplane import (
    ELASTICQUOTA_GROUP,
    ELASTICQUOTA_PLURAL,
    ELASTICQUOTA_VERSION,
    Api,
    Binaries,
    ControlPlane,
    create_canonical_gpu_node,
    install_elasticquota_crd,
    make_api,
)
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from loadbalancer import HAProxy, start_replicas_behind_haproxy
from prometheus_client.parser import text_string_to_metric_families
from reviews import body, pod, review
from webhookproc import WebhookProcess, quota_service_pid

from gpuquota_core import shared_ledger

RESERVATION_TTL = 3.0
ROOM, LEAF_ROOM = 12, 8  # pods of one card: the parent holds fewer than both leaves together
BURST, CLIENTS = 40, 16
CREATE_TIMEOUT = 30.0  # the client's own bound on one create (an etcd pause holds creates)
RECOVERY_DEADLINE = 60.0
RUNS = int(os.environ.get("GPUQUOTA_FAULT_RUNS", "1"))
REPORT = os.environ.get("GPUQUOTA_FAULT_REPORT", "")


@dataclass
class Cluster:
    plane: ControlPlane
    api: Api
    replicas: list[WebhookProcess]
    balancer: HAProxy
    ledger_namespace: str


@pytest.fixture(scope="module")
def cluster(control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("faults")
    plane = ControlPlane(control_plane_binaries, base_dir=base / "control-plane")
    plane.start()
    api = make_api(plane.kubeconfig_path)
    servers: list[WebhookProcess] = []
    balancer: HAProxy | None = None
    try:
        install_elasticquota_crd(api)
        create_canonical_gpu_node(api.core, "faults-canonical")  # so the webhook rewrites (rewrite: auto)
        ledger_namespace = "gpuquota-ledger"
        api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ledger_namespace)))
        serve_args = ["--kubeconfig", str(plane.kubeconfig_path), "--workers", "1", "--threads", "8",
                      "--accounting", "strict", "--ledger-namespace", ledger_namespace,
                      "--reservation-ttl", str(RESERVATION_TTL)]
        servers, balancer = start_replicas_behind_haproxy(base, serve_args)
        register_webhook_configurations(api, local_webhook_configurations(balancer.url, servers[0].ca_bundle))
        probe = "webhook-probe"
        api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=probe)))
        wait_until_webhook_is_called(api, probe)
        yield Cluster(plane, api, servers, balancer, ledger_namespace)
    finally:
        if balancer is not None:
            balancer.stop()
        for server in servers:
            server.stop()
        api.close()
        plane.stop()


@pytest.fixture
def cluster_ok(cluster: Cluster) -> Cluster:
    """The cluster as a test expects it: etcd running, every replica serving (restarted if a test left it dead)."""
    cluster.plane.resume_etcd()
    for server in cluster.replicas:
        if server.alive():
            os.killpg(server.pid, signal.SIGCONT)
        if not server.alive() or server.get("/readyz")[0] != 200:
            # What a kubelet does to a container whose probes fail: a fresh one.
            server.stop()
            server.start()
    return cluster


@dataclass
class Tree:
    namespace: str
    parent: str
    leaves: tuple[str, str]


@dataclass
class Figures:
    fault: str
    outcomes: Counter[str] = field(default_factory=Counter)
    recovery_seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)


def make_tree(cluster: Cluster) -> Tree:
    namespace = f"faults-{uuid.uuid4().hex[:6]}"
    cluster.api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    parent, leaves = f"org-{namespace}", (f"a-{namespace}", f"b-{namespace}")
    create_quota(cluster.api, namespace, parent, {RATIO: str(100 * ROOM)},
                 labels={"quota.scheduling.koordinator.sh/is-parent": "true"})
    for leaf in leaves:
        create_quota(cluster.api, namespace, leaf, {RATIO: str(100 * LEAF_ROOM)}, labels={PARENT_LABEL: parent})
    for server in cluster.replicas:
        for leaf in leaves:
            poll(lambda s=server, q=leaf: admits_quota(s, namespace, q), f"replica {server.port} sees {leaf}")
    return Tree(namespace, parent, leaves)


def poll(condition: Callable[[], bool], what: str, deadline: float = RECOVERY_DEADLINE) -> float:
    """Poll ``condition`` until it holds (exceptions count as not yet); seconds it took."""
    start = time.monotonic()
    while True:
        try:
            if condition():
                return time.monotonic() - start
        except Exception:  # a fault in progress makes probes fail; that is "not yet"
            pass
        assert time.monotonic() - start < deadline, f"not true after {deadline:.0f}s: {what}"
        time.sleep(0.1)  # polling a condition with a deadline


def create(api: Api, tree: Tree, name: str, leaf: str) -> str:
    """"stored", the HTTP status of a refusal (with "exceeded" for the quota's), or "connection"."""
    try:
        api.core.create_namespaced_pod(tree.namespace, whole_card_pod(name, leaf), _request_timeout=CREATE_TIMEOUT)
    except ApiException as error:
        if error.status == 403 and "exceeded quota: " in error.body:
            return "403 exceeded"
        return f"{error.status} {refusal_reason(error)}"
    except Exception:  # the apiserver away: refused connections, resets, timeouts
        return "connection"
    return "stored"


def burst(cluster: Cluster, tree: Tree, figures: Figures, fault: Callable[[int], None] | None = None) -> None:
    """BURST concurrent creates over both leaves; ``fault(index)`` runs before each (to strike once)."""
    def one(index: int) -> str:
        if fault is not None:
            fault(index)
        return create(cluster.api, tree, f"p{index}", tree.leaves[index % 2])

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        figures.outcomes.update(pool.map(one, range(BURST)))


def stored_by_leaf(api: Api, tree: Tree) -> Counter[str]:
    pods = api.core.list_namespaced_pod(tree.namespace).items
    return Counter((pod.metadata.labels or {}).get(QUOTA_LABEL, "") for pod in pods)


def assert_within_room(api: Api, tree: Tree, parent_room: int = ROOM) -> int:
    stored = stored_by_leaf(api, tree)
    for leaf in tree.leaves:
        assert stored[leaf] <= LEAF_ROOM, f"leaf {leaf} over-admitted: {stored}"
    total = sum(stored.values())
    assert total <= parent_room, f"parent {tree.parent} over-admitted: {total} > {parent_room} ({stored})"
    return total


def counted_by(server: WebhookProcess, quota: str) -> float:
    status, text = server.get("/metrics")
    assert status == 200
    return sum(sample.value for family in text_string_to_metric_families(text.decode()) for sample in family.samples
               if sample.name == "gpuquota_quota_used" and sample.labels.get("quota") == quota)


def assert_nothing_lost(cluster: Cluster, tree: Tree) -> None:
    """Every replica counts every stored pod (its watch, whatever the ledger held meanwhile)."""
    stored = sum(stored_by_leaf(cluster.api, tree).values())
    for server in cluster.replicas:
        poll(lambda s=server: counted_by(s, tree.parent) == 100 * stored,
             f"replica {server.port} counts the {stored} stored pods of {tree.parent}")


def refill(cluster: Cluster, tree: Tree, figures: Figures, fault_over: float, parent_room: int = ROOM) -> None:
    """Fill what is left of the room, retrying through the outage; then one more is refused for quota.

    Recovery: from the end of the fault to the first create answered by a decision (stored, or
    refused for the quota), not by an outage.
    """
    api, index, recovered = cluster.api, 0, False
    deadline = time.monotonic() + RECOVERY_DEADLINE

    def room_left() -> int:
        stored = stored_by_leaf(api, tree)
        return parent_room - sum(stored.values())

    while room_left() > 0:
        assert time.monotonic() < deadline, f"room not usable after {RECOVERY_DEADLINE:.0f}s: {figures.outcomes}"
        stored = stored_by_leaf(api, tree)
        leaf = min(tree.leaves, key=lambda name: stored[name])  # the emptier leaf has room if any has
        outcome = create(api, tree, f"refill{index}", leaf)
        index += 1
        if outcome in ("stored", "403 exceeded") and not recovered:
            recovered = True
            figures.recovery_seconds = max(0.0, time.monotonic() - fault_over)
        if outcome != "stored":
            time.sleep(0.2)  # polling: reservations of lost admissions expire within the TTL
    assert assert_within_room(api, tree, parent_room) == parent_room
    # Full: in each leaf the next create is refused for the quota once a decision is made again
    # (an outage may still answer first), and never stored.
    for leaf in tree.leaves:
        while (outcome := create(api, tree, f"one-too-many-{leaf}", leaf)) != "403 exceeded":
            assert outcome != "stored", f"stored beyond the room in {leaf}"
            assert time.monotonic() < deadline, f"no quota decision after {RECOVERY_DEADLINE:.0f}s: {outcome}"
            time.sleep(0.2)  # polling for the outage to end
        if not recovered:
            recovered = True
            figures.recovery_seconds = max(0.0, time.monotonic() - fault_over)


def report(figures: Figures, tree: Tree, cluster: Cluster, run: int, room: int = ROOM) -> None:
    if not REPORT:
        return
    stored = stored_by_leaf(cluster.api, tree)
    line = {"fault": figures.fault, "run": run, "room": room, "burst": BURST,
            "stored_after_burst": figures.outcomes["stored"], "stored_at_end": sum(stored.values()),
            "outcomes": dict(figures.outcomes), "recovery_seconds": round(figures.recovery_seconds, 2),
            "seconds": round(time.monotonic() - figures.started, 1)}
    with Path(REPORT).open("a", encoding="utf-8") as out:
        out.write(json.dumps(line, sort_keys=True) + "\n")


def once_at(index: int, action: Callable[[], None], in_thread: bool = True) -> Callable[[int], None]:
    """A fault hook that runs ``action`` when create ``index`` starts.

    ``in_thread``: beside the burst (a kill, a restart, a pause that lasts). Otherwise before the
    creates after ``index``, which wait for it: an instant fault (a delete, a patch) that lands
    between the first creates of a burst and the rest, however fast the burst runs.
    """
    done = threading.Event()

    def hook(current: int) -> None:
        if current == index:
            if in_thread:
                threading.Thread(target=action, daemon=True).start()
            else:
                try:
                    action()
                finally:
                    done.set()
        elif current > index and not in_thread:
            assert done.wait(RECOVERY_DEADLINE), "the fault never happened"

    return hook


class Fault:
    """One fault struck during a burst; recovery is measured from when it is over (``ended_at``)."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action
        self.over = threading.Event()
        self.ended_at = 0.0

    def __call__(self) -> None:
        self.action()
        self.ended_at = time.monotonic()
        self.over.set()


def timed(start: Callable[[], None], end: Callable[[], None], seconds: float) -> Fault:
    """A fault that starts at one point of the burst and ends ``seconds`` later (its length, not a wait)."""
    def strike() -> None:
        start()
        threading.Event().wait(seconds)  # the fault's duration
        end()

    return Fault(strike)


def burst_under(cluster: Cluster, tree: Tree, figures: Figures, fault: Fault, at: int, in_thread: bool = True) -> int:
    """A burst with ``fault`` struck at create ``at`` (see :func:`once_at`); once it is over, no quota
    is over-admitted. The pods stored."""
    burst(cluster, tree, figures, once_at(at, fault, in_thread))
    assert fault.over.wait(RECOVERY_DEADLINE), "the fault never ended"
    return assert_within_room(cluster.api, tree)


def recover(cluster: Cluster, tree: Tree, figures: Figures, run: int, fault_over: float,
            parent_room: int = ROOM, room: int = ROOM) -> None:
    """After the fault: the room left is usable, every replica counts every stored pod; figures reported."""
    refill(cluster, tree, figures, fault_over, parent_room)
    assert_nothing_lost(cluster, tree)
    report(figures, tree, cluster, run, room)


RUN_IDS = [pytest.param(run, id=f"run{run}") for run in range(1, RUNS + 1)]


@pytest.mark.parametrize("run", RUN_IDS)
def test_decider_killed_mid_burst(cluster_ok: Cluster, run: int) -> None:
    cluster, figures = cluster_ok, Figures("decider killed")
    tree = make_tree(cluster)
    # Another replica each run: a supervisor rightly gives up on a service that keeps dying young.
    victim = cluster.replicas[(run - 1) % len(cluster.replicas)]
    kill = Fault(lambda: os.kill(quota_service_pid(victim.pid), signal.SIGKILL))
    burst_under(cluster, tree, figures, kill, at=BURST // 4)
    # Healed: the server restarted its quota service (ready again) or exited for its supervisor.
    poll(lambda: not victim.alive() or victim.get("/readyz")[0] == 200,
         "the replica whose quota service died restarts it or exits")
    if not victim.alive():
        victim.stop()
        victim.start()
    recover(cluster, tree, figures, run, kill.ended_at)


@pytest.mark.parametrize("run", RUN_IDS)
def test_replica_paused_longer_than_the_reservation_ttl(cluster_ok: Cluster, run: int) -> None:
    cluster, figures = cluster_ok, Figures("replica paused")
    tree = make_tree(cluster)
    victim = cluster.replicas[1]
    pause = timed(lambda: os.killpg(victim.pid, signal.SIGSTOP), lambda: os.killpg(victim.pid, signal.SIGCONT),
                  seconds=2 * RESERVATION_TTL + 1)
    # What the paused replica decided before it stopped is written, if at all, only on a fresh
    # read after it resumed: the burst's creates and its stale decisions never exceed the room.
    burst_under(cluster, tree, figures, pause, at=BURST // 4)
    recover(cluster, tree, figures, run, pause.ended_at)


@pytest.mark.parametrize("run", RUN_IDS)
def test_apiserver_restarted_mid_burst(cluster_ok: Cluster, run: int) -> None:
    cluster, figures = cluster_ok, Figures("apiserver restarted")
    tree = make_tree(cluster)
    restart = Fault(cluster.plane.restart_apiserver)
    burst_under(cluster, tree, figures, restart, at=BURST // 4)
    recover(cluster, tree, figures, run, restart.ended_at)


@pytest.mark.parametrize("run", RUN_IDS)
def test_etcd_paused_mid_burst(cluster_ok: Cluster, run: int) -> None:
    cluster, figures = cluster_ok, Figures("etcd paused")
    tree = make_tree(cluster)
    # Longer than the webhook timeout (5s): answers decided during the pause reach nobody.
    pause = timed(cluster.plane.pause_etcd, cluster.plane.resume_etcd, seconds=7.0)
    burst_under(cluster, tree, figures, pause, at=BURST // 4)
    recover(cluster, tree, figures, run, pause.ended_at)


@pytest.mark.parametrize("run", RUN_IDS)
def test_ledger_deleted_mid_burst(cluster_ok: Cluster, run: int) -> None:
    cluster, figures = cluster_ok, Figures("ledger deleted")
    tree = make_tree(cluster)
    name = shared_ledger.ledger_object_name(tree.parent)

    def delete() -> None:
        poll(lambda: bool(cluster.api.core.read_namespaced_config_map(name, cluster.ledger_namespace)),
             "the burst wrote the ledger")
        cluster.api.core.delete_namespaced_config_map(name, cluster.ledger_namespace)

    deleted = Fault(delete)
    burst_under(cluster, tree, figures, deleted, at=ROOM // 2, in_thread=False)
    recover(cluster, tree, figures, run, deleted.ended_at)


@pytest.mark.parametrize("run", RUN_IDS)
def test_quota_max_lowered_mid_burst(cluster_ok: Cluster, run: int) -> None:
    cluster, figures = cluster_ok, Figures("max lowered")
    tree = make_tree(cluster)
    lowered_room = ROOM // 2
    lower = Fault(lambda: cluster.api.custom.patch_namespaced_custom_object(
        ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, tree.namespace, ELASTICQUOTA_PLURAL, tree.parent,
        {"spec": {"max": {RATIO: str(100 * lowered_room)}}}))
    # Creates decided before every replica saw the new max may fill the old room, never more.
    stored = burst_under(cluster, tree, figures, lower, at=ROOM // 4, in_thread=False)
    # Once they all see it, nothing more is admitted above the new max; below it, exactly up to it.
    for server in cluster.replicas:
        poll(lambda s=server: not admits_quota_of(s, tree, 100 * (lowered_room - stored) + 100),
             f"replica {server.port} sees the lowered max")
    recover(cluster, tree, figures, run, lower.ended_at, parent_room=max(stored, lowered_room), room=lowered_room)


def admits_quota_of(server: WebhookProcess, tree: Tree, ratio: int) -> bool:
    """Whether ``server`` would admit a pod of ``ratio`` in the first leaf (a dry run, reserving nothing)."""
    document = review(pod("probe", tree.namespace, labels={QUOTA_LABEL: tree.leaves[0]},
                          resources={RATIO: str(max(ratio, 1))}), dry_run=True)
    request = urllib.request.Request(server.url + "/validate-pods", data=body(document),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5, context=server.ssl_context()) as response:
        return bool(json.loads(response.read())["response"]["allowed"])


@pytest.mark.parametrize("run", RUN_IDS)
def test_pods_moved_between_quotas_during_a_burst(cluster_ok: Cluster, run: int) -> None:
    cluster, figures = cluster_ok, Figures("pods relabelled")
    tree = make_tree(cluster)
    first, second = tree.leaves
    movers = [f"mover{index}" for index in range(4)]
    for name in movers:
        assert create(cluster.api, tree, name, first) == "stored"
    moved: Counter[str] = Counter()
    started = time.monotonic()

    def move(index: int) -> None:
        if index < len(movers):
            try:
                cluster.api.core.patch_namespaced_pod(movers[index], tree.namespace,
                                                      {"metadata": {"labels": {QUOTA_LABEL: second}}})
                moved["moved"] += 1
            except ApiException as error:
                moved[f"{error.status}"] += 1

    burst(cluster, tree, figures, move)
    figures.outcomes.update({f"relabel {key}": value for key, value in moved.items()})
    assert sum(moved.values()) == len(movers)
    # A move is an admission to the new leaf: with the moves, neither leaf nor the parent is over.
    assert_within_room(cluster.api, tree)
    recover(cluster, tree, figures, run, started)


def test_a_refusal_says_how_much_of_used_is_held_by_admissions_not_yet_seen(cluster_ok: Cluster) -> None:
    cluster = cluster_ok
    tree = make_tree(cluster)
    leaf = tree.leaves[0]
    for index in range(LEAF_ROOM - 1):
        assert create(cluster.api, tree, f"p{index}", leaf) == "stored"
    # Admission runs before storage: the webhook admits and records a second "p0", whose create
    # then fails as AlreadyExists. Its reservation holds the leaf's last card until the TTL.
    assert create(cluster.api, tree, "p0", leaf).startswith("409")
    with pytest.raises(ApiException) as refused:
        cluster.api.core.create_namespaced_pod(tree.namespace, whole_card_pod("one-more", leaf))
    assert json.loads(refused.value.body)["message"].endswith(
        f"exceeded quota: {tree.namespace}/{leaf}, requested: {RATIO}=100, used: {RATIO}={100 * LEAF_ROOM} "
        f"(100 of it reserved by admissions not yet seen), limited: {RATIO}={100 * LEAF_ROOM}")
    # The reservation expires: the card is free again.
    poll(lambda: create(cluster.api, tree, "one-more", leaf) == "stored", "the lost reservation expired")
