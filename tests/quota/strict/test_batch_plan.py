"""One commit attempt's plan (webhook/quota/strict/batch_plan.py): what its write stores, decided on the copy read."""

from __future__ import annotations

from typing import Any

from fakeledger import LEDGER, TREE, FakeCore, Replica, admission_of

from gpuquota_core import shared_ledger
from gpuquota_core.ledger import Reservation
from gpuquota_core.pod_admission import quota_requests
from webhook.quota.strict.batch_plan import Job, LedgerRead, plan_batch
from webhook.quota.strict.escrow import Escrow, EscrowShape, SettleEscrow
from webhook.quota.strict.withdrawals import Withdrawal


def entry(key: str, uid: str, replica: str = "w", expires_at: float = 100.0) -> shared_ledger.StoredReservation:
    return shared_ledger.StoredReservation(Reservation(key, uid, ("team-a", "org"), {}, expires_at), replica, 0.0)


def test_a_plan_settles_withdraws_and_reserves_on_a_copy_and_leaves_the_read_as_it_was(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "w", clock)
    stored = {"team/a": entry("team/a", "adm-a"), "~escrow/w/1": entry("~escrow/w/1", "escrow")}
    read = LedgerRead("1", dict(stored), now=10.0, pods_counted_through=0)
    closed = Escrow("~escrow/w/1", EscrowShape(("team-a", TREE), (), 0), count=2, admits_until=0.0,
                    admitted=[Reservation("team/b", "adm-b", ("team-a", TREE), {}, 40.0),
                              Reservation("team/old", "adm-old", ("team-a", TREE), {}, 5.0)])
    job = Job(admission_of("c"), quota_requests(admission_of("c")), shape=None)
    with replica.state.snapshot() as view:
        plan = plan_batch(view, read, [job], [closed], [Withdrawal("team/a", "adm-a")], "w", None, False)
    assert plan is not None and plan.results[0][0].allowed
    # The escrow settled (its expired pod gone), a withdrawn, c reserved; the copy read is untouched.
    assert set(plan.keep) == {"team/b", "team/c"} and plan.held_before == {"team/b"}
    assert read.stored == stored


def test_a_take_back_replaces_an_escrow_entry_only_while_it_is_there() -> None:
    keep = {"~escrow/w/1": entry("~escrow/w/1", "escrow")}
    SettleEscrow("~escrow/w/1", (entry("team/b", "adm-b"),), taken_back=True).apply(keep, now=10.0)
    assert set(keep) == {"team/b"}
    SettleEscrow("~escrow/w/1", (entry("team/c", "adm-c"),), taken_back=True).apply(keep, now=10.0)
    assert set(keep) == {"team/b"}  # settled already (by the process that took it, say): nothing added


def test_on_a_conflict_the_edits_are_made_again_from_the_fresh_copy(core: FakeCore, clock: list[float]) -> None:
    first, second = Replica(core, "r1", clock), Replica(core, "r2", clock)
    assert first.admit("p1").allowed and second.admit("p2").allowed  # r2's copy now holds p1 and p2
    replace = core.replace_namespaced_config_map

    def another_write_first(*args: Any, **kwargs: Any) -> Any:
        core.replace_namespaced_config_map = replace  # type: ignore[method-assign]
        assert first.admit("p3").allowed  # lands between r2's read and its write
        return replace(*args, **kwargs)

    core.replace_namespaced_config_map = another_write_first  # type: ignore[method-assign]
    # Room for three of 100. On r2's copy (p1, p2) p4 fits and its edit was planned; the write conflicts,
    # and on the fresh copy (p1, p2, p3) the verdict and its edits are made again: refused, nothing written.
    verdict = second.admit("p4")
    assert (verdict.allowed, verdict.reason) == (False, "QuotaExceeded")
    assert set(shared_ledger.decode(core.config_maps[LEDGER]["data"])) == {"team/p1", "team/p2", "team/p3"}
