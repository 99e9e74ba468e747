"""Koordinator itself in the test cluster: koord-scheduler (and koord-manager, tests/koordmanager.py)
built from Koordinator's Go module by ``hack/build-koordinator.sh`` (not a test module).

Everything Koordinator-specific the tests install comes from the files the build copied out of the
same module (``<build>/config``): its CRDs and the scheduler profile it ships. Where the test
cluster needs a change, it is made here in code, beside a comment that says why, never in a copy.
No koordlet runs: a GPU node is a Node whose allocatable the test writes plus the ``Device`` object
koordlet would report for it, and a pod counts as placed once koord-scheduler binds it with its
device allocation annotation.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from controlplane import (
    REPO_ROOT,
    Api,
    ControlPlane,
    ControlPlaneError,
    free_ports,
    run_build_script,
    wait_for_crd_established,
)
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpuquota_core.quantity import Quantity

BUILD_SCRIPT = REPO_ROOT / "hack" / "build-koordinator.sh"
KOORD_SCHEDULER_NAME = "koord-scheduler"
# Where koord-scheduler creates its root, system and default quotas (ElasticQuotaArgs default).
KOORDINATOR_NAMESPACE = "koordinator-system"
DEVICE_GROUP = "scheduling.koordinator.sh"
DEVICE_VERSION = "v1alpha1"
DEVICE_PLURAL = "devices"
DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
GPU_VENDOR_LABEL = "node.koordinator.sh/gpu-vendor"
QUOTA_ANNOTATION_PREFIX = "quota.scheduling.koordinator.sh/"
POLL_SECONDS = 0.1


@dataclass(frozen=True)
class KoordinatorBuild:
    """What hack/build-koordinator.sh produced: two binaries and the module's own config files."""

    directory: Path

    @property
    def version(self) -> str:
        return (self.directory / "VERSION").read_text(encoding="utf-8").strip()

    @property
    def koord_scheduler(self) -> Path:
        return self.directory / "koord-scheduler"

    @property
    def koord_manager(self) -> Path:
        return self.directory / "koord-manager"

    @property
    def crd_dir(self) -> Path:
        return self.directory / "config" / "crd" / "bases"

    @property
    def webhook_dir(self) -> Path:
        return self.directory / "config" / "webhook"

    @property
    def scheduler_config_map(self) -> Path:
        return self.directory / "config" / "manager" / "scheduler-config.yaml"

    def crd_path(self, plural: str, group: str) -> Path:
        return self.crd_dir / f"{group}_{plural}.yaml"


def locate_koordinator(build_script: Path = BUILD_SCRIPT) -> KoordinatorBuild:
    """Run the (cached) build and return where it put koord-scheduler, koord-manager and the config."""
    build = KoordinatorBuild(run_build_script(build_script))
    for binary in (build.koord_scheduler, build.koord_manager):
        if not os.access(binary, os.X_OK):
            raise ControlPlaneError(f"{build_script} reported {build.directory}, but {binary} is not executable")
    return build


def install_koordinator_crds(api: Api, build: KoordinatorBuild) -> None:
    """Every CRD of Koordinator's config/crd/bases, as its chart installs them, each Established.

    koord-scheduler and koord-manager start informers for most of them (Device, Reservation,
    PodGroup, ElasticQuota, NodeMetric, ...) and wait for their caches, so all are installed.
    An existing CRD of the same name is replaced by Koordinator's, as `kubectl apply` of its chart
    would do on a cluster where something else created it first.
    """
    names: list[str] = []
    for path in sorted(build.crd_dir.glob("*.yaml")):
        for manifest in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not manifest:
                continue
            name = manifest["metadata"]["name"]
            try:
                api.apiextensions.create_custom_resource_definition(manifest)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                current = api.apiextensions.read_custom_resource_definition(name)
                manifest["metadata"]["resourceVersion"] = current.metadata.resource_version
                api.apiextensions.replace_custom_resource_definition(name, manifest)
            names.append(name)
    for name in names:
        wait_for_crd_established(api.apiextensions, name)


def ensure_namespace(api: Api, name: str) -> None:
    try:
        api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    except ApiException as exc:
        if exc.status != 409:
            raise


def koord_scheduler_configuration(build: KoordinatorBuild, kubeconfig: Path,
                                  elastic_quota_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Koordinator's shipped KubeSchedulerConfiguration (config/manager/scheduler-config.yaml), with
    only what the test cluster needs changed: leader election off (one replica, no Lease to wait
    for), the admin kubeconfig of the test apiserver, and ``elastic_quota_args`` merged into the
    ElasticQuota plugin's args (e.g. ``enableCheckParentQuota``) when a scenario names them."""
    config_map = yaml.safe_load(build.scheduler_config_map.read_text(encoding="utf-8"))
    configuration: dict[str, Any] = yaml.safe_load(config_map["data"]["koord-scheduler-config"])
    configuration["leaderElection"] = {"leaderElect": False}
    configuration["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    if elastic_quota_args:
        for profile in configuration["profiles"]:
            for plugin in profile.get("pluginConfig", []):
                if plugin["name"] == "ElasticQuota":
                    plugin["args"].update(elastic_quota_args)
    return configuration


def start_koord_scheduler(plane: ControlPlane, api: Api, build: KoordinatorBuild, *,
                          elastic_quota_args: Mapping[str, Any] | None = None,
                          feature_gates: Mapping[str, bool] | None = None) -> None:
    """koord-scheduler with Koordinator's profile against ``plane``, healthy before this returns.

    It schedules only pods whose ``spec.schedulerName`` is ``koord-scheduler`` (the profile's
    name); kube-scheduler keeps the others. Its quota plugin creates the root, system and default
    quotas in koordinator-system, so that namespace must exist first.
    """
    ensure_namespace(api, KOORDINATOR_NAMESPACE)
    config_path = plane.work_dir / "koord-scheduler-config.yaml"
    configuration = koord_scheduler_configuration(build, plane.kubeconfig_path, elastic_quota_args)
    config_path.write_text(yaml.safe_dump(configuration, sort_keys=False), encoding="utf-8")
    (port,) = free_ports(1)
    # --port=0: without it koord-scheduler also serves plain HTTP on 0.0.0.0:10251
    # (cmd/koord-scheduler/app/options/insecure_serving.go), so a second test cluster on the same
    # machine cannot start its scheduler. Health is read on the secure port.
    args = [str(build.koord_scheduler), f"--config={config_path}", f"--secure-port={port}", "--port=0",
            *plane.component_tls_args()]
    if feature_gates:
        args.append(feature_gates_flag(feature_gates))
    plane.start_component(KOORD_SCHEDULER_NAME, args, plane.component_healthy(port))


def feature_gates_flag(feature_gates: Mapping[str, bool]) -> str:
    """``--feature-gates=A=true,B=false``, sorted, as Koordinator's binaries take them."""
    return "--feature-gates=" + ",".join(f"{gate}={str(on).lower()}" for gate, on in sorted(feature_gates.items()))


@dataclass(frozen=True)
class Gpu:
    """One GPU as koordlet reports it in a Device object: minor number, memory, health."""

    minor: int
    memory: str = "80Gi"
    healthy: bool = True


def create_gpu_device(api: Api, node: str, gpus: Sequence[Gpu], vendor: str | None = None) -> dict[str, Any]:
    """The cluster-scoped Device koordlet writes for ``node`` (name = node name): one ``gpu`` entry per
    card with 100 gpu-core, its memory and 100 gpu-memory-ratio; ``vendor``: the gpu-vendor label
    koordlet puts on it (pkg/koordlet/statesinformer/impl/states_device_linux.go), None for none."""
    metadata: dict[str, Any] = {"name": node}
    if vendor is not None:
        metadata["labels"] = {GPU_VENDOR_LABEL: vendor}
    body = {
        "apiVersion": f"{DEVICE_GROUP}/{DEVICE_VERSION}",
        "kind": "Device",
        "metadata": metadata,
        "spec": {"devices": [{
            "type": "gpu", "minor": gpu.minor, "id": f"GPU-{node}-{gpu.minor}", "health": gpu.healthy,
            "resources": {GPU_CORE: "100", GPU_MEMORY: gpu.memory, GPU_MEMORY_RATIO: "100"},
        } for gpu in gpus]},
    }
    created: dict[str, Any] = api.custom.create_cluster_custom_object(DEVICE_GROUP, DEVICE_VERSION, DEVICE_PLURAL, body)
    return created


def koordinator_allocatable(gpus: Sequence[Gpu], vendor: str | None = None) -> dict[str, str]:
    """What koord-manager's GPUDeviceResource plugin writes into a node's allocatable for these GPUs:
    100 gpu-core and 100 gpu-memory-ratio per healthy card, their memory summed, and the legacy
    ``koordinator.sh/gpu`` equal to gpu-core only for NVIDIA cards or a Device without a vendor
    label (pkg/slo-controller/noderesource/plugins/gpudeviceresource/plugin.go)."""
    healthy = [gpu for gpu in gpus if gpu.healthy]
    memory = sum((Quantity.parse(gpu.memory) for gpu in healthy), Quantity.parse("0"))
    allocatable = {GPU_CORE: str(100 * len(healthy)), GPU_MEMORY_RATIO: str(100 * len(healthy)),
                   GPU_MEMORY: str(memory)}
    if vendor in (None, "nvidia"):
        allocatable["koordinator.sh/gpu"] = str(100 * len(healthy))
    return allocatable


def device_allocation(pod: k8s.V1Pod) -> dict[str, Any] | None:
    """The pod's ``scheduling.koordinator.sh/device-allocated`` annotation, parsed; None without one."""
    raw = (pod.metadata.annotations or {}).get(DEVICE_ALLOCATED)
    return None if raw is None else dict(json.loads(raw))


def quota_annotation(quota: Mapping[str, Any], key: str) -> dict[str, str]:
    """One of the JSON ResourceList annotations koord-scheduler writes on an ElasticQuota
    (``runtime``, ``request``, ``child-request``, ...); empty when absent."""
    raw = (quota.get("metadata", {}).get("annotations") or {}).get(QUOTA_ANNOTATION_PREFIX + key)
    return {} if not raw else {str(name): str(value) for name, value in json.loads(raw).items()}


def wait_for(condition: Callable[[], Any], what: str, deadline: float = 60.0) -> Any:
    """Poll ``condition`` until it returns something truthy, and return it; fail naming ``what``."""
    end = time.monotonic() + deadline
    while True:
        outcome = condition()
        if outcome:
            return outcome
        if time.monotonic() >= end:
            raise AssertionError(f"not true after {deadline:.0f}s: {what}")
        time.sleep(POLL_SECONDS)  # polling the apiserver's state with a deadline
