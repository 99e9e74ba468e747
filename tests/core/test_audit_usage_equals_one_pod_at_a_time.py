"""The audit's fast paths give exactly what the code they short-cut gives.

``UsageIndex.load`` (bulk charging) and the shape keys computed once per pod exist only for speed
at 100,000 pods (docs/benchmarks.md); each is checked here against the one-at-a-time code, over
generated input.
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuquota_core.audit import AuditReport, check_nodes
from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.pod_records import PodRecord, spec_shape_key
from gpuquota_core.quantity import Quantity, QuantityFormat
from gpuquota_core.quota_objects import quota_from_object
from gpuquota_core.quota_tree import QuotaTree
from gpuquota_core.resources import gpu_family
from gpuquota_core.usage_index import UsageIndex

EXAMPLES = int(os.environ.get("GPUQUOTA_PROPERTY_EXAMPLES", "300"))
PROFILE = settings(max_examples=EXAMPLES, deadline=None,
                   derandomize=os.environ.get("GPUQUOTA_PROPERTY_RANDOM") != "1")

PARENT = "quota.scheduling.koordinator.sh/parent"
NAMES = ["cpu", "memory", "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio", "nvidia.com/gpu"]


def tree() -> QuotaTree:
    """Two parents, three leaves (one a namespace-named quota), and the default quota."""
    objects: list[dict[str, Any]] = [
        {"metadata": {"name": "org-a", "namespace": "system"}, "spec": {"max": {}}},
        {"metadata": {"name": "org-b", "namespace": "system"}, "spec": {"max": {}}},
        {"metadata": {"name": "team-1", "namespace": "ns-1", "labels": {PARENT: "org-a"}}, "spec": {"max": {}}},
        {"metadata": {"name": "team-2", "namespace": "ns-2", "labels": {PARENT: "org-a"}}, "spec": {"max": {}}},
        {"metadata": {"name": "ns-3", "namespace": "ns-3", "labels": {PARENT: "org-b"}}, "spec": {"max": {}}},
        {"metadata": {"name": "koordinator-default-quota", "namespace": "system"}, "spec": {"max": {}}},
    ]
    return QuotaTree.build(quota_from_object(obj) for obj in objects)


quantities = st.one_of(
    st.integers(0, 10**12).map(lambda n: Quantity(Fraction(n), QuantityFormat.BINARY_SI)),
    st.integers(0, 10**6).map(lambda n: Quantity(Fraction(n))),
    st.builds(lambda n, d: Quantity(Fraction(n, d)), st.integers(0, 10**6), st.sampled_from([3, 1000, 10**9])),
)
records = st.builds(
    PodRecord,
    namespace=st.sampled_from(["ns-1", "ns-2", "ns-3", "ns-4"]),
    name=st.sampled_from([f"pod-{i}" for i in range(8)]),
    uid=st.just(""),
    quota_label=st.sampled_from(["", "", "team-1", "team-2", "ns-3", "org-b", "missing"]),
    requests=st.dictionaries(st.sampled_from(NAMES), quantities, max_size=4),
    gang=st.sampled_from(["", "", "ns-1/gang-a", "ns-2/gang-b"]),
)


@st.composite
def alike_records(draw: st.DrawFn) -> list[PodRecord]:
    """Records sharing a few requests maps' Quantity objects, as the replicas of a workload do
    (remembered_pod_requests copies the cached map, not its values)."""
    maps = draw(st.lists(st.dictionaries(st.sampled_from(NAMES), quantities, max_size=4), min_size=1, max_size=3))
    return [PodRecord(namespace, f"pod-{i}", "", label, dict(maps[choice]))
            for i, (namespace, label, choice) in enumerate(draw(st.lists(st.tuples(
                st.sampled_from(["ns-1", "ns-2", "ns-3"]), st.sampled_from(["", "team-1", "ns-3", "org-b"]),
                st.integers(0, len(maps) - 1)), max_size=40)))]


def state(usage: UsageIndex) -> tuple[object, ...]:
    """Everything an index holds, orders and formats included."""
    used = [(quota, [(name, q.amount, q.format) for name, q in names.items()])
            for quota, names in usage._used.items()]
    return list(usage._pods.items()), list(usage._charged.items()), used


def nonzero_totals(usage: UsageIndex) -> dict[str, dict[str, Quantity]]:
    totals = {quota: {n: q for n, q in names.items() if not q.is_zero()} for quota, names in usage._used.items()}
    return {quota: names for quota, names in totals.items() if names}


def one_by_one(start: list[PodRecord], batch: list[PodRecord]) -> UsageIndex:
    usage = UsageIndex(tree())
    for record in [*start, *batch]:
        usage.upsert(record)
    return usage


def in_bulk(start: list[PodRecord], batch: list[PodRecord]) -> UsageIndex:
    usage = UsageIndex(tree())
    for record in start:
        usage.upsert(record)
    usage.load(batch)
    return usage


@PROFILE
@given(st.lists(records, max_size=6), st.lists(records, max_size=30, unique_by=lambda r: r.key))
def test_bulk_load_equals_upserting_each_in_turn(start: list[PodRecord], batch: list[PodRecord]) -> None:
    assert state(in_bulk(start, batch)) == state(one_by_one(start, batch))


@PROFILE
@given(st.lists(records, max_size=6), alike_records())
def test_bulk_load_of_alike_pods_equals_upserting_each_in_turn(start: list[PodRecord],
                                                                batch: list[PodRecord]) -> None:
    assert state(in_bulk(start, batch)) == state(one_by_one(start, batch))


@PROFILE
@given(st.lists(records, max_size=6), st.lists(records, max_size=30))
def test_bulk_load_with_repeated_keys_keeps_the_last_record(start: list[PodRecord], batch: list[PodRecord]) -> None:
    bulk, sequential = in_bulk(start, batch), one_by_one(start, batch)
    # The documented difference: a record replaced within the call is never charged, so the
    # zero entries its discard would leave are missing. Pods, charges and non-zero totals agree.
    assert list(bulk._pods.items()) == list(sequential._pods.items())
    assert list(bulk._charged.items()) == list(sequential._charged.items())
    assert nonzero_totals(bulk) == nonzero_totals(sequential)


def test_bulk_load_charges_the_leaf_and_its_ancestors() -> None:
    usage = UsageIndex(tree())
    gpu = {"koordinator.sh/gpu-core": Quantity(Fraction(50))}
    usage.load([PodRecord("ns-1", "a", "", "team-1", gpu), PodRecord("ns-1", "b", "", "team-1", gpu),
                PodRecord("ns-9", "c", "", "missing", gpu)])
    assert usage.used("team-1") == usage.used("org-a") == {"koordinator.sh/gpu-core": Quantity(Fraction(100))}
    assert usage.charged_to("ns-9/c") == ()


def test_shape_keys_tell_value_types_apart() -> None:
    def key(value: object, **spec: object) -> object:
        return spec_shape_key({"containers": [{"name": "c", "resources": {"limits": {"cpu": value}}}], **spec},
                              DEFAULT_CONFIG)

    keys = [key("1"), key(1), key(1.0), key(True)]
    assert len(set(keys)) == 4
    assert key("1") == key("1")
    assert key([1]) is None  # unhashable: the uncached path answers
    pinned = key("1", nodeSelector={DEFAULT_CONFIG.model_label: "A100"})
    assert pinned != key("1") and pinned == key("1", nodeSelector={DEFAULT_CONFIG.model_label: "A100"})
    assert key("1", nodeSelector={}) == key("1")


node_lists = st.dictionaries(st.sampled_from(["nvidia.com/gpu", "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory",
                                              "koordinator.sh/gpu-memory-ratio", "huawei.com/npu-core"]),
                             st.builds(lambda n, s: f"{n}{s}", st.integers(1, 5000),
                                       st.sampled_from(["", "m", "k", "Ki", "Gi", "n"])), max_size=4)


@PROFILE
@given(st.lists(node_lists, max_size=12))
def test_capacity_totals_equal_the_running_text_sum(capacities: list[dict[str, str]]) -> None:
    nodes = [{"kind": "Node", "metadata": {"name": f"n{i}"}, "status": {"capacity": c}}
             for i, c in enumerate(capacities)]
    report = AuditReport()
    check_nodes(nodes, report)
    expected: dict[str, dict[str, str]] = {}
    for capacity in capacities:  # what check_nodes wrote before: parse, add and format per node
        for resource, text in capacity.items():
            family = gpu_family(resource)
            bucket = expected.setdefault(family.value if family else "other", {})
            bucket[resource] = str(Quantity.parse(bucket.get(resource, "0")) + Quantity.parse(text))
    assert report.capacity == expected
    assert [list(b) for b in report.capacity.values()] == [list(b) for b in expected.values()]


@PROFILE
@given(st.lists(records, min_size=1, max_size=8), st.lists(st.integers(0, 7), max_size=12), st.data())
def test_a_pod_upserted_as_it_is_counted_changes_nothing(start: list[PodRecord], picks: list[int],
                                                         data: st.DataObject) -> None:
    # A status-only watch event brings an equal record (a new map, the same or equal quantities).
    # Skipping its charge must leave the index exactly as discarding and charging it would.
    skipping, recharging = UsageIndex(tree()), UsageIndex(tree())
    for record in start:
        skipping.upsert(record)
        recharging.upsert(record)
    for pick in picks:
        counted = list(skipping.pods())[pick % len(skipping)]
        same = data.draw(st.booleans())  # the same Quantity objects, or equal copies of them
        requests = {name: q if same else Quantity(q.amount, q.format) for name, q in counted.requests.items()}
        again = PodRecord(counted.namespace, counted.name, counted.uid, counted.quota_label, requests)
        skipping.upsert(again)
        recharging.discard(again.key)
        recharging.upsert(again)
    assert state(skipping) == state(recharging)


def test_an_equal_amount_in_another_format_is_charged_again() -> None:
    usage = UsageIndex(tree())
    usage.upsert(PodRecord("ns-1", "p", "", "team-1", {"memory": Quantity(Fraction(1024), QuantityFormat.BINARY_SI)}))
    usage.upsert(PodRecord("ns-1", "p", "", "team-1", {"memory": Quantity(Fraction(1024))}))
    # Totals keep formats, so this one is charged again: every total of the chain takes its format.
    for quota in ("team-1", "org-a"):
        assert usage.used(quota)["memory"].format == Quantity(Fraction(1024)).format


@PROFILE
@given(st.lists(records, max_size=30), alike_records())
def test_retree_after_the_tree_changed_equals_charging_each_pod_again(records_: list[PodRecord],
                                                                       alike: list[PodRecord]) -> None:
    usage = UsageIndex(tree())
    for record in [*records_, *alike]:
        usage.upsert(record)
    charged_before = {record.key: usage.charged_to(record.key) for record in usage.pods()}
    # team-2 moves under org-b and ns-3's quota goes: pods re-resolve, some to no quota at all.
    usage.tree.upsert(quota_from_object({"metadata": {"name": "team-2", "namespace": "ns-2",
                                                      "labels": {PARENT: "org-b"}}, "spec": {"max": {}}}))
    usage.tree.remove("ns-3")
    recharged = usage.retree()
    again = UsageIndex(usage.tree)
    for record in list(usage.pods()):
        again.upsert(record)
    # Every pod charged again when any pod's quotas changed, so the index is what a fresh count gives,
    # orders and formats included; none when none did, and then the same pods, charges and amounts.
    moved = any(again.charged_to(key) != quotas for key, quotas in charged_before.items())
    assert recharged == (len(charged_before) if moved else 0)
    if moved:
        assert state(usage) == state(again)
    assert list(usage._pods.items()) == list(again._pods.items()) and usage._charged == again._charged
    assert nonzero_totals(usage) == nonzero_totals(again)
    # A gang's members are counted whatever quotas they are charged to: the same after the tree's change.
    gangs = {record.gang for record in usage.pods() if record.gang}
    assert {gang: members(usage, gang) for gang in gangs} == {gang: members(again, gang) for gang in gangs}
    assert usage.retree() == 0  # the tree as it is now: nothing moves


def members(usage: UsageIndex, gang: str) -> tuple[int, dict[str, Fraction]]:
    """How many members of ``gang`` the index counts, and what they ask (amounts; zeros left out)."""
    count, asked = usage.gang_members(gang)
    return count, {name: quantity.amount for name, quantity in asked.items() if not quantity.is_zero()}
