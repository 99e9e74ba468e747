"""Whether this replica can decide strict admissions now, for ``/readyz``.

Not ready while the ledger namespace cannot be written: checked by a dry-run create at start,
every LEDGER_CHECK_SECONDS, and every LEDGER_CHECK_FAILING_SECONDS while it fails; a ledger write
that fails for another reason than a conflict makes the replica unready until the next check passes.
"""

from __future__ import annotations

import logging
import threading

from kubernetes.client.exceptions import ApiException

from gpuquota_core import shared_ledger
from webhook.quota.strict.ledger_object import FIELD_MANAGER
from webhook.quota.strict.store import LedgerStore, LedgerUnavailable

log = logging.getLogger("gpuquota.quota")
LEDGER_CHECK_FAILING_SECONDS = 1.0
LEDGER_CHECK_SECONDS = 10.0
# How long one check (a dry-run create) may take.
LEDGER_CHECK_TIMEOUT_SECONDS = 3.0


class LedgerReadiness:
    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        # Why this replica cannot decide now ("" when it can).
        self._problem = f"the ledger namespace {store.namespace} has not been checked yet"

    def problem(self) -> str:
        with self._lock:
            return self._problem

    def failed(self, problem: str) -> None:
        """A ledger write failed for another reason than a conflict: unready until the next check."""
        with self._lock:
            self._problem = problem

    def check(self) -> bool:
        """Check that the ledger namespace can be written; whether it can."""
        try:
            self.check_writable()
        except LedgerUnavailable as error:
            with self._lock:
                if str(error) != self._problem:
                    log.warning("strict accounting: not ready: %s", error)
                self._problem = str(error)
            return False
        with self._lock:
            self._problem = ""
        return True

    def check_writable(self) -> None:
        """Raise LedgerUnavailable unless a ledger could be created in the namespace now (a dry run:
        the namespace exists, this replica may create ConfigMaps in it, the apiserver answers)."""
        namespace = self.store.namespace
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"{shared_ledger.LEDGER_NAME_PREFIX}write-check", "namespace": namespace}}
        try:
            self.store.core.create_namespaced_config_map(namespace, body, dry_run="All", field_manager=FIELD_MANAGER,
                                                         _request_timeout=LEDGER_CHECK_TIMEOUT_SECONDS,
                                                         _preload_content=False)
        except ApiException as error:
            if error.status == 409:  # a ledger of that name exists: creating is allowed there
                return
            raise LedgerUnavailable(f"cannot write ledger ConfigMaps in namespace {namespace}: "
                                    f"{error.status} {error.reason}") from None
        except Exception as error:  # connection errors of every kind
            raise LedgerUnavailable(f"cannot reach the apiserver to write ledger ConfigMaps in namespace "
                                    f"{namespace}: {error}") from None

    def run(self, stop: threading.Event) -> None:
        """Check at once, then every LEDGER_CHECK_SECONDS, or every LEDGER_CHECK_FAILING_SECONDS while failing."""
        while True:
            ok = self.check()
            if stop.wait(LEDGER_CHECK_SECONDS if ok else LEDGER_CHECK_FAILING_SECONDS):
                return
