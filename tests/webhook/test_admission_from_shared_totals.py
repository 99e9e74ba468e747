"""A worker's admissions from the shared totals (webhook.quota.fast_admission), against a real QuotaState.

The service's side (QuotaState with a Publisher) and a worker's side (FastAdmission) run in this
process on one real shared region; processes that die holding its locks are real forked children.
``Recorder`` stands for the quota service's socket: what reaches it is what the totals did not answer.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from webhook.admission.quota_port import PodAdmission, Verdict
from webhook.quota.fast_admission import FastAdmission
from webhook.quota.publisher import Publisher
from webhook.quota.shared_region import SharedRegion
from webhook.quota.state import QuotaState

RATIO = "koordinator.sh/gpu-memory-ratio"
CORE = "koordinator.sh/gpu-core"
LABEL = "quota.scheduling.koordinator.sh/name"


def quota(name: str, ratio: str, parent: str = "", is_parent: bool = False) -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/parent": parent} if parent else {}
    if is_parent:
        labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
    return {"kind": "ElasticQuota", "metadata": {"name": name, "namespace": "team", "labels": labels,
                                                 "resourceVersion": "1"},
            "spec": {"max": {RATIO: ratio}}}


def running_pod(name: str, ratio: str, leaf: str = "team-a") -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "team", "uid": "uid-" + name,
                                        "labels": {LABEL: leaf}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {RATIO: ratio}}}]},
            "status": {"phase": "Running"}}


def admission(name: str, ratio: str, *, dry_run: bool = False, operation: str = "CREATE",
              leaf: str = "team-a", caller: str = "127.0.0.1") -> PodAdmission:
    return PodAdmission(uid="uid-" + name, operation=operation, namespace="team", name=name, pod_uid="",
                        labels={LABEL: leaf}, canonical_requests={RATIO: ratio}, dry_run=dry_run, caller=caller,
                        old_labels={LABEL: leaf} if operation == "UPDATE" else None,
                        old_canonical_requests={RATIO: "1"} if operation == "UPDATE" else None)


class Recorder:
    """The quota service's socket: answers from the state itself and records what it was asked."""

    def __init__(self, state: QuotaState) -> None:
        self.state = state
        self.asked: list[str] = []

    def ready(self) -> tuple[bool, str]:
        return self.state.ready()

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        self.asked.append(admission.name)
        return self.state.admit_pod(admission)

    def review_elasticquota(self, quota: dict[str, Any]) -> Verdict:
        return self.state.review_elasticquota(quota)


class Setup:
    def __init__(self, tmp_path: Path, objects: list[dict[str, Any]], max_held: int = 500) -> None:
        self.state = QuotaState(max_reservations_per_caller=max_held)
        self.region = SharedRegion.create(tmp_path / "quota.region", max_held)
        self.publisher = Publisher(self.region)
        self.publisher.hold_alive()
        self.state.publisher = self.publisher
        self.state.load(objects)
        self.service = Recorder(self.state)
        self.worker = FastAdmission(tmp_path / "quota.region", self.service)

    def admit(self, *args: Any, **kwargs: Any) -> Verdict:
        return self.worker.admit_pod(admission(*args, **kwargs))

    def held(self) -> dict[str, str]:
        """What the service's ledger holds per pod, once it has taken in the workers' reservations."""
        self.state.expire_reservations()
        return {key: str(r.requests[RATIO]) for key, r in self.state.ledger._by_pod.items()}


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path, [quota("team-a", "1000"), running_pod("running", "300")])


def test_a_pod_that_fits_is_admitted_by_the_worker_and_lands_in_the_services_ledger(setup: Setup) -> None:
    assert setup.admit("p", "400").allowed
    assert setup.service.asked == []
    assert setup.held() == {"team/p": "400"}


def test_a_pod_that_does_not_fit_gets_the_services_own_message(setup: Setup) -> None:
    assert setup.admit("p", "400").allowed
    refused = setup.admit("q", "400")
    assert setup.service.asked == ["q"]
    # The service took in the worker's reservation before deciding: used is 300 running + 400.
    assert not refused.allowed and refused.message == (
        f"exceeded quota: team/team-a, requested: {RATIO}=400, used: {RATIO}=700 "
        f"(400 of it reserved by admissions not yet seen), limited: {RATIO}=1k")


def test_the_room_is_taken_exactly_whoever_decides(setup: Setup) -> None:
    # 700 of room: seven pods of 100 from the totals, then the service refuses the eighth.
    verdicts = [setup.admit(f"p{i}", "100") for i in range(8)]
    assert [v.allowed for v in verdicts] == [True] * 7 + [False]
    assert setup.service.asked == ["p7"]
    setup.state.apply_event("Pod", "DELETED", running_pod("running", "300"))
    assert setup.admit("p8", "300").allowed and setup.service.asked == ["p7"]


def test_dry_run_reserves_nothing(setup: Setup) -> None:
    assert setup.admit("p", "700", dry_run=True).allowed
    assert setup.held() == {}
    assert setup.admit("q", "700").allowed and setup.service.asked == []


def test_updates_always_go_to_the_service(setup: Setup) -> None:
    assert setup.admit("p", "100", operation="UPDATE").allowed
    assert setup.service.asked == ["p"]


def test_a_watched_pod_confirms_the_workers_reservation(setup: Setup) -> None:
    assert setup.admit("p", "400").allowed
    setup.state.apply_event("Pod", "ADDED", running_pod("p", "400"))
    assert setup.held() == {}
    assert setup.state.usage.used("team-a")[RATIO].amount == 700
    assert setup.admit("q", "300").allowed and not setup.admit("r", "1").allowed


def test_an_expired_reservation_frees_its_room(tmp_path: Path) -> None:
    clock = [0.0]
    setup = Setup(tmp_path, [quota("team-a", "1000")])
    setup.state._clock = lambda: clock[0]
    assert setup.admit("p", "1000").allowed
    setup.held()  # taken in at t=0, expires at the ledger's ttl
    clock[0] = setup.state.ledger.ttl_seconds + 1
    assert setup.held() == {}
    assert setup.admit("q", "1000").allowed and setup.service.asked == []


def test_an_ancestor_limits_the_workers_admissions_too(tmp_path: Path) -> None:
    setup = Setup(tmp_path, [quota("parent", "500", is_parent=True), quota("team-a", "1000", parent="parent"),
                             quota("team-b", "1000", parent="parent"), running_pod("b", "300", leaf="team-b")])
    assert setup.admit("p", "200").allowed
    refused = setup.admit("q", "1")
    assert setup.service.asked == ["q"] and not refused.allowed
    assert "(ancestor of quota team-a)" in refused.message


def test_a_quota_change_reaches_the_worker(setup: Setup) -> None:
    assert setup.admit("p", "100").allowed
    setup.state.apply_event("ElasticQuota", "MODIFIED", quota("team-a", "450"))
    assert not setup.admit("q", "100").allowed  # 300 + 100 + 100 > 450
    assert setup.service.asked == ["q"]
    setup.state.apply_event("ElasticQuota", "MODIFIED", quota("team-a", "2000"))
    assert setup.admit("r", "1000").allowed and setup.service.asked == ["q"]


def test_a_status_only_quota_update_keeps_the_generation(setup: Setup) -> None:
    generation = setup.region.generation
    rewritten = quota("team-a", "1000")
    rewritten["metadata"]["resourceVersion"] = "2"
    setup.state.apply_event("ElasticQuota", "MODIFIED", rewritten)
    assert setup.region.generation == generation


def test_a_caller_near_the_reservation_bound_is_left_to_the_service(tmp_path: Path) -> None:
    setup = Setup(tmp_path, [quota("team-a", "1000")], max_held=3)
    verdicts = [setup.admit(f"p{i}", "10", caller="10.0.0.9") for i in range(5)]
    assert [v.allowed for v in verdicts] == [True, True, True, False, False]
    assert setup.service.asked == ["p3", "p4"]
    assert verdicts[3].reason == "TooManyReservations"


def test_nothing_is_admitted_from_the_totals_before_the_first_sync(tmp_path: Path) -> None:
    state = QuotaState()
    region = SharedRegion.create(tmp_path / "quota.region", 500)
    state.publisher = Publisher(region)
    state.publisher.hold_alive()
    state.replace_kind("ElasticQuota", [quota("team-a", "1000")])  # pods not listed yet
    service = Recorder(state)
    verdict = FastAdmission(tmp_path / "quota.region", service).admit_pod(admission("p", "1"))
    assert service.asked == ["p"] and verdict.code == 503 and verdict.reason == "NotReady"


def test_without_a_region_every_pod_goes_to_the_service(tmp_path: Path) -> None:
    state = QuotaState()
    state.load([quota("team-a", "1000")])
    service = Recorder(state)
    assert FastAdmission(tmp_path / "absent.region", service).admit_pod(admission("p", "1")).allowed
    assert service.asked == ["p"]


def _die_holding(mutex_of: str, path: Path) -> None:
    pid = os.fork()
    if pid == 0:
        region = SharedRegion.open(path)
        assert region is not None
        getattr(region, mutex_of).try_lock()
        os._exit(0)
    os.waitpid(pid, 0)


def test_a_worker_that_died_holding_the_lock_stops_admissions_from_the_totals_until_repaired(
        setup: Setup, tmp_path: Path) -> None:
    _die_holding("state_mutex", tmp_path / "quota.region")
    assert setup.admit("p", "100").allowed  # the next locker inherits the lock: the service answers
    assert setup.service.asked == ["p"]
    assert setup.region.needs_repair is False  # the service's section republished every total
    assert setup.admit("q", "100").allowed and setup.service.asked == ["p"]
    assert setup.held() == {"team/p": "100", "team/q": "100"}


def test_a_dead_service_is_noticed_at_once(tmp_path: Path) -> None:
    state = QuotaState()
    region = SharedRegion.create(tmp_path / "quota.region", 500)
    state.publisher = Publisher(region)  # no hold_alive here: a child process holds it and dies
    state.load([quota("team-a", "1000")])
    service = Recorder(state)
    worker = FastAdmission(tmp_path / "quota.region", service)
    _die_holding("alive_mutex", tmp_path / "quota.region")
    assert worker.admit_pod(admission("p", "1")).allowed
    assert service.asked == ["p"]
    assert region.alive_mutex.owner_alive() is False  # and stays so for every later look


def test_limits_beyond_64_bits_are_published_and_decided_exactly(tmp_path: Path) -> None:
    # Kubernetes quantities have no upper bound worth relying on; the tree document must carry
    # any of them (JSON integers past 64 bits are not portable, and orjson refuses them).
    huge = quota("team-a", "1e30")
    huge["spec"]["max"]["memory"] = "1e40"
    setup = Setup(tmp_path, [huge, running_pod("running", "300")])
    assert setup.region.generation != 0
    assert setup.admit("p", "1000").allowed and setup.service.asked == []
    # A total past the slots' 128 bits (1e30 units are 1e39 nano-units): the service decides,
    # and then stops publishing rather than write a wrong total.
    assert setup.admit("q", "999999999999999999999999998700").allowed and setup.service.asked == ["q"]
    assert setup.region.generation == 0
    refused = setup.admit("r", "1")
    assert setup.service.asked == ["q", "r"] and not refused.allowed
    # Quoted in the format the quota was written in (1e30), as Kubernetes prints quantities.
    assert refused.message == (f"exceeded quota: team/team-a, requested: {RATIO}=1, "
                               f"used: {RATIO}=1e30 ({10**30 - 300} of it reserved by admissions not yet seen), "
                               f"limited: {RATIO}=1e30")


def test_a_killed_service_stays_dead_for_every_look_of_every_process(tmp_path: Path) -> None:
    # A trylock-based look answered "alive" from the third look on (glibc leaves a robust mutex
    # that a dead owner's finder unlocked unrepaired not recoverable, then EBUSY), and workers went
    # on admitting from totals nobody maintained.
    state = QuotaState()
    region = SharedRegion.create(tmp_path / "quota.region", 500)
    state.publisher = Publisher(region)
    state.load([quota("team-a", "1000")])
    service = Recorder(state)
    read, write = os.pipe()
    owner = os.fork()
    if owner == 0:  # the service: holds the alive mutex, says so, and waits to be killed
        held = SharedRegion.open(tmp_path / "quota.region")
        assert held is not None and held.alive_mutex.try_lock() == (True, False)
        os.write(write, b"held")
        while True:
            signal.pause()  # until killed
    assert os.read(read, 4) == b"held"
    worker = FastAdmission(tmp_path / "quota.region", service)
    assert region.alive_mutex.owner_alive() is True
    assert worker.admit_pod(admission("before", "1")).allowed and service.asked == []
    os.kill(owner, signal.SIGKILL)
    os.waitpid(owner, 0)

    looks = []
    for _ in range(2):  # two other worker processes look five times each
        child = os.fork()
        if child == 0:
            seen = SharedRegion.open(tmp_path / "quota.region")
            os._exit(sum(seen is not None and seen.alive_mutex.owner_alive() for _ in range(5)))
        looks.append(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
    assert looks == [0, 0]
    assert [region.alive_mutex.owner_alive() for _ in range(5)] == [False] * 5
    names = [f"after-{n}" for n in range(6)]
    for name in names:
        assert worker.admit_pod(admission(name, "1")).allowed
    assert service.asked == names  # every one decided by the service, none from the frozen totals


def test_a_region_made_by_a_new_service_is_read_with_its_own_tree(tmp_path: Path) -> None:
    # The old service's tree and the new one's both have generation 1; deciding from the old
    # tree against the new totals would admit what the new tree's limit refuses.
    path = tmp_path / "quota.region"
    old_state = QuotaState()
    old_region = SharedRegion.create(path, 500)
    old_state.publisher = Publisher(old_region)
    old_state.load([quota("team-a", "1000")])
    read, write = os.pipe()
    owner = os.fork()
    if owner == 0:
        held = SharedRegion.open(path)
        assert held is not None and held.alive_mutex.try_lock() == (True, False)
        os.write(write, b"held")
        while True:
            signal.pause()
    assert os.read(read, 4) == b"held"
    new_state = QuotaState()
    service = Recorder(new_state)
    worker = FastAdmission(path, service)
    assert worker.admit_pod(admission("old", "100")).allowed and service.asked == []  # from the old tree
    os.kill(owner, signal.SIGKILL)
    os.waitpid(owner, 0)

    path.unlink()  # what the master does before it starts the new service
    new_region = SharedRegion.create(path, 500)
    new_state.publisher = Publisher(new_region)
    new_state.publisher.hold_alive()
    new_state.load([quota("team-a", "10")])
    assert new_region.generation == old_region.generation

    assert worker.admit_pod(admission("dead", "100")).allowed is False  # dead region dropped: the service answers
    refused = worker.admit_pod(admission("new", "100"))
    assert refused.allowed is False and refused.code == 403
    assert "limited: koordinator.sh/gpu-memory-ratio=10" in refused.message
    assert worker.admit_pod(admission("fits", "5")).allowed and service.asked == ["dead", "new"]
