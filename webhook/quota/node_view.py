"""The nodes as the rewrite decision sees them: watched by the quota service, read by the workers.

The quota service lists and watches Nodes with the same loop as pods and quotas
(:mod:`webhook.quota.cluster_state`) and keeps one :class:`~gpuquota_core.placement.NodeSummary` per node:
labels, taints and the extended resources it advertises, nothing of its status conditions, so the
heartbeats that make up most Node events change nothing. When the summaries change it publishes
them as one document, a new generation, in a file beside its socket, replaced whole; at most once
per :data:`PUBLISH_EVERY_SECONDS`, so a rolling relabel of a thousand nodes is a few writes, not a
thousand. The file does not exist until the first list has completed: the workers then know the
nodes are not known yet (and ``rewrite: auto`` leaves requests as written).

A worker looks at the file's identity (one ``stat``) per decision and decodes it again only when
it was replaced.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from gpuquota_core.placement import NodeSummary, NodeView, decode_nodes, encode_nodes, node_summary
from kubeaccess.file_signature import FileSignature, signature_of

log = logging.getLogger("gpuquota.quota")
NODES_FILE = "nodes.json"
NODE_KIND = "Node"
PUBLISH_EVERY_SECONDS = 0.5


def nodes_path(socket_path: Path) -> Path:
    return socket_path.with_name(NODES_FILE)


def _being_written(path: Path) -> Path:
    return path.with_name(path.name + ".new")


def files_of(path: Path) -> tuple[Path, ...]:
    return path, _being_written(path)


def write_nodes(path: Path, nodes: Iterable[NodeSummary], generation: int) -> None:
    """Replace the file whole: a reader sees the old document or the new one, never half of one."""
    temporary = _being_written(path)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(orjson.dumps(encode_nodes(nodes, generation)))
    temporary.replace(path)


class NodeState:
    """The service's side: a sync target for kind Node (see webhook.quota.cluster_state.SyncTarget)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeSummary] = {}
        self._listed = False
        self._generation = 0
        self._changed = threading.Event()

    # -- the sync target -------------------------------------------------------------------

    def compact(self, kind: str, obj: Mapping[str, Any]) -> NodeSummary | None:
        return node_summary(obj)

    def replace_compact(self, kind: str, items: Iterable[Any], version: str = "") -> None:
        nodes = {item.name: item for item in items if isinstance(item, NodeSummary)}
        with self._lock:
            if self._listed and nodes == self._nodes:
                return
            self._nodes = nodes
            self._listed = True
        self._changed.set()

    def apply_event(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        if event_type == "BOOKMARK":
            return
        summary = node_summary(obj)
        if summary is None:
            return
        with self._lock:
            if event_type == "DELETED":
                if self._nodes.pop(summary.name, None) is None:
                    return
            elif self._nodes.get(summary.name) == summary:
                return  # a status heartbeat: nothing the placement reads changed
            else:
                self._nodes[summary.name] = summary
        self._changed.set()

    def sync_failed(self, kind: str) -> None:
        """The loop logs the failure and re-lists; the last view stays in force meanwhile (nodes
        change rarely, and readiness does not wait for them: see docs/deploy.md)."""

    # -- publishing ------------------------------------------------------------------------

    def load(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Offline mode: the Node objects among the manifests, published at once."""
        self.replace_compact(NODE_KIND, (node_summary(o) for o in objects if o.get("kind") == NODE_KIND))
        self.publish()

    def publish(self) -> bool:
        """Write the current view if it changed since the last write; True when written."""
        with self._lock:
            if not self._changed.is_set():
                return False
            self._changed.clear()
            self._generation += 1
            nodes, generation = list(self._nodes.values()), self._generation
        write_nodes(self.path, nodes, generation)
        return True

    def publish_while(self, stop: threading.Event) -> None:
        """Live mode's publishing thread: each change written, at most every PUBLISH_EVERY_SECONDS."""
        while not stop.is_set():
            if not self._changed.wait(1.0):
                continue
            try:
                self.publish()
            except OSError as error:
                log.warning("node view: cannot write %s: %s", self.path, error)
            stop.wait(PUBLISH_EVERY_SECONDS)


class NodeViewReader:
    """A worker's side: the published view, decoded again only when the file was replaced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._identity: FileSignature | None = None
        self._view: NodeView | None = None
        self._lock = threading.Lock()

    def current(self) -> NodeView | None:
        """The latest view; None while the service has not listed the nodes."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        identity = signature_of(stat)
        if identity == self._identity:
            return self._view
        with self._lock:  # one thread decodes; the others wait for it rather than decode too
            if identity != self._identity:
                try:
                    with self.path.open("rb") as source:
                        opened = os.fstat(source.fileno())
                        document = orjson.loads(source.read())
                    self._view = decode_nodes(document)
                    self._identity = signature_of(opened)
                except FileNotFoundError:
                    return self._view
                except (ValueError, KeyError, TypeError) as error:
                    # Only the service writes it, whole; if it ever reads wrong, keep the last view.
                    log.warning("node view: cannot read %s: %s", self.path, error)
            return self._view
