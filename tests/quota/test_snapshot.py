"""The quota tree and totals as the webhook workers see them (gpuquota_core.quota_snapshot).

A worker admits a pod from the published totals only when ``decide`` on them allows it; the
service then takes that yes as its own. So the one property that matters: over any tree, usage,
reservations and request, a yes from the published view is a yes from the service's exact view,
and where every total is a whole number of nano-units the two views decide alike.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuquota_core.ledger import ReservationLedger
from gpuquota_core.quantity import Quantity
from gpuquota_core.quota import PodRecord, QuotaTree, UsageIndex, quota_from_object
from gpuquota_core.quota_decision import PodQuotaRequest, decide, requests_of
from gpuquota_core.quota_snapshot import (
    NANOS_PER_UNIT,
    PublishedTotals,
    decode_tree,
    encode_tree,
    from_nanos,
    nanos_ceil,
    slot_count,
    slot_layout,
)
from gpuquota_core.resources import add_lists

RATIO = "koordinator.sh/gpu-memory-ratio"
CORE = "koordinator.sh/gpu-core"
GPU = "nvidia.com/gpu"
LEAVES = ("team-a", "team-b")

# Limits mix both families and plain resources, so the tree's canonical limits (and its notes on
# quotas naming both) are what the snapshot must carry across.
limit_names = st.sampled_from([RATIO, CORE, GPU, "cpu"])
limit_texts = st.sampled_from(["0", "1", "3", "100", "250", "1k", "1500m", "2.5"])
limits = st.dictionaries(limit_names, limit_texts, max_size=3)
# Requests and usage hit the limits exactly (the boundary where rounding matters) and include
# dust finer than a nano-unit, which the published totals must round up, never down.
LIMIT_AMOUNTS = [Fraction(0), Fraction(1), Fraction(3), Fraction(100), Fraction(250), Fraction(1000),
                 Fraction(3, 2), Fraction(5, 2), Fraction(300)]
request_amounts = st.one_of(st.sampled_from(LIMIT_AMOUNTS), st.integers(0, 400).map(Fraction),
                            st.builds(Fraction, st.integers(1, 10**6), st.sampled_from([10**3, 10**9, 3 * 10**9])),
                            st.sampled_from([Fraction(1, 3 * 10**9), Fraction(2, 3 * 10**9)]))
request_maps = st.dictionaries(st.sampled_from([RATIO, CORE, "cpu"]), request_amounts, min_size=1, max_size=3)


def quota(name: str, max_: dict[str, str], parent: str = "", is_parent: bool = False,
          admission: dict[str, str] | None = None) -> Any:
    labels = {"quota.scheduling.koordinator.sh/parent": parent} if parent else {}
    if is_parent:
        labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
    annotations = {}
    if admission is not None:
        annotations["quota.scheduling.koordinator.sh/admission"] = json.dumps(admission)
    return quota_from_object({"metadata": {"name": name, "namespace": "team", "labels": labels,
                                           "annotations": annotations, "resourceVersion": "7"},
                              "spec": {"max": max_}})


@st.composite
def worlds(draw: st.DrawFn) -> tuple[QuotaTree, UsageIndex, ReservationLedger, PodQuotaRequest]:
    parent = quota("org", draw(limits), is_parent=True)
    leaves = [quota(name, draw(limits), parent="org", admission=draw(st.none() | limits)) for name in LEAVES]
    tree = QuotaTree.build([parent, *leaves])
    usage = UsageIndex(tree)
    for index, (leaf, requests) in enumerate(draw(st.lists(st.tuples(st.sampled_from(LEAVES), request_maps),
                                                           max_size=4))):
        usage.upsert(PodRecord("team", f"running-{index}", f"uid-{index}", leaf,
                               {name: Quantity(amount) for name, amount in requests.items()}))
    ledger = ReservationLedger(ttl_seconds=30)
    for index, (leaf, requests) in enumerate(draw(st.lists(st.tuples(st.sampled_from(LEAVES), request_maps),
                                                           max_size=3))):
        asked = {name: Quantity(amount) for name, amount in requests.items()}
        ledger.reserve(f"team/held-{index}", f"held-{index}", (leaf, "org"), asked, now=0.0)
    asked = {name: Quantity(amount) for name, amount in draw(request_maps).items()}
    return tree, usage, ledger, PodQuotaRequest("team", "new", draw(st.sampled_from(LEAVES)), asked)


def published_view(tree: QuotaTree, usage: UsageIndex, ledger: ReservationLedger) -> tuple[QuotaTree, PublishedTotals]:
    """What a worker reads: the tree through its JSON document, the totals through nano-unit slots."""
    layout = slot_layout(tree)
    slots: dict[int, int] = {}
    for name, resources in layout.items():
        total = add_lists(usage.used(name), ledger.used(name))
        for resource, slot in resources.items():
            slots[slot] = nanos_ceil(total[resource]) if resource in total else 0
    snapshot = decode_tree(encode_tree(tree, 1, layout))
    return snapshot.tree, PublishedTotals(snapshot.layout, slots.__getitem__)


class _Nothing:
    def used(self, quota: str) -> dict[str, Quantity]:
        return {}


@settings(max_examples=400, deadline=None)
@given(worlds())
def test_a_yes_from_the_published_totals_is_a_yes_from_the_service(
        world: tuple[QuotaTree, UsageIndex, ReservationLedger, PodQuotaRequest]) -> None:
    tree, usage, ledger, pod = world
    service = decide(tree, usage, ledger, pod)
    worker_tree, totals = published_view(tree, usage, ledger)
    worker = decide(worker_tree, totals, _Nothing(), pod)
    if worker.allowed:
        assert service.allowed
        # What the worker then reserves is what the service would have charged.
        assert worker.quotas == service.quotas and worker.charges == service.charges
    exact = all(total.amount * NANOS_PER_UNIT == int(total.amount * NANOS_PER_UNIT)
                for name in tree.quotas for total in add_lists(usage.used(name), ledger.used(name)).values())
    if exact:
        assert worker.allowed == service.allowed


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_the_tree_document_rebuilds_the_same_tree(
        world: tuple[QuotaTree, UsageIndex, ReservationLedger, PodQuotaRequest]) -> None:
    tree = world[0]
    layout = slot_layout(tree)
    snapshot = decode_tree(encode_tree(tree, 42, layout))
    assert snapshot.generation == 42 and snapshot.layout == layout
    # resource_version is left out on purpose: a status-only rewrite must not start a generation.
    for name, original in tree.quotas.items():
        rebuilt = snapshot.tree.quotas[name]
        assert (rebuilt.namespace, rebuilt.parent, rebuilt.is_parent, rebuilt.min, rebuilt.max, rebuilt.admission,
                rebuilt.bound_namespaces, rebuilt.tree_id) == (original.namespace, original.parent, original.is_parent,
                                                               original.min, original.max, original.admission,
                                                               original.bound_namespaces, original.tree_id)
        assert snapshot.tree.limit(name)[0] == tree.limit(name)[0]


def test_slots_cover_each_limited_resource_once() -> None:
    tree = QuotaTree.build([quota("org", {GPU: "2", "cpu": "4"}, is_parent=True),
                            quota("team-a", {RATIO: "100"}, parent="org"), quota("team-b", {}, parent="org")])
    layout = slot_layout(tree)
    assert layout == {"org": {"cpu": 0, CORE: 1, RATIO: 2}, "team-a": {RATIO: 3}, "team-b": {}}
    assert slot_count(layout) == 4


def test_nano_units_round_up_and_read_back_exactly() -> None:
    assert nanos_ceil(Quantity.parse("1")) == 10**9
    assert nanos_ceil(Quantity.parse("1n")) == 1
    assert nanos_ceil(Quantity(Fraction(1, 3 * 10**9))) == 1  # finer than a nano-unit: never less
    assert nanos_ceil(Quantity.parse("-1500m")) == -1_500_000_000
    assert from_nanos(2_500_000_000).amount == Fraction(5, 2)
    assert requests_of({RATIO: "250"})[RATIO].amount == from_nanos(250 * 10**9).amount
