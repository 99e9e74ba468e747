"""Strict accounting's commit, retry and reconcile logic against a fake ConfigMap API, without Go.

The fake keeps what the API server guarantees and nothing more: a resourceVersion precondition on
replace (409 on a stale one, 404 when the object is gone), 409 on creating an existing name, a new
``metadata.uid`` for every created object. The e2e tests (tests/e2e/test_strict_accounting.py,
tests/e2e/test_faults.py) run the same code against a real apiserver.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpuquota_core import shared_ledger
from gpuquota_core.pod_admission import PodAdmission
from webhook.admission.status import status_of
from webhook.quota.state import QuotaState
from webhook.quota.strict.accounting import Mode, strict_parts
from webhook.quota.strict.escrow import ESCROW_WINDOW_SECONDS as WINDOW

RATIO = "koordinator.sh/gpu-memory-ratio"
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
NAMESPACE = "gpuquota-system"
TREE = "org"
LEDGER = shared_ledger.ledger_object_name(TREE)
TTL = 30.0
# The calls of a tree's first admission: the ledger missing, the registry not listing it, the ledger
# created empty, the tree listed, then the reservation written (store.LedgerStore.write).
FIRST_LEDGER_OF_A_TREE = ["read", "registry read", "create", "registry read", "registry create", "replace"]


@dataclass
class _Raw:
    data: bytes


class FakeCore:
    """The few CoreV1Api calls LedgerStore makes, with the API server's preconditions."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.config_maps: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, str] = {}  # namespace/name -> uid
        self.pod_versions: dict[str, str] = {}  # namespace/name -> resourceVersion
        self._versions = itertools.count(1)
        self.calls: list[str] = []
        self.namespace_missing = False
        self.before_registry_read: Callable[[], None] | None = None  # runs once, at the next registry read

    def _stamp(self, body: dict[str, Any], uid: str) -> _Raw:
        stored = json.loads(json.dumps(body))
        stored["metadata"].update(resourceVersion=str(next(self._versions)), uid=uid)
        self.config_maps[stored["metadata"]["name"]] = stored
        return _Raw(json.dumps(stored).encode())

    def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> _Raw:
        self.calls.append("read" if name != shared_ledger.REGISTRY_OBJECT_NAME else "registry read")
        if name == shared_ledger.REGISTRY_OBJECT_NAME and self.before_registry_read is not None:
            hook, self.before_registry_read = self.before_registry_read, None
            hook()
        if name not in self.config_maps:
            raise ApiException(status=404, reason="Not Found")
        return _Raw(json.dumps(self.config_maps[name]).encode())

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any], dry_run: str = "", **_: Any) -> _Raw:
        if self.namespace_missing:
            raise ApiException(status=404, reason="Not Found")
        if body["metadata"]["name"] in self.config_maps:
            raise ApiException(status=409, reason="AlreadyExists")
        if dry_run:
            return _Raw(json.dumps(body).encode())
        self.calls.append("create" if body["metadata"]["name"] != shared_ledger.REGISTRY_OBJECT_NAME
                          else "registry create")
        body = {**body, "metadata": {**body["metadata"], "creationTimestamp": datetime.fromtimestamp(
            self.clock[0], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}
        return self._stamp(body, uid=f"uid-{next(self._versions)}")

    def replace_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> _Raw:
        self.calls.append("replace" if name != shared_ledger.REGISTRY_OBJECT_NAME else "registry replace")
        current = self.config_maps.get(name)
        if current is None:
            raise ApiException(status=404, reason="Not Found")
        if current["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        body = {**body, "metadata": {**body["metadata"],
                                     "creationTimestamp": current["metadata"]["creationTimestamp"]}}
        if "deletionTimestamp" in current["metadata"]:  # set by the delete; an update cannot clear it
            body["metadata"]["deletionTimestamp"] = current["metadata"]["deletionTimestamp"]
        raw = self._stamp(body, uid=current["metadata"]["uid"])
        if "deletionTimestamp" in body["metadata"] and not body["metadata"].get("finalizers"):
            del self.config_maps[name]  # the last finalizer gone: the apiserver removes it
        return raw

    def delete(self, name: str) -> None:
        """DELETE as the apiserver does it: an object with finalizers only gets its deletionTimestamp."""
        current = self.config_maps[name]
        if not current["metadata"].get("finalizers"):
            del self.config_maps[name]
            return
        stamped = json.loads(json.dumps(current))
        stamped["metadata"]["deletionTimestamp"] = datetime.fromtimestamp(self.clock[0], UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        self._stamp(stamped, uid=current["metadata"]["uid"])

    def list_namespaced_config_map(self, namespace: str, **_: Any) -> _Raw:
        return _Raw(json.dumps({"items": list(self.config_maps.values())}).encode())

    def list_pod_for_all_namespaces(self, limit: int, _continue: str | None = None, **_: Any) -> _Raw:
        """Pages of ``limit`` pods, each at the resourceVersion in ``pod_versions`` ("1" if unset)."""
        keys = sorted(self.pods)
        start = int(_continue or 0)
        items = [{"metadata": {"namespace": key.partition("/")[0], "name": key.partition("/")[2],
                               "uid": self.pods[key], "resourceVersion": self.pod_versions.get(key, "1")}}
                 for key in keys[start:start + limit]]
        more = str(start + limit) if start + limit < len(keys) else ""
        return _Raw(json.dumps({"metadata": {"continue": more}, "items": items}).encode())

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> _Raw:
        uid = self.pods.get(f"{namespace}/{name}")
        if uid is None:
            raise ApiException(status=404, reason="Not Found")
        return _Raw(json.dumps({"metadata": {"name": name, "namespace": namespace, "uid": uid}}).encode())

    def overwrite(self, name: str, data: dict[str, str]) -> None:
        """An update by someone else (a person with kubectl edit): new data, a new resourceVersion."""
        current = json.loads(json.dumps(self.config_maps[name]))
        current["data"] = data
        self._stamp(current, uid=current["metadata"]["uid"])

    def stored(self) -> set[str]:
        return set(shared_ledger.decode(self.config_maps[LEDGER]["data"]))


class Replica:
    """One replica's state and strict accounting. Escrow is off unless asked for: most tests here look
    at the reservation each admitted pod leaves in the object; the escrow tests below turn it on."""

    def __init__(self, core: FakeCore, name: str, clock: list[float], room: int = 300,
                 create_deadline: float = 60.0, escrow: int = 0, leaf_room: int = 1000,
                 monotonic: list[float] | None = None) -> None:
        self.state = QuotaState(ttl_seconds=TTL)
        self.state.load([
            {"kind": "ElasticQuota", "metadata": {"name": TREE, "namespace": "team"},
             "spec": {"max": {RATIO: str(room)}}},
            {"kind": "ElasticQuota", "metadata": {"name": "team-a", "namespace": "team",
                                                  "labels": {"quota.scheduling.koordinator.sh/parent": TREE}},
             "spec": {"max": {RATIO: str(leaf_room)}}},
        ])
        self.parts = strict_parts(self.state, core, NAMESPACE, replica=name, clock=lambda: clock[0],
                                  create_deadline_seconds=create_deadline, escrow_most_pods=escrow,
                                  monotonic=(lambda: monotonic[0]) if monotonic else time.monotonic)
        self.store, self.accounting = self.parts.store, self.parts.accounting

    def admit(self, pod: str, ratio: str = "100", answer_by: float = float("inf"), mode: Mode = Mode.WRITER) -> Any:
        return self.accounting.admit_pod(PodAdmission(
            uid="adm-" + pod, operation="CREATE", namespace="team", name=pod, pod_uid="uid-" + pod,
            labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: ratio}), answer_by, mode)

    def settle(self) -> None:
        """The escrow settler's round: writes what is owed (settled escrows, withdrawals) without an admission."""
        self.parts.committer.settle_due()

    def reconcile(self) -> int:
        return self.parts.reconciler.reconcile_once()


@pytest.fixture
def clock() -> list[float]:
    return [1_000_000.0]


@pytest.fixture
def core(clock: list[float]) -> FakeCore:
    return FakeCore(clock)


def test_a_deleted_ledger_is_created_again_and_the_tree_held_until_what_it_held_expired(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed and replica.admit("p2").allowed
    del core.config_maps[LEDGER]
    core.calls.clear()
    # The cached version is stale now: the replace finds nothing, the fresh read finds nothing,
    # and a create (not a replace, which would 404 for ever) puts back p1 and p2. Other replicas
    # may have written reservations this one never read: until they have expired the tree is
    # held, and the admission is refused for the ledger, not admitted into room that may be taken.
    refused = replica.admit("p3")
    assert not refused.allowed and status_of(refused.reason) == 503 and refused.reason == "LedgerUnavailable"
    assert "the shared quota ledger of tree org was deleted" in refused.message
    # It knew the object, so it needs no registry to know a ledger was lost; the new one is listed.
    assert core.calls == ["replace", "read", "create", "registry read"]
    assert core.stored() == {"team/p1", "team/p2"}
    assert shared_ledger.recovering_until(core.config_maps[LEDGER]["data"]) == clock[0] + TTL
    clock[0] += TTL
    assert replica.admit("p3").allowed and replica.admit("p4", "200").allowed
    assert core.stored() == {"team/p3", "team/p4"}
    assert shared_ledger.RECOVERING_UNTIL_KEY not in core.config_maps[LEDGER]["data"]


def test_a_ledger_removed_without_its_finalizer_holds_its_tree_for_a_replica_that_never_read_it(
        core: FakeCore, clock: list[float]) -> None:
    first, second = Replica(core, "r1", clock), Replica(core, "r2", clock)
    assert first.admit("p1").allowed
    assert shared_ledger.decode_registry(core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"]) == {TREE}
    del core.config_maps[LEDGER]  # its finalizer taken off by hand: gone at once
    # The second replica never saw the old object, and p1 still holds room there. The registry
    # lists the tree, so the missing object is a lost ledger, not a new tree: held, not admitted from
    # an empty ledger; the new object records the hold for every replica.
    refused = second.admit("p2")
    assert not refused.allowed and refused.reason == "LedgerUnavailable" and status_of(refused.reason) == 503
    assert "the shared quota ledger of tree org was deleted" in refused.message
    assert shared_ledger.recovering_until(core.config_maps[LEDGER]["data"]) == clock[0] + TTL
    # The first replica's replace conflicts; its fresh read shows another object (another uid):
    # it carries p1 into it and holds the tree too.
    clock[0] += 1.0
    assert status_of(first.admit("p3").reason) == 503
    assert core.stored() == {"team/p1"}
    clock[0] += TTL
    assert second.admit("p4").allowed and first.admit("p5").allowed
    assert core.stored() == {"team/p4", "team/p5"}


def test_a_new_tree_is_listed_before_its_ledger_holds_a_reservation(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed
    # Missing and unlisted: a new tree. Created with nothing in it, listed, then written: a ledger
    # never holds a reservation that a replica finding it missing could take for a new tree's.
    assert core.calls == FIRST_LEDGER_OF_A_TREE
    assert core.stored() == {"team/p1"}
    # An existing ledger read by a replica that has not listed it (one made before the registry
    # existed, or whose maker stopped in between) is listed by that replica's first read.
    core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"] = shared_ledger.encode_registry([])
    assert Replica(core, "r2", clock).admit("p2").allowed
    assert shared_ledger.decode_registry(core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"]) == {TREE}


def test_a_new_tree_made_by_another_replica_between_a_missing_read_and_the_registry_read_is_not_held(
        core: FakeCore, clock: list[float]) -> None:
    first, second = Replica(core, "r1", clock), Replica(core, "r2", clock)
    # The second replica finds no ledger; before it asks the registry, the first makes the ledger and
    # lists the tree (the first admissions of a new tree, on several replicas at once). Listed does
    # not mean lost here: the ledger is there when read again, and nothing is held.
    core.before_registry_read = lambda: first.admit("p1")
    assert second.admit("p2").allowed
    assert core.stored() == {"team/p1", "team/p2"}
    assert second.store.recovering_until(TREE) == 0.0


def test_a_registry_that_cannot_be_read_is_rebuilt_from_the_ledgers_that_exist(core: FakeCore,
                                                                               clock: list[float]) -> None:
    assert Replica(core, "r1", clock).admit("p1").allowed
    core.overwrite(shared_ledger.REGISTRY_OBJECT_NAME, {shared_ledger.REGISTRY_DATA_KEY: "{not json"})
    assert Replica(core, "r2", clock).admit("p2").allowed
    assert shared_ledger.decode_registry(core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"]) == {TREE}


def test_unlisting_a_tree_from_a_registry_that_cannot_be_read_keeps_the_other_ledgers_listed(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed
    other = json.loads(json.dumps(core.config_maps[LEDGER]))
    other["metadata"].update(name=shared_ledger.ledger_object_name("other"),
                             labels={**other["metadata"]["labels"], shared_ledger.TREE_LABEL: "other"})
    core.config_maps[other["metadata"]["name"]] = other
    core.overwrite(shared_ledger.REGISTRY_OBJECT_NAME, {shared_ledger.REGISTRY_DATA_KEY: "{not json"})
    # Rebuilt from the ledgers that exist, as a listing rebuilds it, then the tree let go is unlisted.
    replica.store.registry.remove(TREE)
    assert shared_ledger.decode_registry(core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"]) == {"other"}


def test_a_ledger_let_go_through_its_finalizer_is_unlisted_first_and_its_tree_is_new_again(
        core: FakeCore, clock: list[float]) -> None:
    first, second = Replica(core, "r1", clock), Replica(core, "r2", clock)
    assert first.admit("p1").allowed
    core.delete(LEDGER)  # kept, terminating, by the finalizer
    assert status_of(first.admit("p2").reason) == 503
    clock[0] += TTL + 1
    assert first.reconcile() == 0 and LEDGER not in core.config_maps
    assert shared_ledger.decode_registry(core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"]) == set()
    # Nothing it held can take room any more: a replica that never saw it is not held.
    assert second.admit("p3").allowed


def test_the_reconciler_recreates_a_deleted_ledger_that_no_admission_writes(core: FakeCore,
                                                                             clock: list[float]) -> None:
    first, second = Replica(core, "r1", clock), Replica(core, "r2", clock)
    assert first.admit("p1").allowed and first.admit("p2").allowed
    del core.config_maps[LEDGER]
    # No object lists any more: only what the replica wrote to tells it the tree exists.
    assert first.reconcile() == 0
    assert core.stored() == {"team/p1", "team/p2"}
    assert status_of(second.admit("p3").reason) == 503  # the hold is in the object, for replicas that never saw it
    # Once the reservations expire, the reconciler empties the object and the room is back.
    clock[0] += TTL + 1
    assert first.reconcile() == 2 and core.stored() == set()
    assert second.admit("p5", "300").allowed


def test_the_hold_after_a_deletion_is_not_extended_while_the_object_stays_missing(core: FakeCore,
                                                                                   clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed
    clock[0] += TTL + 1  # p1 expired: nothing is worth recreating the object for
    del core.config_maps[LEDGER]
    start = clock[0]
    for _ in range(4):
        assert replica.reconcile() == 0 and LEDGER not in core.config_maps
        clock[0] += TTL / 4
    assert replica.store.recovering_until(TREE) == start + TTL
    assert clock[0] >= start + TTL and replica.admit("p2", "300").allowed


def test_a_replica_that_never_wrote_a_tree_does_not_create_an_empty_ledger(core: FakeCore,
                                                                           clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.reconcile() == 0 and core.config_maps == {}


def test_a_create_that_missed_its_deadline_and_left_no_pod_releases_its_room(core: FakeCore,
                                                                           clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, create_deadline=10.0)
    for pod in ("landed", "lost", "replaced"):
        assert replica.admit(pod).allowed
    core.pods["team/landed"] = "uid-landed"  # stored, but this replica's watch has not shown it yet
    core.pods["team/replaced"] = "uid-other"  # another pod of that name: not the admitted one
    # Before the deadline a create may still land: nothing is released, whatever the API shows.
    clock[0] += 9.0
    assert replica.reconcile() == 0
    assert core.stored() == {"team/landed", "team/lost", "team/replaced"}
    clock[0] += 2.0
    assert replica.reconcile() == 2
    assert core.stored() == {"team/landed"}
    assert replica.admit("again", "200").allowed  # 100 landed + 200 = 300, well before the TTL


def test_a_missing_ledger_namespace_refuses_instead_of_admitting(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)

    def no_namespace(*_args: Any, **_kwargs: Any) -> None:
        raise ApiException(status=404, reason="Not Found")

    core.create_namespaced_config_map = no_namespace  # type: ignore[method-assign]
    verdict = replica.admit("p1")
    assert not verdict.allowed and status_of(verdict.reason) == 503 and verdict.reason == "LedgerUnavailable"
    assert f"cannot write ConfigMap {NAMESPACE}/{LEDGER}: 404" in verdict.message


def watch_shows(replica: Replica, pod: str, version: str, ratio: str = "100") -> None:
    """The replica's pod watch delivers the stored pod, at that resourceVersion."""
    replica.state.apply_event("Pod", "ADDED", {
        "kind": "Pod",
        "metadata": {"name": pod, "namespace": "team", "uid": "uid-" + pod, "resourceVersion": version,
                     "labels": {QUOTA_LABEL: "team-a"}},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {RATIO: ratio}, "limits": {RATIO: ratio}}}]},
    })


def test_a_replica_whose_pod_watch_is_behind_the_ledger_does_not_decide_on_it(
        core: FakeCore, clock: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    # The writer drops a reservation once its own watch has shown the pod; a replica whose watch has
    # not shown that pod yet (paused, slow, re-listing) would count neither and admit past the room.
    monkeypatch.setattr("webhook.quota.strict.committer.RETRY_BUDGET_SECONDS", 0.1)
    writer, behind = Replica(core, "r1", clock, room=200), Replica(core, "r2", clock, room=200)
    watch_shows(writer, "seed", "90", ratio="0")
    watch_shows(behind, "seed", "90", ratio="0")
    assert writer.admit("p1").allowed
    watch_shows(writer, "p1", "100")
    clock[0] += shared_ledger.DEFAULT_SETTLE_SECONDS
    assert writer.admit("p2").allowed
    assert core.stored() == {"team/p2"}  # p1's reservation is gone: the writer's watch counts it
    # ... as of the resourceVersion its watch showed p1 at, which every reader's watch must reach first.
    assert shared_ledger.pods_counted_through(core.config_maps[LEDGER]["data"]) == 100
    refused = behind.admit("p3")
    assert not refused.allowed and status_of(refused.reason) == 503 and "watch" in refused.message
    watch_shows(behind, "p1", "100")  # caught up: p1 and p2 fill the room
    refused = behind.admit("p3")
    assert not refused.allowed and refused.reason == "QuotaExceeded"


def escrow_entries(core: FakeCore) -> dict[str, shared_ledger.StoredReservation]:
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    return {key: item for key, item in stored.items() if shared_ledger.is_escrow(key)}


def test_pods_of_one_shape_are_admitted_from_escrow_without_a_write_of_their_own(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)  # room for 100 one-card pods
    assert replica.admit("p1").allowed
    # The write that admitted p1 also took a quarter of what was left for its shape: 99 // 4.
    [(key, entry)] = escrow_entries(core).items()
    assert entry.replica == "r1" and entry.reservation.quotas == ("team-a", TREE)
    assert entry.reservation.requests == {RATIO: shared_ledger.Quantity.of(2400)}
    assert entry.reservation.expires_at == clock[0] + WINDOW + TTL  # the window, then a reservation's TTL
    assert core.calls == FIRST_LEDGER_OF_A_TREE
    for n in range(2, 26):
        assert replica.admit(f"p{n}").allowed
    assert core.calls == FIRST_LEDGER_OF_A_TREE  # 24 pods, no write
    # The 26th is written with the 24 it admitted from escrow; the spent escrow is gone, and a new
    # one takes a quarter of what is left: 100 - 26 = 74 -> 18.
    assert replica.admit("p26").allowed
    assert core.calls[-1] == "replace"
    assert {key for key in core.stored() if not shared_ledger.is_escrow(key)} == {f"team/p{n}" for n in range(1, 27)}
    [(new_key, new_entry)] = escrow_entries(core).items()
    assert new_key != key and new_entry.reservation.requests == {RATIO: shared_ledger.Quantity.of(1800)}


def test_escrow_stops_near_the_limit_and_every_pod_is_then_written(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=300, escrow=32)  # room for 3: never a quarter of one
    for pod in ("p1", "p2", "p3"):
        assert replica.admit(pod).allowed
    assert not escrow_entries(core) and core.stored() == {"team/p1", "team/p2", "team/p3"}
    refused = replica.admit("p4")
    assert not refused.allowed and refused.reason == "QuotaExceeded"


def test_a_lowered_limit_is_not_admitted_past_from_escrow(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("p1").allowed and escrow_entries(core)
    replica.state.apply_event("ElasticQuota", "MODIFIED", {
        "kind": "ElasticQuota", "metadata": {"name": TREE, "namespace": "team"}, "spec": {"max": {RATIO: "150"}}})
    refused = replica.admit("p2")
    assert not refused.allowed and refused.reason == "QuotaExceeded"
    assert not escrow_entries(core)  # the write that judged p2 gave the escrow back


def test_the_settler_writes_what_an_escrow_admitted_and_gives_back_the_rest(core: FakeCore,
                                                                            clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    for pod in ("p1", "p2", "p3"):
        assert replica.admit(pod).allowed
    replica.settle()
    assert escrow_entries(core)  # still inside its window: kept
    clock[0] += WINDOW
    replica.settle()
    assert core.stored() == {"team/p1", "team/p2", "team/p3"}
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    # p2 and p3 hold room for one TTL from their own admission, as a pod written on its own would.
    assert stored["team/p2"].reservation.expires_at == clock[0] - WINDOW + TTL


def test_a_deleted_ledger_keeps_holding_what_an_open_escrow_admitted(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("p1").allowed and replica.admit("p2").allowed
    [key] = escrow_entries(core)
    del core.config_maps[LEDGER]
    core.calls.clear()
    # Inside its window the escrow admits without a write, so the deletion is not seen yet: every
    # other replica that saw the object holds the tree for an escrow's window plus the TTL from
    # when it notices, which covers what this escrow admits (docs/design.md, "Known limits").
    assert replica.admit("p3").allowed and core.calls == []
    clock[0] += WINDOW
    assert status_of(replica.admit("p4").reason) == 503
    # The recreated object holds p1 and the escrow p2 and p3 were admitted from, until they expire,
    # and the tree is held for the longest any lost entry could live.
    assert core.stored() == {"team/p1", key}
    assert shared_ledger.recovering_until(core.config_maps[LEDGER]["data"]) == clock[0] + WINDOW + TTL
    # After the hold the next write records p2 and p3 in place of the escrow (p1 has expired too).
    clock[0] += WINDOW + TTL
    assert replica.admit("p5").allowed
    assert "team/p5" in core.stored() and key not in core.stored()


@pytest.mark.parametrize("seed", range(6))
def test_replicas_with_escrow_never_admit_past_the_room_and_lose_none_of_it(
        core: FakeCore, clock: list[float], seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # A refused pod waits for other replicas' escrow only within the retry budget; here the other
    # replicas run in this thread between admissions, so a short budget keeps the test quick.
    monkeypatch.setattr("webhook.quota.strict.committer.RETRY_BUDGET_SECONDS", 0.1)
    pods_of_room = 40
    replicas = [Replica(core, f"r{n}", clock, room=100 * pods_of_room, escrow=32, leaf_room=100_000)
                for n in range(3)]
    rng = random.Random(seed)
    admitted = 0
    for n in range(3 * pods_of_room):
        clock[0] += rng.choice([0.0, 0.0, 0.1, 0.4])
        replica = rng.choice(replicas)
        if rng.random() < 0.2:
            replica.settle()
        admitted += replica.admit(f"p{n}").allowed
        assert admitted <= pods_of_room
    # Once every window has passed and each replica has settled, the ledger holds exactly the pods
    # admitted: the room that is left is all there for a replica that never took escrow.
    clock[0] += WINDOW
    for replica in replicas:
        replica.settle()
    assert not escrow_entries(core) and len(core.stored()) == admitted
    latecomer = Replica(core, "late", clock, room=100 * pods_of_room, leaf_room=100_000)
    left = pods_of_room - admitted
    assert all(latecomer.admit(f"late{n}").allowed for n in range(left))
    assert not latecomer.admit("one-too-many").allowed


def test_pods_of_two_leaves_each_keep_their_escrow_when_they_alternate(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    replica.state.apply_event("ElasticQuota", "ADDED", {
        "kind": "ElasticQuota", "metadata": {"name": "team-b", "namespace": "team",
                                             "labels": {"quota.scheduling.koordinator.sh/parent": TREE}},
        "spec": {"max": {RATIO: "10000"}}})

    def admit(pod: str, leaf: str) -> bool:
        return replica.accounting.admit_pod(PodAdmission(
            uid="adm-" + pod, operation="CREATE", namespace="team", name=pod, pod_uid="uid-" + pod,
            labels={QUOTA_LABEL: leaf}, canonical_requests={RATIO: "100"})).allowed

    assert admit("a1", "team-a") and admit("b1", "team-b")
    assert len(escrow_entries(core)) == 2  # one per leaf; b1's write left a1's escrow open
    writes = len(core.calls)
    for n in range(2, 8):
        assert admit(f"a{n}", "team-a") and admit(f"b{n}", "team-b")
    assert len(core.calls) == writes  # twelve pods, alternating leaves, no write


def test_room_this_replica_holds_in_escrow_for_another_shape_is_given_back_before_a_refusal(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=1000, escrow=32, leaf_room=10_000)  # room for 10 cards

    def admit(pod: str, cards: int) -> bool:
        return replica.admit(pod, str(100 * cards)).allowed

    assert admit("one-1", 1)  # and escrow for 2 more one-card pods: (10 - 1) // 4
    assert admit("two-1", 2) and admit("two-2", 2) and admit("two-3", 2)  # 9 cards taken or held
    [held] = escrow_entries(core).values()
    assert held.reservation.requests == {RATIO: shared_ledger.Quantity.of(200)}
    # 2 of those 9 cards are this replica's unused one-card escrow: the next two-card pod gets them
    # back rather than a refusal, and the escrow is gone.
    assert admit("two-4", 2)
    assert not escrow_entries(core)
    assert core.stored() == {"team/one-1", "team/two-1", "team/two-2", "team/two-3", "team/two-4"}
    assert not admit("two-5", 2)  # 9 cards admitted: now the room is really gone


def test_room_lent_to_another_writers_escrow_is_a_retryable_503_at_once_and_admitted_once_given_back(
        core: FakeCore, clock: list[float]) -> None:
    # r1 was the writer and holds escrow; r2 decides here (the writer could not be asked). Nobody
    # waits for lent escrow: r2 answers at once with a retryable 503 naming the lender, not "exceeded
    # quota" (the room exists), and the worker's second attempt finds it given back.
    first = Replica(core, "r1", clock, room=1000, escrow=32, leaf_room=10_000)  # room for 10 cards
    second = Replica(core, "r2", clock, room=1000, escrow=32, leaf_room=10_000)
    assert first.admit("small").allowed  # and escrow for 2 more one-card pods: (10 - 1) // 4
    reads_before = core.calls.count("read")
    # 8 cards: 7 are free while r1's escrow holds 2, 9 once it gives them back.
    verdict = second.admit("big", "800", mode=Mode.DEGRADED)
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "EscrowNotBackInTime")
    assert "held in escrow by webhook replica r1" in verdict.message and "exceeded quota" not in verdict.message
    assert core.calls.count("read") - reads_before == 1  # one fresh look, no waiting
    assert "team/big" not in core.stored()
    clock[0] += WINDOW
    first.settle()  # r1's window is over: it writes "small" and gives the rest back
    assert second.admit("big", "800", mode=Mode.DEGRADED).allowed
    assert core.stored() == {"team/small", "team/big"}


def test_the_degraded_mode_reads_fresh_and_takes_no_escrow(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("p1", mode=Mode.DEGRADED).allowed
    reads = core.calls.count("read")
    assert replica.admit("p2", mode=Mode.DEGRADED).allowed
    assert core.calls.count("read") == reads + 1  # a fresh read for every commit, the cache never trusted
    assert not escrow_entries(core) and core.stored() == {"team/p1", "team/p2"}


def test_a_pod_that_does_not_fit_even_without_another_replicas_escrow_is_refused_at_once(
        core: FakeCore, clock: list[float]) -> None:
    first = Replica(core, "r1", clock, room=1000, escrow=32, leaf_room=10_000)  # room for 10 cards
    second = Replica(core, "r2", clock, room=1000, escrow=32, leaf_room=10_000)
    assert first.admit("small").allowed  # and escrow for 2 more one-card pods: (10 - 1) // 4
    reads_before = core.calls.count("read")
    # 10 cards: more than the 9 free with r1's escrow given back, so waiting for it is pointless.
    verdict = second.admit("huge", "1000")
    assert (verdict.allowed, status_of(verdict.reason)) == (False, 403)
    assert f"used: {RATIO}=300 (300 of it reserved by admissions not yet seen)" in verdict.message
    assert core.calls.count("read") - reads_before <= 1


def test_an_escrow_spent_while_a_commit_retries_is_given_back_in_that_commit(core: FakeCore,
                                                                             clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("a1").allowed and replica.admit("a2").allowed  # a2 from a1's escrow, no write
    assert "team/a2" not in core.stored()
    write = core.replace_namespaced_config_map

    def conflict_once(*args: Any, **kwargs: Any) -> Any:
        core.replace_namespaced_config_map = write  # type: ignore[method-assign]
        clock[0] += WINDOW  # the escrow's window ends while this write fails
        raise ApiException(status=409, reason="Conflict")

    core.replace_namespaced_config_map = conflict_once  # type: ignore[method-assign]
    assert replica.admit("b1", "200").allowed  # another shape: its commit conflicts once, then writes
    # The retry closed the escrow spent meanwhile and wrote what it admitted: other replicas waiting
    # for that room do not wait for the settler's next round after this commit.
    assert {"team/a1", "team/a2", "team/b1"} <= core.stored()
    assert "~escrow/r1/1" not in escrow_entries(core)  # a1's, given back


def test_a_quota_event_that_changes_nothing_decisions_read_keeps_the_escrow(core: FakeCore,
                                                                           clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("p1").allowed and escrow_entries(core)
    writes = len(core.calls)
    # Koordinator rewrites a quota's status and annotations often: a new resourceVersion, same limits.
    replica.state.apply_event("ElasticQuota", "MODIFIED", {
        "kind": "ElasticQuota", "metadata": {"name": TREE, "namespace": "team", "resourceVersion": "7"},
        "spec": {"max": {RATIO: "10000"}}, "status": {"used": {RATIO: "100"}}})
    assert replica.admit("p2").allowed and len(core.calls) == writes  # from the escrow, no write


def test_a_deleted_ledger_stays_readable_and_holds_its_tree_for_every_replica_until_what_it_held_expired(
        core: FakeCore, clock: list[float]) -> None:
    knew = Replica(core, "r1", clock, room=100 * 100, escrow=32, leaf_room=100 * 100)
    first_look_after = Replica(core, "r2", clock, room=100 * 100, escrow=32, leaf_room=100 * 100)
    assert knew.admit("p1").allowed  # takes escrow for more: room the object holds, not yet any pod
    assert core.config_maps[LEDGER]["metadata"]["finalizers"] == ["gpuquota.koord-gpuquota.io/ledger"]
    core.delete(LEDGER)
    assert LEDGER in core.config_maps  # kept by the finalizer, with everything it held
    # A replica whose first look at the tree comes after the deletion finds it, and holds.
    verdict = first_look_after.admit("p2")
    assert not verdict.allowed and status_of(verdict.reason) == 503 and "was deleted" in verdict.message
    # The one that knew it may still admit from its open escrow: that room is in the object.
    assert knew.admit("p3").allowed
    clock[0] += WINDOW + TTL + 1  # everything the deleted object held has expired
    assert first_look_after.admit("p4").allowed
    # The finalizer went, the apiserver removed the object, and a new one was created (no deletion).
    assert "deletionTimestamp" not in core.config_maps[LEDGER]["metadata"]
    assert "team/p4" in core.stored()
    # The one that knew the old object and never saw it terminating cannot tell the new one from a
    # recreation after a loss: it holds the tree as after a loss, then admits again.
    assert status_of(knew.admit("p5").reason) == 503
    clock[0] += WINDOW + TTL + 1
    assert knew.admit("p6").allowed


def slow_writes(core: FakeCore, monotonic: list[float], seconds: float) -> None:
    """Every ledger write of ``core`` takes ``seconds`` of the workers' clock (etcd stalled, say)."""
    for name in ("create_namespaced_config_map", "replace_namespaced_config_map"):
        write = getattr(core, name)

        def slow(*args: Any, _write: Any = write, **kwargs: Any) -> Any:
            monotonic[0] += seconds
            return _write(*args, **kwargs)

        setattr(core, name, slow)


def test_an_admission_that_reaches_the_ledger_after_its_worker_gave_up_is_refused_and_writes_nothing(
        core: FakeCore, clock: list[float]) -> None:
    monotonic = [500.0]
    replica = Replica(core, "r1", clock, monotonic=monotonic)
    verdict = replica.admit("p1", answer_by=monotonic[0] - 0.1)  # queued while the service was stopped
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "AnswerTooLate")
    assert verdict.message == ("pod team/p1 not admitted: the quota service arrived after the webhook worker "
                               "stopped waiting for its answer; retry shortly")
    assert core.calls == []  # no read, no write: nothing holds room for it


def test_an_admission_whose_write_ends_after_its_worker_gave_up_is_refused_and_its_room_withdrawn(
        core: FakeCore, clock: list[float]) -> None:
    monotonic = [500.0]
    replica = Replica(core, "r1", clock, monotonic=monotonic)
    assert replica.admit("answered").allowed  # 100 of the 300
    slow_writes(core, monotonic, 3.0)
    # Decided in time, but the write that records it returns after the worker's deadline: the
    # worker never receives "allowed", so the pod is never stored on its strength.
    verdict = replica.admit("late", "200", answer_by=monotonic[0] + 1.75)
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "AnswerTooLate")
    assert "decided it after the webhook worker stopped waiting" in verdict.message
    assert core.stored() == {"team/answered", "team/late"}  # written before the deadline passed
    replica.settle()  # the settler's next round (no admission needed)
    assert core.stored() == {"team/answered"}
    # The room is back at once, long before the reservation's TTL.
    assert replica.admit("fits", "200").allowed


def test_a_late_retry_never_withdraws_the_room_of_an_admission_already_answered(
        core: FakeCore, clock: list[float]) -> None:
    monotonic = [500.0]
    replica = Replica(core, "r1", clock, monotonic=monotonic)
    assert replica.admit("p1").allowed  # answered: the pod may be stored
    slow_writes(core, monotonic, 3.0)
    clock[0] += 1.0
    # The same admission delivered again (same uid), decided too late: refused, but the entry it
    # rewrote is also the answered one's, so it stays.
    assert replica.admit("p1", answer_by=monotonic[0] + 1.0).reason == "AnswerTooLate"
    replica.settle()
    assert core.stored() == {"team/p1"}
    assert not replica.admit("p2", "250").allowed


def admission_of(pod: str, ratio: str = "100") -> PodAdmission:
    return PodAdmission(uid="adm-" + pod, operation="CREATE", namespace="team", name=pod, pod_uid="uid-" + pod,
                        labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: ratio})


def test_what_any_replica_reserved_for_an_admission_its_worker_got_no_answer_for_is_withdrawn(
        core: FakeCore, clock: list[float]) -> None:
    # The writer reserved "lost" for a forwarder whose quota service then died before it passed the
    # "allowed" on: that worker answered QuotaServiceDown, and reports the admission to the
    # forwarder's next quota service. That one passes the report to the writer when it can; in the
    # degraded mode it writes the withdrawal itself, and the one rule takes the writer's entry out.
    writer, forwarder = Replica(core, "writer/1", clock), Replica(core, "forwarder/2", clock)
    assert writer.admit("answered").allowed and writer.admit("lost", "200").allowed
    assert not forwarder.admit("waiting", "100").allowed  # 300 of 300 held
    forwarder.accounting.withdraw_unanswered([admission_of("lost", "200"), admission_of("never-reserved")])
    forwarder.settle()
    assert core.stored() == {"team/answered"}
    # The room is back at once, not after the reservation's TTL.
    assert forwarder.admit("fits", "200").allowed


def test_the_writer_withdraws_what_a_forwarder_reports_and_its_cached_copy_shows_the_room_at_once(
        core: FakeCore, clock: list[float]) -> None:
    # The forwarder passes its workers' report to the writer (forwarding.SingleWriter), so the
    # withdrawal is the writer's own write: its cached copy is the ledger, and a refusal on it is right.
    writer = Replica(core, "writer/1", clock)
    assert writer.admit("answered").allowed and writer.admit("lost", "200").allowed
    assert not writer.admit("fits", "200").allowed  # 300 of 300 held
    assert writer.accounting.withdraw_unanswered([admission_of("lost", "200")])
    writer.settle()
    assert core.stored() == {"team/answered"}
    reads = core.calls.count("read")
    assert writer.admit("fits", "200").allowed
    assert core.calls.count("read") == reads  # decided on its own copy: nothing to read again


def test_a_withdrawal_of_a_refused_review_never_takes_the_entry_of_the_same_pods_next_review(
        core: FakeCore, clock: list[float]) -> None:
    # The review-uid assumption (webhook/quota/strict/withdrawals.py): review adm-1 of pod p was
    # reserved, but its worker got no answer and refused it 503. The client retried the create: a new
    # request, so a new review, adm-2, admitted and answered. The report of adm-1 arrives after it.
    replica = Replica(core, "writer/1", clock)
    refused = PodAdmission(uid="adm-1", operation="CREATE", namespace="team", name="p", pod_uid="uid-p",
                           labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: "100"})
    retried = PodAdmission(uid="adm-2", operation="CREATE", namespace="team", name="p", pod_uid="uid-p",
                           labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: "100"})
    assert replica.accounting.admit_pod(refused).allowed  # written; the "allowed" never reached the apiserver
    assert replica.accounting.admit_pod(retried).allowed  # the retry's review: answered, the pod may be stored
    assert replica.accounting.withdraw_unanswered([refused])
    replica.settle()
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    assert set(stored) == {"team/p"} and stored["team/p"].reservation.admission_uid == "adm-2"
    assert not replica.admit("other", "250").allowed  # p's 100 still held: 100 + 250 > 300
    # Reported before the retry's review is judged, the withdrawal takes the refused review's entry,
    # and the retry's is written in the same write.
    q_refused = dataclasses.replace(retried, uid="adm-3", name="q", pod_uid="uid-q")
    q_retried = dataclasses.replace(q_refused, uid="adm-4")
    assert replica.accounting.admit_pod(q_refused).allowed
    assert replica.accounting.withdraw_unanswered([q_refused])
    assert replica.accounting.admit_pod(q_retried).allowed
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    assert stored["team/q"].reservation.admission_uid == "adm-4"


def test_an_unanswered_admission_never_withdraws_an_entry_another_admission_of_its_pod_wrote(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed  # review adm-p1, answered
    # Another review of the same pod name (a new uid) went unanswered: adm-p1's entry stays.
    other = PodAdmission(uid="adm-other", operation="CREATE", namespace="team", name="p1", pod_uid="",
                         labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: "100"})
    replica.accounting.withdraw_unanswered([other])
    replica.settle()
    assert core.stored() == {"team/p1"}
    assert not replica.admit("p2", "250").allowed


def test_nobody_waits_for_the_escrow_of_a_replica_that_stopped_giving_it_back(core: FakeCore,
                                                                           clock: list[float]) -> None:
    dead = Replica(core, "host/101", clock, room=1000, escrow=32, leaf_room=10_000)  # room for 10 cards
    restarted = Replica(core, "host/202", clock, room=1000, escrow=32, leaf_room=10_000)
    assert dead.admit("small").allowed  # and escrow for 2 more, in the object; then its process is killed
    # Past the escrow's window and the time its replica takes to give it back: whoever needs that
    # room is answered now instead of asking again until its worker gives up, and not with
    # "exceeded quota", since the room exists: a retryable 503 naming the lender and when it comes back.
    clock[0] += WINDOW + 2.0
    reads_before = core.calls.count("read")
    verdict = restarted.admit("big", "800")  # 7 cards are free while the escrow holds 2
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "EscrowNotBackInTime")
    assert "held in escrow by webhook replica host/101" in verdict.message
    # The escrow lives its window plus a TTL from its write; 2.5 s of that are gone.
    assert f"if that replica has stopped, the room comes back when the escrow expires, in " \
        f"{TTL + WINDOW - (WINDOW + 2.0):.0f}s at most" in verdict.message
    assert core.calls.count("read") - reads_before <= 1
    # A pod that would not fit even without that escrow is refused for the quota, as ever.
    refused = restarted.admit("huge", "1000")
    assert (refused.allowed, status_of(refused.reason)) == (False, 403)
    assert f"used: {RATIO}=300 (300 of it reserved by admissions not yet seen)" in refused.message
    # The escrow's room comes back when it expires, as the room of any admission not yet seen does.
    clock[0] += TTL
    assert restarted.admit("big", "800").allowed


UNREADABLE = {
    "not JSON": {shared_ledger.LEDGER_DATA_KEY: "{not json"},
    "a list": {shared_ledger.LEDGER_DATA_KEY: "[]"},
    "entries of another version": {shared_ledger.LEDGER_DATA_KEY: '{"team/x": {"pod": "x", "version": 2}}'},
    "no reservations": {"something": "else"},
    "a bad podsCountedThrough": {shared_ledger.LEDGER_DATA_KEY: "{}", shared_ledger.PODS_COUNTED_THROUGH_KEY: "x"},
}


@pytest.mark.parametrize("garbage", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_an_unreadable_ledger_is_rebuilt_and_its_tree_held_until_what_it_may_have_held_expired(
        core: FakeCore, clock: list[float], garbage: dict[str, str]) -> None:
    knew = Replica(core, "r1", clock)
    never_saw = Replica(core, "r2", clock)
    assert knew.admit("p1").allowed
    core.pods.update({"team/landed": "uid-landed", "team/other": "uid-other"})
    core.pod_versions.update({"team/landed": "41", "team/other": "57"})
    core.overwrite(LEDGER, garbage)
    # Whoever reads it first rebuilds it: the reservations it may have held are unknown, so the tree
    # is held one TTL, and the rebuilt object says so to every replica.
    verdict = never_saw.admit("p2")
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "LedgerUnavailable")
    assert "the shared quota ledger of tree org could not be read and is being rebuilt" in verdict.message
    data = core.config_maps[LEDGER]["data"]
    assert shared_ledger.decode(data) == {}
    assert shared_ledger.recovering_until(data) == clock[0] + TTL
    # Readers decide on it only once their watch shows every pod that exists now.
    assert shared_ledger.pods_counted_through(data) == 57
    # The replica that knew the object holds the tree too, from the rebuilt object.
    clock[0] += 1.0
    verdict = knew.admit("p3")
    assert status_of(verdict.reason) == 503
    assert "was deleted or could not be read; reservations only it held" in verdict.message
    clock[0] += TTL
    for replica in (knew, never_saw):
        watch_shows(replica, "other", "57")
    # The room is back: 300, of which "other" takes 100 (p1 expired with the hold).
    assert never_saw.admit("p4", "200").allowed and not never_saw.admit("p5").allowed
    assert status_of(knew.admit("p6").reason) == 403


def test_an_unreadable_ledger_deleted_under_its_finalizer_goes_once_the_hold_is_over(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed
    core.overwrite(LEDGER, {shared_ledger.LEDGER_DATA_KEY: "{not json"})
    core.delete(LEDGER)  # kept, terminating, by the finalizer
    assert status_of(replica.admit("p2").reason) == 503
    assert "deletionTimestamp" in core.config_maps[LEDGER]["metadata"]
    clock[0] += TTL
    # The finalizer went, the apiserver removed the object, and a new ledger holds the new admission.
    assert replica.admit("p3", "300").allowed
    assert "deletionTimestamp" not in core.config_maps[LEDGER]["metadata"]
    assert core.stored() == {"team/p3"}


def test_a_write_that_lands_but_whose_answer_is_lost_leaves_no_room_held_by_the_refused_pods(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=1000, escrow=32, leaf_room=10_000)
    assert replica.admit("answered").allowed  # creates the object; escrow for 2 more
    replace = core.replace_namespaced_config_map

    def lands_then_breaks(*args: Any, **kwargs: Any) -> Any:
        replace(*args, **kwargs)  # stored in etcd, then the connection to this replica broke
        raise ConnectionResetError("connection reset by peer")

    core.replace_namespaced_config_map = lands_then_breaks  # type: ignore[method-assign]
    verdict = replica.admit("big", "300")  # not of the escrow's shape: a write of its own
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "LedgerUnavailable")
    assert "team/big" in core.stored()  # it landed, though the replica cannot know
    core.replace_namespaced_config_map = replace  # type: ignore[method-assign]
    replica.settle()
    assert "team/big" not in core.stored() and "team/answered" in core.stored()
    assert replica.admit("big", "300").allowed


def test_readiness_says_why_a_replica_cannot_write_its_ledger_until_it_can(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    replica.state.decider_problem = replica.parts.readiness.problem
    assert replica.state.ready() == (False, f"the ledger namespace {NAMESPACE} has not been checked yet")
    core.namespace_missing = True
    assert not replica.parts.readiness.check()
    missing = f"cannot write ledger ConfigMaps in namespace {NAMESPACE}: 404 Not Found"
    assert replica.state.ready() == (False, missing)
    core.namespace_missing = False
    assert replica.parts.readiness.check() and replica.state.ready() == (True, "quota state synced")
    assert core.config_maps == {}  # a dry run: nothing created
    # A ledger write failing for another reason than a conflict makes it unready until the next check.
    core.namespace_missing = True
    assert status_of(replica.admit("p1").reason) == 503
    assert replica.state.ready() == (False, f"cannot write ConfigMap {NAMESPACE}/{LEDGER}: 404 Not Found")
    core.namespace_missing = False
    assert replica.parts.readiness.check() and replica.state.ready()[0]


def test_a_pod_s_quota_requests_are_read_once_per_admission(core: FakeCore, clock: list[float],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Escrow shape, judgement and the escrow's room all read the requests the admission arrived with."""
    import gpuquota_core.pod_admission
    import webhook.quota.state
    import webhook.quota.strict.accounting

    calls: list[str] = []

    def counted(admission: PodAdmission) -> Any:
        calls.append(admission.name)
        return gpuquota_core.pod_admission.quota_requests(admission)

    monkeypatch.setattr(webhook.quota.strict.accounting, "quota_requests", counted)
    monkeypatch.setattr(webhook.quota.state, "quota_requests", counted)
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("p1").allowed  # written, with an escrow taken for its shape
    assert replica.admit("p2").allowed  # admitted from that escrow
    assert any(shared_ledger.is_escrow(key) for key in core.stored())
    assert calls == ["p1", "p2"]


def test_a_withdrawal_reported_while_a_commit_writes_is_not_dropped(core: FakeCore, clock: list[float]) -> None:
    # A worker's report of an unanswered admission reaches the service while a commit of the same
    # tree is writing: the commit took the withdrawals queued before it started, and must leave the
    # one reported meanwhile for the next write instead of clearing it with its own.
    replica = Replica(core, "r1", clock)
    assert replica.admit("lost", "200").allowed
    replace = core.replace_namespaced_config_map

    def reported_during_the_write(*args: Any, **kwargs: Any) -> Any:
        core.replace_namespaced_config_map = replace  # type: ignore[method-assign]
        assert replica.accounting.withdraw_unanswered([admission_of("lost", "200")])
        return replace(*args, **kwargs)

    core.replace_namespaced_config_map = reported_during_the_write  # type: ignore[method-assign]
    assert replica.admit("answered").allowed
    replica.settle()
    assert core.stored() == {"team/answered"}
    assert replica.admit("fits", "200").allowed
