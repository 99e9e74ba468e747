"""Every view keeps the pod's GPU vendor as the webhook does (gpuquota_core.placement).

The example cluster's GPU nodes are all NVIDIA (``node.koordinator.sh/gpu-vendor: nvidia``); an
``amd.com/gpu`` Deployment explained against it used to be rewritten and said to land on
gpu-mixed-0. With an AMD node that reports Koordinator GPUs beside them, it is rewritten and kept
on that node by a required node affinity, and ``convert``, ``explain`` and ``audit`` say the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from cli.main import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "cluster"
VENDOR_LABEL = "node.koordinator.sh/gpu-vendor"
CANONICAL = {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}
AMD_NODE = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "amd-shared-0", "labels": {VENDOR_LABEL: "amd"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                                       "koordinator.sh/gpu-core": "800", "koordinator.sh/gpu-memory-ratio": "800",
                                       "koordinator.sh/gpu-memory": "1536Gi"}}}
LEFT_AMD = ("left amd.com/gpu as written: the node(s) this pod can be scheduled on that advertise "
            "koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio (gpu-shared-0, gpu-mixed-0) have another GPU "
            "vendor than node.koordinator.sh/gpu-vendor=amd")
KEPT_AMD = ("kept the pod on amd nodes (required node affinity on node.koordinator.sh/gpu-vendor): "
            "koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio name no vendor, and gpu-shared-0, gpu-mixed-0 "
            "of another vendor advertise(s) them")
KEPT_NVIDIA = ("kept the pod on nvidia nodes (required node affinity on node.koordinator.sh/gpu-vendor): "
               "koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio name no vendor, and amd-shared-0 "
               "of another vendor advertise(s) them")


def deployment(name: str, resource: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": "registry.example/x:1",
                                                           "resources": {"limits": {resource: "1"}}}]}}}}


def write(path: Path, *objects: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump_all(objects), encoding="utf-8")
    return str(path)


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_an_amd_deployment_on_the_example_cluster_is_left_as_written_and_lands_on_no_nvidia_node(
        tmp_path: Path) -> None:
    workload = write(tmp_path / "amd.yaml", deployment("amd-train", "amd.com/gpu"))

    code, out, _ = run("explain", "-f", workload, "--state", str(EXAMPLES))
    assert code == 0
    why = LEFT_AMD.removeprefix("left amd.com/gpu as written: ")
    assert out.splitlines()[2:5] == ["Mutation (/mutate-pods):", f"  no rewrite (left as written: {why})",
                                     f"  {LEFT_AMD}"]
    assert "gpu-mixed-0, which advertise(s)" not in out

    _, out, _ = run("audit", "-f", workload, "-f", str(EXAMPLES / "nodes.yaml"), "-o", "json", "--fail-on", "none")
    on_it = {f["check"]: f["message"] for f in json.loads(out)["findings"] if f["name"] == "amd-train"}
    assert on_it == {"gpu-request-unadvertised": "asks for amd.com/gpu, but none of the 3 node(s) this pod can be "
                     "scheduled on (gpu-whole-0, gpu-shared-0, gpu-mixed-0) advertises amd.com/gpu: it cannot be "
                     "scheduled"}


def test_beside_an_amd_node_each_deployment_is_rewritten_and_kept_on_its_vendors_nodes(tmp_path: Path) -> None:
    workloads = write(tmp_path / "workloads.yaml", deployment("amd-train", "amd.com/gpu"),
                      deployment("nvidia-train", "nvidia.com/gpu"))
    amd_node = write(tmp_path / "amd-node.yaml", AMD_NODE)
    nodes = ("-f", str(EXAMPLES / "nodes.yaml"), "-f", amd_node)

    code, out, err = run("convert", "-f", workloads, *nodes, "-o", "json")
    assert code == 0
    converted = {item["metadata"]["name"]: item["spec"]["template"]["spec"] for item in json.loads(out)["items"]
                 if item["kind"] == "Deployment"}
    amd_term = {"key": VENDOR_LABEL, "operator": "In", "values": ["amd"]}
    nvidia_terms = [{"key": VENDOR_LABEL, "operator": "In", "values": ["nvidia"]},
                    {"key": VENDOR_LABEL, "operator": "DoesNotExist"}]
    for name, terms in (("amd-train", [amd_term]), ("nvidia-train", nvidia_terms)):
        assert converted[name]["containers"][0]["resources"]["limits"] == CANONICAL
        assert converted[name]["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [term]} for term in terms]}}}
    assert f"Deployment/team-a/amd-train: gpuquota {KEPT_AMD}" in err.splitlines()
    assert f"Deployment/team-a/nvidia-train: gpuquota {KEPT_NVIDIA}" in err.splitlines()

    code, out, _ = run("explain", "-f", workloads, "--state", str(EXAMPLES), "--state", amd_node, "-o", "json")
    explained = {e["subject"]: e["mutation"] for e in json.loads(out)["explanations"]}
    amd = explained["Deployment team-a/amd-train (pod template)"]
    assert amd["notes"] == [KEPT_AMD]
    assert {"op": "add", "path": "/spec/affinity", "value": converted["amd-train"]["affinity"]} in amd["patch"]
    nvidia = explained["Deployment team-a/nvidia-train (pod template)"]
    assert nvidia["notes"][0] == KEPT_NVIDIA
    assert {"op": "add", "path": "/spec/affinity", "value": converted["nvidia-train"]["affinity"]} in nvidia["patch"]

    _, out, _ = run("audit", "-f", workloads, *nodes, "-o", "json", "--fail-on", "none")
    found = {(f["name"], f["check"]): f for f in json.loads(out)["findings"] if f["kind"] == "Deployment"}
    # Rewritten, and placeable as stored: no gpu-request-unadvertised.
    assert set(found) == {("amd-train", "workload-legacy-gpu-request"), ("nvidia-train", "workload-legacy-gpu-request")}
    for name, vendor, resource in (("amd-train", "amd", "amd.com/gpu"), ("nvidia-train", "nvidia", "nvidia.com/gpu")):
        finding = found[(name, "workload-legacy-gpu-request")]
        assert finding["message"] == (
            f'the webhook would rewrite: container "main" limits: {resource}: 1 -> koordinator.sh/gpu-core: 100, '
            f"koordinator.sh/gpu-memory-ratio: 100, and keep the pod on {vendor} nodes (required node affinity on "
            f"{VENDOR_LABEL})")
        assert finding["details"]["keptOnVendor"] == vendor
