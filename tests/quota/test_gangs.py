"""Gangs under local accounting: a gang's first member reserves the whole minimum or is refused,
its other members draw from that reservation (QuotaState, the quota service's own decision path)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.gang import go_duration_seconds
from gpuquota_core.pod_admission import PodAdmission, Verdict, read_pod_admission
from webhook.quota.state import QuotaState

RATIO = "koordinator.sh/gpu-memory-ratio"
CORE = "koordinator.sh/gpu-core"
_uids = itertools.count()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def quota(name: str, cards: int, parent: str = "", is_parent: bool = False) -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/parent": parent} if parent else {}
    if is_parent:
        labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
    return {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": "team-train", "labels": labels},
            "spec": {"max": {RATIO: str(cards * 100), CORE: str(cards * 100)}}}


def member(name: str, gang: str, minimum: int | None = 8, *, labels: dict[str, str] | None = None,
           waiting: str = "", cards: int = 1, nvidia: bool = False) -> dict[str, Any]:
    annotations = {"gang.scheduling.koordinator.sh/name": gang} if gang else {}
    if minimum is not None and gang:
        annotations["gang.scheduling.koordinator.sh/min-available"] = str(minimum)
    if waiting:
        annotations["gang.scheduling.koordinator.sh/waiting-time"] = waiting
    gpu = {"nvidia.com/gpu": str(cards)} if nvidia else {RATIO: str(cards * 100), CORE: str(cards * 100)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-train", "uid": f"uid-{name}",
                         "labels": {"quota.scheduling.koordinator.sh/name": "train", **(labels or {})},
                         "annotations": annotations},
            "spec": {"containers": [{"name": "worker", "image": "trainer",
                                     "resources": {"requests": dict(gpu), "limits": dict(gpu)}}]}}


def admission(pod: dict[str, Any]) -> PodAdmission:
    reading = read_pod_admission(pod, None, DEFAULT_CONFIG, uid=f"review-{next(_uids)}", operation="CREATE")
    assert isinstance(reading.admission, PodAdmission)
    return reading.admission


def state_with(*objects: dict[str, Any], clock: Clock | None = None) -> QuotaState:
    state = QuotaState(clock=clock or Clock())
    state.load([quota("train", 10), *objects])
    return state


def admit(state: QuotaState, pod: dict[str, Any]) -> Verdict:
    return state.admit_pod(admission(pod))


def store(state: QuotaState, pod: dict[str, Any]) -> None:
    state.apply_event("Pod", "ADDED", pod)


def test_two_gangs_created_interleaved_under_room_for_ten_admit_one_whole_and_nothing_of_the_other() -> None:
    state = state_with()
    verdicts: dict[str, list[bool]] = {"gang-a": [], "gang-b": []}
    for index in range(8):
        for gang in ("gang-a", "gang-b"):
            verdicts[gang].append(admit(state, member(f"{gang}-{index}", gang)).allowed)
    assert verdicts == {"gang-a": [True] * 8, "gang-b": [False] * 8}


def test_the_refused_member_is_told_the_gang_its_need_and_the_room() -> None:
    state = state_with()
    assert admit(state, member("gang-a-0", "gang-a")).allowed
    refused = admit(state, member("gang-b-0", "gang-b"))
    assert not refused.allowed and refused.reason == "QuotaExceeded"
    assert refused.message == (
        f"gang team-train/gang-b needs {CORE}=800,{RATIO}=800 (8 × {CORE}=100,{RATIO}=100) at team-train/train; "
        f"{CORE}=200,{RATIO}=200 free: pod team-train/gang-b-0 is a member of gang team-train/gang-b (minimum 8 "
        f"members) and no member is admitted until the whole minimum fits")
    assert refused.details == {"quota": "team-train/train", "gang": "team-train/gang-b", "gangResult": "refused"}


def test_members_draw_from_their_gangs_reservation_and_a_plain_pod_sees_only_what_is_left() -> None:
    state = state_with()
    assert admit(state, member("gang-a-0", "gang-a")).allowed
    # Eight cards are held for gang-a: two plain one-card pods fit, a third does not.
    assert admit(state, member("plain-0", "")).allowed
    assert admit(state, member("plain-1", "")).allowed
    assert not admit(state, member("plain-2", "")).allowed
    # Members are never refused for room their gang holds.
    assert all(admit(state, member(f"gang-a-{index}", "gang-a")).allowed for index in range(1, 8))


def test_members_beyond_the_minimum_are_charged_like_any_pod() -> None:
    state = state_with()
    assert all(admit(state, member(f"gang-a-{index}", "gang-a", minimum=4)).allowed for index in range(4))
    # The minimum holds four cards; six are left for members beyond it, one card each.
    assert [admit(state, member(f"gang-a-{index}", "gang-a", minimum=4)).allowed for index in range(4, 11)] == \
        [True] * 6 + [False]


def test_stored_members_take_their_gangs_room_and_the_reservation_ends_with_the_minimum() -> None:
    state = state_with()
    pods = [member(f"gang-a-{index}", "gang-a") for index in range(8)]
    for pod in pods:
        assert admit(state, pod).allowed
        store(state, pod)
    assert state.ledger.gang_hold("team-train/gang-a") == {}
    assert len(state.ledger) == 0  # every member's reservation confirmed by the watch
    # Two cards are left, for anything.
    assert admit(state, member("plain-0", "", cards=2)).allowed


def test_a_reservation_whose_members_do_not_all_come_is_released_after_the_gangs_waiting_time() -> None:
    clock = Clock()
    state = state_with(clock=clock)
    first = member("gang-a-0", "gang-a", waiting="30s")
    assert admit(state, first).allowed
    store(state, first)
    assert not admit(state, member("gang-b-0", "gang-b")).allowed
    clock.now += 30
    # gang-a's reservation is given up; its stored member keeps counting, as every stored pod does.
    assert state.ledger.gang("team-train/gang-a") is not None  # released at the next decision
    assert not admit(state, member("gang-b-0", "gang-b", minimum=10)).allowed  # 9 free: 1 is gang-a's pod
    assert state.ledger.gang("team-train/gang-a") is None
    assert admit(state, member("gang-b-0", "gang-b", minimum=9)).allowed


def test_a_gang_of_nvidia_pods_is_counted_in_canonical_units() -> None:
    state = state_with()
    assert admit(state, member("gang-a-0", "gang-a", nvidia=True)).allowed
    assert not admit(state, member("gang-b-0", "gang-b", nvidia=True)).allowed
    assert all(admit(state, member(f"gang-a-{index}", "gang-a", nvidia=True)).allowed for index in range(1, 8))


def test_a_gang_that_does_not_fit_admits_nothing_and_a_smaller_one_still_fits() -> None:
    state = state_with()
    assert not admit(state, member("big-0", "big", minimum=11)).allowed
    assert state.ledger.gang("team-train/big") is None
    assert admit(state, member("small-0", "small", minimum=10)).allowed


def test_a_pod_group_gives_the_minimum_its_resources_and_its_timeout() -> None:
    clock = Clock()
    group = {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "pg", "namespace": "team-train"},
             "spec": {"minMember": 2, "minResources": {"nvidia.com/gpu": "6"}, "scheduleTimeoutSeconds": 20}}
    state = state_with(group, clock=clock)
    labels = {"pod-group.scheduling.sigs.k8s.io": "pg"}
    assert admit(state, member("pg-0", "", labels=labels)).allowed
    held = state.ledger.gang("team-train/pg")
    assert held is not None and held.expires_at == clock.now + 20 and held.pod_group
    # minResources (six cards) is the need: five cards are still held after the first member.
    assert state.ledger.gang_hold("team-train/pg") == {CORE: held.need[CORE].parse("500"),
                                                       RATIO: held.need[RATIO].parse("500")}
    assert not admit(state, member("plain-0", "", cards=5)).allowed
    # Deleting the PodGroup gives its reservation up.
    state.apply_event("PodGroup", "DELETED", group)
    assert state.ledger.gang("team-train/pg") is None
    assert admit(state, member("plain-0", "", cards=5)).allowed


def test_lightweight_pod_group_labels_name_a_gang() -> None:
    state = state_with()
    labels = {"pod-group.scheduling.sigs.k8s.io/name": "light", "pod-group.scheduling.sigs.k8s.io/min-available": "6"}
    assert admit(state, member("light-0", "", labels=labels)).allowed
    assert not admit(state, member("other-0", "other", minimum=5)).allowed
    assert admit(state, member("other-0", "other", minimum=4)).allowed


def test_a_pod_naming_a_gang_without_a_minimum_is_charged_like_any_pod() -> None:
    state = state_with()
    assert admit(state, member("odd-0", "odd", minimum=None)).allowed
    assert state.ledger.gangs() == []


def test_a_dry_run_reserves_nothing_for_its_gang() -> None:
    state = state_with()
    pod = member("gang-a-0", "gang-a")
    reading = read_pod_admission(pod, None, DEFAULT_CONFIG, uid="dry", operation="CREATE", dry_run=True)
    assert isinstance(reading.admission, PodAdmission)
    assert state.admit_pod(reading.admission).allowed
    assert state.ledger.gangs() == []


def test_waiting_time_reads_as_go_durations_do() -> None:
    assert [go_duration_seconds(text) for text in ("30s", "1m30s", "1h", "500ms", "", "soon", "-1s", "0")] == \
        [30, 90, 3600, 1, None, None, None, 0]


def test_a_member_of_a_pod_group_the_state_has_not_seen_is_refused_for_now_not_charged_alone() -> None:
    state = state_with()  # files list every PodGroup there is: none here
    refused = admit(state, member("pg-0", "", labels={"pod-group.scheduling.sigs.k8s.io": "late"}))
    assert (refused.allowed, refused.reason) == (False, "PodGroupNotSeen")
    assert refused.message.startswith("pod team-train/pg-0 is a member of PodGroup team-train/late (label "
                                      "pod-group.scheduling.sigs.k8s.io), which this webhook has not seen")
    group = {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "late", "namespace": "team-train"}, "spec": {"minMember": 4}}
    state.apply_event("PodGroup", "ADDED", group)
    assert admit(state, member("pg-0", "", labels={"pod-group.scheduling.sigs.k8s.io": "late"})).allowed


def test_without_a_pod_group_list_a_member_naming_one_is_charged_like_any_pod() -> None:
    # A live cluster without the PodGroup CRD (or the right to read it): nothing is ever listed.
    state = QuotaState(clock=Clock())
    state.replace_kind("ElasticQuota", [quota("train", 10)])
    state.replace_kind("Pod", [])
    assert admit(state, member("pg-0", "", labels={"pod-group.scheduling.sigs.k8s.io": "late"})).allowed
    assert state.ledger.gangs() == []


def test_a_gang_keeps_the_minimum_of_the_member_that_opened_its_reservation() -> None:
    state = state_with()
    assert admit(state, member("gang-a-0", "gang-a", minimum=4)).allowed
    # A later member saying 8 does not grow the reservation: koord-scheduler keeps the first minimum.
    assert admit(state, member("gang-a-1", "gang-a", minimum=8)).allowed
    assert admit(state, member("plain-0", "", cards=6)).allowed


def test_a_gang_left_below_its_minimum_when_its_waiting_time_ends_is_told_of_with_an_event() -> None:
    clock = Clock()
    state = state_with(clock=clock)
    stored = [member(f"gang-a-{index}", "gang-a", waiting="30s") for index in range(3)]
    for pod in stored:
        assert admit(state, pod).allowed
        store(state, pod)
    whole = [member(f"gang-b-{index}", "gang-b", minimum=2, waiting="30s") for index in range(2)]
    for pod in whole:
        assert admit(state, pod).allowed
        store(state, pod)
    assert state.partly_admitted_gangs() == []  # within their waiting time
    clock.now += 30
    (event,) = state.partly_admitted_gangs()
    assert (event.reason, event.namespace, event.quota_label, event.owner) == (
        "GangPartlyAdmitted", "team-train", "train", None)
    assert event.message == (
        "gang team-train/gang-a has 3 of its minimum 8 members stored and its waiting time is over: its reservation "
        "for the rest was given up, and koord-scheduler places the stored members only together with the rest; they "
        "keep holding quota room until they are deleted or the rest is created and admitted")
    assert state.partly_admitted_gangs() == []  # told once


def test_without_a_waiting_time_a_gang_waits_as_long_as_koord_scheduler_does_by_default() -> None:
    clock = Clock()
    state = state_with(clock=clock)
    assert admit(state, member("gang-a-0", "gang-a")).allowed
    held = state.ledger.gang("team-train/gang-a")
    assert held is not None and held.expires_at == clock.now + 600


def grouped(name: str, gang: str, group: list[str], minimum: int = 4) -> dict[str, Any]:
    pod = member(name, gang, minimum)
    pod["metadata"]["annotations"]["gang.scheduling.koordinator.sh/groups"] = json.dumps(
        [f"team-train/{each}" for each in group])
    return pod


def test_a_gang_group_is_reserved_whole_by_its_first_member() -> None:
    state = state_with()
    assert admit(state, grouped("a-0", "gang-a", ["gang-a", "gang-b"])).allowed
    # Eight cards held: four for gang-a (one of them its member's), four for gang-b, which has no pod yet.
    assert state.ledger.gang("team-train/gang-b") is not None
    assert not admit(state, member("plain-0", "", cards=3)).allowed
    assert all(admit(state, grouped(f"b-{index}", "gang-b", ["gang-a", "gang-b"])).allowed for index in range(4))
    # Two cards are left: a group of two gangs of two cards each does not fit, though each gang would.
    refused = admit(state, grouped("c-0", "gang-c", ["gang-c", "gang-d"], minimum=2))
    assert not refused.allowed
    assert refused.message.startswith(
        f"gang team-train/gang-c needs {CORE}=400,{RATIO}=400 (2 × {CORE}=100,{RATIO}=100, and the minimums of the "
        f"rest of its gang group: team-train/gang-d) at team-train/train; {CORE}=200,{RATIO}=200 free:")
    assert admit(state, member("c-0", "gang-c", minimum=2)).allowed


def test_a_gang_group_of_pod_groups_reserves_each_pod_groups_own_minimum() -> None:
    groups = json.dumps(["team-train/pg-a", "team-train/pg-b"])
    pod_groups = [{"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup",
                   "metadata": {"name": name, "namespace": "team-train",
                                "annotations": {"gang.scheduling.koordinator.sh/groups": groups}},
                   "spec": {"minMember": minimum}} for name, minimum in (("pg-a", 2), ("pg-b", 6))]
    state = state_with(*pod_groups)
    assert admit(state, member("pg-a-0", "", labels={"pod-group.scheduling.sigs.k8s.io": "pg-a"})).allowed
    held = state.ledger.gang("team-train/pg-b")
    assert held is not None and held.min_members == 6 and held.pod_group
    assert admit(state, member("plain-0", "", cards=2)).allowed
    assert not admit(state, member("plain-1", "")).allowed
