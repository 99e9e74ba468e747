"""The quota service: one process per server instance, serving decisions over a Unix socket.

Started from the gunicorn master (``start_shared_services``) with multiprocessing ``spawn``, so
no gunicorn state is inherited and workers forked later do not copy it. It exits when the master
does: it watches its parent pid and stops when it changes.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuquota_core.quota import QuotaShapeError
from kubeaccess.manifests import load_objects

from .quota_port import PodAdmission, Verdict
from .quota_state import QuotaState
from .quota_wire import recv_frame, send_frame

log = logging.getLogger("gpuquota.quota")
SOCKET_NAME = "quota.sock"


def private_socket_path() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="gpuquota-quota-"))  # mkdtemp makes it 0700
    return directory / SOCKET_NAME


def verdict_to_wire(verdict: Verdict) -> dict[str, Any]:
    return asdict(verdict)


def handle(state: QuotaState, message: Any) -> dict[str, Any]:
    op = message.get("op") if isinstance(message, dict) else None
    if op == "ready":
        ready, reason = state.ready()
        return {"ready": ready, "reason": reason}
    if op == "admit_pod":
        return verdict_to_wire(state.admit_pod(PodAdmission(**message["admission"])))
    if op == "review_elasticquota":
        try:
            return verdict_to_wire(state.review_elasticquota(message["quota"]))
        except QuotaShapeError as error:
            return verdict_to_wire(Verdict(False, f"cannot read the ElasticQuota: {error}", 422, "Invalid"))
    return {"error": f"unknown operation {op!r}"}


def serve_connection(state: QuotaState, conn: socket.socket) -> None:
    with conn:
        while True:
            try:
                message = recv_frame(conn)
                if message is None:
                    return
                send_frame(conn, handle(state, message))
            except (OSError, ValueError, TypeError, KeyError) as error:
                log.warning("quota service: dropping connection: %s", error)
                return


def serve(state: QuotaState, path: Path, stop: threading.Event | None = None) -> socket.socket:
    """Listen on ``path`` and serve each connection in a thread; returns the listening socket."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    path.chmod(0o600)
    listener.listen(128)

    def accept_loop() -> None:
        while stop is None or not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve_connection, args=(state, conn), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True, name="quota-accept").start()
    return listener


def _service_main(path: str, state_path: str | None, kubeconfig: str | None, context: str | None,
                  parent_pid: int) -> None:
    state = QuotaState()
    serve(state, Path(path))
    if state_path is not None:
        state.load(load_objects(state_path))
    else:
        from .cluster_state import start_live_sync

        start_live_sync(state, Path(kubeconfig) if kubeconfig else None, context)
    # Die with the master: poll the parent (cheap; avoids orphans when the master is SIGKILLed).
    stopped = threading.Event()
    while os.getppid() == parent_pid:
        stopped.wait(1.0)


def start_service_process(path: Path, state_path: Path | None, kubeconfig: Path | None = None,
                          kube_context: str | None = None) -> multiprocessing.process.BaseProcess:
    """Offline when ``state_path`` is set, else live (kubeconfig, or in-cluster without one)."""
    spawn = multiprocessing.get_context("spawn")
    args = (str(path), str(state_path) if state_path else None, str(kubeconfig) if kubeconfig else None,
            kube_context, os.getpid())
    process = spawn.Process(target=_service_main, args=args, daemon=True, name="gpuquota-quota")
    process.start()
    return process
