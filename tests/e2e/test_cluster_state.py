"""The live cache of the quota service against a real apiserver: events, reconnects, staleness.

The state is driven in-process (``sync_kind`` with the real listers), so the tests can read its
usage directly; the webhook itself reads exactly this state through its socket.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from clusterhelpers import QUOTA_LABEL, RATIO, create_quota, eventually
from controlplane import (
    ELASTICQUOTA_GROUP,
    ELASTICQUOTA_PLURAL,
    ELASTICQUOTA_VERSION,
    Api,
    Binaries,
    ControlPlane,
    install_elasticquota_crd,
    make_api,
)

from gpuquota_core.pod_admission import PodAdmission
from gpuquota_core.quantity import Quantity
from webhook.quota.cluster_state import lister_for, sync_kind
from webhook.quota.state import KINDS, QuotaState

FINALIZER = "test.koord-gpuquota.io/hold"


class CountingLister:
    """The real lister, counting the watches it opens (to wait for a reconnect, not for time)."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner
        self.watches = 0

    def __call__(self, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            self.watches += 1
        return self.inner(**kwargs)


def start_sync(api: Api, state: QuotaState, watch_seconds: int) -> tuple[threading.Event, dict[str, CountingLister]]:
    stop = threading.Event()
    listers = {kind: CountingLister(lister_for(api.client, kind)) for kind in KINDS}
    for kind, lister in listers.items():
        # Pages of 7: the suite's apiserver holds far more pods, so the list takes many continues.
        threading.Thread(target=sync_kind, args=(state, lister, kind, stop, watch_seconds, 0.1, 7),
                         daemon=True).start()
    eventually(lambda: state.ready()[0], "first full sync")
    return stop, listers


def share_pod(name: str, quota: str, ratio: str, finalizers: list[str] | None = None) -> dict[str, Any]:
    gpu = {"koordinator.sh/gpu-core": ratio, RATIO: ratio}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {QUOTA_LABEL: quota}, "finalizers": finalizers or []},
            "spec": {"containers": [{"name": "main", "image": "registry.example/infer:1",
                                     "resources": {"requests": gpu, "limits": gpu}}]}}


def used_ratio(state: QuotaState, quota: str) -> Quantity | None:
    return state.usage.used(quota).get(RATIO)


@pytest.fixture
def live_state(api: Api, elasticquota_crd: object) -> Iterator[tuple[QuotaState, dict[str, CountingLister]]]:
    state = QuotaState()
    # One-second watches: every few events the stream ends and the loop resumes from the last
    # resourceVersion, which is the path a dead connection takes too.
    stop, listers = start_sync(api, state, watch_seconds=1)
    yield state, listers
    stop.set()


def test_watch_follows_pods_through_reconnects_termination_and_deletion(
        api: Api, namespace: str, live_state: tuple[QuotaState, dict[str, CountingLister]]) -> None:
    state, listers = live_state
    quota = f"team-{namespace}"
    create_quota(api, namespace, quota, {RATIO: "1000"})
    eventually(lambda: quota in state.tree.quotas, "the quota is in the tree")

    api.core.create_namespaced_pod(namespace, share_pod("held", quota, "300", finalizers=[FINALIZER]))
    api.core.create_namespaced_pod(namespace, share_pod("done", quota, "200"))
    eventually(lambda: used_ratio(state, quota) == Quantity.parse("500"), "both pods counted")

    opened = listers["Pod"].watches
    eventually(lambda: listers["Pod"].watches >= opened + 2, "the pod watch was reopened twice")
    api.core.create_namespaced_pod(namespace, share_pod("late", quota, "100"))
    eventually(lambda: used_ratio(state, quota) == Quantity.parse("600"), "a pod created after reconnects counted")

    # A finished pod no longer takes quota.
    api.core.patch_namespaced_pod_status("done", namespace, {"status": {"phase": "Succeeded"}})
    eventually(lambda: used_ratio(state, quota) == Quantity.parse("400"), "the Succeeded pod released")

    # Terminating (deletionTimestamp set, finalizer pending) still counts: the GPUs are not free yet.
    api.core.delete_namespaced_pod("held", namespace)
    eventually(lambda: api.core.read_namespaced_pod("held", namespace).metadata.deletion_timestamp is not None,
               "the pod is terminating")
    assert used_ratio(state, quota) == Quantity.parse("400")
    api.core.patch_namespaced_pod("held", namespace, {"metadata": {"finalizers": None}})
    eventually(lambda: used_ratio(state, quota) == Quantity.parse("100"), "the deleted pod released")

    api.core.delete_namespaced_pod("late", namespace)
    eventually(lambda: used_ratio(state, quota) in (None, Quantity.parse("0")), "the last pod released")
    assert state.usage.get(f"{namespace}/late") is None


def test_quota_limit_update_applies_without_reindexing_pods(
        api: Api, namespace: str, live_state: tuple[QuotaState, dict[str, CountingLister]]) -> None:
    state, _ = live_state
    quota = f"team-{namespace}"
    create_quota(api, namespace, quota, {RATIO: "300"})
    api.core.create_namespaced_pod(namespace, share_pod("p", quota, "200"))
    eventually(lambda: used_ratio(state, quota) == Quantity.parse("200"), "pod counted")

    def admit(ratio: str) -> bool:
        return state.admit_pod(PodAdmission(uid="probe", operation="CREATE", namespace=namespace, name="probe",
                                            pod_uid="", labels={QUOTA_LABEL: quota},
                                            canonical_requests={RATIO: ratio}, dry_run=True)).allowed

    assert not admit("200")
    api.custom.patch_namespaced_custom_object(ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace,
                                              ELASTICQUOTA_PLURAL, quota, {"spec": {"max": {RATIO: "400"}}})
    eventually(lambda: admit("200"), "the raised limit is enforced")
    assert used_ratio(state, quota) == Quantity.parse("200")


@pytest.fixture
def own_control_plane(control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory,
                      ) -> Iterator[tuple[ControlPlane, Api]]:
    """A control plane of this test alone: it is stopped in the middle of the test."""
    plane = ControlPlane(control_plane_binaries, base_dir=tmp_path_factory.mktemp("stale-cp"))
    plane.start()
    api = make_api(plane.kubeconfig_path)
    try:
        install_elasticquota_crd(api)
        yield plane, api
    finally:
        api.close()
        plane.stop()


def test_broken_watch_keeps_deciding_from_last_state_then_reports_stale(
        own_control_plane: tuple[ControlPlane, Api]) -> None:
    plane, api = own_control_plane
    api.core.create_namespace({"metadata": {"name": "team"}})
    create_quota(api, "team", "team-a", {RATIO: "300"})
    state = QuotaState(stale_after_seconds=1.0)
    stop, _ = start_sync(api, state, watch_seconds=30)
    try:
        eventually(lambda: "team-a" in state.tree.quotas, "quota synced")
        plane.stop()
        eventually(lambda: not state.ready()[0], "readiness fails once the view is stale")
        _, reason = state.ready()
        assert reason.startswith("quota state is stale: the list/watch of ")
        assert "for more than 1s" in reason
        # Still deciding from what it last saw: the quota of the dead cluster limits as before.
        probe = PodAdmission(uid="u", operation="CREATE", namespace="team", name="p", pod_uid="",
                             labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: "400"})
        verdict = state.admit_pod(probe)
        assert not verdict.allowed and verdict.message.startswith("exceeded quota: team/team-a,")
    finally:
        stop.set()
