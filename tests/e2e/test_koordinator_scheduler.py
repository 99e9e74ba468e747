"""koord-scheduler itself, from Koordinator's Go module, beside the webhook (issue 35 §3).

A control plane of its own (the session's other tests leave pods and quotas that Koordinator's quota
plugin would count), with Koordinator's CRDs and koord-scheduler running the profile Koordinator
ships. Nodes are written as koordlet and koord-manager would report them: a ``Device`` with the
GPUs and node allocatable in ``koordinator.sh/gpu-*`` (plus ``nvidia.com/gpu`` where the NVIDIA
device plugin runs too). Pods name ``koord-scheduler`` as their scheduler, so kube-scheduler,
which also runs, leaves them alone; Deployments make them, as on a real cluster.

The first test shows the problem the product exists for with nothing of ours installed; the others
show it closed with the webhook as shipped (three strict replicas behind a load balancer). One scene
has an NVIDIA node and an AMD node side by side, both with Koordinator GPUs: the rewrite keeps each
pod on its vendor's node.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from admissionchain import (
    delete_webhook_configurations,
    local_webhook_configurations,
    register_webhook_configurations,
)
from clusterhelpers import (
    DENIED_BY,
    QUOTA_LABEL,
    RATIO,
    create_quota,
    pods_of,
    read_quota,
    scheduling_state,
    wait_until_bound,
    wait_until_unschedulable,
)
from controlplane import CONTROLLERS, REPO_ROOT, Api, Binaries, ControlPlane, create_gpu_node, make_api
from koordinator import (
    GPU_CORE,
    GPU_VENDOR_LABEL,
    KOORD_SCHEDULER_NAME,
    Gpu,
    KoordinatorBuild,
    create_gpu_device,
    device_allocation,
    install_koordinator_crds,
    koordinator_allocatable,
    quota_annotation,
    start_koord_scheduler,
    wait_for,
)
from kubernetes import client as k8s
from loadbalancer import HAProxy, start_replicas_behind_haproxy
from webhookproc import WebhookProcess

from gpuquota_core.canonical import ORIGINAL_RESOURCES_ANNOTATION
from gpuquota_core.quantity import Quantity

GPU = "nvidia.com/gpu"
AMD_GPU = "amd.com/gpu"
TAINT_KEY = "e2e.gpuquota.koord-gpuquota.io/koordinator"
HOSTNAME = "kubernetes.io/hostname"
ROOM = {"cpu": "64", "memory": "512Gi", "pods": "110"}
ZERO = Quantity.parse("0")
GPUQUOTA = Path(sys.executable).with_name("gpuquota")
# koord-scheduler writes quota status and annotations once a second when they change.
QUOTA_STATUS_DEADLINE = 60.0


@dataclass
class Koordinator:
    """The Koordinator test cluster: its control plane, an API handle and koord-scheduler running."""

    plane: ControlPlane
    api: Api
    build: KoordinatorBuild
    apps: k8s.AppsV1Api = field(init=False)

    def __post_init__(self) -> None:
        self.apps = k8s.AppsV1Api(self.api.client)


@contextlib.contextmanager
def running_koordinator(binaries: Binaries, build: KoordinatorBuild, base: Path,
                        controllers: Sequence[str] = CONTROLLERS) -> Iterator[Koordinator]:
    """A control plane of its own running ``controllers``, Koordinator's CRDs, and koord-scheduler."""
    plane = ControlPlane(binaries, base_dir=base, with_controllers=True, controllers=controllers)
    plane.start()
    api = make_api(plane.kubeconfig_path)
    try:
        install_koordinator_crds(api, build)
        start_koord_scheduler(plane, api, build)
        yield Koordinator(plane, api, build)
    finally:
        api.close()
        plane.stop()


@pytest.fixture(scope="module")
def koordinator(control_plane_binaries: Binaries, koordinator_build: KoordinatorBuild,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Koordinator]:
    with running_koordinator(control_plane_binaries, koordinator_build,
                             tmp_path_factory.mktemp("koordinator-plane")) as started:
        yield started


@dataclass(frozen=True)
class Scene:
    """One test's namespace and GPU nodes, tainted so that only this test's pods go there."""

    namespace: str
    toleration: dict[str, str]
    nodes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """What a GPU node runs: ``both`` koordlet and the vendor's device plugin (a Device, both families in
    allocatable), ``koordinator`` only koordlet (a Device, koordinator.sh/gpu-* only), ``vendor`` only
    the device plugin (the vendor's name, no Device); how many cards it has; and whose cards they
    are (``vendor``: the gpu-vendor label koordlet reports on the Device and koord-manager copies to
    the Node, None for none, which Koordinator reads as NVIDIA)."""

    runs: str
    cards: int = 4
    vendor: str | None = None

    @property
    def device_plugin_resource(self) -> str:
        return AMD_GPU if self.vendor == "amd" else GPU


BOTH, KOORDINATOR_ONLY, VENDOR_ONLY = Layout("both"), Layout("koordinator"), Layout("vendor")


def scene(koordinator: Koordinator, layouts: Mapping[str, Layout]) -> Scene:
    """A namespace and one node per ``layouts`` entry (role -> layout), tainted for this test alone."""
    namespace = f"koord-{uuid.uuid4().hex[:6]}"
    koordinator.api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    taint = {"key": TAINT_KEY, "value": namespace, "effect": "NoSchedule"}
    nodes: dict[str, str] = {}
    for role, layout in layouts.items():
        name = f"{role}-{namespace}"
        gpus = [Gpu(minor) for minor in range(layout.cards)]
        allocatable: dict[str, str] = dict(ROOM)
        if layout.runs in ("both", "vendor"):
            allocatable[layout.device_plugin_resource] = str(layout.cards)
        if layout.runs in ("both", "koordinator"):
            allocatable.update(koordinator_allocatable(gpus, layout.vendor))
            create_gpu_device(koordinator.api, name, gpus, layout.vendor)
        labels = {GPU_VENDOR_LABEL: layout.vendor} if layout.vendor is not None else {}
        create_gpu_node(koordinator.api.core, name, allocatable, labels=labels, taints=[taint])
        nodes[role] = name
    return Scene(namespace, {"key": TAINT_KEY, "operator": "Equal", "value": namespace, "effect": "NoSchedule"},
                 nodes)


def deployment(name: str, where: Scene, resources: Mapping[str, str], *, replicas: int, quota: str | None,
               node_selector: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``replicas`` pods for koord-scheduler, each with ``resources`` as requests and limits and 1 cpu,
    labelled into ``quota`` (None: no label, Koordinator's fallback decides)."""
    requests = {"cpu": "1", **resources}
    spec: dict[str, Any] = {
        "schedulerName": KOORD_SCHEDULER_NAME,
        "tolerations": [where.toleration],
        "containers": [{"name": "main", "image": "registry.example/train:1",
                        "resources": {"requests": requests, "limits": dict(requests)}}],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    labels = {"app": name, **({QUOTA_LABEL: quota} if quota else {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}


def scheduler_used(api: Api, namespace: str, name: str) -> dict[str, str]:
    """koord-scheduler's own account of the quota: ``status.used`` as it last wrote it."""
    used = read_quota(api, namespace, name).get("status", {}).get("used") or {}
    return {key: str(value) for key, value in used.items()}


def gpu_allocations(pod: k8s.V1Pod) -> list[dict[str, Any]]:
    """The GPUs DeviceShare allocated to ``pod`` (its device-allocated annotation), [] without any."""
    allocation = device_allocation(pod) or {}
    return list(allocation.get("gpu", []))


def two_card_quota(koordinator: Koordinator, where: Scene) -> str:
    """A leaf ElasticQuota under Koordinator's root: 10 cpu and two cards, written as gpu-memory-ratio."""
    name = f"team-{where.namespace}"
    create_quota(koordinator.api, where.namespace, name, {"cpu": "10", RATIO: "200"})
    return name


def test_without_the_webhook_a_ratio_quota_does_not_see_whole_card_pods_and_koordinator_only_nodes_strand_them(
        koordinator: Koordinator) -> None:
    where = scene(koordinator, {"both": BOTH, "koordinator": KOORDINATOR_ONLY})
    quota = two_card_quota(koordinator, where)

    # On a node with both families and a Device, all three are bound with a GPU each: the quota of
    # two cards never saw them.
    koordinator.apps.create_namespaced_deployment(where.namespace, deployment(
        "overcommit", where, {GPU: "1"}, replicas=3, quota=quota, node_selector={HOSTNAME: where.nodes["both"]}))
    pods = wait_until_bound(koordinator.api, where.namespace, "overcommit", 3)
    minors = sorted(entry["minor"] for pod in pods for entry in gpu_allocations(pod))
    assert len(minors) == 3 and len(set(minors)) == 3, [scheduling_state(pod) for pod in pods]
    used = wait_for(lambda: (lambda used: used if used.get("cpu") == "3" else None)(
        scheduler_used(koordinator.api, where.namespace, quota)),
        f"koord-scheduler's status.used of {quota} counts three pods' cpu", QUOTA_STATUS_DEADLINE)
    assert nonzero(used) == {"cpu": Quantity.parse("3")}, f"the quota counted a GPU: {used}"

    # On a node that reports only Koordinator's names, the vendor request never fits. (A quota of its
    # own, in GPU names only: koord-scheduler's quota plugin refreshes a quota's runtime from the
    # requests it has seen, and could refuse the pod for cpu before its node filter runs.)
    gpu_only = f"gpu-only-{where.namespace}"
    create_quota(koordinator.api, where.namespace, gpu_only, {RATIO: "200"})
    koordinator.apps.create_namespaced_deployment(where.namespace, deployment(
        "stranded", where, {GPU: "1"}, replicas=1, quota=gpu_only,
        node_selector={HOSTNAME: where.nodes["koordinator"]}))
    condition = wait_until_unschedulable(koordinator.api, where.namespace, "stranded")
    assert "Insufficient nvidia.com/gpu" in condition.message, condition.message


@dataclass
class ShippedWebhook:
    servers: list[WebhookProcess]
    balancer: HAProxy
    documents: list[dict[str, Any]]


@pytest.fixture(scope="module")
def shipped_webhook(koordinator: Koordinator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShippedWebhook]:
    """The webhook as shipped: three strict replicas behind HAProxy, through the project's configurations."""
    ledger_namespace = f"gpuquota-ledger-{uuid.uuid4().hex[:6]}"
    koordinator.api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ledger_namespace)))
    serve_args = ["--kubeconfig", str(koordinator.plane.kubeconfig_path), "--workers", "1", "--threads", "8",
                  "--accounting", "strict", "--ledger-namespace", ledger_namespace]
    servers, balancer = start_replicas_behind_haproxy(tmp_path_factory.mktemp("koordinator-webhook"), serve_args)
    # Named apart from the shipped "gpuquota-webhook", which the install test applies and removes.
    documents = local_webhook_configurations(balancer.url, servers[0].ca_bundle, name_suffix="-shipped")
    try:
        register_webhook_configurations(koordinator.api, documents)
        yield ShippedWebhook(servers, balancer, documents)
    finally:
        delete_webhook_configurations(koordinator.api, documents)
        balancer.stop()
        for server in servers:
            server.stop()


def wait_until_quota_enforced(koordinator: Koordinator, where: Scene, quota: str, node: str, cards: int = 3) -> None:
    """Dry-run creates of a pod of ``cards`` cards, more than ``quota`` holds (nothing reserved), until the
    webhook refuses it for ``quota``: every replica behind the balancer has the quota and the node in its watch."""
    pod = one_pod_of(deployment("probe", where, {GPU: str(cards)}, replicas=1, quota=quota,
                                node_selector={HOSTNAME: node}))
    streak = [0]

    def refused_three_times_in_a_row() -> bool:
        try:
            koordinator.api.core.create_namespaced_pod(where.namespace, pod, dry_run="All")
            streak[0] = 0
        except k8s.exceptions.ApiException as error:
            streak[0] = streak[0] + 1 if f"exceeded quota: {where.namespace}/{quota}," in str(error.body) else 0
        return streak[0] >= 3

    wait_for(refused_three_times_in_a_row, f"every replica enforces {quota}")


def failed_creates(koordinator: Koordinator, namespace: str, app: str) -> list[str]:
    """The FailedCreate events of ``app``'s ReplicaSet: why the controller could not store a pod."""
    replica_sets = koordinator.apps.list_namespaced_replica_set(namespace, label_selector=f"app={app}").items
    messages: list[str] = []
    for replica_set in replica_sets:
        events = koordinator.api.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={replica_set.metadata.name},reason=FailedCreate")
        messages.extend(event.message for event in events.items)
    return messages


def test_with_the_webhook_the_third_pod_is_refused_and_koord_scheduler_counts_the_two_in_the_quota(
        koordinator: Koordinator, shipped_webhook: ShippedWebhook) -> None:
    where = scene(koordinator, {"both": BOTH})
    quota = two_card_quota(koordinator, where)
    node = where.nodes["both"]
    wait_until_quota_enforced(koordinator, where, quota, node)

    koordinator.apps.create_namespaced_deployment(where.namespace, deployment(
        "fixed", where, {GPU: "1"}, replicas=3, quota=quota, node_selector={HOSTNAME: node}))

    refusals = wait_for(lambda: failed_creates(koordinator, where.namespace, "fixed"),
                        "a FailedCreate event for the third pod")
    # A replica whose pod watch has not yet seen the second pod counts it from the ledger instead.
    expected = re.compile(re.escape(f"Error creating: {DENIED_BY}exceeded quota: {where.namespace}/{quota}, "
                                    f"requested: {RATIO}=100, used: {RATIO}=200")
                          + r"( \((100|200) of it reserved by admissions not yet seen\))?"
                          + re.escape(f", limited: {RATIO}=200"))
    assert all(expected.fullmatch(message) for message in refusals), refusals
    pods = wait_until_bound(koordinator.api, where.namespace, "fixed", 2)
    for pod in pods:
        requests = pod.spec.containers[0].resources.requests
        assert requests == {"cpu": "1", GPU_CORE: "100", RATIO: "100"}, requests
        assert ORIGINAL_RESOURCES_ANNOTATION in (pod.metadata.annotations or {})
        (allocated,) = gpu_allocations(pod)
        assert allocated["resources"][GPU_CORE] == "100" and allocated["resources"][RATIO] == "100", allocated
    assert len({gpu_allocations(pod)[0]["minor"] for pod in pods}) == 2
    assert len(pods_of(koordinator.api, where.namespace, "fixed")) == 2

    used = wait_for(lambda: (lambda used: used if used.get(RATIO) == "200" else None)(
        scheduler_used(koordinator.api, where.namespace, quota)),
        f"koord-scheduler's status.used of {quota} shows two cards", QUOTA_STATUS_DEADLINE)
    assert used == {"cpu": "2", RATIO: "200"}
    stored = read_quota(koordinator.api, where.namespace, quota)
    assert quota_annotation(stored, "request").get(RATIO) == "200", stored["metadata"].get("annotations")



# -- d. placement --------------------------------------------------------------------------------

def test_pods_pinned_to_a_vendor_only_node_keep_nvidia_gpu_and_koord_scheduler_binds_them_there(
        koordinator: Koordinator, shipped_webhook: ShippedWebhook) -> None:
    where = scene(koordinator, {"vendor": VENDOR_ONLY, "both": BOTH})
    quota = two_card_quota(koordinator, where)
    wait_until_quota_enforced(koordinator, where, quota, where.nodes["both"])

    koordinator.apps.create_namespaced_deployment(where.namespace, deployment(
        "pinned", where, {GPU: "1"}, replicas=2, quota=quota, node_selector={HOSTNAME: where.nodes["vendor"]}))

    pods = wait_until_bound(koordinator.api, where.namespace, "pinned", 2)
    for pod in pods:
        assert pod.spec.node_name == where.nodes["vendor"]
        assert pod.spec.containers[0].resources.requests == {"cpu": "1", GPU: "1"}
        assert ORIGINAL_RESOURCES_ANNOTATION not in (pod.metadata.annotations or {})
        # No Device on that node: DeviceShare lets NodeResourcesFit decide and allocates nothing.
        assert gpu_allocations(pod) == [], device_allocation(pod)
    # Counted in canonical units all the same: both cards of the quota are taken.
    status, message = refusal_of(koordinator, where.namespace, one_pod_of(deployment(
        "third", where, {GPU: "1"}, replicas=1, quota=quota, node_selector={HOSTNAME: where.nodes["vendor"]})))
    assert status == 403 and message.startswith(DENIED_BY + f"exceeded quota: {where.namespace}/{quota}, "), message


def test_the_rewrite_keeps_the_gpu_vendor_amd_pods_bind_to_the_amd_node_and_nvidia_pods_to_the_nvidia_node(
        koordinator: Koordinator, shipped_webhook: ShippedWebhook) -> None:
    # Both nodes report Koordinator GPUs, so both advertise the canonical names a rewrite asks for.
    # The NVIDIA node carries no vendor label (Koordinator reads it as NVIDIA); the AMD one does.
    where = scene(koordinator, {"nvidia": BOTH, "amd": Layout("both", vendor="amd")})
    amd_only = [{"matchExpressions": [{"key": GPU_VENDOR_LABEL, "operator": "In", "values": ["amd"]}]}]
    nvidia_or_unlabelled = [
        {"matchExpressions": [{"key": GPU_VENDOR_LABEL, "operator": "In", "values": ["nvidia"]}]},
        {"matchExpressions": [{"key": GPU_VENDOR_LABEL, "operator": "DoesNotExist"}]}]
    wait_until_kept_on_vendor(koordinator, where, AMD_GPU, amd_only)
    wait_until_kept_on_vendor(koordinator, where, GPU, nvidia_or_unlabelled)

    for app, resource in (("amd-train", AMD_GPU), ("nvidia-train", GPU)):
        koordinator.apps.create_namespaced_deployment(where.namespace, deployment(
            app, where, {resource: "1"}, replicas=2, quota=None))
    for app, node, terms in (("amd-train", where.nodes["amd"], amd_only),
                             ("nvidia-train", where.nodes["nvidia"], nvidia_or_unlabelled)):
        pods = wait_until_bound(koordinator.api, where.namespace, app, 2)
        for pod in pods:
            assert pod.spec.node_name == node, (app, scheduling_state(pod))
            assert pod.spec.containers[0].resources.requests == {"cpu": "1", GPU_CORE: "100", RATIO: "100"}
            assert required_node_terms(pod) == terms, app
            (allocated,) = gpu_allocations(pod)
            assert allocated["resources"][GPU_CORE] == "100", allocated
        assert len({gpu_allocations(pod)[0]["minor"] for pod in pods}) == 2, app


def required_node_terms(pod: k8s.V1Pod) -> list[dict[str, Any]]:
    """The stored pod's required node affinity terms, as JSON."""
    affinity = pod.spec.affinity
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution if affinity else None
    if required is None:
        return []
    terms: list[dict[str, Any]] = k8s.ApiClient().sanitize_for_serialization(required.node_selector_terms)
    return terms


def wait_until_kept_on_vendor(koordinator: Koordinator, where: Scene, resource: str,
                              terms: list[dict[str, Any]]) -> None:
    """Dry-run creates of a pod asking one card of ``resource`` until every replica rewrites it with
    ``terms``: their node watch has both vendors' nodes."""
    probe = one_pod_of(deployment("probe", where, {resource: "1"}, replicas=1, quota=None))
    streak = [0]

    def kept_three_times_in_a_row() -> bool:
        stored = koordinator.api.core.create_namespaced_pod(where.namespace, probe, dry_run="All")
        kept = GPU_CORE in (stored.spec.containers[0].resources.requests or {}) and required_node_terms(
            stored) == terms
        streak[0] = streak[0] + 1 if kept else 0
        return streak[0] >= 3

    wait_for(kept_three_times_in_a_row, f"every replica keeps {resource} pods on their vendor's nodes")


def test_gpu_shares_are_packed_by_device_share_two_halves_to_a_card_and_a_fifth_half_waits_for_room(
        koordinator: Koordinator, shipped_webhook: ShippedWebhook) -> None:
    where = scene(koordinator, {"small": Layout("koordinator", cards=2)})
    node = where.nodes["small"]
    wait_until_rewritten_for(koordinator, where, node)

    koordinator.apps.create_namespaced_deployment(where.namespace, deployment(
        "halves", where, {"koordinator.sh/gpu": "50"}, replicas=4, quota=None, node_selector={HOSTNAME: node}))

    pods = wait_until_bound(koordinator.api, where.namespace, "halves", 4)
    per_card: dict[int, int] = {}
    for pod in pods:
        assert pod.spec.containers[0].resources.requests == {"cpu": "1", GPU_CORE: "50", RATIO: "50"}
        (allocated,) = gpu_allocations(pod)
        assert allocated["resources"][GPU_CORE] == "50" and allocated["resources"][RATIO] == "50", allocated
        per_card[allocated["minor"]] = per_card.get(allocated["minor"], 0) + 50
    assert per_card == {0: 100, 1: 100}

    koordinator.apps.patch_namespaced_deployment_scale("halves", where.namespace, {"spec": {"replicas": 5}})
    waiting = wait_for(lambda: [pod for pod in pods_of(koordinator.api, where.namespace, "halves")
                                if not pod.spec.node_name and pod_scheduled(pod) is not None],
                       "the fifth half waits for a card")
    condition = pod_scheduled(waiting[0])
    # The node's allocatable (what koord-manager sums from the Device) is used up before DeviceShare
    # looks at the cards.
    assert condition is not None and f"1 Insufficient {GPU_CORE}, 1 Insufficient {RATIO}" in condition.message, \
        condition.message


def pod_scheduled(pod: k8s.V1Pod) -> k8s.V1PodCondition | None:
    """The pod's PodScheduled condition once a scheduler has given up on it for now, else None."""
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition
    return None


def one_pod_of(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod ``workload``'s controller would create, as a bare Pod."""
    template = workload["spec"]["template"]
    metadata = {"name": workload["metadata"]["name"], **template["metadata"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def refusal_of(koordinator: Koordinator, namespace: str, pod: dict[str, Any]) -> tuple[int, str]:
    """The status and message of the apiserver's refusal of a dry-run create of ``pod``; (0, "admitted")."""
    try:
        koordinator.api.core.create_namespaced_pod(namespace, pod, dry_run="All")
    except k8s.exceptions.ApiException as error:
        return error.status, json.loads(error.body)["message"]
    return 0, "admitted"


def wait_until_rewritten_for(koordinator: Koordinator, where: Scene, node: str) -> None:
    """Dry-run creates pinned to ``node`` until every replica rewrites them: their node watch has it."""
    probe = one_pod_of(deployment("probe", where, {GPU: "1"}, replicas=1, quota=None,
                                  node_selector={HOSTNAME: node}))
    streak = [0]

    def rewritten_three_times_in_a_row() -> bool:
        stored = koordinator.api.core.create_namespaced_pod(where.namespace, probe, dry_run="All")
        rewritten = GPU_CORE in (stored.spec.containers[0].resources.requests or {})
        streak[0] = streak[0] + 1 if rewritten else 0
        return streak[0] >= 3

    wait_for(rewritten_three_times_in_a_row, f"every replica rewrites pods pinned to {node}")


# -- c. one account with the scheduler -----------------------------------------------------------

# Every spelling a user writes, each a valid request of one pod; the nodes of this scene all
# advertise the canonical names, so the webhook rewrites each into them (or leaves it, when it
# already is canonical, or asks for nothing).
SPELLINGS: tuple[dict[str, str], ...] = (
    {GPU: "1"}, {GPU: "2"},
    {"koordinator.sh/gpu": "50"}, {"koordinator.sh/gpu": "100"}, {"koordinator.sh/gpu": "200"},
    {RATIO: "50"}, {RATIO: "25"},
    {GPU_CORE: "100", RATIO: "100"}, {GPU_CORE: "50", RATIO: "50"},
    {"kubernetes.io/gpu-core": "100", "kubernetes.io/gpu-memory-ratio": "100"}, {"kubernetes.io/gpu": "50"},
    {GPU: "0"},
)
SEED = 35
PODS = 200


@dataclass(frozen=True)
class Tree:
    namespace: str
    parent: str
    leaves: tuple[str, ...]


def two_level_tree(koordinator: Koordinator, namespace: str) -> Tree:
    """A parent of 30 cards over three leaves: two of 16 cards reached by label and one named like the
    namespace (Koordinator's fallback for a pod without a label), of 8. The leaves together could take
    40, so the parent binds first."""
    parent = f"org-{namespace}"
    canonical = {GPU_CORE: "3000", RATIO: "3000"}
    create_quota(koordinator.api, namespace, parent, canonical,
                 labels={"quota.scheduling.koordinator.sh/is-parent": "true"})
    leaves = (f"a-{namespace}", f"b-{namespace}", namespace)
    for leaf, cards in zip(leaves, (16, 16, 8), strict=True):
        create_quota(koordinator.api, namespace, leaf, {GPU_CORE: str(100 * cards), RATIO: str(100 * cards)},
                     labels={"quota.scheduling.koordinator.sh/parent": parent})
    return Tree(namespace, parent, leaves)


def our_view(koordinator: Koordinator) -> dict[str, Any]:
    """``gpuquota quota -A -o json --pods`` of the live cluster, as a user runs it."""
    result = subprocess.run([str(GPUQUOTA), "quota", "-A", "-o", "json", "--pods",
                             "--kubeconfig", str(koordinator.plane.kubeconfig_path)],
                            capture_output=True, text=True, timeout=120, check=True)
    view: dict[str, Any] = json.loads(result.stdout)
    return view


def disagreements(koordinator: Koordinator, tree: Tree) -> list[str]:
    """Where our quota view and koord-scheduler's status.used differ, quota by quota and name by name."""
    view = {quota["name"]: quota for quota in our_view(koordinator)["quotas"]}
    found: list[str] = []
    for name in (tree.parent, *tree.leaves):
        theirs = scheduler_used(koordinator.api, tree.namespace, name)
        for row in view[name]["resources"]:
            ours, scheduler = Quantity.parse(row["used"]), Quantity.parse(theirs.get(row["name"], "0"))
            if ours != scheduler:
                found.append(f"{name} {row['name']}: gpuquota {ours}, koord-scheduler {scheduler}")
    return found


def nonzero(resources: Mapping[str, str]) -> dict[str, Quantity]:
    return {name: Quantity.parse(value) for name, value in resources.items() if Quantity.parse(value) != ZERO}


def test_seeded_workloads_are_counted_alike_by_gpuquota_and_koord_scheduler_and_no_quota_ends_above_its_max(
        koordinator: Koordinator, shipped_webhook: ShippedWebhook) -> None:
    where = scene(koordinator, {f"gpu{index}": Layout("both", cards=8) for index in range(6)})
    tree = two_level_tree(koordinator, where.namespace)
    for node in where.nodes.values():
        wait_until_rewritten_for(koordinator, where, node)
    wait_until_quota_enforced(koordinator, where, tree.leaves[0], next(iter(where.nodes.values())), cards=17)
    chooser = random.Random(SEED)
    targets = (tree.leaves[0], tree.leaves[1], None)
    outcomes: dict[str, str] = {}
    for index in range(PODS):
        resources = chooser.choice(SPELLINGS)
        pod = one_pod_of(deployment(f"p{index}", where, resources, replicas=1, quota=chooser.choice(targets)))
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m", **resources},
                                                     "limits": {"cpu": "100m", **resources}}
        try:
            koordinator.api.core.create_namespaced_pod(where.namespace, pod)
            outcomes[pod["metadata"]["name"]] = "admitted"
        except k8s.exceptions.ApiException as error:
            message = json.loads(error.body)["message"]
            assert error.status == 403 and "exceeded quota: " in message, (resources, message)
            outcomes[pod["metadata"]["name"]] = "refused"
    admitted = sum(1 for outcome in outcomes.values() if outcome == "admitted")
    assert 0 < admitted < PODS, outcomes

    # Every admitted pod is bound: 48 cards on the nodes, at most 30 admitted.
    def all_bound() -> list[k8s.V1Pod] | None:
        pods = koordinator.api.core.list_namespaced_pod(where.namespace).items
        return pods if len(pods) == admitted and all(pod.spec.node_name for pod in pods) else None

    try:
        pods = wait_for(all_bound, f"all {admitted} admitted pods bound by koord-scheduler", 120.0)
    except AssertionError as error:
        pending = [scheduling_state(pod) for pod in koordinator.api.core.list_namespaced_pod(where.namespace).items
                   if not pod.spec.node_name]
        raise AssertionError(f"{error}; held Pending while cards are free: {pending}") from None

    # Per pod: what we charge is what koord-scheduler counts, the stored request in the quota's names.
    charged = {pod["name"]: pod for quota in our_view(koordinator)["quotas"] for pod in quota.get("pods", [])}
    for pod in pods:
        requests = pod.spec.containers[0].resources.requests or {}
        counted = {name: value for name, value in requests.items() if name in (GPU_CORE, RATIO)}
        ours = charged.get(pod.metadata.name, {}).get("requests", {})
        assert nonzero(ours) == nonzero(counted), f"{pod.metadata.name}: {requests} charged as {ours}"

    # Per quota: our used equals koord-scheduler's status.used, once it has written it.
    differences: list[str] = []

    def agree() -> bool:
        differences[:] = disagreements(koordinator, tree)
        return not differences

    try:
        wait_for(agree, "gpuquota and koord-scheduler agree on every quota", QUOTA_STATUS_DEADLINE)
    except AssertionError:
        raise AssertionError(f"they differ: {differences}") from None
    for quota in our_view(koordinator)["quotas"]:
        if quota["name"] in (tree.parent, *tree.leaves):
            for row in quota["resources"]:
                assert Quantity.parse(row["used"]) <= Quantity.parse(row["limit"]), (quota["name"], row)


# -- f. migration under the real scheduler -------------------------------------------------------

IGNORE_LABEL = "gpuquota.koord-gpuquota.io/ignore"


def gpuquota(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, against the live cluster."""
    return subprocess.run([str(GPUQUOTA), *args], capture_output=True, text=True, timeout=120, check=False)


def bare_pod(name: str, where: Scene, resources: Mapping[str, str], quota: str, node: str) -> dict[str, Any]:
    return one_pod_of(deployment(name, where, resources, replicas=1, quota=quota, node_selector={HOSTNAME: node}))


def koordinator_percent(used: Mapping[str, str]) -> Quantity:
    """koord-scheduler's used in percent of a card: a whole card of a vendor name is 100, a
    gpu-memory-ratio point is 1."""
    whole_cards = Quantity.parse(used.get(GPU, "0"))
    return sum((whole_cards for _ in range(100)), Quantity.parse(used.get(RATIO, "0")))


def test_migrating_a_legacy_quota_with_running_pods_keeps_koord_scheduler_counting_every_card_and_rolls_back(
        koordinator: Koordinator, shipped_webhook: ShippedWebhook, tmp_path: Path) -> None:
    where = scene(koordinator, {"both": BOTH})
    node, kubeconfig = where.nodes["both"], str(koordinator.plane.kubeconfig_path)
    quota = f"legacy-{where.namespace}"
    create_quota(koordinator.api, where.namespace, quota, {GPU: "4"})
    # Two pods that ran before the webhook judged this namespace: they store nvidia.com/gpu.
    koordinator.api.core.patch_namespace(where.namespace, {"metadata": {"labels": {IGNORE_LABEL: "true"}}})
    for index in range(2):
        koordinator.api.core.create_namespaced_pod(where.namespace, bare_pod(f"old-{index}", where, {GPU: "1"},
                                                                              quota, node))
    koordinator.api.core.patch_namespace(where.namespace, {"metadata": {"labels": {IGNORE_LABEL: None}}})
    wait_for(lambda: scheduler_used(koordinator.api, where.namespace, quota).get(GPU) == "2",
             "koord-scheduler counts the two running vendor pods", QUOTA_STATUS_DEADLINE)
    original = read_quota(koordinator.api, where.namespace, quota)["spec"]

    planned = gpuquota("migrate", "plan", "--kubeconfig", kubeconfig, "-o", "json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    mine = [step for step in plan["steps"] if step["quota"] == quota]
    assert [(step["phase"], step["after"]["max"]) for step in mine] == [
        ("add-canonical", {GPU: "4", GPU_CORE: "400", RATIO: "400"})]
    assert any(item["name"] == quota and item["check"] == "vendor-pods-running" for item in plan["revisit"])

    backup = tmp_path / "backup.yaml"
    applied = gpuquota("migrate", "apply", "--kubeconfig", kubeconfig, "-n", where.namespace, "--backup", str(backup))
    assert applied.returncode == 0, applied.stderr
    # koord-scheduler still counts both running cards, and a new pod, rewritten by the webhook, in
    # the canonical names beside them: three cards, as gpuquota counts them.
    koordinator.api.core.create_namespaced_pod(where.namespace, bare_pod("new", where, {GPU: "1"}, quota, node))
    used = wait_for(lambda: (lambda used: used if used.get(RATIO) == "100" else None)(
        scheduler_used(koordinator.api, where.namespace, quota)), "koord-scheduler counts the new pod",
        QUOTA_STATUS_DEADLINE)
    assert nonzero(used) == {GPU: Quantity.parse("2"), GPU_CORE: Quantity.parse("100"), RATIO: Quantity.parse("100")}
    ours = {quota_view["name"]: quota_view for quota_view in our_view(koordinator)["quotas"]}[quota]
    (ratio_row,) = [row for row in ours["resources"] if row["name"] == RATIO]
    assert Quantity.parse(ratio_row["used"]) == koordinator_percent(used) == Quantity.parse("300")

    rolled_back = gpuquota("migrate", "rollback", "-f", str(backup), "--kubeconfig", kubeconfig)
    assert rolled_back.returncode == 0, rolled_back.stderr
    assert read_quota(koordinator.api, where.namespace, quota)["spec"] == original

    # Once the vendor pods are replaced through the webhook, the next plan drops the vendor key.
    applied = gpuquota("migrate", "apply", "--kubeconfig", kubeconfig, "-n", where.namespace,
                       "--backup", str(tmp_path / "again.yaml"))
    assert applied.returncode == 0, applied.stderr
    for index in range(2):
        koordinator.api.core.delete_namespaced_pod(f"old-{index}", where.namespace, grace_period_seconds=0)
        koordinator.api.core.create_namespaced_pod(where.namespace, bare_pod(f"old-{index}", where, {GPU: "1"},
                                                                              quota, node))
    applied = gpuquota("migrate", "apply", "--kubeconfig", kubeconfig, "-n", where.namespace,
                       "--backup", str(tmp_path / "last.yaml"))
    assert applied.returncode == 0, applied.stderr
    assert read_quota(koordinator.api, where.namespace, quota)["spec"]["max"] == {GPU_CORE: "400", RATIO: "400"}
    used = wait_for(lambda: (lambda used: used if used.get(RATIO) == "300" else None)(
        scheduler_used(koordinator.api, where.namespace, quota)), "koord-scheduler counts three cards in ratio",
        QUOTA_STATUS_DEADLINE)
    assert koordinator_percent(used) == Quantity.parse("300")


# -- installing beside Koordinator (§2) ----------------------------------------------------------

def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    kubectl_path = shutil.which("kubectl")
    assert kubectl_path, "kubectl is required (hack/install-test-tools.sh installs it)"
    return subprocess.run([kubectl_path, *args], input=stdin, capture_output=True, text=True, timeout=120,
                          check=False, cwd=REPO_ROOT)


def test_our_manifests_apply_server_side_beside_koordinators_crds_and_webhook_configurations(
        koordinator: Koordinator) -> None:
    kubeconfig = str(koordinator.plane.kubeconfig_path)
    theirs = kubectl("kustomize", str(koordinator.build.webhook_dir))
    assert theirs.returncode == 0, theirs.stderr
    koordinator_configurations = [document for document in yaml.safe_load_all(theirs.stdout)
                                  if document and document["kind"].endswith("WebhookConfiguration")]
    crd_name = "elasticquotas.scheduling.sigs.k8s.io"
    before = koordinator.api.apiextensions.read_custom_resource_definition(crd_name)
    ours: list[dict[str, Any]] = []
    try:
        applied = kubectl("apply", "--server-side", "--kubeconfig", kubeconfig, "-f", "-",
                          stdin=yaml.safe_dump_all(koordinator_configurations))
        assert applied.returncode == 0, applied.stderr
        for step in ("manifests/overlays/self-managed", "manifests/webhooks"):
            rendered = kubectl("kustomize", step)
            assert rendered.returncode == 0, rendered.stderr
            ours.extend(document for document in yaml.safe_load_all(rendered.stdout) if document)
            applied = kubectl("apply", "--server-side", "--kubeconfig", kubeconfig, "-f", "-", stdin=rendered.stdout)
            assert applied.returncode == 0, f"{step}:\n{applied.stdout}\n{applied.stderr}"

        after = koordinator.api.apiextensions.read_custom_resource_definition(crd_name)
        assert after.metadata.resource_version == before.metadata.resource_version, "Koordinator's CRD was changed"
        stored = {configuration.metadata.name for configuration in
                  koordinator.api.admissionregistration.list_validating_webhook_configuration().items}
        assert {c["metadata"]["name"] for c in koordinator_configurations
                if c["kind"] == "ValidatingWebhookConfiguration"} | {"gpuquota-webhook"} <= stored
    finally:
        # Both sets point at Services nothing serves here: leave no fail-closed webhook behind.
        for document in [*koordinator_configurations, *ours]:
            if document["kind"] == "MutatingWebhookConfiguration":
                koordinator.api.admissionregistration.delete_mutating_webhook_configuration(document["metadata"]["name"])
            elif document["kind"] == "ValidatingWebhookConfiguration":
                koordinator.api.admissionregistration.delete_validating_webhook_configuration(
                    document["metadata"]["name"])


# -- g. the differences table, against koord-scheduler as it is -----------------------------------

def ignored_scene(koordinator: Koordinator, layouts: Mapping[str, Layout]) -> Scene:
    """A scene whose namespace the webhook does not judge: what Koordinator alone does."""
    where = scene(koordinator, layouts)
    koordinator.api.core.patch_namespace(where.namespace, {"metadata": {"labels": {IGNORE_LABEL: "true"}}})
    return where


def test_koord_scheduler_holds_a_count_past_its_int64_range_pending_where_gpuquota_refuses_it(
        koordinator: Koordinator, shipped_webhook: ShippedWebhook) -> None:
    where = ignored_scene(koordinator, {"both": BOTH})
    huge = {"amd.com/gpu": "92233720368548"}
    koordinator.apps.create_namespaced_deployment(where.namespace, deployment(
        "huge", where, huge, replicas=1, quota=None, node_selector={HOSTNAME: where.nodes["both"]}))

    condition = wait_until_unschedulable(koordinator.api, where.namespace, "huge")
    assert condition.reason == "Unschedulable", condition.message

    judged = scene(koordinator, {"both": BOTH})
    status, message = refusal_of(koordinator, judged.namespace, bare_pod(
        "huge", judged, huge, f"none-{judged.namespace}", judged.nodes["both"]))
    assert status == 422 and message.startswith(
        f'{DENIED_BY}container "main" resources.requests[amd.com/gpu]: 92233720368548 is larger than '
        "92233720368547, beyond what the scheduler can count [rule: out-of-range]"), message


def test_koord_scheduler_without_the_parent_check_binds_past_a_parents_max(koordinator: Koordinator) -> None:
    """Koordinator's defaults (EnableCheckParentQuota off): a parent of two cards over two leaves of two.
    One pod at a time, each bound before the next: the leaves' runtime shares are recomputed from
    their requests, and what a leaf already holds is never taken back, so a third card is bound."""
    where = ignored_scene(koordinator, {"both": BOTH})
    parent = f"org-{where.namespace}"
    create_quota(koordinator.api, where.namespace, parent, {GPU_CORE: "200", RATIO: "200"},
                 labels={"quota.scheduling.koordinator.sh/is-parent": "true"})
    leaves = [f"{side}-{where.namespace}" for side in ("a", "b")]
    for leaf in leaves:
        create_quota(koordinator.api, where.namespace, leaf, {GPU_CORE: "200", RATIO: "200"},
                     labels={"quota.scheduling.koordinator.sh/parent": parent})

    for name, leaf in (("a0", leaves[0]), ("a1", leaves[0]), ("b0", leaves[1])):
        koordinator.apps.create_namespaced_deployment(where.namespace, deployment(
            name, where, {GPU_CORE: "100", RATIO: "100"}, replicas=1, quota=leaf,
            node_selector={HOSTNAME: where.nodes["both"]}))
        # A first attempt may meet a runtime not yet raised for the new request; it is retried.
        wait_until_bound(koordinator.api, where.namespace, name, 1)

    used = wait_for(lambda: (lambda used: used if used.get(RATIO) == "300" else None)(
        scheduler_used(koordinator.api, where.namespace, parent)), f"{parent} used shows three cards")
    assert Quantity.parse(used[RATIO]) > Quantity.parse("200")
