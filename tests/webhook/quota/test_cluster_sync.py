"""The list/watch loop's recovery paths with a scripted API: 410 Gone, errors, staleness.

A real apiserver answers 410 only once etcd has compacted past the watch's resourceVersion, which a
test cannot arrange quickly; the normal paths (events, reconnects, a dead apiserver) run against the
real one in tests/e2e/test_cluster_state.py.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import REGISTRY
from scriptedapi import ScriptedApi, events, listing

from webhook.quota.cluster_state import sync_kind
from webhook.quota.state import QuotaState

QUOTA = {"metadata": {"name": "team-a", "namespace": "team", "resourceVersion": "5"},
         "spec": {"max": {"koordinator.sh/gpu-memory-ratio": "100"}}}


def run(state: QuotaState, script: list[Any]) -> ScriptedApi:
    stop = threading.Event()
    api = ScriptedApi(script, stop)
    sync_kind(state, api, "ElasticQuota", stop, initial_backoff=0.0)
    return api


def test_gone_relists_at_once_and_resumes_from_the_new_version() -> None:
    state = QuotaState()
    state.replace_kind("Pod", [])
    raised = {**QUOTA, "metadata": {**QUOTA["metadata"], "resourceVersion": "12"},
              "spec": {"max": {"koordinator.sh/gpu-memory-ratio": "300"}}}
    api = run(state, [
        listing("10", QUOTA),
        events(("BOOKMARK", {"metadata": {"resourceVersion": "11"}})),
        events(("ERROR", {"code": 410, "message": "too old resource version: 11 (20)"})),
        listing("20", raised),
        events(("MODIFIED", {**raised, "metadata": {**raised["metadata"], "resourceVersion": "21"}})),
    ])
    assert api.calls[:6] == ["list", "watch@10", "watch@11", "list", "watch@20", "watch@21"]
    assert str(state.tree.limit("team-a")[0]["koordinator.sh/gpu-memory-ratio"]) == "300"
    assert state.ready() == (True, "quota state synced")


def test_errors_back_off_keep_the_last_state_and_turn_stale_then_recover() -> None:
    now = [0.0]
    state = QuotaState(clock=lambda: now[0], stale_after_seconds=60)
    state.replace_kind("Pod", [])
    state.replace_kind("ElasticQuota", [QUOTA])
    state.sync_failed("ElasticQuota")
    now[0] = 59.0
    assert state.ready()[0] is True  # within the bound: still serving
    now[0] = 61.0
    ready, reason = state.ready()
    assert not ready
    assert reason == "quota state is stale: the list/watch of ElasticQuota has been failing for more than 60s"
    assert stale_gauge() == 1
    assert "team-a" in state.tree.quotas  # the last state is kept, not dropped
    # The next successful list clears it, and the gauge follows (it is only written on a change).
    run(state, [listing("30", QUOTA)])
    assert stale_gauge() == 0
    assert state.ready() == (True, "quota state synced")


def stale_gauge() -> float | None:
    return REGISTRY.get_sample_value("gpuquota_cluster_state_stale")


def test_watch_error_event_relists_after_backoff() -> None:
    state = QuotaState()
    state.replace_kind("Pod", [])
    api = run(state, [listing("1", QUOTA), events(("ERROR", {"code": 500, "message": "etcd timeout"})),
                      listing("2", QUOTA)])
    assert api.calls[:4] == ["list", "watch@1", "list", "watch@2"]


def test_paged_list_follows_continue_tokens_and_restarts_when_one_expires() -> None:
    from kubernetes.client.exceptions import ApiException

    other = {**QUOTA, "metadata": {**QUOTA["metadata"], "name": "team-b"}}
    state = QuotaState()
    state.replace_kind("Pod", [])
    api = run(state, [
        listing("7", QUOTA, more="tok-1"),
        ApiException(status=410, reason="Expired"),  # the continue token is too old: start over
        listing("9", QUOTA, more="tok-2"),
        listing("9", other),
    ])
    assert api.calls[:5] == ["list", "list+tok-1", "list", "list+tok-2", "watch@9"]
    assert sorted(state.tree.quotas) == ["team-a", "team-b"]
