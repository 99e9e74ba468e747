"""The e2e harness itself: the built apiserver runs, and the objects later tests rely on behave."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from clusterhelpers import eventually
from controlplane import (
    ELASTICQUOTA_GROUP,
    ELASTICQUOTA_PLURAL,
    ELASTICQUOTA_VERSION,
    Api,
    Binaries,
    ControlPlane,
    GpuNodeFactory,
    StartupError,
    make_api,
    processes_using,
)
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

GPU = "nvidia.com/gpu"
GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _elasticquota(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{ELASTICQUOTA_GROUP}/{ELASTICQUOTA_VERSION}",
        "kind": "ElasticQuota",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_apiserver_reports_the_built_version(api: Api) -> None:
    info = k8s.VersionApi(api.client).get_code()
    assert info.git_version == "v1.36.3"
    assert (info.major, info.minor) == ("1", "36")


def test_gpu_node_advertises_gpus_in_status(api: Api, gpu_node: GpuNodeFactory) -> None:
    name = _unique("gpu")
    gpu_node(name, {"cpu": "32", "memory": "256Gi", "pods": "110", GPU: "8"}, labels={"nvidia.com/gpu.present": "true"})

    node = api.core.read_node(name)
    assert node.status.allocatable[GPU] == "8"
    assert node.status.capacity[GPU] == "8"
    assert node.metadata.labels["nvidia.com/gpu.present"] == "true"
    # TaintNodesByCondition is off, so audit output is not polluted by a not-ready taint.
    assert not node.spec.taints

    # Later changes go through /status, as a kubelet's would.
    api.core.patch_node_status(name, {"status": {"allocatable": {GPU: "7"}}})
    node = api.core.read_node(name)
    assert node.status.allocatable[GPU] == "7"
    assert node.status.capacity[GPU] == "8"


def test_elasticquota_round_trips(api: Api, elasticquota_crd: k8s.V1CustomResourceDefinition, namespace: str) -> None:
    # Koordinator's CRD, as on a cluster running it (ours, for clusters without Koordinator, adds the
    # short names eq/eqs: tests/e2e/test_manifests.py).
    assert elasticquota_crd.metadata.annotations["controller-gen.kubebuilder.io/version"]
    assert elasticquota_crd.spec.names.short_names is None
    conditions = {c.type: c.status for c in elasticquota_crd.status.conditions}
    assert conditions["Established"] == "True"

    # The protected-group annotation was accepted as a real approval, not as "unapproved". Another
    # controller sets that condition, possibly after Established: wait for it to appear.
    def approval() -> str | None:
        crd = api.apiextensions.read_custom_resource_definition(elasticquota_crd.metadata.name)
        return {c.type: c.status for c in crd.status.conditions}.get("KubernetesAPIApprovalPolicyConformant")

    eventually(lambda: approval() is not None, "the API approval condition is set")
    assert approval() == "True"
    api.custom.create_namespaced_custom_object(
        ELASTICQUOTA_GROUP,
        ELASTICQUOTA_VERSION,
        namespace,
        ELASTICQUOTA_PLURAL,
        _elasticquota("team-a", {"max": {GPU_MEMORY_RATIO: "400"}, "min": {GPU_MEMORY_RATIO: 100}}),
    )

    stored = api.custom.get_namespaced_custom_object(
        ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace, ELASTICQUOTA_PLURAL, "team-a"
    )
    assert stored["kind"] == "ElasticQuota"
    assert stored["spec"]["max"] == {GPU_MEMORY_RATIO: "400"}
    # int-or-string keeps the JSON type it was given.
    assert stored["spec"]["min"] == {GPU_MEMORY_RATIO: 100}


def test_elasticquota_schema_rejects_a_non_quantity(
    api: Api, elasticquota_crd: k8s.V1CustomResourceDefinition, namespace: str
) -> None:
    with pytest.raises(ApiException) as rejected:
        api.custom.create_namespaced_custom_object(
            ELASTICQUOTA_GROUP,
            ELASTICQUOTA_VERSION,
            namespace,
            ELASTICQUOTA_PLURAL,
            _elasticquota("bad", {"max": {GPU_MEMORY_RATIO: "four hundred"}}),
        )
    assert rejected.value.status == 422
    assert "spec.max" in (rejected.value.body or "")


def test_elasticquota_status_is_written_with_the_object_as_koord_scheduler_writes_it(
    api: Api, elasticquota_crd: k8s.V1CustomResourceDefinition, namespace: str
) -> None:
    # Koordinator's CRD has no status subresource: koord-scheduler writes status.used with a patch of
    # the object itself, so a status in a create or a patch body is stored as sent.
    created = api.custom.create_namespaced_custom_object(
        ELASTICQUOTA_GROUP,
        ELASTICQUOTA_VERSION,
        namespace,
        ELASTICQUOTA_PLURAL,
        {**_elasticquota("with-status", {"max": {GPU: "8"}}), "status": {"used": {GPU: "2"}}},
    )
    assert created["status"]["used"] == {GPU: "2"}
    api.custom.patch_namespaced_custom_object(
        ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace, ELASTICQUOTA_PLURAL, "with-status",
        {"status": {"used": {GPU: "3"}}},
    )
    stored = api.custom.get_namespaced_custom_object(
        ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace, ELASTICQUOTA_PLURAL, "with-status"
    )
    assert stored["status"]["used"] == {GPU: "3"}


def test_pod_without_node_or_service_account_stays_pending(api: Api, namespace: str) -> None:
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="sleeper"),
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(
                    name="main",
                    image="registry.invalid/none:0",
                    resources=k8s.V1ResourceRequirements(limits={GPU: "1"}),
                )
            ]
        ),
    )
    api.core.create_namespaced_pod(namespace, pod)

    stored = api.core.read_namespaced_pod("sleeper", namespace)
    assert stored.status.phase == "Pending"
    assert stored.spec.node_name is None
    # Extended resources: requests default to the limits.
    assert stored.spec.containers[0].resources.requests == {GPU: "1"}
    # With the ServiceAccount plugin off, no token volume is injected.
    assert not stored.spec.volumes


def test_startup_failure_reports_the_log_and_leaves_nothing_running(control_plane_binaries: Binaries) -> None:
    plane = ControlPlane(control_plane_binaries, extra_apiserver_args=["--no-such-flag=1"])
    try:
        with pytest.raises(StartupError) as failed:
            plane.start()
        message = str(failed.value)
        assert "kube-apiserver exited" in message
        assert "unknown flag: --no-such-flag" in message
        assert "kube-apiserver.log" in message
        # etcd had started fine; the failed start must have taken it down again.
        assert processes_using(plane.work_dir) == []
    finally:
        plane.cleanup()


def test_controller_manager_failure_reports_its_log_and_leaves_nothing_running(
        control_plane_binaries: Binaries) -> None:
    plane = ControlPlane(control_plane_binaries, with_controllers=True, controllers=["no-such-controller"])
    try:
        with pytest.raises(StartupError) as failed:
            plane.start()
        message = str(failed.value)
        assert "kube-controller-manager exited" in message
        assert "no-such-controller" in message
        assert "kube-controller-manager.log" in message
        assert processes_using(plane.work_dir) == []
    finally:
        plane.cleanup()


@pytest.mark.parametrize("with_controllers", [False, True], ids=["apiserver-etcd", "with-scheduler-and-kcm"])
def test_stop_ends_every_server(control_plane_binaries: Binaries, with_controllers: bool) -> None:
    plane = ControlPlane(control_plane_binaries, with_controllers=with_controllers)
    try:
        plane.start()
        assert len(processes_using(plane.work_dir)) == (4 if with_controllers else 2)
        second = make_api(plane.kubeconfig_path)
        try:
            assert second.core.read_namespace("default").metadata.name == "default"
        finally:
            second.close()
    finally:
        plane.cleanup()
    # Checked after cleanup() removed the directory: the path string still identifies the servers.
    assert processes_using(plane.work_dir) == []
    assert not plane.work_dir.exists()
