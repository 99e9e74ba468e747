from __future__ import annotations

from typing import Any

from gpuquota_core.ledger import ReservationLedger
from gpuquota_core.pod_records import PodRecord, canonical_pod_requests
from gpuquota_core.quota_decision import PodQuotaRequest, decide, needs_check, quota_use_unchanged, requests_of
from gpuquota_core.quota_objects import quota_from_object
from gpuquota_core.quota_tree import QuotaTree
from gpuquota_core.usage_index import UsageIndex
from webhook.admission.status import status_of

RATIO = "koordinator.sh/gpu-memory-ratio"


def quota(name: str, namespace: str, max_: dict[str, str], parent: str = "", is_parent: bool = False) -> Any:
    labels = {}
    if parent:
        labels["quota.scheduling.koordinator.sh/parent"] = parent
    if is_parent:
        labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
    return quota_from_object({"metadata": {"name": name, "namespace": namespace, "labels": labels},
                              "spec": {"max": max_}})


def world() -> tuple[QuotaTree, UsageIndex, ReservationLedger]:
    tree = QuotaTree.build([
        quota("org", "team", {"nvidia.com/gpu": "3"}, is_parent=True),
        quota("team-a", "team", {RATIO: "200"}, parent="org"),
        quota("team-b", "team", {RATIO: "200"}, parent="org"),
    ])
    return tree, UsageIndex(tree), ReservationLedger(ttl_seconds=10)


def pod(name: str, ratio: str, label: str = "team-a") -> PodQuotaRequest:
    return PodQuotaRequest("team", name, label, requests_of({RATIO: ratio}))


def admit(tree: QuotaTree, usage: UsageIndex, ledger: ReservationLedger, request: PodQuotaRequest) -> Any:
    decision = decide(tree, usage, ledger, request)
    if decision.allowed:
        ledger.reserve(f"{request.namespace}/{request.name}", "uid-" + request.name, decision.quotas,
                       request.requests, now=0.0)
    return decision


def test_leaf_quota_refuses_with_native_message() -> None:
    tree, usage, ledger = world()
    assert admit(tree, usage, ledger, pod("p1", "150")).allowed
    denied = admit(tree, usage, ledger, pod("p2", "100"))
    assert not denied.allowed and status_of(denied.reason) == 403 and denied.reason == "QuotaExceeded"
    assert denied.message == (f"exceeded quota: team/team-a, requested: {RATIO}=100, used: {RATIO}=150 "
                              f"(150 of it reserved by admissions not yet seen), limited: {RATIO}=200")


def test_ancestor_legacy_limit_in_canonical_units_refuses() -> None:
    tree, usage, ledger = world()
    assert admit(tree, usage, ledger, pod("a1", "200")).allowed
    denied = admit(tree, usage, ledger, pod("b1", "200", label="team-b"))
    assert denied.message == (f"exceeded quota: team/org, requested: {RATIO}=200, used: {RATIO}=200 "
                              f"(200 of it reserved by admissions not yet seen), "
                              f"limited: {RATIO}=300 (ancestor of quota team-b)")
    assert admit(tree, usage, ledger, pod("b2", "100", label="team-b")).allowed


def test_missing_label_quota_and_parent_quota_are_refused() -> None:
    tree, usage, ledger = world()
    missing = decide(tree, usage, ledger, pod("x", "10", label="nope"))
    assert not missing.allowed and missing.reason == "QuotaNotFound" and "'nope'" in missing.message
    parent = decide(tree, usage, ledger, pod("x", "10", label="org"))
    assert not parent.allowed and parent.reason == "ParentQuota" and "team/org" in parent.message


def test_unknown_gpu_memory_refused_against_ratio_limit() -> None:
    tree, usage, ledger = world()
    request = PodQuotaRequest("team", "m", "team-a", requests_of({"koordinator.sh/gpu-memory": "8Gi"}), True)
    decision = decide(tree, usage, ledger, request)
    assert not decision.allowed and decision.reason == "UnknownGpuMemory"


def test_reservation_released_on_expiry_frees_room() -> None:
    tree, usage, ledger = world()
    assert admit(tree, usage, ledger, pod("p1", "200")).allowed
    assert not decide(tree, usage, ledger, pod("p2", "100")).allowed
    assert [r.pod_key for r in ledger.expire(now=10.0)] == ["team/p1"]
    assert decide(tree, usage, ledger, pod("p2", "100")).allowed


def test_update_checked_only_on_quota_change_or_growth() -> None:
    tree, _, _ = world()
    old = pod("p", "100")
    assert not needs_check(pod("p", "100"), old, tree)
    assert not needs_check(pod("p", "50"), old, tree)
    assert needs_check(pod("p", "150"), old, tree)
    assert needs_check(pod("p", "100", label="team-b"), old, tree)


def test_what_a_worker_may_answer_without_the_tree_is_what_needs_check_lets_pass() -> None:
    tree, _, _ = world()
    old = pod("p", "100")
    for new in (pod("p", "100"), pod("p", "50"), pod("p", "150"), pod("p", "100", label="team-b"),
                pod("p", "100", label="")):
        # Unchanged is a sufficient answer, never a different one: whatever the worker lets pass
        # the quota service would have let pass too.
        assert not (quota_use_unchanged(new, old) and needs_check(new, old, tree))
    assert quota_use_unchanged(pod("p", "50"), old) and not quota_use_unchanged(pod("p", "150"), old)
    # A label naming the same quota differently is for the tree to judge, not the worker.
    assert not quota_use_unchanged(pod("p", "100", label=""), old)


def test_label_change_into_full_quota_is_refused() -> None:
    tree, usage, ledger = world()
    assert admit(tree, usage, ledger, pod("b1", "200", label="team-b")).allowed
    denied = decide(tree, usage, ledger, pod("p", "100", label="team-b"), old=pod("p", "100"))
    assert not denied.allowed and denied.message.startswith("exceeded quota: team/team-b,")


def test_moving_between_siblings_under_a_full_parent_charges_only_the_new_leaf() -> None:
    tree, usage, ledger = world()
    # org (300) is full: team-a holds 200, team-b 100.
    assert admit(tree, usage, ledger, pod("a1", "200")).allowed
    assert admit(tree, usage, ledger, pod("b1", "100", label="team-b")).allowed
    usage.upsert(_record("a1", "200", "team-a"))
    ledger.release("team/a1")
    moved = decide(tree, usage, ledger, pod("a1", "100", label="team-b"), old=pod("a1", "200"))
    assert moved.allowed
    ratio = requests_of({RATIO: "100"})
    assert moved.charges == {"team-b": ratio, "org": {}}


def test_growth_in_place_is_charged_only_for_what_it_adds() -> None:
    tree, usage, ledger = world()
    usage.upsert(_record("a1", "150", "team-a"))
    grown = decide(tree, usage, ledger, pod("a1", "200"), old=pod("a1", "150"))
    assert grown.allowed and grown.charges == {"team-a": requests_of({RATIO: "50"}), "org": requests_of({RATIO: "50"})}
    too_much = decide(tree, usage, ledger, pod("a1", "250"), old=pod("a1", "150"))
    assert too_much.message == (f"exceeded quota: team/team-a, requested: {RATIO}=100, used: {RATIO}=150, "
                                f"limited: {RATIO}=200")


def test_quota_naming_both_families_is_judged_by_the_stricter_and_says_so() -> None:
    tree = QuotaTree.build([quota("mixed", "team", {"nvidia.com/gpu": "2", RATIO: "300"})])
    usage, ledger = UsageIndex(tree), ReservationLedger()
    assert admit(tree, usage, ledger, pod("p1", "200", label="mixed")).allowed
    denied = decide(tree, usage, ledger, pod("p2", "1", label="mixed"))
    assert denied.message == (
        f"exceeded quota: team/mixed, requested: {RATIO}=1, used: {RATIO}=200 "
        f"(200 of it reserved by admissions not yet seen), limited: {RATIO}=200; "
        f"{RATIO} is limited by {RATIO} and nvidia.com/gpu ({RATIO}=300, nvidia.com/gpu=200); "
        f"the stricter value 200 applies")


def _record(name: str, ratio: str, label: str) -> PodRecord:
    return PodRecord("team", name, "uid-" + name, label, requests_of({RATIO: ratio}))


def test_a_second_delivery_of_the_same_admission_is_not_charged_against_itself() -> None:
    tree, usage, ledger = world()
    first = admit(tree, usage, ledger, pod("p1", "150"))
    assert first.allowed
    replay_of = ledger.made_by("team/p1", "uid-p1")
    assert replay_of is not None
    assert decide(tree, usage, ledger, pod("p1", "150"), replay_of=replay_of).allowed
    # Without the rule, the pod's own 150 would be counted: 150 + 150 > 200.
    assert not decide(tree, usage, ledger, pod("p1", "150")).allowed
    # Another admission under the same pod name (a recreate) is not a replay: its room stays taken.
    assert ledger.made_by("team/p1", "uid-other") is None
    assert ledger.made_by("team/p1", "") is None


def test_a_label_naming_no_quota_is_refused_with_koordinators_words_first() -> None:
    tree, usage, ledger = world()

    missing = decide(tree, usage, ledger, pod("x", "10", label="nope"))

    assert missing.message == ("elastic quota nope not found: pod team/x names ElasticQuota 'nope' in label "
                               "quota.scheduling.koordinator.sh/name, but no such quota exists")


def test_a_parent_quota_is_refused_with_koordinators_words_first() -> None:
    tree, usage, ledger = world()

    parent = decide(tree, usage, ledger, pod("x", "10", label="org"))

    assert parent.message == ("pod can not be linked to a parentQuotaGroup,quota:org, pod:x: pod team/x cannot use "
                              "ElasticQuota team/org: it is a parent quota (is-parent=true); use one of its leaf "
                              "quotas")


def test_quota_messages_print_quantities_as_kubernetes_does() -> None:
    tree = QuotaTree.build([quota("mem", "team", {"memory": "8Gi"})])
    usage, ledger = UsageIndex(tree), ReservationLedger()

    def memory_pod(name: str, memory: str) -> PodQuotaRequest:
        spec = {"containers": [{"name": "main", "resources": {"requests": {"memory": memory}}}]}
        return PodQuotaRequest("team", name, "mem", canonical_pod_requests(spec))

    assert admit(tree, usage, ledger, memory_pod("p1", "4Gi")).allowed
    denied = decide(tree, usage, ledger, memory_pod("p2", "6Gi"))

    assert denied.message == ("exceeded quota: team/mem, requested: memory=6Gi, used: memory=4Gi "
                              "(4Gi of it reserved by admissions not yet seen), limited: memory=8Gi")


def test_a_refusal_says_how_much_of_used_is_held_by_admissions_not_yet_seen() -> None:
    tree, usage, ledger = world()
    usage.upsert(PodRecord("team", "running", "u1", "team-a", requests_of({RATIO: "100"})))
    denied = admit(tree, usage, ledger, pod("p2", "150"))
    # Only watched pods: nothing reserved, nothing said about it.
    assert denied.message == (f"exceeded quota: team/team-a, requested: {RATIO}=150, used: {RATIO}=100, "
                              f"limited: {RATIO}=200")
    assert admit(tree, usage, ledger, pod("p3", "50")).allowed
    denied = admit(tree, usage, ledger, pod("p4", "100"))
    assert denied.message == (f"exceeded quota: team/team-a, requested: {RATIO}=100, used: {RATIO}=150 "
                              f"(50 of it reserved by admissions not yet seen), limited: {RATIO}=200")
    # A second delivery of an admission does not count its own reservation as someone else's.
    replay = decide(tree, usage, ledger, pod("p3", "150"), replay_of=ledger.get("team/p3"))
    assert replay.message == (f"exceeded quota: team/team-a, requested: {RATIO}=150, used: {RATIO}=100, "
                              f"limited: {RATIO}=200")
