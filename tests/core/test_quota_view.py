"""gpuquota_core.quota_view: the usage view and the chain headroom, exact numbers on the example
cluster (a two-level tree: team-nlp has 4 cards, 2 in use) and on small trees made for one rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuquota_core.canonical import ORIGINAL_RESOURCES_ANNOTATION, canonicalize_pod
from gpuquota_core.ledger import Reservation
from gpuquota_core.pod_records import pod_record
from gpuquota_core.quantity import Quantity
from gpuquota_core.quota_integrity import tree_problems
from gpuquota_core.quota_objects import quota_from_object
from gpuquota_core.quota_tree import QuotaTree
from gpuquota_core.quota_view import (
    SCHEMA_VERSION,
    build_view,
    cards,
    chain_headroom,
    pods_that_fit,
    quota_figures,
    tree_order,
    with_cards,
    written_family,
)
from gpuquota_core.shared_ledger import StoredReservation, holding_room
from gpuquota_core.usage_index import UsageIndex
from kubeaccess.manifests import load_objects

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster"
CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"


def example() -> tuple[QuotaTree, list[dict[str, Any]]]:
    objects = load_objects(EXAMPLE)
    tree = QuotaTree.build(quota_from_object(o) for o in objects if o["kind"] == "ElasticQuota")
    return tree, [o for o in objects if o["kind"] == "Pod"]


def quota(name: str, max_: dict[str, str], parent: str = "", namespace: str = "", **extra: Any) -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/parent": parent} if parent else {}
    if extra.get("is_parent"):
        labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
    return {"kind": "ElasticQuota", "metadata": {"name": name, "namespace": namespace or name, "labels": labels},
            "spec": {"max": max_, "min": extra.get("min", {})}}


def pod(name: str, namespace: str, resources: dict[str, str], **metadata: Any) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, **metadata},
            "spec": {"containers": [{"name": "main", "resources": {"requests": resources, "limits": resources}}]},
            "status": {"phase": "Running"}}


def q(text: str) -> Quantity:
    return Quantity.parse(text)


def test_example_cluster_numbers() -> None:
    tree, pods = example()
    view = build_view(tree, pods)

    assert [(v.quota.name, v.depth) for v in view.quotas] == [("ml-platform", 0), ("team-nlp", 1), ("team-vision", 1)]
    nlp = {r.resource: r for r in view.quotas[1].resources}
    # team-nlp limits nvidia.com/gpu: 4 and min 2, enforced as 400 / 200 of each canonical name.
    assert set(nlp) == {CORE, RATIO}
    core = nlp[CORE]
    assert (core.min, core.limit, core.used, core.reserved, core.free) == (q("200"), q("400"), q("200"), q("0"),
                                                                         q("200"))
    assert core.used_by_family == {"vendor": q("0"), "koordinator": q("200")}
    assert (core.binds_first, core.chain_free, core.state) == ("team-nlp", q("200"), "ok")
    vision = {r.resource: r for r in view.quotas[2].resources}[CORE]
    # resnet-train-0 asks nvidia.com/gpu: 2 (a vendor pod, charged 200), notebook-alice a 50 share.
    assert vision.used_by_family == {"vendor": q("200"), "koordinator": q("50")}
    parent = {r.resource: r for r in view.quotas[0].resources}[RATIO]
    assert (parent.used, parent.free, parent.used_by_family["vendor"]) == (q("450"), q("750"), q("200"))
    assert [p.name for p in view.quotas[2].pods] == ["resnet-train-0", "notebook-alice"]  # largest first
    assert view.quotas[2].pods[0].family == "vendor"
    assert view.quotas[0].pods == ()  # a parent holds no pods of its own


def test_json_document_carries_the_schema_version() -> None:
    tree, pods = example()
    document = build_view(tree, pods).as_dict(with_pods=True)
    assert document["schemaVersion"] == SCHEMA_VERSION
    nlp = document["quotas"][1]
    assert nlp["resources"][0] == {
        "name": CORE, "min": "200", "limit": "400", "used": "200",
        "usedByFamily": {"vendor": "0", "koordinator": "200"}, "reserved": "0", "free": "200", "state": "ok",
        "bindsFirst": "team-nlp", "chainFree": "200"}
    assert nlp["pods"][0]["name"] == "bert-finetune-0"
    json.dumps(document)  # plain JSON throughout


def test_the_tighter_ancestor_binds_first() -> None:
    tree = QuotaTree.build(quota_from_object(o) for o in [
        quota("parent", {CORE: "300"}, is_parent=True), quota("a", {CORE: "400"}, parent="parent"),
        quota("b", {CORE: "400"}, parent="parent")])
    view = build_view(tree, [pod("x", "a", {CORE: "100"}), pod("y", "b", {CORE: "150"})])
    a = {v.quota.name: v for v in view.quotas}["a"].resources[0]
    # a has 300 left of its own 400, but the parent only 50 of 300.
    assert (a.free, a.binds_first, a.chain_free) == (q("300"), "parent", q("50"))
    parent = view.quotas[0].resources[0]
    assert (parent.used, parent.state) == (q("250"), "near-full")


def test_states_full_and_over() -> None:
    tree = QuotaTree.build(quota_from_object(o) for o in [quota("full", {CORE: "100"}), quota("over", {CORE: "100"})])
    view = build_view(tree, [pod("x", "full", {CORE: "100"}), pod("y", "over", {CORE: "200"})])
    assert [v.resources[0].state for v in view.quotas] == ["full", "over"]
    assert view.quotas[1].resources[0].free == q("-100")


def test_a_rewritten_pod_counts_for_the_family_its_author_wrote() -> None:
    written = pod("w", "t", {"nvidia.com/gpu": "1"})
    rewritten = canonicalize_pod(written).obj
    assert ORIGINAL_RESOURCES_ANNOTATION in rewritten["metadata"]["annotations"]
    assert written_family(rewritten) == "vendor"
    assert written_family(pod("s", "t", {CORE: "50", RATIO: "50"})) == "koordinator"
    assert written_family(pod("r", "t", {"kubernetes.io/gpu-core": "50"})) == "koordinator"
    assert written_family(pod("c", "t", {"cpu": "1"})) is None
    mixed = pod("m", "t", {CORE: "50"})
    mixed["spec"]["containers"].append({"name": "side", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    assert written_family(mixed) == "mixed"

    tree = QuotaTree.build([quota_from_object(quota("t", {CORE: "400"}))])
    view = build_view(tree, [rewritten, mixed])
    row = view.quotas[0].resources[0]
    assert row.used_by_family == {"vendor": q("100"), "koordinator": q("0"), "mixed": q("150")}
    assert view.quotas[0].pods[1].rewritten


def test_reserved_comes_from_the_strict_ledger_and_is_unknown_without_one() -> None:
    tree = QuotaTree.build(quota_from_object(o) for o in [
        quota("root", {CORE: "1000"}, is_parent=True), quota("leaf", {CORE: "500"}, parent="root"),
        quota("other", {CORE: "100"})])
    reservation = Reservation("leaf/new", "uid-1", ("leaf", "root"), {CORE: q("200")}, expires_at=130.0)
    expired = Reservation("leaf/old", "uid-2", ("leaf", "root"), {CORE: q("50")}, expires_at=90.0)
    stored = {r.pod_key: StoredReservation(r, "replica-a", 100.0) for r in (reservation, expired)}
    view = build_view(tree, [pod("x", "leaf", {CORE: "100"})], reservations=stored, ledger_trees={"root"}, now=100.0)
    rows = {v.quota.name: v.resources[0] for v in view.quotas}
    assert (rows["leaf"].reserved, rows["leaf"].free) == (q("200"), q("200"))
    assert rows["root"].reserved == q("200")
    assert (rows["other"].reserved, rows["other"].free) == (None, q("100"))  # its tree has no ledger object


def test_select_keeps_ancestors_and_with_a_name_descendants() -> None:
    tree, pods = example()
    view = build_view(tree, pods)
    assert [v.quota.name for v in view.select(namespace="team-nlp").quotas] == ["ml-platform", "team-nlp"]
    assert [v.quota.name for v in view.select(name="ml-platform").quotas] == ["ml-platform", "team-nlp",
                                                                             "team-vision"]
    assert view.select(namespace="nowhere").quotas == ()


def test_tree_order_survives_orphans_and_cycles() -> None:
    """The members of a cycle side by side at the top (neither is the other's parent in any tree),
    with what hangs below them."""
    tree = QuotaTree.build(quota_from_object(o) for o in [
        quota("orphan", {}, parent="gone"), quota("x", {}, parent="y"), quota("y", {}, parent="x"),
        quota("below", {}, parent="y")])
    assert [(info.name, depth) for info, depth in tree_order(tree)] == [("orphan", 0), ("x", 0), ("y", 0),
                                                                        ("below", 1)]


def test_a_broken_tree_is_marked_on_each_quota_it_concerns() -> None:
    infos = [quota_from_object(o) for o in [
        quota("orphan", {}, parent="gone"), quota("x", {}, parent="y"), quota("y", {}, parent="x"),
        quota("fine", {})]]
    view = build_view(QuotaTree.build(infos), [], problems=tree_problems(infos))
    assert {v.quota.name: v.broken_because for v in view.quotas} == {
        "orphan": "parent gone missing", "x": "in a parent cycle", "y": "in a parent cycle", "fine": ""}
    assert view.broken and not view.select(name="fine").broken
    assert [p["check"] for p in view.as_dict()["treeProblems"]] == [
        "quota-parent-missing", "quota-parent-cycle", "quota-parent-cycle"]


def test_chain_headroom_before_and_after() -> None:
    tree, pods = example()
    view_usage = {v.quota.name: {r.resource: r.used for r in v.resources} for v in build_view(tree, pods).quotas}
    resolution = tree.resolve("team-nlp", "")
    levels = chain_headroom(tree, resolution, {CORE: q("300"), RATIO: q("300")}, lambda name: view_usage[name])
    assert [(lv.quota.name, lv.resource, str(lv.before), str(lv.after), lv.fits) for lv in levels] == [
        ("team-nlp", CORE, "200", "-100", False), ("team-nlp", RATIO, "200", "-100", False),
        ("ml-platform", CORE, "750", "450", True), ("ml-platform", RATIO, "750", "450", True)]
    assert pods_that_fit(levels) == 0
    one_card = chain_headroom(tree, resolution, {CORE: q("100"), RATIO: q("100")}, lambda name: view_usage[name])
    assert pods_that_fit(one_card) == 2


def test_cards_are_exact() -> None:
    assert [cards(q(t)) for t in ("350", "100", "50", "0", "-700", "333", "1")] == [
        "3.5", "1", "0.5", "0", "-7", "3.33", "0.01"]
    assert with_cards(CORE, q("350")) == "350 (3.5 cards)"
    assert with_cards(CORE, q("100")) == "100 (1 card)"
    assert with_cards("nvidia.com/gpu", q("2")) == "2"


def test_the_admission_annotation_is_the_limit_shown() -> None:
    annotated = quota("a", {CORE: "800"}, min={CORE: "100"})
    annotated["metadata"]["annotations"] = {"quota.scheduling.koordinator.sh/admission": json.dumps({CORE: "300"})}
    cpu_only = quota("c", {"cpu": "10"})
    tree = QuotaTree.build(quota_from_object(o) for o in [annotated, cpu_only])
    views = {v.quota.name: v for v in build_view(tree, [pod("x", "a", {CORE: "250"})]).quotas}
    row = views["a"].resources[0]
    assert (views["a"].limit_source, row.min, row.limit, row.free, row.state) == (
        "admission", q("100"), q("300"), q("50"), "near-full")
    assert views["c"].resources == ()  # GPU resources only


def test_a_pod_listed_twice_counts_once_as_its_later_version() -> None:
    tree = QuotaTree.build([quota_from_object(quota("t", {CORE: "400"}))])
    view = build_view(tree, [pod("x", "t", {CORE: "100"}), pod("x", "t", {CORE: "300"}),
                             {**pod("done", "t", {CORE: "100"}), "status": {"phase": "Succeeded"}}])
    assert view.quotas[0].resources[0].used == q("300")
    assert [(p.name, p.requests[CORE]) for p in view.quotas[0].pods] == [("x", q("300"))]


def test_quota_figures_are_the_views_rows() -> None:
    # The webhook's per-quota metrics come from quota_figures, `gpuquota quota` from build_view: the
    # same rows (quota, resource) with the same min, limit, used and reserved, on a tree whose child
    # is limited only through its parent.
    objects = [quota("root", {CORE: "1000", RATIO: "1000"}, is_parent=True, min={CORE: "300"}),
               quota("child", {}, parent="root"), quota("capped", {"nvidia.com/gpu": "2"}, parent="root")]
    tree = QuotaTree.build(quota_from_object(o) for o in objects)
    pods = [pod("a", "child", {CORE: "150", RATIO: "150"}), pod("b", "capped", {"nvidia.com/gpu": "1"})]
    reservation = Reservation("capped/c", "admission-1", ("capped", "root"), {CORE: q("50")}, expires_at=100.0)
    view = build_view(tree, pods, reservations={"capped/c": StoredReservation(reservation, "r", 0.0)}, now=1.0)
    usage = UsageIndex(tree)
    for obj in pods:
        usage.upsert(pod_record(obj))
    ledger = holding_room({"capped/c": StoredReservation(reservation, "r", 0.0)}, usage, 1.0, 0.0)

    figures = quota_figures(tree, usage, ledger.used)

    assert [(f.quota, f.tree, f.resource, f.min, f.limit, f.used, f.reserved) for f in figures] == [
        (v.quota.name, "root", r.resource, r.min, r.limit, r.used, r.reserved)
        for v in view.quotas for r in v.resources]
    assert {(f.quota, f.resource): (f.limit, f.used, f.reserved) for f in figures} == {
        ("root", CORE): (q("1000"), q("250"), q("50")), ("root", RATIO): (q("1000"), q("250"), q("0")),
        ("capped", CORE): (q("200"), q("100"), q("50")), ("capped", RATIO): (q("200"), q("100"), q("0")),
        ("child", CORE): (None, q("150"), q("0")), ("child", RATIO): (None, q("150"), q("0"))}
