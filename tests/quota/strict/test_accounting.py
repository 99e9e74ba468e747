"""Strict accounting's modes (webhook/quota/strict/accounting.py): the writer and the degraded mode."""

from __future__ import annotations

from typing import Any

import pytest
from fakeledger import FakeCore, Replica, escrow_entries

from gpuquota_core import shared_ledger
from gpuquota_core.pod_admission import PodAdmission
from webhook.quota.strict.accounting import Mode


def test_the_degraded_mode_reads_fresh_and_takes_no_escrow(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("p1", mode=Mode.DEGRADED).allowed
    reads = core.calls.count("read")
    assert replica.admit("p2", mode=Mode.DEGRADED).allowed
    assert core.calls.count("read") == reads + 1  # a fresh read for every commit, the cache never trusted
    assert not escrow_entries(core) and core.stored() == {"team/p1", "team/p2"}


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
