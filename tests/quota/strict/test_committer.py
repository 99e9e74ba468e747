"""The group commit (webhook/quota/strict/committer.py): refusals instead of unrecorded admissions,
and the watch gate."""

from __future__ import annotations

from typing import Any

import pytest
from fakeledger import LEDGER, NAMESPACE, FakeCore, Replica, watch_shows
from kubernetes.client.exceptions import ApiException

from gpuquota_core import shared_ledger
from webhook.admission.status import status_of


def test_a_missing_ledger_namespace_refuses_instead_of_admitting(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)

    def no_namespace(*_args: Any, **_kwargs: Any) -> None:
        raise ApiException(status=404, reason="Not Found")

    core.create_namespaced_config_map = no_namespace  # type: ignore[method-assign]
    verdict = replica.admit("p1")
    assert not verdict.allowed and status_of(verdict.reason) == 503 and verdict.reason == "LedgerUnavailable"
    assert f"cannot write ConfigMap {NAMESPACE}/{LEDGER}: 404" in verdict.message


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


def test_an_admission_that_reaches_the_ledger_after_its_worker_gave_up_is_refused_and_writes_nothing(
        core: FakeCore, clock: list[float]) -> None:
    monotonic = [500.0]
    replica = Replica(core, "r1", clock, monotonic=monotonic)
    verdict = replica.admit("p1", answer_by=monotonic[0] - 0.1)  # queued while the service was stopped
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "AnswerTooLate")
    assert verdict.message == ("pod team/p1 not admitted: the quota service arrived after the webhook worker "
                               "stopped waiting for its answer; retry shortly")
    assert core.calls == []  # no read, no write: nothing holds room for it
