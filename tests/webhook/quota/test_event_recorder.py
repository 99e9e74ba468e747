"""Aggregation and rate limiting of Events, driven by a fake clock and a fake sink (pure)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpuquota_core.events import ObjectRef, PodEvent, quota_target
from webhook.quota.event_recorder import COMBINED_PREFIX, EventKey, EventRecorder, EventWrite, TokenBucket
from webhook.quota.events import EventForwarder, EventService, event_from_wire, event_name, event_to_wire

RS = ObjectRef("apps/v1", "ReplicaSet", "train", "team-a", "u-1")
JOB = ObjectRef("batch/v1", "Job", "etl", "team-a", "u-2")


class FakeSink:
    def __init__(self) -> None:
        self.writes: list[EventWrite] = []

    def write(self, write: EventWrite) -> str:
        self.writes.append(write)
        return "created"


def test_token_bucket_refills_at_its_rate_up_to_its_capacity() -> None:
    bucket = TokenBucket.full(2, 0.5, now=0.0)
    assert [bucket.take(0.0), bucket.take(0.0), bucket.take(0.0)] == [True, True, False]
    assert not bucket.take(1.9)
    assert bucket.take(2.0)
    assert bucket.available(100.0) == 2
    # A clock stepping back neither refills nor breaks the bucket.
    assert bucket.take(50.0) and bucket.available(50.0) == 1


def test_identical_occurrences_are_one_write_with_their_count() -> None:
    recorder = EventRecorder(0.0)
    for second in range(5):
        assert recorder.observe(RS, "GPUQuotaExceeded", "over", float(second))
    (write,) = recorder.due(5.0)
    assert write == EventWrite(EventKey(RS, "GPUQuotaExceeded", "over"), "over", 5, 0.0, 4.0)
    assert recorder.due(6.0) == []


def test_a_target_over_its_budget_waits_and_keeps_counting() -> None:
    recorder = EventRecorder(0.0, object_burst=2, object_refill_per_second=1 / 300)
    writes = []
    for second in range(100):  # a controller retrying every second
        recorder.observe(RS, "GPUQuotaExceeded", "over", float(second))
        writes += recorder.due(float(second))
    # Two writes from the burst, then nothing until the bucket refills: the rest wait, counted.
    assert [w.count for w in writes] == [1, 1]
    assert recorder.pending == 1
    (late,) = recorder.due(300.0)
    assert late.count == 98
    assert sum(w.count for w in [*writes, late]) == 100


def test_one_noisy_target_does_not_hold_back_another() -> None:
    recorder = EventRecorder(0.0, object_burst=1)
    recorder.observe(RS, "GPUQuotaExceeded", "over", 0.0)
    recorder.due(0.0)
    recorder.observe(RS, "GPUQuotaExceeded", "over", 1.0)
    recorder.observe(JOB, "GPUQuotaExceeded", "over", 1.0)
    assert [w.key.target for w in recorder.due(1.0)] == [JOB]


def test_the_global_bucket_bounds_writes_over_all_targets() -> None:
    recorder = EventRecorder(0.0, global_burst=3, global_refill_per_second=1.0)
    targets = [ObjectRef("apps/v1", "ReplicaSet", f"rs-{n}", "team-a") for n in range(10)]
    for target in targets:
        recorder.observe(target, "GPUQuotaExceeded", "over", 0.0)
    assert len(recorder.due(0.0)) == 3
    assert len(recorder.due(2.0)) == 2
    assert recorder.pending == 5


def test_similar_messages_beyond_the_limit_are_combined() -> None:
    recorder = EventRecorder(0.0, similar_limit=3, similar_window=600.0)
    for n in range(6):
        recorder.observe(RS, "GPUQuotaNotFound", f"pod team-a/p{n} names a missing quota", float(n))
    writes = recorder.due(10.0)
    assert [w.count for w in writes] == [1, 1, 1, 3]
    combined = writes[-1]
    assert combined.key.message == COMBINED_PREFIX
    assert combined.message == COMBINED_PREFIX + "pod team-a/p5 names a missing quota"
    # An already-seen message keeps its own event; after the window a new group starts.
    recorder.observe(RS, "GPUQuotaNotFound", "pod team-a/p0 names a missing quota", 11.0)
    recorder.observe(RS, "GPUQuotaNotFound", "pod team-a/p9 names a missing quota", 700.0)
    assert {w.key.message for w in recorder.due(700.0)} == {"pod team-a/p0 names a missing quota",
                                                           "pod team-a/p9 names a missing quota"}


def test_too_many_distinct_pending_events_are_dropped_not_kept() -> None:
    recorder = EventRecorder(0.0, global_burst=0, max_pending=2)
    assert recorder.observe(RS, "A", "m", 0.0)
    assert recorder.observe(JOB, "A", "m", 0.0)
    assert not recorder.observe(RS, "B", "m", 0.0)
    assert recorder.observe(RS, "A", "m", 1.0)  # an existing entry still counts


def test_event_names_are_stable_and_distinct() -> None:
    key = EventKey(RS, "GPUQuotaExceeded", "over")
    assert event_name(key) == event_name(EventKey(RS, "GPUQuotaExceeded", "over"))
    assert event_name(key).startswith("train.")
    assert event_name(key) != event_name(EventKey(RS, "GPUQuotaExceeded", "other"))
    long_target = ObjectRef("v1", "Namespace", "n" * 253)
    assert len(event_name(EventKey(long_target, "R", "m"))) <= 253


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def service(sink: FakeSink, clock: Clock, capacity: int = 100) -> EventService:
    quotas = {("team-a", ""): quota_target("team-a", "team-a", "q-uid")}
    return EventService(sink, lambda namespace, label: quotas.get((namespace, label)), clock=clock,
                        capacity=capacity)


def test_the_wire_form_round_trips_and_refuses_garbage() -> None:
    owned = PodEvent("WouldDenyGPUQuotaExceeded", "m", "team-a", "q", RS)
    for event in (owned, PodEvent("GPUQuotaNotFound", "m", "team-b", "", None)):
        assert event_from_wire(event_to_wire(event)) == event
    for garbage in (None, [], {"reason": 1}, {**event_to_wire(owned), "owner": ["a", "b"]}):
        with pytest.raises(ValueError):
            event_from_wire(garbage)

def test_the_service_resolves_targets_and_writes_aggregated() -> None:
    sink, clock = FakeSink(), Clock()
    events = service(sink, clock)
    owned = PodEvent("GPUQuotaExceeded", "pod refused: over", "team-a", "", RS)
    ownerless = PodEvent("GPUQuotaExceeded", "pod refused: over", "team-a", "", None)
    lost = PodEvent("GPUQuotaNotFound", "pod refused: gone", "team-b", "gone", None)
    assert events.submit([event_to_wire(e) for e in (owned, owned, ownerless, lost)]) == 4
    events.step()
    targets = {(w.key.target.kind, w.key.target.name): w.count for w in sink.writes}
    assert targets == {("ReplicaSet", "train"): 2, ("ElasticQuota", "team-a"): 1, ("Namespace", "team-b"): 1}


def test_the_service_drops_what_does_not_fit_its_queue_and_ignores_garbage() -> None:
    sink, clock = FakeSink(), Clock()
    events = service(sink, clock, capacity=2)
    owned = event_to_wire(PodEvent("GPUQuotaExceeded", "pod refused: over", "team-a", "", RS))
    assert events.submit([owned, {"reason": 5}, owned, owned]) == 2
    assert events.submit("not a list") == 0
    events.step()
    assert [w.count for w in sink.writes] == [2]


# -- the worker's forwarder: never blocks, drops and counts what does not fit ---------------------

class BlockingSender:
    """Takes the first batch, then holds the forwarder's thread until released."""

    def __init__(self) -> None:
        self.sending = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[dict[str, Any]]] = []

    def record_events(self, events: list[dict[str, Any]]) -> int:
        self.batches.append(events)
        self.sending.set()
        assert self.release.wait(10)
        return len(events)


def dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("gpuquota_events_total", {"reason": reason, "result": "dropped"}) or 0.0


def test_the_forwarder_never_blocks_admission_and_counts_what_it_drops() -> None:
    sender = BlockingSender()
    forwarder = EventForwarder(sender, capacity=2)
    event = PodEvent("ForwarderTest", "pod refused: over", "team-a", "", RS)
    total_before = REGISTRY.get_sample_value("gpuquota_events_dropped_total") or 0.0
    forwarder.report(event)
    assert sender.sending.wait(10)  # the thread holds the first event, in the (stuck) send
    for _ in range(5):
        forwarder.report(event)  # returns at once: 2 queued, 3 dropped
    assert dropped("ForwarderTest") == 3
    assert REGISTRY.get_sample_value("gpuquota_events_dropped_total") == total_before + 3
    sender.release.set()
    deadline = time.monotonic() + 10
    while sum(len(batch) for batch in sender.batches) < 3:
        assert time.monotonic() < deadline, sender.batches
        time.sleep(0.01)  # polling a condition with a deadline
    assert sender.batches[0] == [event_to_wire(event)]


def test_the_service_writes_what_it_polls_beside_what_workers_sent() -> None:
    sink, clock = FakeSink(), Clock()
    polled = [PodEvent("GangPartlyAdmitted", "gang team-a/g has 1 of its minimum 2", "team-a", "", None)]
    events = EventService(sink, lambda namespace, label: quota_target("team-a", "team-a", "q-uid"), clock=clock,
                          polled=lambda: polled)
    events.step()
    assert [(w.key.reason, w.key.target.kind, w.key.target.name) for w in sink.writes] == [
        ("GangPartlyAdmitted", "ElasticQuota", "team-a")]
