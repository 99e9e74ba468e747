"""Where a pod can be scheduled (kube-scheduler's filters) and whether its GPU request is rewritten."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuquota_core.conversion import load_config
from gpuquota_core.convert import convert_object
from gpuquota_core.mutation import admission_mutation
from gpuquota_core.placement import (
    NodeView,
    RewritePolicy,
    can_be_scheduled_on,
    constraints_of,
    decide_rewrite,
    node_summary,
    reachable_nodes,
)

NVIDIA, CORE, RATIO = "nvidia.com/gpu", "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
CANONICAL = frozenset({CORE, RATIO})
VENDOR_ONLY = {NVIDIA: "8"}
CANONICAL_ONLY = {CORE: "400", RATIO: "400", "koordinator.sh/gpu-memory": "320Gi"}
BOTH = {NVIDIA: "4", CORE: "400", RATIO: "400"}


def node(name: str, allocatable: dict[str, str] | None = None, labels: dict[str, str] | None = None,
         taints: list[dict[str, str]] | None = None, unschedulable: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": taints or []}
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}, "spec": spec,
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", **(allocatable or {})}}}


def view(*nodes: dict[str, Any]) -> NodeView:
    result = NodeView.from_objects(nodes)
    assert result is not None
    return result


def names(spec: dict[str, Any], nodes: NodeView) -> list[str]:
    return [n.name for n in reachable_nodes(constraints_of(spec), nodes.nodes)]


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


ZONED = view(node("a", labels={"zone": "z1", "cards": "8"}), node("b", labels={"zone": "z2", "cards": "4"}),
             node("c", labels={"cards": "many"}))


# -- the node summary -----------------------------------------------------------------------------

def test_a_summary_keeps_labels_taints_and_the_extended_resources_advertised() -> None:
    summary = node_summary(node("n", {NVIDIA: "2", "koordinator.sh/gpu-core": "0", "hugepages-2Mi": "1Gi"},
                                {"zone": "z1"}, [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]))

    assert summary is not None
    assert summary.resources == {NVIDIA}  # zero amounts and standard resources are not advertised
    assert dict(summary.labels) == {"zone": "z1"}
    assert [(t.key, t.value, t.effect) for t in summary.taints] == [("gpu", "yes", "NoSchedule")]
    assert not summary.mixed_gpu
    both = node_summary(node("m", BOTH))
    assert both is not None and both.mixed_gpu


def test_a_cordoned_node_is_tainted_unschedulable() -> None:
    assert names({}, view(node("open"), node("cordoned", unschedulable=True))) == ["open"]


def test_garbage_in_a_node_is_skipped_not_raised() -> None:
    summary = node_summary({"metadata": {"name": "n", "labels": {"a": 1}}, "spec": {"taints": [5, {"key": 3}]},
                            "status": {"allocatable": {NVIDIA: "lots", "x.io/y": [1]}}})
    assert summary is not None
    assert (dict(summary.labels), summary.taints, summary.resources) == ({}, (), frozenset())
    assert node_summary({"metadata": {}}) is None


# -- the filters ----------------------------------------------------------------------------------

def test_node_name_pins_one_node() -> None:
    assert names({"nodeName": "b"}, ZONED) == ["b"]


def test_node_selector_requires_every_label() -> None:
    assert names({"nodeSelector": {"zone": "z1", "cards": "8"}}, ZONED) == ["a"]
    assert names({"nodeSelector": {"zone": "z1", "cards": "4"}}, ZONED) == []


@pytest.mark.parametrize(("requirement", "expected"), [
    pytest.param(expression("zone", "In", "z1", "z3"), ["a"], id="In"),
    pytest.param(expression("zone", "NotIn", "z1"), ["b", "c"], id="NotIn-includes-unlabelled"),
    pytest.param(expression("zone", "Exists"), ["a", "b"], id="Exists"),
    pytest.param(expression("zone", "DoesNotExist"), ["c"], id="DoesNotExist"),
    pytest.param(expression("cards", "Gt", "4"), ["a"], id="Gt-integer-compare-non-integer-label-no-match"),
    pytest.param(expression("cards", "Lt", "8"), ["b"], id="Lt"),
    pytest.param(expression("cards", "Gt", "four"), [], id="Gt-non-integer-bound"),
    pytest.param(expression("cards", "Gt", "1", "2"), [], id="Gt-two-values"),
    pytest.param(expression("zone", "Near", "z1"), [], id="unknown-operator"),
])
def test_each_operator(requirement: dict[str, Any], expected: list[str]) -> None:
    assert names(required({"matchExpressions": [requirement]}), ZONED) == expected


def test_terms_are_ored_and_expressions_anded() -> None:
    anded = {"matchExpressions": [expression("zone", "Exists"), expression("cards", "Lt", "5")]}
    assert names(required(anded), ZONED) == ["b"]
    assert names(required(anded, {"matchExpressions": [expression("zone", "DoesNotExist")]}), ZONED) == ["b", "c"]


def test_match_fields_select_by_node_name_and_an_empty_term_matches_nothing() -> None:
    by_name = {"matchFields": [expression("metadata.name", "In", "c", "x")]}
    assert names(required(by_name), ZONED) == ["c"]
    assert names(required({}), ZONED) == []
    assert names(required(), ZONED) == []


def test_node_selector_and_affinity_both_apply() -> None:
    spec = {"nodeSelector": {"zone": "z2"}, **required({"matchExpressions": [expression("cards", "Gt", "6")]})}
    assert names(spec, ZONED) == []


TAINTED = view(node("plain"), node("gpu", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
               node("evict", taints=[{"key": "maint", "effect": "NoExecute"}]),
               node("soft", taints=[{"key": "gpu", "value": "yes", "effect": "PreferNoSchedule"}]))


@pytest.mark.parametrize(("tolerations", "expected"), [
    pytest.param([], ["plain", "soft"], id="none-PreferNoSchedule-ignored"),
    pytest.param([{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}],
                 ["plain", "gpu", "soft"], id="Equal"),
    pytest.param([{"key": "gpu", "value": "no"}], ["plain", "soft"], id="Equal-other-value"),
    pytest.param([{"key": "gpu", "operator": "Exists"}], ["plain", "gpu", "soft"], id="Exists-any-value-any-effect"),
    pytest.param([{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}], ["plain", "soft"],
                 id="effect-must-match"),
    pytest.param([{"operator": "Exists"}], ["plain", "gpu", "evict", "soft"], id="empty-key-Exists-tolerates-all"),
    pytest.param([{"operator": "Exists", "effect": "NoExecute"}], ["plain", "evict", "soft"],
                 id="empty-key-one-effect"),
])
def test_taints_the_pod_does_not_tolerate(tolerations: list[dict[str, str]], expected: list[str]) -> None:
    assert names({"tolerations": tolerations}, TAINTED) == expected


def test_a_pod_with_node_name_skips_no_schedule_but_not_no_execute() -> None:
    assert names({"nodeName": "gpu"}, TAINTED) == ["gpu"]
    assert names({"nodeName": "evict"}, TAINTED) == []


def test_unreadable_constraints_match_no_node() -> None:
    constraints = constraints_of({"nodeSelector": ["zone"]})
    assert constraints.unreadable
    assert not any(can_be_scheduled_on(constraints, n) for n in ZONED.nodes)


# -- the decision ---------------------------------------------------------------------------------

CLUSTER = view(node("gpu-whole-0", VENDOR_ONLY, {"pool": "whole"}),
               node("gpu-shared-0", CANONICAL_ONLY, {"pool": "shared"}))


def gpu_pod(**spec: Any) -> dict[str, Any]:
    gpu = {NVIDIA: "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "main", "resources": {"requests": gpu, "limits": gpu}}], **spec}}


def test_pinned_to_a_vendor_only_node_is_left_with_the_reason() -> None:
    mutation = admission_mutation(gpu_pod(nodeSelector={"pool": "whole"}), load_config(None), CLUSTER)

    assert not mutation.changed and mutation.patch == ()
    assert mutation.warnings == (
        "gpuquota left nvidia.com/gpu as written: none of the 1 node(s) this pod can be scheduled on "
        "(gpu-whole-0) advertises koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio",)


def test_unconstrained_with_a_canonical_node_is_rewritten() -> None:
    mutation = admission_mutation(gpu_pod(), load_config(None), CLUSTER)

    assert mutation.changed and mutation.warnings == ()
    assert mutation.needs == CANONICAL


def test_nothing_reachable_is_left_and_says_so() -> None:
    mutation = admission_mutation(gpu_pod(nodeSelector={"pool": "gone"}), load_config(None), CLUSTER)

    assert not mutation.changed
    assert mutation.warnings == (
        "gpuquota left nvidia.com/gpu as written: none of the 2 node(s) listed can take this pod (nodeName, "
        "nodeSelector, required node affinity, taints), so none advertises koordinator.sh/gpu-core, "
        "koordinator.sh/gpu-memory-ratio",)


def test_before_the_nodes_are_listed_auto_does_not_guess() -> None:
    mutation = admission_mutation(gpu_pod(), load_config(None), None)

    assert not mutation.changed
    assert mutation.warnings == (
        "gpuquota left nvidia.com/gpu as written: the webhook has not listed the cluster's nodes yet, so it "
        "cannot tell whether a node this pod can reach advertises koordinator.sh/gpu-core, "
        "koordinator.sh/gpu-memory-ratio",)


def test_always_rewrites_regardless_and_warns_when_no_node_fits() -> None:
    config = load_config({"rewrite": "always"})
    assert admission_mutation(gpu_pod(), config, None).changed
    pinned = admission_mutation(gpu_pod(nodeSelector={"pool": "whole"}), config, CLUSTER)
    assert pinned.changed
    assert pinned.warnings == (
        "gpuquota rewrote nvidia.com/gpu (rewrite: always) although none of the 1 node(s) this pod can be "
        "scheduled on (gpu-whole-0) advertises koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio; the pod "
        "may stay Pending",)


def test_never_rewrites_nothing_and_stays_quiet() -> None:
    mutation = admission_mutation(gpu_pod(), load_config({"rewrite": "never"}), CLUSTER)
    assert (mutation.changed, mutation.warnings) == (False, ())


def test_a_pod_that_can_land_on_a_mixed_node_is_warned() -> None:
    cluster = view(node("gpu-mixed-0", BOTH), node("gpu-shared-0", CANONICAL_ONLY))
    canonical = {CORE: "100", RATIO: "100"}
    pod = gpu_pod()
    pod["spec"]["containers"][0]["resources"] = {"requests": canonical, "limits": canonical}

    mutation = admission_mutation(pod, load_config(None), cluster)

    assert not mutation.changed
    assert mutation.warnings == (
        "gpuquota: this pod can be scheduled on gpu-mixed-0, which advertise(s) both a vendor GPU name and "
        "koordinator.sh/gpu-* for the same cards: the device plugin and Koordinator may hand out one card twice "
        "(audit check node-mixed-gpu-resources)",)
    assert admission_mutation(pod, load_config(None), view(node("gpu-shared-0", CANONICAL_ONLY))).warnings == ()


def test_the_decision_follows_a_new_node_view() -> None:
    pod = gpu_pod(nodeSelector={"pool": "whole"})
    assert not admission_mutation(pod, load_config(None), CLUSTER).changed

    converted = view(node("gpu-whole-0", {**VENDOR_ONLY, **CANONICAL_ONLY}, {"pool": "whole"}))
    assert admission_mutation(pod, load_config(None), converted).changed


def test_a_zero_output_asks_nothing_of_a_node() -> None:
    decision = decide_rewrite(RewritePolicy.AUTO, constraints_of({}), [NVIDIA], [], CLUSTER)
    assert decision.rewrite


def test_convert_applies_the_same_rule_to_templates() -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ns"},
                  "spec": {"template": {k: v for k, v in gpu_pod(nodeSelector={"pool": "whole"}).items()
                                        if k in ("metadata", "spec")}}}

    left = convert_object(deployment, load_config(None), CLUSTER)
    assert left.patch == [] and left.summary == []
    assert left.notes[0].startswith("gpuquota left nvidia.com/gpu as written: none of the 1 node(s)")
    # No nodes to look at: what a rewrite would store.
    assert convert_object(deployment, load_config(None), None).summary


def test_one_view_remembers_decisions_per_constraints_not_per_shape() -> None:
    config = load_config(None)
    pinned, free = gpu_pod(nodeSelector={"pool": "whole"}), gpu_pod()

    for _ in range(2):  # the second round answers from the view's memo: still per constraints
        assert not admission_mutation(pinned, config, CLUSTER).changed
        assert admission_mutation(free, config, CLUSTER).changed


# -- hostile input: the decision answers, it never raises -----------------------------------------

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6), st.sampled_from(
    ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Equal", "NoSchedule", "NoExecute", "pool", "whole", "8"]))
_KEYS = st.one_of(st.sampled_from(["nodeName", "nodeSelector", "affinity", "nodeAffinity", "tolerations",
                                   "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms",
                                   "matchExpressions", "matchFields", "key", "operator", "values", "value",
                                   "effect", "pool"]), st.text(max_size=6))
_JSON = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(_KEYS, inner, max_size=3)), max_leaves=20)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.dictionaries(_KEYS, _JSON, max_size=4))
def test_any_scheduling_fields_get_an_answer(fields: dict[str, Any]) -> None:
    pod = gpu_pod()
    pod["spec"].update(fields)
    mutation = admission_mutation(pod, load_config(None), CLUSTER)
    assert mutation.changed or mutation.warnings
