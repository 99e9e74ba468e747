"""What one write does to a ledger, as values (webhook/quota/strict/ledger_edits.py, batch_plan.py)."""

from __future__ import annotations

from typing import Any

from fakeledger import LEDGER, FakeCore, Replica

from gpuquota_core import shared_ledger
from gpuquota_core.ledger import Reservation
from webhook.quota.strict.ledger_edits import Reserve, SettleEscrow, Withdraw, applied
from webhook.quota.strict.withdrawals import Withdrawal


def entry(key: str, uid: str, replica: str = "w", expires_at: float = 100.0) -> shared_ledger.StoredReservation:
    return shared_ledger.StoredReservation(Reservation(key, uid, ("team-a", "org"), {}, expires_at), replica, 0.0)


def test_edits_apply_in_order_to_a_copy_and_leave_the_read_as_it_was() -> None:
    read = {"team/a": entry("team/a", "adm-a"), "~escrow/w/1": entry("~escrow/w/1", "escrow")}
    edits = [SettleEscrow("~escrow/w/1", (entry("team/b", "adm-b"), entry("team/old", "adm-old", expires_at=5.0))),
             Withdraw(Withdrawal("team/a", "adm-a")), Reserve(entry("team/c", "adm-c"))]
    keep = applied(read, edits, now=10.0)
    assert set(keep) == {"team/b", "team/c"}  # the escrow settled (its expired pod gone), a withdrawn, c new
    assert set(read) == {"team/a", "~escrow/w/1"}


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
