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

import contextlib
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
    LOOPBACK,
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
from webhookproc import WebhookProcess, post_review, quota_service_pid

from gpuquota_core import shared_ledger
from gpuquota_core.gang import GANG_MIN_ANNOTATION, GANG_NAME_ANNOTATION

RESERVATION_TTL = 3.0
WRITER_LEASE = "gpuquota-ledger-writer"
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


@contextlib.contextmanager
def running_cluster(binaries: Binaries, base: Path, ttl_args: list[str]) -> Iterator[Cluster]:
    """A control plane of its own, three strict replicas with the writer Lease behind HAProxy, registered."""
    plane = ControlPlane(binaries, base_dir=base / "control-plane")
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
                      "--accounting", "strict", "--ledger-namespace", ledger_namespace, *ttl_args,
                      # The shipped shape: one writer, the others forwarding to it (docs/accounting.md).
                      "--writer-lease", WRITER_LEASE, "--peer-address", LOOPBACK, "--peer-port", "0"]
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


@pytest.fixture(scope="module")
def cluster(control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(control_plane_binaries, tmp_path_factory.mktemp("faults"),
                         ["--reservation-ttl", str(RESERVATION_TTL)]) as started:
        yield started


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
    refused_with_room: int = 0  # refill creates not stored although the room had space for them
    refill_outcomes: Counter[str] = field(default_factory=Counter)
    room_back_seconds: float = 0.0  # from the end of the fault until the room left was all stored
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


def writer_role(server: WebhookProcess) -> str:
    """The replica's part with the writer Lease (gpuquota_ledger_writer_role), "" while it has none."""
    status, text = server.get("/metrics")
    if status != 200:
        return ""
    held = [sample.labels["role"] for family in text_string_to_metric_families(text.decode())
            for sample in family.samples if sample.name == "gpuquota_ledger_writer_role" and sample.value == 1]
    return held[0] if held else ""


def the_writer(cluster: Cluster) -> WebhookProcess:
    """The replica holding the writer Lease, once one does and the others forward to it."""
    poll(lambda: sorted(writer_role(server) for server in cluster.replicas) == ["forwarding", "forwarding", "writer"],
         "one replica holds the writer Lease and the others forward to it")
    (writer,) = [server for server in cluster.replicas if writer_role(server) == "writer"]
    return writer


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
        figures.refill_outcomes[outcome] += 1
        if outcome != "stored":
            figures.refused_with_room += 1
            time.sleep(0.2)  # polling: reservations of lost admissions expire within the TTL
    figures.room_back_seconds = max(0.0, time.monotonic() - fault_over)
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
            "refused_with_room": figures.refused_with_room, "refill_outcomes": dict(figures.refill_outcomes),
            "room_back_seconds": round(figures.room_back_seconds, 2),
            "over_admitted": max(0, sum(stored.values()) - room),
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
# How soon a replica whose quota service was restarted and is ready again answers with a decision.
DECISION_BOUND = 3.0
# With the shipped TTL, how soon after the writer's quota service is killed the room is all usable again.
ROOM_BACK_BOUND = 10.0


def decides(server: WebhookProcess, tree: Tree) -> bool:
    """Whether ``server`` answers a one-card pod of the first leaf with a quota decision (a dry run:
    allowed, or refused for the quota), not with an outage."""
    document = review(pod("probe", tree.namespace, labels={QUOTA_LABEL: tree.leaves[0]}, resources={RATIO: "100"}),
                      dry_run=True)
    answer = post_review(server, "/validate-pods", document)
    return bool(answer["allowed"]) or answer["status"]["code"] == 403


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
    # Ready means deciding: no waiting on the dead process's escrow (docs/reliability.md, issue 37).
    poll(lambda: decides(victim, tree), "the restarted quota service decides", deadline=DECISION_BOUND)
    recover(cluster, tree, figures, run, kill.ended_at)


@pytest.mark.parametrize("run", RUN_IDS)
def test_the_writers_quota_service_killed_gives_the_room_back_within_seconds_at_the_default_ttl(
        control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory, run: int) -> None:
    # The shipped TTL (30 s): nothing here may wait for a reservation or an escrow to expire. The
    # writer takes escrow for each leaf's shape in its first writes and is killed inside the escrow's
    # window; its successor takes the escrow back from the journal, and the forwarders decide here
    # (degraded) meanwhile. Without the journal the escrow held its room for 30.5 s.
    with running_cluster(control_plane_binaries, tmp_path_factory.mktemp("faults-default-ttl"), []) as cluster:
        figures = Figures("the writer's quota service killed, default TTL")
        tree = make_tree(cluster)
        writer = the_writer(cluster)
        for index, leaf in enumerate(tree.leaves):  # one after the other: a write, and escrow, for each
            figures.outcomes[create(cluster.api, tree, f"first{index}", leaf)] += 1
        kill = Fault(lambda: os.kill(quota_service_pid(writer.pid), signal.SIGKILL))
        kill()
        escrowed = escrow_entries(cluster, tree)
        recover(cluster, tree, figures, run, kill.ended_at)
        assert figures.room_back_seconds <= ROOM_BACK_BOUND, (escrowed, figures.room_back_seconds,
                                                              figures.refill_outcomes)


def escrow_entries(cluster: Cluster, tree: Tree) -> list[str]:
    ledger = cluster.api.core.read_namespaced_config_map(shared_ledger.ledger_object_name(tree.parent),
                                                         cluster.ledger_namespace)
    return sorted(key for key in shared_ledger.decode(ledger.data) if shared_ledger.is_escrow(key))


@pytest.mark.parametrize("run", RUN_IDS)
def test_replica_paused_longer_than_the_reservation_ttl(cluster_ok: Cluster, run: int) -> None:
    cluster, figures = cluster_ok, Figures("replica paused")
    tree = make_tree(cluster)
    # The writer: the others' forwarded admissions then wait on it, time out and are decided by them,
    # and what it reads of them when it resumes is too late to decide.
    victim = the_writer(cluster)
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
def test_ledger_removed_without_its_finalizer_mid_burst(cluster_ok: Cluster, run: int) -> None:
    cluster, figures = cluster_ok, Figures("ledger deleted, finalizer removed")
    tree = make_tree(cluster)
    name = shared_ledger.ledger_object_name(tree.parent)
    fresh = cluster.replicas[2]

    def remove() -> None:
        poll(lambda: bool(cluster.api.core.read_namespaced_config_map(name, cluster.ledger_namespace)),
             "the burst wrote the ledger")
        # One replica restarted meanwhile: it never read the lost object, and only the registry of
        # ledgers tells it the tree is not new (webhook/quota/strict/registry.py).
        fresh.stop()
        cluster.api.core.patch_namespaced_config_map(name, cluster.ledger_namespace, {"metadata": {"finalizers": None}})
        cluster.api.core.delete_namespaced_config_map(name, cluster.ledger_namespace)  # gone at once
        fresh.start()

    removed = Fault(remove)
    burst_under(cluster, tree, figures, removed, at=ROOM // 2, in_thread=False)
    recover(cluster, tree, figures, run, removed.ended_at)


@pytest.mark.parametrize("also_deleted", [False, True], ids=["overwritten", "overwritten-and-deleted"])
@pytest.mark.parametrize("run", RUN_IDS)
def test_ledger_overwritten_with_garbage_mid_burst(cluster_ok: Cluster, run: int, also_deleted: bool) -> None:
    cluster = cluster_ok
    figures = Figures("ledger garbage, deleted" if also_deleted else "ledger garbage")
    tree = make_tree(cluster)
    name = shared_ledger.ledger_object_name(tree.parent)

    def overwrite() -> None:
        poll(lambda: bool(cluster.api.core.read_namespaced_config_map(name, cluster.ledger_namespace)),
             "the burst wrote the ledger")
        # What a bad hand edit leaves: no replica can read it, and nothing says what it held.
        cluster.api.core.patch_namespaced_config_map(
            name, cluster.ledger_namespace, {"data": {shared_ledger.LEDGER_DATA_KEY: "{not json"}})
        if also_deleted:  # kept, terminating, by its finalizer, with the garbage in it
            cluster.api.core.delete_namespaced_config_map(name, cluster.ledger_namespace)

    garbage = Fault(overwrite)
    burst_under(cluster, tree, figures, garbage, at=ROOM // 2, in_thread=False)
    # Rebuilt without a person: the room comes back once what it may have held has expired.
    recover(cluster, tree, figures, run, garbage.ended_at)


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


def test_admissions_refused_while_the_quota_service_was_stopped_hold_no_room_once_it_resumes(
        cluster_ok: Cluster) -> None:
    cluster = cluster_ok
    tree = make_tree(cluster)
    leaf, victim = tree.leaves[0], cluster.replicas[0]

    def admit(name: str) -> dict[str, object]:
        document = review(pod(name, tree.namespace, labels={QUOTA_LABEL: leaf}, resources={RATIO: "100"}))
        return post_review(victim, "/validate-pods", document)

    service = quota_service_pid(victim.pid)
    os.kill(service, signal.SIGSTOP)
    try:
        # Enough to fill the leaf, each waiting in the stopped service's socket until its worker gives up.
        with ThreadPoolExecutor(max_workers=LEAF_ROOM) as pool:
            answers = list(pool.map(admit, [f"unanswered{index}" for index in range(LEAF_ROOM)]))
    finally:
        os.kill(service, signal.SIGCONT)
    assert [(answer["allowed"], answer["status"]["code"]) for answer in answers] == [(False, 503)] * LEAF_ROOM
    # The resumed service reads those admissions first; none may take room now that nobody waits for
    # its answer, so the leaf's room is all there, well within the reservations' TTL.
    after = admit("after")
    assert after["allowed"] is True, after
    data = cluster.api.core.read_namespaced_config_map(shared_ledger.ledger_object_name(tree.parent),
                                                       cluster.ledger_namespace).data
    assert not [key for key in shared_ledger.decode(data) if "/unanswered" in key]


def test_pods_of_a_deleted_leaf_quota_no_longer_count_at_its_parent(cluster_ok: Cluster) -> None:
    """The decision of docs/reliability.md, "A deleted leaf quota": as Koordinator's scheduler, which
    moves a pod whose quota is gone to the default quota, its former parent stops counting it."""
    cluster = cluster_ok
    tree = make_tree(cluster)
    gone, kept = tree.leaves
    for index in range(ROOM // 2):  # the parent full: 6 + 6
        assert create(cluster.api, tree, f"gone{index}", gone) == "stored"
        assert create(cluster.api, tree, f"kept{index}", kept) == "stored"
    assert create(cluster.api, tree, "refused", kept) == "403 exceeded"
    cluster.api.custom.delete_namespaced_custom_object(ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, tree.namespace,
                                                       ELASTICQUOTA_PLURAL, gone)
    for server in cluster.replicas:
        poll(lambda s=server: counted_by(s, tree.parent) == 100 * (ROOM // 2),
             f"replica {server.port} counts only the pods of {kept} at {tree.parent}")
    # The parent's room is what the remaining leaf's pods leave; the leaf's own max binds now. Until
    # the deleted leaf's pods' reservations expire (within a TTL of their admission) they still hold it:
    # no watch can confirm a reservation for a quota that is gone.
    for index in range(LEAF_ROOM - ROOM // 2):
        poll(lambda i=index: create(cluster.api, tree, f"more{i}", kept) == "stored", f"more{index} stored",
             deadline=RESERVATION_TTL + 10)
    assert create(cluster.api, tree, "one-too-many", kept) == "403 exceeded"
    # The pods of the deleted leaf are still there; a new pod naming it is refused (no such quota).
    assert sum(1 for pod in cluster.api.core.list_namespaced_pod(tree.namespace).items
               if (pod.metadata.labels or {}).get(QUOTA_LABEL) == gone) == ROOM // 2
    assert create(cluster.api, tree, "into-gone", gone).startswith("403")


# --- Gangs under the same faults: one gang whole, nothing of the other, never past the room -------

GANG_MEMBERS = 7  # two gangs of seven one-card pods, one per leaf: only one fits the parent's twelve


def gang_member(name: str, gang: str, leaf: str) -> dict[str, object]:
    member = whole_card_pod(name, leaf)
    member["metadata"]["annotations"] = {GANG_NAME_ANNOTATION: gang, GANG_MIN_ANNOTATION: str(GANG_MEMBERS)}
    member["metadata"]["labels"]["app"] = gang
    return member


def create_until_answered(api: Api, tree: Tree, member: dict[str, object]) -> str:
    """Create as a controller does: retried through outages (503s, the apiserver away) until stored or
    refused for the quota; "stored" or the refusal's message."""
    end = time.monotonic() + RECOVERY_DEADLINE
    last = ""
    while time.monotonic() < end:
        try:
            api.core.create_namespaced_pod(tree.namespace, member, _request_timeout=CREATE_TIMEOUT)
        except ApiException as error:
            if error.status == 409:
                return "stored"  # an earlier attempt landed; its answer was lost
            if error.status == 403:
                return str(json.loads(error.body).get("message", ""))
            last = f"{error.status} {error.body}"
        except Exception as error:  # the apiserver away: a controller retries
            last = repr(error)
        else:
            return "stored"
        time.sleep(0.2)  # a controller's backoff between retries
    raise AssertionError(f"no answer but outages for {RECOVERY_DEADLINE:.0f}s, the last: {last}")


GANG_LOWERED_ROOM = 10  # the parent's max lowered mid-race: still room for one gang, not two
MOVER = "mover"  # a plain pod of the first leaf relabelled to the second mid-race


def gang_faults(cluster: Cluster, tree: Tree) -> dict[str, Callable[[], Fault]]:
    ledger = shared_ledger.ledger_object_name(tree.parent)

    def written() -> None:
        poll(lambda: bool(cluster.api.core.read_namespaced_config_map(ledger, cluster.ledger_namespace)),
             "the race wrote the ledger")

    def overwrite_ledger() -> None:
        written()
        cluster.api.core.patch_namespaced_config_map(ledger, cluster.ledger_namespace,
                                                     {"data": {shared_ledger.LEDGER_DATA_KEY: "{not json"}})

    def delete_ledger() -> None:
        written()  # kept, terminating, by its finalizer, with the gang's reservation in it
        cluster.api.core.delete_namespaced_config_map(ledger, cluster.ledger_namespace)

    def remove_ledger() -> None:
        written()
        # As in the burst above: one replica restarted meanwhile never read the lost object.
        fresh = cluster.replicas[2]
        fresh.stop()
        cluster.api.core.patch_namespaced_config_map(ledger, cluster.ledger_namespace,
                                                     {"metadata": {"finalizers": None}})
        cluster.api.core.delete_namespaced_config_map(ledger, cluster.ledger_namespace)  # gone at once
        fresh.start()

    def lower_max() -> None:
        cluster.api.custom.patch_namespaced_custom_object(
            ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, tree.namespace, ELASTICQUOTA_PLURAL, tree.parent,
            {"spec": {"max": {RATIO: str(100 * GANG_LOWERED_ROOM)}}})

    def move_pod() -> None:
        cluster.api.core.patch_namespaced_pod(MOVER, tree.namespace,
                                              {"metadata": {"labels": {QUOTA_LABEL: tree.leaves[1]}}})

    def pause_writer() -> Fault:
        writer = the_writer(cluster)
        return timed(lambda: os.killpg(writer.pid, signal.SIGSTOP), lambda: os.killpg(writer.pid, signal.SIGCONT),
                     seconds=2 * RESERVATION_TTL + 1)

    return {
        "writer paused": pause_writer,
        "writer's quota service killed": lambda: Fault(
            lambda: os.kill(quota_service_pid(the_writer(cluster).pid), signal.SIGKILL)),
        "apiserver restarted": lambda: Fault(cluster.plane.restart_apiserver),
        "etcd paused": lambda: timed(cluster.plane.pause_etcd, cluster.plane.resume_etcd, seconds=7.0),
        "a forwarder's quota service killed": lambda: Fault(lambda: os.kill(quota_service_pid(
            next(server for server in cluster.replicas if server is not the_writer(cluster)).pid), signal.SIGKILL)),
        "ledger overwritten with garbage": lambda: Fault(overwrite_ledger),
        "ledger deleted": lambda: Fault(delete_ledger),
        "ledger deleted, finalizer removed": lambda: Fault(remove_ledger),
        "max lowered": lambda: Fault(lower_max),
        "a pod moved between the leaves": lambda: Fault(move_pod),
    }


# Instant faults land between the race's first creates and the rest (see once_at); the others beside it.
INSTANT_GANG_FAULTS = {"ledger overwritten with garbage", "ledger deleted", "ledger deleted, finalizer removed",
                       "max lowered", "a pod moved between the leaves"}


@pytest.mark.parametrize("fault_name", ["writer paused", "writer's quota service killed", "apiserver restarted",
                                        "etcd paused", "a forwarder's quota service killed",
                                        "ledger overwritten with garbage", "ledger deleted",
                                        "ledger deleted, finalizer removed", "max lowered",
                                        "a pod moved between the leaves"])
def test_two_gangs_racing_through_a_fault_store_one_whole_and_nothing_of_the_other(cluster_ok: Cluster,
                                                                                   fault_name: str) -> None:
    cluster = cluster_ok
    tree = make_tree(cluster)
    if fault_name == "a pod moved between the leaves":
        # It takes the first leaf's eighth card, then the second's: either gang still fits its leaf.
        assert create(cluster.api, tree, MOVER, tree.leaves[0]) == "stored"
    fault = gang_faults(cluster, tree)[fault_name]()
    gangs = {"gang-a": tree.leaves[0], "gang-b": tree.leaves[1]}
    order = [(gang, index) for index in range(GANG_MEMBERS) for gang in gangs]
    # The ledger faults strike once the race has written the ledger (its gang reservation in it).
    hook = once_at(3, fault, in_thread=fault_name not in INSTANT_GANG_FAULTS)

    def one(position: int) -> tuple[str, str]:
        hook(position)
        gang, index = order[position]
        return gang, create_until_answered(cluster.api, tree, gang_member(f"{gang}-{index}", gang, gangs[gang]))

    with ThreadPoolExecutor(max_workers=len(order)) as pool:
        results = list(pool.map(one, range(len(order))))
    assert fault.over.wait(RECOVERY_DEADLINE), "the fault never ended"
    assert_within_room(cluster.api, tree, GANG_LOWERED_ROOM if fault_name == "max lowered" else ROOM)
    stored = {gang: len(cluster.api.core.list_namespaced_pod(tree.namespace, label_selector=f"app={gang}").items)
              for gang in gangs}
    assert sorted(stored.values()) == [0, GANG_MEMBERS], (stored, results)
