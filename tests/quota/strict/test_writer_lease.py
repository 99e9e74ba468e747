"""The writer Lease's rules as pure functions: what a replica does with the Lease it read, how the
record is read, and the peer addresses it carries."""

from __future__ import annotations

import pytest

from webhook.quota.strict.peer import join_address, split_address
from webhook.quota.strict.writer_lease import ADDRESS_ANNOTATION, LEASE_DURATION_SECONDS, LeaseRecord, Step, next_step


def record(holder: str) -> LeaseRecord:
    return LeaseRecord(holder=holder, address="10.0.0.1:8444", duration_seconds=4.0, version="7", transitions=2)


@pytest.mark.parametrize(("lease", "expired", "step"), [
    (None, False, Step.CREATE),
    (record("me"), False, Step.RENEW),
    (record("me"), True, Step.RENEW),  # its own, however long unseen: renewed, not taken as a transition
    (record(""), False, Step.TAKE),  # released on a clean stop
    (record("other"), True, Step.TAKE),
    (record("other"), False, Step.FOLLOW),
])
def test_what_a_replica_does_with_the_lease_it_read(lease: LeaseRecord | None, expired: bool, step: Step) -> None:
    assert next_step(lease, "me", expired) is step


def test_the_record_is_read_from_the_stored_object() -> None:
    body = {"metadata": {"resourceVersion": "42", "annotations": {ADDRESS_ANNOTATION: "[fd00::5]:8444"}},
            "spec": {"holderIdentity": "gpuquota-webhook-7c9/1", "leaseDurationSeconds": 6, "leaseTransitions": 3,
                     "acquireTime": "2026-12-07T11:00:00.000000Z"}}
    assert LeaseRecord.from_object(body) == LeaseRecord("gpuquota-webhook-7c9/1", "[fd00::5]:8444", 6.0, "42", 3,
                                                        "2026-12-07T11:00:00.000000Z")


def test_a_lease_without_holder_duration_or_address_reads_as_released() -> None:
    read = LeaseRecord.from_object({"metadata": {"resourceVersion": "1"}, "spec": {"leaseDurationSeconds": 0}})
    assert (read.holder, read.address, read.duration_seconds, read.transitions) == ("", "", LEASE_DURATION_SECONDS, 0)
    assert next_step(read, "me", expired=False) is Step.TAKE


@pytest.mark.parametrize(("host", "port", "address"), [
    ("10.0.0.1", 8444, "10.0.0.1:8444"),
    ("fd00::5", 8444, "[fd00::5]:8444"),
])
def test_peer_addresses_round_trip(host: str, port: int, address: str) -> None:
    assert join_address(host, port) == address
    assert split_address(address) == (host, port)


@pytest.mark.parametrize("address", ["", "10.0.0.1", ":8444", "10.0.0.1:http"])
def test_a_peer_address_without_host_and_port_is_refused(address: str) -> None:
    with pytest.raises(ValueError, match="not host:port"):
        split_address(address)
