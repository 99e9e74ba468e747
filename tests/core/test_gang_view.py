"""gpuquota_core.gang_view and quota_view.workload_replicas: how many of a workload's pods the
webhook's decision admits one after another, with a gang's reservation already open or not."""

from __future__ import annotations

from typing import Any

from gpuquota_core.enforcement import DEFAULT_ENFORCEMENT, EnforcementConfig, InTurn, Mode
from gpuquota_core.gang import FROM_ANNOTATIONS, Gang
from gpuquota_core.gang_view import gang_fit, how_many_fit, scratch_ledger, workload_in_turn
from gpuquota_core.ledger import GangReservation, ReservationLedger
from gpuquota_core.quantity import Quantity
from gpuquota_core.quota_decision import PodQuotaRequest
from gpuquota_core.quota_objects import quota_from_object
from gpuquota_core.quota_tree import QuotaTree
from gpuquota_core.quota_view import workload_replicas
from gpuquota_core.resources import add_lists
from gpuquota_core.usage_index import UsageIndex

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
ONE_CARD = {CORE: Quantity.parse("100"), RATIO: Quantity.parse("100")}


def tree(cards: int) -> QuotaTree:
    return QuotaTree.build([quota_from_object({
        "kind": "ElasticQuota", "metadata": {"name": "train", "namespace": "team-train"},
        "spec": {"max": {CORE: str(cards * 100), RATIO: str(cards * 100)}}})])


def request(name: str = "w-") -> PodQuotaRequest:
    return PodQuotaRequest("team-train", name, "train", dict(ONE_CARD))


GANG = Gang("team-train", "g", 8, 600, FROM_ANNOTATIONS)


def test_workload_replicas_reads_each_kinds_field_and_default() -> None:
    def workload(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"kind": kind, "spec": spec}

    assert workload_replicas(workload("Deployment", {"replicas": 3})) == 3
    assert workload_replicas(workload("StatefulSet", {})) == 1
    assert workload_replicas(workload("Job", {"parallelism": 8})) == 8
    assert workload_replicas(workload("Job", {})) == 1
    assert workload_replicas(workload("CronJob", {"jobTemplate": {"spec": {"parallelism": 4}}})) == 4
    assert workload_replicas(workload("CronJob", {"jobTemplate": {}})) == 1
    assert workload_replicas(workload("DaemonSet", {})) is None
    assert workload_replicas(workload("Deployment", {"replicas": "3"})) is None
    assert workload_replicas(workload("Job", {"parallelism": True})) is None


def fit_in_turn(tree: QuotaTree, usage: UsageIndex, ledger: ReservationLedger, pod: PodQuotaRequest,
                gang: Gang | None, replicas: int, now: float) -> int:
    """How many of the pods the quota decision itself admits one after another (every check enforced)."""
    return workload_in_turn(tree, usage, ledger, pod, gang, replicas, now, DEFAULT_ENFORCEMENT).fit


def test_how_many_fit() -> None:
    assert [how_many_fit(8, fit) for fit in (8, 9, 3, 0)] == ["all", "all", "some", "none"]
    assert how_many_fit(0, 0) == "all"


def test_a_gang_fits_whole_or_not_at_all_and_the_scratch_ledger_leaves_the_base_alone() -> None:
    base = ReservationLedger()
    usage = UsageIndex(tree(10))
    assert fit_in_turn(tree(7), UsageIndex(tree(7)), scratch_ledger(base, usage), request(), GANG, 8,
                       1000.0) == 0
    assert fit_in_turn(tree(10), usage, scratch_ledger(base, usage), request(), GANG, 8, 1000.0) == 8
    # Beyond the minimum, plain pods in the room the gang leaves: two more of four.
    assert fit_in_turn(tree(10), usage, scratch_ledger(base, usage), request(), GANG, 12, 1000.0) == 10
    assert len(base) == 0 and base.gangs() == []


def test_members_draw_from_a_reservation_another_admission_opened() -> None:
    # Another replica admitted the first member: eight cards are held; a plain pod sees two free.
    base = ReservationLedger()
    base.open_gang(GangReservation(GANG.key, "review-0", ("train",), {n: q.scaled(8) for n, q in ONE_CARD.items()},
                                   8, expires_at=1600.0))
    base.reserve("team-train/w-first", "review-0", ("train",), ONE_CARD, 1000.0, gang=GANG.key)
    usage = UsageIndex(tree(10))
    assert fit_in_turn(tree(10), usage, scratch_ledger(base, usage), request("plain-"), None, 5,
                       1000.0) == 2
    # The other seven members draw from it, whatever else is there; two plain pods after them.
    assert fit_in_turn(tree(10), usage, scratch_ledger(base, usage), request(), GANG, 9, 1000.0) == 9
    fit = gang_fit(tree(10), "train", GANG, ONE_CARD, base, base.used)
    assert (fit.members, fit.fits, fit.rest, fit.held) == (
        1, True, {n: q.scaled(7) for n, q in ONE_CARD.items()}, {n: q.scaled(7) for n, q in ONE_CARD.items()})
    # What the gang adds beyond what it holds: nothing, at every level.
    assert [level.needs.is_zero() for level in fit.levels] == [True, True]
    assert add_lists(base.used("train")) == {n: q.scaled(8) for n, q in ONE_CARD.items()}


def test_a_gang_fit_counts_the_minimums_of_the_rest_of_its_gang_group() -> None:
    other = Gang("team-train", "h", 4, 600, FROM_ANNOTATIONS)
    grouped = Gang("team-train", "g", 4, 600, FROM_ANNOTATIONS, group=(other,))
    nothing_used: dict[str, Quantity] = {}
    fits = gang_fit(tree(8), "train", grouped, ONE_CARD, ReservationLedger(), lambda quota: nothing_used)
    assert fits.fits and fits.group == ("team-train/h",)
    assert fits.group_rest == {CORE: Quantity.parse("400"), RATIO: Quantity.parse("400")}
    assert "with the minimums of the rest of its gang group (team-train/h)" in fits.summary()
    # Each gang alone would fit in seven cards; the group of two does not.
    assert not gang_fit(tree(7), "train", grouped, ONE_CARD, ReservationLedger(), lambda quota: nothing_used).fits
    assert gang_fit(tree(7), "train", Gang("team-train", "g", 4, 600, FROM_ANNOTATIONS), ONE_CARD,
                    ReservationLedger(), lambda quota: nothing_used).fits


def test_under_warn_the_pods_beyond_the_room_pass_with_the_refusal_the_first_of_them_meets() -> None:
    warn = EnforcementConfig(Mode.ENFORCE, {"QuotaExceeded": Mode.WARN})
    usage = UsageIndex(tree(3))
    turn = workload_in_turn(tree(3), usage, scratch_ledger(ReservationLedger(), usage), request("plain-"), None, 8,
                            1000.0, warn)
    assert (turn.replicas, turn.fit, turn.admitted, turn.would_be_refused) == (8, 3, 8, 5)
    assert turn.beyond_fit is not None and (turn.beyond_fit.check, turn.beyond_fit.mode) == ("QuotaExceeded", Mode.WARN)
    # The fourth pod's refusal, with the three before it held as reservations.
    assert turn.beyond_fit.message.startswith("exceeded quota: team-train/train, requested: ")
    assert f"used: {CORE}=300,{RATIO}=300 ({CORE}=300,{RATIO}=300 of it reserved" in turn.beyond_fit.message
    # A gang of eight in room for seven: none fits; in warn every member passes, enforced none does.
    usage = UsageIndex(tree(7))
    assert workload_in_turn(tree(7), usage, scratch_ledger(ReservationLedger(), usage), request(), GANG, 8, 1000.0,
                            DEFAULT_ENFORCEMENT) == InTurn(8, 0, 0, 0)
    gang_turn = workload_in_turn(tree(7), usage, scratch_ledger(ReservationLedger(), usage), request(), GANG, 8,
                                 1000.0, warn)
    assert (gang_turn.fit, gang_turn.admitted, gang_turn.would_be_refused) == (0, 8, 8)
    assert gang_turn.beyond_fit is not None and gang_turn.beyond_fit.message.startswith("gang team-train/g needs ")
