"""Audit messages are prose for people: never a Python list, dict, tuple, set or object repr.

Every finding the audit produces on the example cluster and on a broad generated set (every check
id of docs/audit-checks.md fires in it) is scanned for the marks Python's reprs leave.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from gpuquota_core.audit import Finding, audit_objects
from kubeaccess.manifests import load_objects

ROOT = Path(__file__).resolve().parents[2]
PARENT = "quota.scheduling.koordinator.sh/parent"
IS_PARENT = "quota.scheduling.koordinator.sh/is-parent"
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
CORE, RATIO, MEMORY = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio", "koordinator.sh/gpu-memory"
GANG_NAME, GANG_MIN = "gang.scheduling.koordinator.sh/name", "gang.scheduling.koordinator.sh/min-available"

# ['a'  ["a"  {'a'  ('a',)  (1,)  set()  frozenset(  dict_keys(  Quantity(  Fraction(  <x object at 0x
PYTHON_SYNTAX = re.compile(r"""\[['"]|\{['"]|\(['"][^)]*['"],?\)|,\)|\bset\(|frozenset\(|dict_(keys|values|items)\(|"""
                           r"""\b(Quantity|Fraction|Decimal|QuotaInfo|PodRecord)\(|<[\w.]+ object at 0x|\bNone\b""")
DOCUMENTED_CHECKS = set(re.findall(r"^\| `([a-z-]+)` \|", (ROOT / "docs" / "audit-checks.md").read_text(), re.M))

GPU_NAMES = ["nvidia.com/gpu", "amd.com/gpu", CORE, RATIO, MEMORY, "koordinator.sh/gpu",
             "koordinator.sh/gpu.shared", "kubernetes.io/gpu-core", "cpu"]
AMOUNTS = ["1", "2", "0", "-1", "0.5", "150", "50", "100", "400", "1Gi", "1e3", "abc", "", "10000000000"]


def quota(rng: random.Random, name: str, parents: list[str]) -> dict[str, Any]:
    labels: dict[str, str] = {}
    if parents and rng.random() < 0.7:
        labels[PARENT] = rng.choice([*parents, "missing-parent"])
    if rng.random() < 0.3:
        labels[IS_PARENT] = "true"

    def resources() -> dict[str, str]:
        return {rng.choice(GPU_NAMES): rng.choice(AMOUNTS) for _ in range(rng.randint(0, 3))}

    return {"kind": "ElasticQuota", "metadata": {"name": name, "namespace": rng.choice(["a", "b", name]),
                                                 "labels": labels},
            "spec": {"min": resources(), "max": resources()}}


def pod_spec(rng: random.Random) -> dict[str, Any]:
    containers = []
    for index in range(rng.randint(1, 3)):
        requests = {rng.choice(GPU_NAMES): rng.choice(AMOUNTS) for _ in range(rng.randint(0, 3))}
        limits = dict(requests) if rng.random() < 0.6 else {
            rng.choice(GPU_NAMES): rng.choice(AMOUNTS) for _ in range(rng.randint(0, 2))}
        containers.append({"name": f"c{index}", "resources": {"requests": requests, "limits": limits}})
    spec: dict[str, Any] = {"containers": containers}
    if rng.random() < 0.2:
        spec["nodeSelector"] = {"kubernetes.io/hostname": f"node-{rng.randint(0, 5)}"}
    if rng.random() < 0.1:
        spec["initContainers"] = [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    return spec


def generated(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    objects: list[dict[str, Any]] = []
    for index in range(6):
        capacity = {rng.choice(GPU_NAMES[:4]): rng.choice(["1", "2", "100", "200", "400"])
                    for _ in range(rng.randint(1, 3))}
        labels = {"node.koordinator.sh/gpu-shared": rng.choice(["true", "false"])} if rng.random() < 0.5 else {}
        objects.append({"kind": "Node", "metadata": {"name": f"node-{index}", "labels": labels},
                        "status": {"capacity": capacity, "allocatable": capacity}})
    names: list[str] = []
    for index in range(8):
        name = rng.choice([f"q{index}", *names]) if names and rng.random() < 0.15 else f"q{index}"
        objects.append(quota(rng, name, names))
        names.append(name)
    if rng.random() < 0.5:  # a cycle
        objects.append({"kind": "ElasticQuota", "metadata": {"name": "x", "namespace": "x", "labels": {PARENT: "y"}},
                        "spec": {"max": {CORE: "100"}}})
        objects.append({"kind": "ElasticQuota", "metadata": {"name": "y", "namespace": "y", "labels": {PARENT: "x"}},
                        "spec": {"max": {CORE: "100"}}})
    objects.append({"kind": "ElasticQuota", "metadata": {"name": "broken", "namespace": "a"},
                    "spec": {"max": rng.choice([{"nvidia.com/gpu": "x"}, ["a"], "text"])}})
    for index in range(12):
        labels = {QUOTA_LABEL: rng.choice([*names, "nowhere"])} if rng.random() < 0.4 else {}
        namespace = rng.choice(["a", "b", "q1"])
        pod: dict[str, Any] = {"kind": "Pod", "metadata": {"name": f"p{index}", "namespace": namespace,
                                                           "labels": labels}, "spec": pod_spec(rng)}
        if rng.random() < 0.4:  # a gang member: gangs that never fit, partly admitted, disagreeing
            pod["metadata"]["annotations"] = {GANG_NAME: rng.choice(["g1", "g2"]),
                                              GANG_MIN: rng.choice(["1", "2", "3", "50"])}
        objects.append(pod)
    for index, kind in enumerate(["Deployment", "StatefulSet", "Job", "DaemonSet"]):
        objects.append({"kind": kind, "metadata": {"name": f"w{index}", "namespace": "a"},
                        "spec": {"template": {"metadata": {}, "spec": pod_spec(rng)}}})
    objects.append({"kind": "CronJob", "metadata": {"name": "cj", "namespace": "b"},
                    "spec": {"jobTemplate": {"spec": {"template": {"spec": pod_spec(rng)}}}}})
    if rng.random() < 0.3:  # a workload the audit cannot read as far as its pod spec
        objects.append({"kind": "Deployment", "metadata": {"name": "unread", "namespace": "a"},
                        "spec": {"template": rng.choice([[1], "text", None, {"spec": 3}])}})
    objects.append({"kind": "ResourceQuota", "metadata": {"name": "rq", "namespace": "a"},
                    "spec": {"hard": {"requests.nvidia.com/gpu": "4", "limits.nvidia.com/gpu": "4"}}})
    return objects


def python_in(findings: list[Finding]) -> list[str]:
    return [f"{f.check} {f.kind} {f.namespace}/{f.name}: {f.message}" for f in findings
            if PYTHON_SYNTAX.search(f.message)]


def test_the_pattern_catches_what_python_writes() -> None:
    for leak in [str(["nvidia.com/gpu"]), str({"a": 1}), str(("a",)), str((1,)), str(set()), str(frozenset("a")),
                 str({"a": 1}.keys()), "limit None", str(object())]:
        assert PYTHON_SYNTAX.search(leak), leak
    for prose in ["max keys [nvidia.com/gpu] differ", "invalid resource device requests: [a b]: mix",
                  "min {koordinator.sh/gpu-core: 200}", "container \"main\" (asked for by x)", "(none)"]:
        assert not PYTHON_SYNTAX.search(prose), prose


def test_example_cluster_messages_are_plain() -> None:
    report = audit_objects(load_objects([str(ROOT / "examples" / "cluster")]))
    assert report.findings
    assert python_in(report.findings) == []


def test_generated_cluster_messages_are_plain() -> None:
    checks: set[str] = set()
    leaks: list[str] = []
    for seed in range(40):
        report = audit_objects(generated(seed))
        checks |= {f.check for f in report.findings}
        leaks += python_in(report.findings)
    assert leaks == []
    # The set is broad: every documented check fired somewhere in it.
    assert DOCUMENTED_CHECKS and DOCUMENTED_CHECKS - checks == set()
