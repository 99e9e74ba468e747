"""Audit check gpu-request-unadvertised: GPU requests no node a pod can be scheduled on advertises."""

from __future__ import annotations

from typing import Any

from gpuquota_core.audit import audit_objects
from gpuquota_core.conversion import load_config

NVIDIA, CORE, RATIO = "nvidia.com/gpu", "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"


def node(name: str, allocatable: dict[str, str], pool: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"pool": pool}},
            "status": {"allocatable": allocatable, "capacity": allocatable}}


NODES = [node("whole-0", {NVIDIA: "8"}, "whole"), node("shared-0", {CORE: "400", RATIO: "400"}, "shared")]


def spec(resources: dict[str, str], pool: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": resources,
                                                                            "limits": resources}}]}
    if pool is not None:
        result["nodeSelector"] = {"pool": pool}
    return result


def pod(name: str, resources: dict[str, str], pool: str | None = None, phase: str = "Pending") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
            "spec": spec(resources, pool), "status": {"phase": phase}}


def deployment(name: str, resources: dict[str, str], pool: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"template": {"spec": spec(resources, pool)}}}


def unadvertised(objects: list[dict[str, Any]], config: Any = None) -> dict[tuple[str, str], str]:
    report = audit_objects(objects, config=config or load_config(None))
    return {(f.kind, f.name): f.message for f in report.findings if f.check == "gpu-request-unadvertised"}


def test_a_stored_pod_is_judged_as_written() -> None:
    found = unadvertised([*NODES, pod("canonical-on-whole", {CORE: "100", RATIO: "100"}, "whole"),
                          pod("vendor-on-shared", {NVIDIA: "1"}, "shared"), pod("vendor-anywhere", {NVIDIA: "1"}),
                          pod("done", {NVIDIA: "1"}, "shared", phase="Succeeded"), pod("cpu", {"cpu": "1"}, "x")])

    assert found == {
        ("Pod", "canonical-on-whole"): "asks for koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio, but none "
                                       "of the 1 node(s) this pod can be scheduled on (whole-0) advertises "
                                       "koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio: it cannot be "
                                       "scheduled",
        ("Pod", "vendor-on-shared"): "asks for nvidia.com/gpu, but none of the 1 node(s) this pod can be scheduled "
                                     "on (shared-0) advertises nvidia.com/gpu: it cannot be scheduled"}


def test_a_template_is_judged_as_the_webhook_would_store_its_pods() -> None:
    objects = [*NODES, deployment("vendor-on-shared", {NVIDIA: "1"}, "shared"),
               deployment("vendor-on-whole", {NVIDIA: "1"}, "whole"),
               deployment("canonical-on-whole", {CORE: "100", RATIO: "100"}, "whole")]

    # auto: the first is rewritten (shared-0 advertises the canonical names), the second left as written.
    assert set(unadvertised(objects)) == {("Deployment", "canonical-on-whole")}
    # never: nothing is rewritten, so the first stays a vendor request on a canonical-only node.
    assert set(unadvertised(objects, load_config({"rewrite": "never"}))) == {
        ("Deployment", "vendor-on-shared"), ("Deployment", "canonical-on-whole")}
    # always: the second is rewritten into names its only node does not advertise.
    assert set(unadvertised(objects, load_config({"rewrite": "always"}))) == {
        ("Deployment", "vendor-on-whole"), ("Deployment", "canonical-on-whole")}


def test_without_nodes_nothing_is_said() -> None:
    assert unadvertised([pod("vendor-on-shared", {NVIDIA: "1"}, "shared")]) == {}


def test_names_as_koordinators_scheduler_reads_them() -> None:
    # gpu.shared is added by Koordinator's own webhook; kubernetes.io/gpu-core is renamed by its informers.
    shared = pod("shared-hint", {CORE: "100", RATIO: "100", "koordinator.sh/gpu.shared": "1"}, "shared")
    deprecated = pod("deprecated", {"kubernetes.io/gpu-core": "100", "kubernetes.io/gpu-memory-ratio": "100"},
                     "shared")

    assert unadvertised([*NODES, shared, deprecated]) == {}
