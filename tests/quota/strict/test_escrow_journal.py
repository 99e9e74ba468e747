"""The escrow journal (webhook/quota/strict/escrow.py, EscrowJournal): a restarted writer takes back what its
predecessor lent to its own escrow, within its first settler round instead of a TTL."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeledger import LEDGER, FakeCore, Replica

from gpuquota_core import shared_ledger
from webhook.admission.status import status_of


def escrow_keys(core: FakeCore) -> set[str]:
    return {key for key in shared_ledger.decode(core.config_maps[LEDGER]["data"]) if shared_ledger.is_escrow(key)}


def test_a_restarted_writer_takes_back_its_predecessors_escrow_with_the_pods_admitted_from_it(
        core: FakeCore, clock: list[float], tmp_path: Path) -> None:
    journal = tmp_path / "escrow.journal"
    killed = Replica(core, "host/101", clock, room=1000, escrow=32, leaf_room=10_000, journal=journal)  # 10 cards
    assert killed.admit("small").allowed  # written, with escrow for 2 more: (10 - 1) // 4
    assert killed.admit("from-escrow").allowed  # admitted from it, in memory and the journal; then SIGKILL
    assert "team/from-escrow" not in core.stored() and escrow_keys(core)
    # The quota service its master starts next reads the journal; its settler's first round replaces
    # the escrow by the pod admitted from it, and gives back the card nobody used.
    restarted = Replica(core, "host/202", clock, room=1000, escrow=32, leaf_room=10_000, journal=journal)
    restarted.settle()
    assert core.stored() == {"team/small", "team/from-escrow"}
    big = restarted.admit("big", "800")  # 8 of the 10 cards are free again, at once
    assert big.allowed, big.message


def test_without_the_journal_the_predecessors_escrow_holds_its_room_until_it_expires(
        core: FakeCore, clock: list[float], tmp_path: Path) -> None:
    # The replica vanished whole (its pod deleted): nobody knows what the escrow admitted.
    killed = Replica(core, "host/101", clock, room=1000, escrow=32, leaf_room=10_000, journal=tmp_path / "a")
    assert killed.admit("small").allowed and killed.admit("from-escrow").allowed
    elsewhere = Replica(core, "other/7", clock, room=1000, escrow=32, leaf_room=10_000, journal=tmp_path / "b")
    elsewhere.settle()
    verdict = elsewhere.admit("big", "800")
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "EscrowNotBackInTime")


def test_a_journal_line_cut_short_by_the_kill_is_skipped(core: FakeCore, clock: list[float], tmp_path: Path) -> None:
    journal = tmp_path / "escrow.journal"
    killed = Replica(core, "host/101", clock, room=1000, escrow=32, leaf_room=10_000, journal=journal)
    assert killed.admit("small").allowed and killed.admit("from-escrow").allowed
    with journal.open("ab") as cut:
        cut.write(b'{"from": "~escrow/host/101/1", "tree": "org", "da')  # the answer for this one never left
    restarted = Replica(core, "host/202", clock, room=1000, escrow=32, leaf_room=10_000, journal=journal)
    restarted.settle()
    assert core.stored() == {"team/small", "team/from-escrow"}
    assert journal.read_bytes() == b""  # the journal is the new process's now


def test_an_escrow_whose_taking_was_compacted_away_is_left_to_expire(
        core: FakeCore, clock: list[float], tmp_path: Path) -> None:
    # The journal was started afresh between the escrow's "took" line and its admissions: what it
    # holds for that escrow may be only part of what it admitted, so the successor takes back nothing.
    journal = tmp_path / "escrow.journal"
    killed = Replica(core, "host/101", clock, room=1000, escrow=32, leaf_room=10_000, journal=journal)
    assert killed.admit("small").allowed
    journal.write_bytes(b"")
    assert killed.admit("from-escrow").allowed
    restarted = Replica(core, "host/202", clock, room=1000, escrow=32, leaf_room=10_000, journal=journal)
    restarted.settle()
    assert escrow_keys(core) and "team/from-escrow" not in core.stored()
    assert restarted.admit("big", "800").reason == "EscrowNotBackInTime"


def test_a_restarted_writer_takes_back_before_its_pod_watch_has_caught_up(
        core: FakeCore, clock: list[float], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The watch gate guards decisions; giving room back decides nothing, so the successor need not
    # wait for its own list of pods (seconds on a loaded host) before it takes the escrow back.
    monkeypatch.setattr("webhook.quota.strict.committer.RETRY_BUDGET_SECONDS", 0.1)
    journal = tmp_path / "escrow.journal"
    killed = Replica(core, "host/101", clock, room=1000, escrow=32, leaf_room=10_000, journal=journal)
    assert killed.admit("small").allowed and killed.admit("from-escrow").allowed
    data = dict(core.config_maps[LEDGER]["data"])
    data[shared_ledger.PODS_COUNTED_THROUGH_KEY] = "999"  # further than the successor's watch has got
    core.overwrite(LEDGER, data)
    restarted = Replica(core, "host/202", clock, room=1000, escrow=32, leaf_room=10_000, journal=journal)
    restarted.settle()
    assert core.stored() == {"team/small", "team/from-escrow"}
    # A decision still waits for the watch: refused, not admitted on a copy it cannot count.
    assert restarted.admit("big", "800").reason == "LedgerUnavailable"
