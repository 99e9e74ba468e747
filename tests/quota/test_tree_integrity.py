"""Quota trees that are not trees: a repeated name, a missing parent, a parent cycle.

The core's whole-set check (audit, plan, ``serve --state``), the webhook's one-object check (a
CREATE/UPDATE review) and the ``--state`` loader, which refuses to load them.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuquota_core.pod_admission import PodAdmission
from gpuquota_core.quota_admission import review_quota_object
from gpuquota_core.quota_integrity import (
    DUPLICATE_NAME,
    PARENT_CYCLE,
    PARENT_MISSING,
    QuotaTreeError,
    check_tree,
    tree_problems,
)
from gpuquota_core.quota_objects import quota_from_object
from gpuquota_core.quota_tree import QuotaTree
from webhook.admission.status import status_of
from webhook.quota.state import QuotaState

RATIO = "koordinator.sh/gpu-memory-ratio"
PARENT = "quota.scheduling.koordinator.sh/parent"
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"


def quota(name: str, namespace: str = "", ratio: str = "1000", parent: str = "", is_parent: bool = False
          ) -> dict[str, Any]:
    labels = {PARENT: parent} if parent else {}
    if is_parent:
        labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
    return {"kind": "ElasticQuota", "metadata": {"name": name, "namespace": namespace or name, "labels": labels},
            "spec": {"max": {RATIO: ratio}}}


def problems(*objects: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted((p.check, p.quota.ref, p.message) for p in tree_problems(quota_from_object(o) for o in objects))


def test_a_repeated_name_is_reported_for_each_copy() -> None:
    found = problems(quota("team", "ns-a"), quota("team", "ns-b"), quota("other"))
    message = ("ElasticQuota name team is used by 2 quotas (ns-a/team, ns-b/team): quota names are cluster-wide "
               "in Koordinator, so only one of them can limit the pods bound to that name")
    assert found == [(DUPLICATE_NAME, "ns-a/team", message), (DUPLICATE_NAME, "ns-b/team", message)]


def test_a_missing_parent_is_reported_and_the_root_is_not_missing() -> None:
    found = problems(quota("team", parent="org"), quota("solo", parent="koordinator-root-quota"))
    assert found == [(PARENT_MISSING, "team/team",
                      "ElasticQuota team/team names parent org (label quota.scheduling.koordinator.sh/parent), "
                      "which does not exist: no ancestor limits its pods; create the parent first or fix the label")]


def test_each_member_of_a_cycle_is_reported_with_the_cycle() -> None:
    found = problems(quota("b", parent="a"), quota("a", parent="c"), quota("c", parent="b"),
                     quota("leaf", parent="a"), quota("self", parent="self"))
    cycle = ("the parent labels of ElasticQuotas a -> c -> b -> a form a cycle: none of them reaches the root "
             "quota")
    assert found == [(PARENT_CYCLE, "a/a", cycle), (PARENT_CYCLE, "b/b", cycle), (PARENT_CYCLE, "c/c", cycle),
                     (PARENT_CYCLE, "self/self", "the parent labels of ElasticQuotas self -> self form a cycle: "
                                                 "none of them reaches the root quota")]


def test_check_tree_raises_for_duplicates_and_cycles_not_for_a_missing_parent() -> None:
    check_tree([quota_from_object(quota("team", parent="gone"))])
    with pytest.raises(QuotaTreeError) as raised:
        check_tree([quota_from_object(o) for o in (quota("team", "ns-a"), quota("team", "ns-b"))], "state.yaml")
    assert isinstance(raised.value, ValueError)
    assert str(raised.value).startswith("state.yaml: the ElasticQuotas do not form a tree: ElasticQuota name team "
                                        "is used by 2 quotas (ns-a/team, ns-b/team)")


# -- the --state loader -------------------------------------------------------------------------


def pod(name: str, ratio: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns-a", "uid": name,
                                        "labels": {QUOTA_LABEL: "team"}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {RATIO: ratio}}}]},
            "status": {"phase": "Running"}}


@pytest.mark.parametrize("order", [1, -1])
def test_state_with_a_repeated_name_does_not_load_in_either_order(order: int) -> None:
    # Before: the copy read last won, so the room (1000 or 400) depended on the order of the files.
    copies = [quota("team", "ns-a", ratio="1000"), quota("team", "ns-b", ratio="400")][::order]
    state = QuotaState()
    with pytest.raises(QuotaTreeError, match=r"^the ElasticQuotas do not form a tree: ElasticQuota name team is used "
                                             r"by 2 quotas \((ns-a/team, ns-b/team|ns-b/team, ns-a/team)\)"):
        state.load([*copies, pod("p", "100")])
    assert state.ready() == (False, "quota state not synced yet")
    refused = state.admit_pod(PodAdmission(uid="u", operation="CREATE", namespace="ns-a", name="q", pod_uid="",
                                           labels={QUOTA_LABEL: "team"}, canonical_requests={RATIO: "100"}))
    assert (refused.allowed, refused.reason) == (False, "NotReady")


def test_state_with_a_parent_cycle_does_not_load() -> None:
    with pytest.raises(QuotaTreeError, match="ElasticQuotas a -> b -> a form a cycle"):
        QuotaState().load([quota("a", parent="b"), quota("b", parent="a")])


def test_state_with_a_missing_parent_loads_and_enforces_the_leaf() -> None:
    state = QuotaState()
    state.load([quota("team", "ns-a", ratio="400", parent="org")])
    assert state.ready()[0]


# -- the webhook's review of one ElasticQuota ---------------------------------------------------


def review(obj: dict[str, Any], *stored: dict[str, Any]) -> tuple[str, ...]:
    tree = QuotaTree.build(quota_from_object(o) for o in stored)
    return review_quota_object(obj, tree, {}).problems


def test_webhook_refuses_a_second_quota_of_a_name_in_another_namespace() -> None:
    assert review(quota("team", "ns-b"), quota("team", "ns-a")) == (
        "ElasticQuota name team is already used by ns-a/team: quota names are cluster-wide in Koordinator; choose "
        "another name",)
    # The same object again (an UPDATE) is not a second quota.
    assert review(quota("team", "ns-a", ratio="10"), quota("team", "ns-a")) == ()


def test_webhook_refuses_a_cycle_and_leaves_a_missing_parent_to_the_audit() -> None:
    # Its view comes from a watch: a parent created just before may not be in it yet.
    assert review(quota("team", parent="org")) == ()
    org = quota("org", parent="dept", is_parent=True)
    dept = quota("dept", parent="koordinator-root-quota", is_parent=True)
    assert review(quota("team", parent="org"), org, dept) == ()
    # Moving dept under org closes a loop.
    assert review(quota("dept", parent="org", is_parent=True), org, dept) == (
        "the parent labels of ElasticQuotas dept -> org -> dept form a cycle: none of them reaches the root quota",)
    assert review(quota("dept", parent="dept"), dept) == (
        "the parent labels of ElasticQuotas dept -> dept form a cycle: none of them reaches the root quota",)


def test_webhook_does_not_judge_again_the_place_of_a_quota_that_keeps_its_parent() -> None:
    # A loop closed behind the webhook's back (two writes its watch saw out of order): status and
    # annotation writes of its members must still pass; a new parent label is judged.
    a, b = quota("a", parent="b", is_parent=True), quota("b", parent="a", is_parent=True)
    assert review(quota("a", parent="b", is_parent=True, ratio="10"), a, b) == ()
    c = quota("c", parent="a", is_parent=True)
    assert review(quota("a", parent="c", is_parent=True), a, b, c)[0].startswith(
        "the parent labels of ElasticQuotas a -> c -> a form a cycle")


def test_quota_state_review_runs_the_tree_checks() -> None:
    state = QuotaState()
    state.load([quota("team", "ns-a")])
    verdict = state.review_elasticquota(quota("team", "ns-b"))
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 422, "Invalid")
    assert "already used by ns-a/team" in verdict.message
    assert state.review_elasticquota(quota("other", parent="team")).allowed


# -- live mode: two quotas of one name that predate the webhook ---------------------------------


def admitted(state: QuotaState, count: int) -> int:
    return sum(state.admit_pod(PodAdmission(uid=f"u{i}", operation="CREATE", namespace="ns-a", name=f"p{i}",
                                            pod_uid="", labels={QUOTA_LABEL: "team"},
                                            canonical_requests={RATIO: "100"})).allowed for i in range(count))


@pytest.mark.parametrize("order", [1, -1])
def test_live_list_keeps_the_same_copy_of_a_repeated_name_in_either_order(order: int) -> None:
    # Before: the copy listed last won, so 10 of 10 or 4 of 10 pods were admitted by list order.
    state = QuotaState()
    copies = [quota("team", "ns-a", ratio="1000"), quota("team", "ns-b", ratio="400")]
    state.replace_kind("ElasticQuota", copies[::order])
    state.replace_kind("Pod", [])
    assert state.tree.quotas["team"].namespace == "ns-a"
    assert admitted(state, 10) == 10


def test_watch_events_of_the_other_copy_leave_the_kept_one_alone() -> None:
    state = QuotaState()
    state.replace_kind("ElasticQuota", [quota("team", "ns-a", ratio="1000")])
    state.replace_kind("Pod", [])
    state.apply_event("ElasticQuota", "ADDED", quota("team", "ns-b", ratio="400"))
    assert state.tree.quotas["team"].namespace == "ns-a"
    # Before: deleting the other copy removed the name from the tree, and with it ns-a's limit.
    state.apply_event("ElasticQuota", "DELETED", quota("team", "ns-b", ratio="400"))
    assert state.tree.quotas["team"].namespace == "ns-a"
    state.apply_event("ElasticQuota", "ADDED", quota("team", "ns-b", ratio="400"))
    state.apply_event("ElasticQuota", "DELETED", quota("team", "ns-a", ratio="1000"))
    assert state.tree.quotas["team"].namespace == "ns-b"  # the next copy takes its place
    assert admitted(state, 10) == 4
    state.apply_event("ElasticQuota", "ADDED", quota("team", "ns-0", ratio="200"))  # sorts first: kept
    assert state.tree.quotas["team"].namespace == "ns-0"
    state.apply_event("ElasticQuota", "DELETED", quota("team", "ns-0", ratio="200"))
    assert state.tree.quotas["team"].namespace == "ns-b"


def test_the_audit_and_the_tree_keep_the_same_copy() -> None:
    from gpuquota_core.audit import audit_objects

    for order in (1, -1):
        copies = [quota("team", "ns-a", ratio="1000"), quota("team", "ns-b", ratio="400")][::order]
        assert audit_objects(copies).quota_usage["team"][RATIO]["limit"] == "1k"
