"""Readiness (webhook/quota/strict/readiness.py): a replica that cannot write its ledgers says why."""

from __future__ import annotations

from fakeledger import LEDGER, NAMESPACE, FakeCore, Replica

from webhook.admission.status import status_of


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
