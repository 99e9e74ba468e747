"""The quota tree and totals as the webhook workers see them (webhook.quota.snapshot).

A worker admits a pod from the published totals only when its fit check (``decide`` reduced to
integer bounds) passes; the service then takes that yes as its own. So the one property that
matters: over any tree, usage, reservations and request, a fit on the published view is a yes
from the service's exact view with the same charges, and where nothing needs rounding the two
decide alike.
"""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuquota_core.ledger import ReservationLedger
from gpuquota_core.pod_records import PodRecord
from gpuquota_core.quantity import Quantity
from gpuquota_core.quota_decision import PodQuotaRequest, decide, requests_of
from gpuquota_core.quota_objects import quota_from_object
from gpuquota_core.quota_tree import QuotaTree
from gpuquota_core.resources import add_lists
from gpuquota_core.usage_index import UsageIndex
from webhook.quota.snapshot import (
    NANOS_PER_UNIT,
    decode_tree,
    encode_tree,
    fit_check,
    nanos_ceil,
    nanos_floor,
    slot_count,
    slot_layout,
)

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


World = tuple[QuotaTree, UsageIndex, ReservationLedger, PodQuotaRequest]


def world_of(leaf_max: dict[str, Quantity], running: dict[str, Quantity], asked: dict[str, Quantity]) -> World:
    """team-a under org: one running pod and one new pod in team-a."""
    tree = QuotaTree.build([quota("org", {}, is_parent=True), replace(quota("team-a", {}, parent="org"),
                                                                      max=leaf_max)])
    usage = UsageIndex(tree)
    usage.upsert(PodRecord("team", "running", "uid-running", "team-a", running))
    return tree, usage, ReservationLedger(ttl_seconds=30), PodQuotaRequest("team", "new", "team-a", asked)


DUST = Fraction(1, 3 * 10**9)
# Used dust the totals must round up: 100 of room less a third of a nano-unit does not hold 100.
DUST_USED = world_of({RATIO: Quantity(Fraction(100))}, {RATIO: Quantity(DUST)}, {RATIO: Quantity(Fraction(100))})
# A limit finer than a nano-unit must round down: 100 and a third of a nano-unit, with one
# nano-unit used, does not hold 100 more.
DUST_LIMIT = world_of({RATIO: Quantity(100 + DUST)}, {RATIO: Quantity(Fraction(1, 10**9))},
                      {RATIO: Quantity(Fraction(100))})


@st.composite
def worlds(draw: st.DrawFn) -> World:
    parent = quota("org", draw(limits), is_parent=True)
    leaves = [quota(name, draw(limits), parent="org", admission=draw(st.none() | limits)) for name in LEAVES]
    # Parsed limits are whole nano-units (as in Kubernetes); one built by arithmetic need not be.
    if draw(st.booleans()):
        leaves[0] = replace(leaves[0], max={name: Quantity(amount) for name, amount in draw(request_maps).items()})
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


def published_slots(tree: QuotaTree, usage: UsageIndex, ledger: ReservationLedger) -> dict[int, int]:
    """The totals as the quota service publishes them: usage plus reservations, nano-units rounded up."""
    slots: dict[int, int] = {}
    for name, resources in slot_layout(tree).items():
        total = add_lists(usage.used(name), ledger.used(name))
        for resource, slot in resources.items():
            slots[slot] = nanos_ceil(total[resource]) if resource in total else 0
    return slots


def whole_nanos(quantity: Quantity) -> bool:
    return (quantity.amount * NANOS_PER_UNIT).denominator == 1


@settings(max_examples=400, deadline=None)
@given(worlds())
@example(DUST_USED)
@example(DUST_LIMIT)
def test_a_fit_on_the_published_totals_is_a_yes_from_the_service(world: World) -> None:
    tree, usage, ledger, pod = world
    service = decide(tree, usage, ledger, pod)
    # The worker's side: the tree through its JSON document, the totals through nano-unit slots.
    snapshot = decode_tree(encode_tree(tree, 1, slot_layout(tree)))
    check = fit_check(snapshot.tree, snapshot.layout, pod)
    if check is None:
        assert not service.allowed  # refused whatever is used: the service refuses too
        return
    fits = check.fits(published_slots(tree, usage, ledger).__getitem__)
    if fits:
        assert service.allowed
        # What the worker then reserves is what the service would have charged.
        assert check.quotas == service.quotas and check.charges == service.charges
    totals = [total for name in tree.quotas for total in add_lists(usage.used(name), ledger.used(name)).values()]
    limits = [limit for name in tree.quotas for limit in tree.limit(name)[0].values()]
    if all(whole_nanos(q) for q in [*totals, *limits, *pod.requests.values()]):
        assert fits == service.allowed  # nothing rounded: the two decide alike


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_the_tree_document_rebuilds_the_same_tree(world: World) -> None:
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


def test_nano_units_round_totals_up_and_limits_down() -> None:
    assert nanos_ceil(Quantity.parse("1")) == nanos_floor(Quantity.parse("1")) == 10**9
    assert nanos_ceil(Quantity.parse("1n")) == 1
    assert nanos_ceil(Quantity(Fraction(1, 3 * 10**9))) == 1  # finer than a nano-unit: never less
    assert nanos_floor(Quantity(Fraction(5, 3 * 10**9))) == 1  # a limit: never more
    assert nanos_ceil(Quantity.parse("-1500m")) == -1_500_000_000
    assert nanos_ceil(requests_of({RATIO: "250"})[RATIO]) == 250 * 10**9


def test_a_fit_check_holds_the_chain_and_refuses_what_never_fits() -> None:
    tree = QuotaTree.build([quota("org", {GPU: "2"}, is_parent=True), quota("team-a", {RATIO: "150"}, parent="org")])
    layout = slot_layout(tree)
    check = fit_check(tree, layout, PodQuotaRequest("team", "p", "team-a", requests_of({RATIO: "100", "cpu": "2"})))
    assert check is not None and check.quotas == ("team-a", "org")
    # org's 2 cards are 200 of each canonical name; cpu is limited nowhere, so checked nowhere.
    assert set(check.bounds) == {(layout["team-a"][RATIO], 100 * 10**9, 150 * 10**9),
                                 (layout["org"][RATIO], 100 * 10**9, 200 * 10**9)}
    assert check.fits({layout["team-a"][RATIO]: 50 * 10**9, layout["org"][RATIO]: 0}.__getitem__)
    assert not check.fits({layout["team-a"][RATIO]: 50 * 10**9 + 1, layout["org"][RATIO]: 0}.__getitem__)
    too_big = PodQuotaRequest("team", "p", "team-a", requests_of({RATIO: "151"}))
    assert fit_check(tree, layout, too_big) is None
    assert fit_check(tree, layout, PodQuotaRequest("team", "p", "org", requests_of({RATIO: "1"}))) is None  # parent
    assert fit_check(tree, layout, PodQuotaRequest("team", "p", "nope", requests_of({RATIO: "1"}))) is None
