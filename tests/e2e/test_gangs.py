"""Gangs admitted whole or not at all, proven with koord-scheduler (Coscheduling and ElasticQuota as
Koordinator ships them) and the webhook as shipped: three strict replicas with the writer Lease.

The deadlock this closes: a webhook that charges a quota pod by pod as pods are stored admits two
gangs under one quota each in part (five and five of eight under room for ten), and koord-scheduler,
which places a gang only whole, then binds neither, while their stored pods hold the quota for ever.
With gang reservations, the first member of a gang takes the room of its whole minimum or is
refused, so one gang is stored whole and bound, and no member of the other is stored until room
returns.

There is no kubelet in the test cluster: a pod "ends" when the test writes its status as a kubelet
would (phase Succeeded).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from admissionchain import delete_webhook_configurations, local_webhook_configurations, register_webhook_configurations
from clusterhelpers import DENIED_BY, QUOTA_LABEL, RATIO, create_quota, pods_of, scheduling_state, wait_until_bound
from controlplane import CONTROLLERS, LOOPBACK, Binaries
from koordinator import (
    GPU_CORE,
    KOORD_SCHEDULER_NAME,
    KoordinatorBuild,
    wait_for,
)
from kubernetes import client as k8s
from loadbalancer import start_replicas_behind_haproxy

from gpuquota_core.gang import GANG_MIN_ANNOTATION, GANG_NAME_ANNOTATION, GANG_WAITING_TIME_ANNOTATION, POD_GROUP_LABEL
from tests.e2e.test_koordinator_scheduler import Koordinator, Layout, Scene, gpu_allocations, running_koordinator, scene

GPU = "nvidia.com/gpu"
EIGHT_CARDS = Layout("both", cards=8)
MEMBERS = 8
# koord-scheduler gives up a gang that cannot be placed whole after its waiting time; short here, so a
# gang it rejects gives its quota back quickly (as the problem's measurement without the webhook did).
WAITING = "30s"
# A Job controller that could not create a pod tries again with a growing backoff (up to a minute).
JOB_RETRY_DEADLINE = 180.0


@pytest.fixture(scope="module")
def koordinator(control_plane_binaries: Binaries, koordinator_build: KoordinatorBuild,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Koordinator]:
    # The Job controller too: training Jobs make the gang's pods, and retry the creates a gang refusal fails.
    with running_koordinator(control_plane_binaries, koordinator_build, tmp_path_factory.mktemp("gang-plane"),
                             controllers=(*CONTROLLERS, "job-controller")) as started:
        yield started


@pytest.fixture(scope="module")
def shipped_webhook(koordinator: Koordinator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Three strict replicas with the writer Lease behind HAProxy, through the project's configurations."""
    ledger_namespace = f"gpuquota-ledger-{uuid.uuid4().hex[:6]}"
    koordinator.api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ledger_namespace)))
    serve_args = ["--kubeconfig", str(koordinator.plane.kubeconfig_path), "--workers", "1", "--threads", "8",
                  "--accounting", "strict", "--ledger-namespace", ledger_namespace,
                  "--writer-lease", "gpuquota-ledger-writer", "--peer-address", LOOPBACK, "--peer-port", "0"]
    servers, balancer = start_replicas_behind_haproxy(tmp_path_factory.mktemp("gang-webhook"), serve_args)
    documents = local_webhook_configurations(balancer.url, servers[0].ca_bundle, name_suffix="-gangs")
    try:
        register_webhook_configurations(koordinator.api, documents)
        yield
    finally:
        delete_webhook_configurations(koordinator.api, documents)
        balancer.stop()
        for server in servers:
            server.stop()


@dataclass(frozen=True)
class Style:
    """How the pods of a gang say so: Koordinator's annotations, or a PodGroup; and their GPU spelling."""

    name: str
    pod_group: bool
    gpu: dict[str, str]


ANNOTATIONS = Style("annotations", False, {RATIO: "100", GPU_CORE: "100"})
ANNOTATIONS_NVIDIA = Style("annotations-nvidia", False, {GPU: "1"})
POD_GROUPS = Style("pod-groups", True, {RATIO: "100", GPU_CORE: "100"})


def gang_metadata(gang: str, style: Style, quota: str) -> dict[str, Any]:
    labels = {"app": gang, QUOTA_LABEL: quota}
    annotations: dict[str, str] = {}
    if style.pod_group:
        labels[POD_GROUP_LABEL] = gang
    else:
        annotations = {GANG_NAME_ANNOTATION: gang, GANG_MIN_ANNOTATION: str(MEMBERS),
                       GANG_WAITING_TIME_ANNOTATION: WAITING}
    return {"labels": labels, "annotations": annotations}


def member_spec(where: Scene, style: Style, restart: str = "Always") -> dict[str, Any]:
    requests = {"cpu": "1", **style.gpu}
    return {"schedulerName": KOORD_SCHEDULER_NAME, "tolerations": [where.toleration], "restartPolicy": restart,
            "containers": [{"name": "worker", "image": "registry.example/train:1",
                            "resources": {"requests": requests, "limits": dict(requests)}}]}


def create_pod_group(koordinator: Koordinator, namespace: str, name: str) -> None:
    body = {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"minMember": MEMBERS, "scheduleTimeoutSeconds": 30}}
    koordinator.api.custom.create_namespaced_custom_object("scheduling.sigs.k8s.io", "v1alpha1", namespace,
                                                           "podgroups", body)


def create_member(koordinator: Koordinator, where: Scene, gang: str, index: int, style: Style,
                  quota: str) -> str:
    """Create one member; "" when stored, else the apiserver's message. A PodGroup created a moment ago
    may not have reached every replica's watch: that retryable refusal is retried, as a controller would."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{gang}-{index}", **gang_metadata(gang, style, quota)},
           "spec": member_spec(where, style)}

    outcome: list[str] = []

    def answered() -> bool:
        try:
            koordinator.api.core.create_namespaced_pod(where.namespace, pod)
        except k8s.exceptions.ApiException as error:
            message = str(json.loads(error.body)["message"])
            if "which this webhook has not seen" in message:
                return False
            outcome.append(message)
            return True
        outcome.append("")
        return True

    wait_for(answered, f"an answer for {gang}-{index} that is not 'PodGroup not seen yet'")
    return outcome[0]


def end(koordinator: Koordinator, namespace: str, pods: list[k8s.V1Pod]) -> None:
    """What a kubelet writes once a pod's containers have exited 0."""
    for pod in pods:
        koordinator.api.core.patch_namespaced_pod_status(pod.metadata.name, namespace,
                                                         {"status": {"phase": "Succeeded"}})


def gang_refusal(where: Scene, gang: str, quota: str, index: int, free: int = 200) -> str:
    return (f"{DENIED_BY}gang {where.namespace}/{gang} needs {RATIO}={MEMBERS * 100} ({MEMBERS} × 100) at "
            f"{where.namespace}/{quota}; {free} free: pod {where.namespace}/{gang}-{index} is a member of gang "
            f"{where.namespace}/{gang} (minimum {MEMBERS} members) and no member is admitted until the whole "
            f"minimum fits")


def assert_bound_whole(koordinator: Koordinator, namespace: str, gang: str) -> list[k8s.V1Pod]:
    pods = wait_until_bound(koordinator.api, namespace, gang, MEMBERS)
    minors = set()
    for pod in pods:
        (allocated,) = gpu_allocations(pod)
        assert allocated["resources"][RATIO] == "100", allocated
        minors.add((pod.spec.node_name, allocated["minor"]))
    assert len(minors) == MEMBERS  # a card of its own each
    return pods


@pytest.mark.parametrize("style", [ANNOTATIONS, ANNOTATIONS_NVIDIA, POD_GROUPS], ids=lambda style: style.name)
def test_two_gangs_created_interleaved_under_room_for_ten_one_is_bound_whole_and_the_other_waits_unstored(
        koordinator: Koordinator, shipped_webhook: None, style: Style) -> None:
    where = scene(koordinator, {"one": EIGHT_CARDS, "two": EIGHT_CARDS})
    quota = f"train-{where.namespace}"
    create_quota(koordinator.api, where.namespace, quota, {RATIO: "1000"})
    if style.pod_group:
        for gang in ("gang-a", "gang-b"):
            create_pod_group(koordinator, where.namespace, gang)

    outcomes: dict[str, list[str]] = {"gang-a": [], "gang-b": []}
    for index in range(MEMBERS):
        for gang in outcomes:
            outcomes[gang].append(create_member(koordinator, where, gang, index, style, quota))

    assert outcomes["gang-a"] == [""] * MEMBERS
    assert outcomes["gang-b"] == [gang_refusal(where, "gang-b", quota, index) for index in range(MEMBERS)]
    pods = assert_bound_whole(koordinator, where.namespace, "gang-a")
    if style.gpu == {GPU: "1"}:
        assert all(pod.spec.containers[0].resources.requests == {"cpu": "1", GPU_CORE: "100", RATIO: "100"}
                   for pod in pods)
    assert pods_of(koordinator.api, where.namespace, "gang-b") == []

    # gang-a's pods end: the second gang is admitted whole on retry, and bound.
    end(koordinator, where.namespace, pods)
    wait_for(lambda: create_member(koordinator, where, "gang-b", 0, style, quota) == "",
             "gang-b's first member admitted once gang-a's pods ended")
    assert [create_member(koordinator, where, "gang-b", index, style, quota) for index in range(1, MEMBERS)] == \
        [""] * (MEMBERS - 1)
    assert_bound_whole(koordinator, where.namespace, "gang-b")


def gang_job(name: str, where: Scene, quota: str) -> dict[str, Any]:
    metadata = gang_metadata(name, ANNOTATIONS, quota)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": MEMBERS, "completions": MEMBERS, "backoffLimit": 0,
                     "template": {"metadata": metadata, "spec": member_spec(where, ANNOTATIONS, restart="Never")}}}


def jobs_state(koordinator: Koordinator, namespace: str) -> str:
    """Each Job's pods and where they are, and its FailedCreate events: what a timeout should say."""
    parts = []
    for job in ("job-a", "job-b"):
        pods = "; ".join(scheduling_state(pod) for pod in pods_of(koordinator.api, namespace, job)) or "no pods"
        parts.append(f"{job}: {pods}; FailedCreate: {failed_creates_of_job(koordinator, namespace, job)[:2]}")
    return " | ".join(parts)


def failed_creates_of_job(koordinator: Koordinator, namespace: str, job: str) -> list[str]:
    events = koordinator.api.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={job},involvedObject.kind=Job,reason=FailedCreate")
    return [event.message for event in events.items]


def test_two_gang_jobs_under_room_for_ten_one_runs_and_the_other_fails_to_create_as_a_gang_until_room_returns(
        koordinator: Koordinator, shipped_webhook: None) -> None:
    where = scene(koordinator, {"one": EIGHT_CARDS, "two": EIGHT_CARDS})
    quota = f"train-{where.namespace}"
    create_quota(koordinator.api, where.namespace, quota, {RATIO: "1000"})
    batch = k8s.BatchV1Api(koordinator.api.client)
    for job in ("job-a", "job-b"):
        batch.create_namespaced_job(where.namespace, gang_job(job, where, quota))

    def one_job_bound_whole() -> str | None:
        for job in ("job-a", "job-b"):
            pods = pods_of(koordinator.api, where.namespace, job)
            if len(pods) == MEMBERS and all(pod.spec.node_name for pod in pods):
                return job
        return None

    try:
        winner: str = wait_for(one_job_bound_whole, "one Job's eight pods bound", JOB_RETRY_DEADLINE)
    except AssertionError as error:
        raise AssertionError(f"{error}; {jobs_state(koordinator, where.namespace)}") from None
    loser = "job-b" if winner == "job-a" else "job-a"
    refusals = wait_for(lambda: failed_creates_of_job(koordinator, where.namespace, loser),
                        f"a FailedCreate event of {loser}")
    prefix = f"Error creating: {DENIED_BY}gang {where.namespace}/{loser} needs {RATIO}=800 (8 × 100) at " \
             f"{where.namespace}/{quota}; 200 free: pod {where.namespace}/{loser}-"
    assert all(message.startswith(prefix) for message in refusals), refusals
    assert pods_of(koordinator.api, where.namespace, loser) == []
    assert_bound_whole(koordinator, where.namespace, winner)

    # The winner's pods end; the Job controller's own retries then create the other gang whole.
    end(koordinator, where.namespace, pods_of(koordinator.api, where.namespace, winner))
    wait_for(lambda: (lambda pods: len(pods) == MEMBERS and all(pod.spec.node_name for pod in pods))(
        pods_of(koordinator.api, where.namespace, loser)), f"{loser}'s eight pods bound", JOB_RETRY_DEADLINE)
    assert_bound_whole(koordinator, where.namespace, loser)
