"""The node view's path from the list/watch loop to the workers: NodeState publishes, NodeViewReader reads.

The loop itself is the pods' and quotas' (``sync_kind``), driven here by a scripted API through a
paged list, a 410 re-list and events; the real apiserver path is in tests/e2e/test_node_placement.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from scriptedapi import Response, ScriptedApi, events, listing

from webhook.quota.cluster_state import sync_kind
from webhook.quota.node_view import NodeState, NodeViewReader

NVIDIA, CORE = "nvidia.com/gpu", "koordinator.sh/gpu-core"


def node(name: str, version: str, allocatable: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "resourceVersion": version, "labels": {"pool": name}},
            "status": {"allocatable": allocatable, **extra}}


def published(path: Path) -> dict[str, frozenset[str]]:
    view = NodeViewReader(path).current()
    assert view is not None
    return {n.name: n.resources for n in view.nodes}


def test_nothing_is_published_before_the_first_list(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "nodes.json")
    reader = NodeViewReader(state.path)

    assert reader.current() is None
    assert state.publish() is False
    assert reader.current() is None


def test_a_paged_list_a_gone_relist_and_events_reach_the_reader(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "nodes.json")
    reader = NodeViewReader(state.path)
    stop = threading.Event()
    api = ScriptedApi([
        listing("10", node("a", "9", {NVIDIA: "8"}), more="page-2"),
        listing("10", node("b", "9", {CORE: "400"})),
        events(("ERROR", {"code": 410, "message": "too old resource version"})),
        listing("20", node("a", "19", {NVIDIA: "8"})),
        events(("ADDED", node("c", "21", {CORE: "100"})), ("DELETED", node("a", "22", {}))),
    ], stop)

    sync_kind(state, api, "Node", stop, initial_backoff=0.0)

    assert api.calls[:5] == ["list", "list+page-2", "watch@10", "list", "watch@20"]
    assert state.publish() is True
    view = reader.current()
    assert view is not None
    assert {n.name: n.resources for n in view.nodes} == {"c": frozenset({CORE})}
    assert reader.current() is view  # the same file: not decoded again


def test_a_heartbeat_publishes_nothing_a_label_change_does(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "nodes.json")
    state.replace_compact("Node", [state.compact("Node", node("a", "1", {NVIDIA: "8"}))])
    assert state.publish() is True
    reader = NodeViewReader(state.path)
    first = reader.current()
    assert first is not None and first.generation == 1

    state.apply_event("Node", "MODIFIED", node("a", "2", {NVIDIA: "8"}, conditions=[{"type": "Ready"}]))
    assert state.publish() is False

    relabelled = node("a", "3", {NVIDIA: "8"})
    relabelled["metadata"]["labels"] = {"pool": "shared"}
    state.apply_event("Node", "MODIFIED", relabelled)
    assert state.publish() is True
    second = reader.current()
    assert second is not None and second.generation == 2
    assert dict(second.nodes[0].labels) == {"pool": "shared"}


def test_offline_load_publishes_the_nodes_among_the_manifests(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "nodes.json")
    state.load([node("a", "1", {NVIDIA: "8"}), {"kind": "Pod", "metadata": {"name": "p"}}])

    assert published(state.path) == {"a": frozenset({NVIDIA})}


def test_live_sync_lists_nodes_in_small_pages_and_pods_in_large_ones(tmp_path: Path,
                                                                     monkeypatch: Any) -> None:
    # A Node's JSON is many times a pod's; listing 5,000 of them in one page while the pods list was
    # most of the quota service's peak memory (docs/benchmarks.md).
    from webhook.quota import cluster_state
    from webhook.quota.state import QuotaState

    limits: dict[str, int] = {}
    listed = threading.Event()

    def lister_for(_api: object, kind: str) -> Any:
        def lister(**kwargs: Any) -> Response:
            if not kwargs.get("watch"):
                limits.setdefault(kind, kwargs["limit"])
                if len(limits) == 4:
                    listed.set()
            return Response(listing("1"))
        return lister

    monkeypatch.setattr(cluster_state, "lister_for", lister_for)
    stop = cluster_state.start_live_sync(QuotaState(), api=None, watch_seconds=1,  # type: ignore[arg-type]
                                         nodes=NodeState(tmp_path / "nodes.json"))
    try:
        assert listed.wait(10), limits
    finally:
        stop.set()
    assert limits == {"Node": 100, "Pod": cluster_state.PAGE_SIZE, "ElasticQuota": cluster_state.PAGE_SIZE,
                      "PodGroup": cluster_state.PAGE_SIZE}
