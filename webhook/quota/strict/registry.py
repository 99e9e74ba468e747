"""The registry of ledgers: one ConfigMap listing the quota trees whose ledger object was created.

A ledger kept by its finalizer is seen terminating by every replica, which then holds its tree. One
removed without it (the finalizer taken off by hand, a restore from an older backup) is simply
missing, and a replica that never read it would take the tree for a new one and admit from an
empty ledger while the lost one's reservations still hold room. The registry tells the two apart
(``gpuquota_core.shared_ledger.REGISTRY_OBJECT_NAME``): a tree is listed before its ledger holds any
reservation (:meth:`LedgerStore.write` creates a new ledger with nothing new in it, lists the tree,
then writes), and unlisted before its ledger is let go through the finalizer, so a listed tree with
no ledger is one whose ledger was lost.

Writes are rare: once per tree when its first ledger is created, and when it is let go. Every write
carries the resourceVersion it was decided on, as the ledgers' do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

from gpuquota_core import shared_ledger
from gpuquota_core.shared_ledger import MANAGED_BY, MANAGED_BY_LABEL
from webhook.quota.strict.ledger_object import put_config_map

log = logging.getLogger("gpuquota.quota")
# Conflicts only come from replicas listing or unlisting other trees at the same moment.
MAX_ATTEMPTS = 8


class RegistryUnavailable(Exception):
    """The registry could not be read or written; the message says why."""


class LedgerRegistry:
    def __init__(self, core: Any, namespace: str, existing_trees: Callable[[], list[str]]) -> None:
        self.core = core  # a CoreV1Api (its raw responses, as the ledger store reads them)
        self.namespace = namespace
        # The trees whose ledger exists now: what a registry that is missing or unreadable is
        # written again from, since each of those was listed, or should have been.
        self.existing_trees = existing_trees

    def lists(self, tree_root: str) -> bool:
        """Whether the tree is listed now (a fresh read). A registry that is missing or cannot be
        read lists nothing: it is rebuilt from the ledgers that exist by the next change."""
        return tree_root in self._read()[1]

    def add(self, tree_root: str) -> None:
        """List the tree."""
        self._change(lambda trees: trees | {tree_root})

    def remove(self, tree_root: str) -> None:
        """Unlist the tree (its ledger is about to be let go: nothing it held can still take room)."""
        self._change(lambda trees: trees - {tree_root})

    def _read(self) -> tuple[str, set[str], bool]:
        """(resourceVersion or "" when missing, the trees listed, whether the stored list was readable)."""
        try:
            response = self.core.read_namespaced_config_map(shared_ledger.REGISTRY_OBJECT_NAME, self.namespace,
                                                            _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return "", set(), False
            raise RegistryUnavailable(f"cannot read ConfigMap {self._shown()}: {error.status} {error.reason}") \
                from None
        body = orjson.loads(response.data)
        version = str(body["metadata"]["resourceVersion"])
        try:
            return version, shared_ledger.decode_registry(body.get("data")), True
        except shared_ledger.LedgerFormatError as error:
            log.warning("strict accounting: ConfigMap %s cannot be read (%s); it is rebuilt from the ledgers "
                        "that exist", self._shown(), error)
            return version, set(), False

    def _change(self, change: Callable[[set[str]], set[str]]) -> None:
        """Write ``change`` of the listed trees; a registry that is missing or unreadable is first
        rebuilt from ``existing_trees``, whichever the change."""
        for _ in range(MAX_ATTEMPTS):
            version, trees, readable = self._read()
            if not readable:
                trees = set(self.existing_trees())
            wanted = change(trees)
            if readable and wanted == trees:
                return
            body: dict[str, Any] = {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": shared_ledger.REGISTRY_OBJECT_NAME, "namespace": self.namespace,
                             "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
                "data": shared_ledger.encode_registry(wanted),
            }
            try:
                put_config_map(self.core, body, version)
                return
            except ApiException as error:
                if error.status in (404, 409):
                    continue  # changed or removed since the read: read it again
                raise RegistryUnavailable(f"cannot write ConfigMap {self._shown()}: {error.status} "
                                          f"{error.reason}") from None
        raise RegistryUnavailable(f"cannot write ConfigMap {self._shown()}: {MAX_ATTEMPTS} conflicting writes "
                                  f"in a row")

    def _shown(self) -> str:
        return f"{self.namespace}/{shared_ledger.REGISTRY_OBJECT_NAME}"
