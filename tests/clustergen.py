"""Generated clusters for the property tests that compare every view (not a test module).

A cluster is nodes of every GPU layout (vendor-only, canonical-only, mixed, another vendor, no GPU)
of NVIDIA and AMD (by the gpu-vendor label, or none), with labels, taints and cordons; a quota tree
(unique names, so ``serve --state`` loads it; a parent that does not exist now and then); pods that
already run, finished or not, some bound to a node, some as the webhook stored them (rewritten,
annotated); workloads; and pods not yet created. Pods and templates carry nodeName, nodeSelector,
required node affinity (one term or two, on the layout or the vendor) and tolerations that reach
some of the nodes, all of them or none; their GPU requests
include invalid ones (negative, fractional), which every view must refuse alike. Some pods and
templates are gang members (Koordinator's gang annotations, the lightweight PodGroup labels, or the
label of a PodGroup that exists or not), a few gangs partly stored; Jobs run several pods at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from gpuquota_core.audit import template_of
from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.jsonpatch import apply
from gpuquota_core.mutation import admission_mutation
from gpuquota_core.placement import RewritePolicy

PREFIX = "quota.scheduling.koordinator.sh/"
CORE, RATIO, MEMORY = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio", "koordinator.sh/gpu-memory"
NVIDIA, AMD = "nvidia.com/gpu", "amd.com/gpu"
NAMESPACES = ["team-a", "team-b", "ns-c"]
QUOTA_NAMES = ["org", "team-a", "team-b", "lab", "koordinator-default-quota"]
POOLS = ["a", "b"]
TAINT_KEY = "dedicated"

NODE_LAYOUTS: dict[str, dict[str, str]] = {
    "vendor": {NVIDIA: "8"},
    "shared": {CORE: "400", RATIO: "400", MEMORY: "320Gi"},
    "mixed": {NVIDIA: "4", CORE: "400", RATIO: "400", MEMORY: "192Gi"},
    "amd": {AMD: "4"},
    "amd-mixed": {AMD: "4", CORE: "400", RATIO: "400", MEMORY: "192Gi"},
    "cpu": {},
}
VENDOR_LABEL = "node.koordinator.sh/gpu-vendor"
# The node.koordinator.sh/gpu-vendor labels a node of each layout may carry (None: no label, which
# Koordinator reads as NVIDIA): NVIDIA's and AMD's Koordinator GPUs side by side, with and without
# the label, so the views judge clusters of several vendors.
NODE_VENDORS: dict[str, list[str | None]] = {
    "vendor": [None, "nvidia"],
    "shared": [None, "nvidia", "amd"],
    "mixed": [None, "nvidia"],
    "amd": ["amd"],
    "amd-mixed": ["amd"],
    "cpu": [None],
}


@dataclass
class Cluster:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    quotas: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)  # in the cluster already
    workloads: list[dict[str, Any]] = field(default_factory=list)  # Deployments, a ResourceQuota
    new_pods: list[dict[str, Any]] = field(default_factory=list)  # not created yet
    pod_groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def objects(self) -> list[dict[str, Any]]:
        """What the cluster holds (``--state``, ``-f DIR``): not the pods still to be created."""
        return [*self.nodes, *self.quotas, *self.pod_groups, *self.pods, *self.workloads]

    def write(self, directory: Path) -> Path:
        """The cluster as manifest files in ``directory``, one ``kind: List`` per kind of object
        (JSON: the CLI reads it as it reads YAML, many times faster); returns it."""
        directory.mkdir(parents=True, exist_ok=True)
        for name, objects in (("nodes", self.nodes), ("quotas", self.quotas), ("podgroups", self.pod_groups),
                              ("pods", self.pods), ("workloads", self.workloads)):
            if objects:
                document = {"apiVersion": "v1", "kind": "List", "items": objects}
                (directory / f"{name}.json").write_text(json.dumps(document), encoding="utf-8")
        return directory

    def write_yaml(self, path: Path, objects: list[dict[str, Any]]) -> Path:
        path.write_text(yaml.safe_dump_all(objects), encoding="utf-8")
        return path


@st.composite
def nodes(draw: st.DrawFn) -> list[dict[str, Any]]:
    result = []
    for index in range(draw(st.integers(0, 4))):
        layout = draw(st.sampled_from(sorted(NODE_LAYOUTS)))
        labels = {"pool": draw(st.sampled_from(POOLS)), "layout": layout}
        vendor = draw(st.sampled_from(NODE_VENDORS[layout]))
        if vendor is not None:
            labels[VENDOR_LABEL] = vendor
        spec: dict[str, Any] = {}
        taint = draw(st.sampled_from([None, "NoSchedule", "NoExecute"]))
        if taint:
            spec["taints"] = [{"key": TAINT_KEY, "value": "gpu", "effect": taint}]
        if draw(st.integers(0, 5)) == 0:
            spec["unschedulable"] = True
        resources = {"cpu": "32", "memory": "256Gi", "pods": "110", **NODE_LAYOUTS[layout]}
        result.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{index}", "labels": labels},
                       "spec": spec, "status": {"capacity": resources, "allocatable": resources}})
    return result


quota_amounts = st.sampled_from(["0", "100", "200", "400", "800", "1200", "2", "4", "-100"])
# Mostly limits in one family as quotas are written (canonical pairs, or whole vendor cards), sized
# like the pods below so that how full a quota is decides; now and then anything.
canonical_limits = st.sampled_from(["100", "200", "300", "400", "800"]).map(lambda n: {CORE: n, RATIO: n})
quota_lists = st.one_of(canonical_limits, canonical_limits,
                        st.sampled_from(["1", "2", "4", "8"]).map(lambda n: {NVIDIA: n}),
                        st.dictionaries(st.sampled_from([CORE, RATIO, NVIDIA, "cpu"]), quota_amounts, max_size=3))


@st.composite
def quotas(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A quota tree: unique names, each parent an earlier quota, the root, or (rarely) missing."""
    names = draw(st.lists(st.sampled_from(QUOTA_NAMES), max_size=4, unique=True))
    result = []
    for index, name in enumerate(names):
        labels: dict[str, str] = {}
        parent = draw(st.sampled_from(["", "", *names[:index], "gone"]))
        if parent:
            labels[PREFIX + "parent"] = parent
        if draw(st.integers(0, 3)) == 0:
            labels[PREFIX + "is-parent"] = "true"
        annotations: dict[str, str] = {}
        if draw(st.integers(0, 4)) == 0:
            annotations[PREFIX + "namespaces"] = f'["{draw(st.sampled_from(NAMESPACES))}"]'
        result.append({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                       "metadata": {"name": name, "namespace": draw(st.sampled_from(NAMESPACES)), "labels": labels,
                                    "annotations": annotations},
                       "spec": {"min": draw(quota_lists), "max": draw(quota_lists)}})
    return result


@st.composite
def broken_quota_trees(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Quotas that may not form a tree: names repeated in another namespace, parents that do not
    exist, parent cycles, a parent that cannot be read (what ``serve --state`` refuses, or the audit
    reports, and ``gpuquota quota`` must show as broken)."""
    names = draw(st.lists(st.sampled_from(QUOTA_NAMES[:4]), min_size=1, max_size=6))
    result = []
    for name in names:
        labels = {PREFIX + "is-parent": "true"}
        parent = draw(st.sampled_from(["", *QUOTA_NAMES[:4], "gone"]))
        if parent:
            labels[PREFIX + "parent"] = parent
        spec: dict[str, Any] = {"max": draw(canonical_limits)}
        if draw(st.integers(0, 7)) == 0:
            spec = {"max": {CORE: "lots"}}  # cannot be read: left out, its children's parent "unreadable"
        result.append({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                       "metadata": {"name": name, "namespace": draw(st.sampled_from(NAMESPACES)), "labels": labels},
                       "spec": spec})
    return result


pod_amounts = st.sampled_from(["1", "2", "4", "50", "100", "200", "0", "0.5", "-1", "150"])
# Mostly the requests users write (whole vendor cards, a share in percent, nothing), sometimes any
# mix of names and amounts, invalid ones included.
shares = st.sampled_from(["25", "50", "100", "200"]).map(lambda n: {CORE: n, RATIO: n})
gpu_requests = st.one_of(
    st.sampled_from(["1", "2", "4"]).map(lambda n: {NVIDIA: n}),
    st.sampled_from(["1", "2", "4"]).map(lambda n: {NVIDIA: n}),
    shares, shares,
    st.sampled_from(["1", "2"]).map(lambda n: {AMD: n}),
    st.just({"cpu": "1"}),
    st.dictionaries(st.sampled_from([NVIDIA, NVIDIA, CORE, RATIO, MEMORY, AMD, "koordinator.sh/gpu",
                                     "koordinator.sh/gpu.shared", "cpu"]), pod_amounts, max_size=3))


@st.composite
def requirements(draw: st.DrawFn) -> dict[str, Any]:
    """A node selector requirement on the layout, or (one time in four) on the GPU vendor."""
    operator = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
    key = VENDOR_LABEL if draw(st.integers(0, 3)) == 0 else "layout"
    requirement: dict[str, Any] = {"key": key, "operator": operator}
    if operator in ("In", "NotIn"):
        choices = ["nvidia", "amd"] if key == VENDOR_LABEL else sorted(NODE_LAYOUTS)
        requirement["values"] = draw(st.lists(st.sampled_from(choices), min_size=1, max_size=2, unique=True))
    return requirement


@st.composite
def constraints(draw: st.DrawFn, node_count: int) -> dict[str, Any]:
    """nodeName, nodeSelector, required node affinity and tolerations: some, all or none of them."""
    spec: dict[str, Any] = {}
    if node_count and draw(st.integers(0, 3)) == 0:
        spec["nodeName"] = f"node-{draw(st.integers(0, node_count))}"  # node_count: a node not listed
    if draw(st.integers(0, 3)) == 0:
        spec["nodeSelector"] = {"pool": draw(st.sampled_from(POOLS))}
    if draw(st.integers(0, 3)) == 0:
        # One term or two (ORed), on the layout and now and then on the vendor (as the rewrite may
        # add it): the rewrite must AND its own requirement into each.
        terms = [{"matchExpressions": draw(st.lists(requirements(), min_size=1, max_size=2))}
                 for _ in range(draw(st.integers(1, 2)))]
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}
    if draw(st.booleans()):
        spec["tolerations"] = [draw(st.sampled_from([
            {"key": TAINT_KEY, "operator": "Exists"},
            {"key": TAINT_KEY, "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
            {"operator": "Exists"},
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]))]
    return spec


@st.composite
def pod_specs(draw: st.DrawFn, node_count: int) -> tuple[dict[str, str], dict[str, Any]]:
    """Labels (the quota label or none) and a spec: one or two containers, sometimes an init container."""
    label = draw(st.sampled_from([None, None, None, None, *QUOTA_NAMES, "missing"]))
    containers = []
    for index in range(draw(st.integers(1, 2))):
        asked = draw(gpu_requests)
        resources: dict[str, Any] = {"limits": dict(asked)}
        if draw(st.booleans()):
            resources["requests"] = dict(asked)
        containers.append({"name": f"c{index}", "image": "registry.example/x:1", "resources": resources})
    spec: dict[str, Any] = {"containers": containers, **draw(constraints(node_count))}
    if draw(st.integers(0, 4)) == 0:
        asked = draw(gpu_requests)
        spec["initContainers"] = [{"name": "init", "image": "registry.example/x:1",
                                   "resources": {"limits": dict(asked)}}]
    return ({PREFIX + "name": label} if label else {}), spec


GANG_PREFIX = "gang.scheduling.koordinator.sh/"
POD_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"
GANGS = ["g1", "g2"]
POD_GROUPS = ["pg1", "pg2"]  # pg2 is never created: its label names no gang


@st.composite
def gang_metadata(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations making a pod a gang member (mostly none), in each of Koordinator's ways."""
    way = draw(st.sampled_from(["none", "none", "none", "annotations", "labels", "pod-group"]))
    minimum = draw(st.sampled_from(["1", "2", "3", "8", "0"]))
    if way == "annotations":
        annotations = {GANG_PREFIX + "name": draw(st.sampled_from(GANGS)), GANG_PREFIX + "min-available": minimum}
        if draw(st.booleans()):
            annotations[GANG_PREFIX + "waiting-time"] = draw(st.sampled_from(["30s", "1m30s", "bad"]))
        return {}, annotations
    if way == "labels":
        name = draw(st.sampled_from(GANGS))
        return {POD_GROUP_LABEL + "/name": name, POD_GROUP_LABEL + "/min-available": minimum}, {}
    if way == "pod-group":
        return {POD_GROUP_LABEL: draw(st.sampled_from(POD_GROUPS))}, {}
    return {}, {}


@st.composite
def pod_groups(draw: st.DrawFn) -> list[dict[str, Any]]:
    """PodGroup pg1 in some namespaces (its minMember, sometimes minResources and a timeout)."""
    result = []
    for namespace in draw(st.lists(st.sampled_from(NAMESPACES), max_size=2, unique=True)):
        spec: dict[str, Any] = {"minMember": draw(st.sampled_from([1, 2, 3, 8]))}
        if draw(st.booleans()):
            spec["minResources"] = draw(st.sampled_from([{NVIDIA: "2"}, {CORE: "300", RATIO: "300"}, {"cpu": "1"}]))
        if draw(st.booleans()):
            spec["scheduleTimeoutSeconds"] = 30
        result.append({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup",
                       "metadata": {"name": "pg1", "namespace": namespace}, "spec": spec})
    return result


def with_gang(metadata: dict[str, Any], gang: tuple[dict[str, str], dict[str, str]]) -> dict[str, Any]:
    labels, annotations = gang
    if labels:
        metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
    if annotations:
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    return metadata


ALWAYS = replace(DEFAULT_CONFIG, rewrite=RewritePolicy.ALWAYS)


def stored_by_the_webhook(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the mutating webhook stored it when it was created: rewritten, with the
    original-resources annotation (a pod created before the webhook keeps what it asked for)."""
    mutation = admission_mutation(pod, ALWAYS, None)
    return apply(pod, mutation.operations()) if mutation.changed else pod


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    cluster = Cluster(nodes=draw(nodes()), quotas=draw(quotas()), pod_groups=draw(pod_groups()))
    node_count = len(cluster.nodes)
    for index in range(draw(st.integers(0, 4))):
        labels, spec = draw(pod_specs(node_count))
        pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                               "metadata": with_gang({"name": f"pod-{index}",
                                                      "namespace": draw(st.sampled_from(NAMESPACES)),
                                                      "labels": labels}, draw(gang_metadata())),
                               "spec": spec}
        if draw(st.integers(0, 3)) == 0:
            pod = stored_by_the_webhook(pod)
        if draw(st.booleans()):
            pod["status"] = {"phase": draw(st.sampled_from(["Running", "Pending", "Succeeded"]))}
        cluster.pods.append(pod)
    for index in range(draw(st.integers(0, 3))):
        labels, spec = draw(pod_specs(node_count))
        template = {"metadata": with_gang({"labels": {"app": f"d{index}", **labels}}, draw(gang_metadata())),
                    "spec": spec}
        kind = draw(st.sampled_from(["Deployment", "Deployment", "StatefulSet", "Job", "CronJob"]))
        workload_spec: dict[str, Any] = {"template": template}
        if kind == "Job":
            workload_spec["parallelism"] = draw(st.integers(1, 10))
        if kind in ("Deployment", "StatefulSet"):
            workload_spec = {"replicas": draw(st.integers(1, 3)), "selector": {"matchLabels": {"app": f"d{index}"}},
                             "template": template}
        elif kind == "CronJob":
            workload_spec = {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}}
        cluster.workloads.append({
            "apiVersion": "batch/v1" if kind in ("Job", "CronJob") else "apps/v1", "kind": kind,
            "metadata": {"name": f"{kind.lower()}-{index}", "namespace": draw(st.sampled_from(NAMESPACES))},
            "spec": workload_spec})
    if draw(st.integers(0, 3)) == 0:
        cluster.workloads.append({"apiVersion": "v1", "kind": "ResourceQuota",
                                  "metadata": {"name": "gpu-cap", "namespace": draw(st.sampled_from(NAMESPACES))},
                                  "spec": {"hard": {f"requests.{NVIDIA}": "4"}}})
    for index in range(draw(st.integers(0, 2))):
        labels, spec = draw(pod_specs(node_count))
        cluster.new_pods.append({"apiVersion": "v1", "kind": "Pod",
                                 "metadata": with_gang({"name": f"new-{index}",
                                                        "namespace": draw(st.sampled_from(NAMESPACES)),
                                                        "labels": labels}, draw(gang_metadata())),
                                 "spec": spec})
    return cluster


def template_pod(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod a controller creates from a workload's template now (as explain builds it)."""
    template = template_of(workload)
    assert template is not None
    metadata = workload["metadata"]
    pod_metadata = {"generateName": f"{metadata['name']}-", "namespace": metadata["namespace"],
                    "labels": template["metadata"]["labels"]}
    if template["metadata"].get("annotations"):
        pod_metadata["annotations"] = template["metadata"]["annotations"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata, "spec": template["spec"]}
