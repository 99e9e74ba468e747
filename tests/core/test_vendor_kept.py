"""The rewrite keeps the pod's GPU vendor (gpuquota_core.placement, gpuquota_core.mutation).

``amd.com/gpu`` fits only nodes that advertise it; the canonical names it is rewritten into fit
every node reporting Koordinator GPUs, NVIDIA ones included. Each test builds the nodes, asks the
webhook's own function for its answer, applies the patch, and reads where the stored pod can land.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.jsonpatch import apply
from gpuquota_core.mutation import PodMutation, admission_mutation
from gpuquota_core.placement import GPU_VENDOR_LABEL, NodeView, RewritePolicy, constraints_of, reachable_nodes

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
KOORDINATOR_GPUS = {CORE: "400", RATIO: "400"}
AMD_TERM = {"key": GPU_VENDOR_LABEL, "operator": "In", "values": ["amd"]}
NVIDIA_TERMS = [{"key": GPU_VENDOR_LABEL, "operator": "In", "values": ["nvidia"]},
                {"key": GPU_VENDOR_LABEL, "operator": "DoesNotExist"}]
ALWAYS = replace(DEFAULT_CONFIG, rewrite=RewritePolicy.ALWAYS)


def node(name: str, vendor: str | None, allocatable: dict[str, str], **labels: str) -> dict[str, Any]:
    if vendor is not None:
        labels[GPU_VENDOR_LABEL] = vendor
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "8", **allocatable}}}


# Koordinator GPUs on every node; the AMD node runs AMD's device plugin too.
NVIDIA_UNLABELLED = node("nvidia-0", None, KOORDINATOR_GPUS, pool="a")
NVIDIA_LABELLED = node("nvidia-1", "nvidia", KOORDINATOR_GPUS, pool="b")
AMD_NODE = node("amd-0", "amd", {"amd.com/gpu": "4", **KOORDINATOR_GPUS}, pool="a")
TWO_VENDORS = NodeView.from_objects([NVIDIA_UNLABELLED, NVIDIA_LABELLED, AMD_NODE])


def pod(resource: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {resource: "1"}}}], **spec}}


def stored(asked: dict[str, Any], mutation: PodMutation) -> dict[str, Any]:
    return apply(asked, mutation.operations()) if mutation.changed else asked


def landing(stored_pod: dict[str, Any], view: NodeView) -> list[str]:
    """The nodes the stored pod can be scheduled on that advertise every GPU name it asks for."""
    limits = stored_pod["spec"]["containers"][0]["resources"]["limits"]
    return [n.name for n in reachable_nodes(constraints_of(stored_pod["spec"]), view.nodes)
            if set(limits) <= n.resources]


def required_terms(stored_pod: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = stored_pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return terms


def test_an_amd_pod_is_rewritten_for_the_amd_nodes_only() -> None:
    asked = pod("amd.com/gpu")
    mutation = admission_mutation(asked, DEFAULT_CONFIG, TWO_VENDORS)
    result = stored(asked, mutation)

    assert result["spec"]["containers"][0]["resources"]["limits"] == {CORE: "100", RATIO: "100"}
    assert required_terms(result) == [{"matchExpressions": [AMD_TERM]}]
    assert landing(result, TWO_VENDORS) == ["amd-0"]
    assert landing(asked, TWO_VENDORS) == ["amd-0"]  # where it could land as written: the same
    assert mutation.warnings == (
        "gpuquota kept the pod on amd nodes (required node affinity on node.koordinator.sh/gpu-vendor): "
        "koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio name no vendor, and nvidia-0, nvidia-1 of "
        "another vendor advertise(s) them",
        "gpuquota: this pod can be scheduled on amd-0, which advertise(s) both a vendor GPU name and "
        "koordinator.sh/gpu-* for the same cards: the device plugin and Koordinator may hand out one card twice "
        "(audit check node-mixed-gpu-resources)")


def test_an_nvidia_pod_still_reaches_nodes_without_a_vendor_label_and_no_amd_node() -> None:
    asked = pod("nvidia.com/gpu")
    result = stored(asked, admission_mutation(asked, DEFAULT_CONFIG, TWO_VENDORS))

    assert required_terms(result) == [{"matchExpressions": [term]} for term in NVIDIA_TERMS]
    assert landing(result, TWO_VENDORS) == ["nvidia-0", "nvidia-1"]


def test_on_a_single_vendor_cluster_the_rewrite_adds_nothing_else() -> None:
    nvidia_only = NodeView.from_objects([NVIDIA_UNLABELLED, NVIDIA_LABELLED])
    asked = pod("nvidia.com/gpu")
    mutation = admission_mutation(asked, DEFAULT_CONFIG, nvidia_only)

    limits = "/spec/containers/0/resources/limits/"
    assert sorted(op["path"] for op in mutation.operations()) == [
        "/metadata/annotations", f"{limits}koordinator.sh~1gpu-core", f"{limits}koordinator.sh~1gpu-memory-ratio",
        f"{limits}nvidia.com~1gpu"]
    assert mutation.warnings == ()
    # Nor where the pod's own constraints already keep it off the other vendor's nodes.
    pinned = pod("amd.com/gpu", nodeSelector={GPU_VENDOR_LABEL: "amd"})
    assert "/spec/affinity" not in [op["path"] for op in admission_mutation(pinned, DEFAULT_CONFIG,
                                                                           TWO_VENDORS).operations()]


def test_an_amd_pod_no_amd_node_takes_rewritten_is_left_as_written_and_told_why() -> None:
    nvidia_and_amd_plugin_only = NodeView.from_objects(
        [NVIDIA_UNLABELLED, node("amd-1", "amd", {"amd.com/gpu": "4"})])
    asked = pod("amd.com/gpu")
    mutation = admission_mutation(asked, DEFAULT_CONFIG, nvidia_and_amd_plugin_only)

    assert not mutation.changed
    assert mutation.warnings == (
        "gpuquota left amd.com/gpu as written: the node(s) this pod can be scheduled on that advertise "
        "koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio (nvidia-0) have another GPU vendor than "
        "node.koordinator.sh/gpu-vendor=amd",)
    # `rewrite: always` rewrites it all the same, and still keeps it off the NVIDIA node.
    forced = admission_mutation(asked, ALWAYS, nvidia_and_amd_plugin_only)
    assert landing(stored(asked, forced), nvidia_and_amd_plugin_only) == []
    assert forced.warnings[0] == (
        "gpuquota rewrote amd.com/gpu (rewrite: always) although the node(s) this pod can be scheduled on that "
        "advertise koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio (nvidia-0) have another GPU vendor "
        "than node.koordinator.sh/gpu-vendor=amd; the pod may stay Pending")


def test_the_vendor_is_anded_into_every_term_the_pod_already_has() -> None:
    by_pool = {"key": "pool", "operator": "In", "values": ["a"]}
    by_name = {"key": "metadata.name", "operator": "In", "values": ["nvidia-1"]}
    no_node = {}  # a term without expressions matches no node, and must go on matching none
    affinity = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [by_pool]}, {"matchFields": [by_name]}, no_node]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [by_pool]}}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}

    amd = stored(pod("amd.com/gpu", affinity=affinity), admission_mutation(
        pod("amd.com/gpu", affinity=affinity), DEFAULT_CONFIG, TWO_VENDORS))
    assert required_terms(amd) == [{"matchExpressions": [by_pool, AMD_TERM]},
                                   {"matchFields": [by_name], "matchExpressions": [AMD_TERM]}, no_node]
    assert landing(amd, TWO_VENDORS) == ["amd-0"]

    nvidia = stored(pod("nvidia.com/gpu", affinity=affinity), admission_mutation(
        pod("nvidia.com/gpu", affinity=affinity), DEFAULT_CONFIG, TWO_VENDORS))
    assert required_terms(nvidia) == [
        {"matchExpressions": [by_pool, NVIDIA_TERMS[0]]}, {"matchExpressions": [by_pool, NVIDIA_TERMS[1]]},
        {"matchFields": [by_name], "matchExpressions": [NVIDIA_TERMS[0]]},
        {"matchFields": [by_name], "matchExpressions": [NVIDIA_TERMS[1]]}, no_node]
    assert landing(nvidia, TWO_VENDORS) == ["nvidia-0", "nvidia-1"]
    # Everything else of the affinity is the user's, untouched.
    for result in (amd, nvidia):
        assert result["spec"]["affinity"]["podAntiAffinity"] == affinity["podAntiAffinity"]
        assert result["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == \
            affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]


def test_the_mutation_of_its_own_output_changes_nothing() -> None:
    for resource in ("amd.com/gpu", "nvidia.com/gpu"):
        asked = pod(resource, affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]}}})
        once = stored(asked, admission_mutation(asked, DEFAULT_CONFIG, TWO_VENDORS))
        again = admission_mutation(once, DEFAULT_CONFIG, TWO_VENDORS)
        assert again.operations() == [], resource


def test_without_a_node_list_always_adds_no_vendor_affinity() -> None:
    # Nothing is known of other vendors' nodes (the webhook before its first list, `convert` with no
    # Node in its input): the rewrite is as on a single-vendor cluster.
    asked = pod("amd.com/gpu")
    result = stored(asked, admission_mutation(asked, ALWAYS, None))
    assert "affinity" not in result["spec"]
    assert result["spec"]["containers"][0]["resources"]["limits"] == {CORE: "100", RATIO: "100"}


def test_a_request_that_names_no_vendor_is_not_tied_to_one() -> None:
    asked = pod("koordinator.sh/gpu")
    result = stored(asked, admission_mutation(asked, DEFAULT_CONFIG, TWO_VENDORS))
    assert "affinity" not in result["spec"]
    assert landing(result, TWO_VENDORS) == ["nvidia-0", "nvidia-1", "amd-0"]


def test_a_rule_without_a_vendor_keeps_none() -> None:
    config = replace(DEFAULT_CONFIG, rules=tuple(replace(rule, vendor=None) for rule in DEFAULT_CONFIG.rules))
    asked = pod("amd.com/gpu")
    assert "affinity" not in stored(asked, admission_mutation(asked, config, TWO_VENDORS))["spec"]
