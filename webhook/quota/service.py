"""The quota service: one process per server instance, serving decisions over a Unix socket.

Started from the gunicorn master (``start_shared_services``) as a fresh interpreter
(``python -m webhook.quota.service``), so no gunicorn state is inherited and workers forked later
share nothing with it but the socket path. It exits when the master does: it watches its parent
pid and stops when it changes.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import astuple
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuquota_core.enforcement import INVALID
from gpuquota_core.events import ObjectRef, quota_target
from gpuquota_core.pod_admission import PodAdmission, Verdict
from gpuquota_core.quota_objects import QuotaShapeError
from kubeaccess.manifests import load_objects
from webhook.quota import metrics as quota_metrics
from webhook.quota.events import ApiEventSink, EventService, EventSink, LogSink, reporting_instance
from webhook.quota.loop import ServiceLoop
from webhook.quota.node_view import NodeState, nodes_path
from webhook.quota.node_view import files_of as node_view_files
from webhook.quota.options import Accounting, QuotaServiceOptions
from webhook.quota.state import QuotaState

if TYPE_CHECKING:
    from webhook.quota.strict.accounting import StrictParts

log = logging.getLogger("gpuquota.quota")
SOCKET_NAME = "quota.sock"
# The service's exit status when its configuration does not load (EX_CONFIG): starting it again
# cannot help, so the master stops the server (webhook.serving.supervision).
CANNOT_START_EXIT = 78


def private_socket_path() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="gpuquota-quota-"))  # mkdtemp makes it 0700
    return directory / SOCKET_NAME


class PodAdmitter(Protocol):
    def admit_pod(self, admission: PodAdmission, answer_by: float = math.inf) -> Verdict: ...

    def withdraw_unanswered(self, admissions: list[PodAdmission]) -> bool: ...


def handle(state: QuotaState, message: Any, admitter: PodAdmitter | None = None,
           events: EventService | None = None) -> dict[str, Any] | Verdict:
    """The reply to one message; a Verdict goes on the wire as its fields (orjson writes dataclasses)."""
    op = message.get("op") if isinstance(message, dict) else None
    if op == "alive":  # liveness: no lock, so a long rebuild of the state does not fail it
        return {"alive": True}
    if op == "record_events":  # webhook.quota.events: queued here, written by the event thread
        return {"accepted": events.submit(message.get("events")) if events is not None else 0}
    if op == "ready":
        ready, reason = state.ready()
        return {"ready": ready, "reason": reason}
    if op == "admit_pod":
        admission = PodAdmission(**message["admission"])
        if admitter is None:  # local accounting decides in memory at once: no deadline to keep
            return state.admit_pod(admission)
        # The monotonic time by which the client must have the answer (QuotaClient.admit_pod).
        answer_by = message.get("answer_by")
        return admitter.admit_pod(admission, float(answer_by) if isinstance(answer_by, int | float) else math.inf)
    if op == "withdraw_unanswered":
        # Admissions a worker refused because no quota service answered them (QuotaClient): a dead
        # predecessor of this process, or this one while it hung, may have reserved for them.
        admissions = message.get("admissions")
        if admitter is None or not isinstance(admissions, list):
            return {"taken": True}  # local accounting: what a dead service reserved died with it
        return {"taken": admitter.withdraw_unanswered([PodAdmission(**each) for each in admissions])}
    if op == "quota_figures":
        # Rows, not objects: a frame holds tens of thousands of them (quota_wire.MAX_FRAME).
        return {"figures": [astuple(figure) for figure in state.quota_figures()]}
    if op == "review_elasticquota":
        try:
            return state.review_elasticquota(message["quota"])
        except QuotaShapeError as error:
            return Verdict(False, f"cannot read the ElasticQuota: {error}", reason=INVALID)
    return {"error": f"unknown operation {op!r}"}


def serve(state: QuotaState, path: Path, admitter: PodAdmitter | None = None,
          events: EventService | None = None) -> socket.socket:
    """Listen on ``path`` and answer in one thread (webhook.quota.loop); closing the returned
    listening socket stops it. With ``admitter`` (strict accounting) admissions go to it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    path.chmod(0o600)
    listener.listen(128)
    loop = ServiceLoop(listener, partial(handle, state, events=events),
                       partial(handle, state, admitter=admitter, events=events) if admitter is not None else None,
                       slow=_is_admission)
    threading.Thread(target=loop.run, daemon=True, name="quota-loop").start()
    return listener


def _is_admission(message: Any) -> bool:
    """What strict accounting answers (in the loop's pool): admissions, and withdrawals of unanswered ones."""
    return isinstance(message, dict) and message.get("op") in ("admit_pod", "withdraw_unanswered")


def load_state_file(state: QuotaState, state_path: Path, nodes: NodeState | None = None) -> None:
    """Offline mode's whole state from manifests; ``gpuquota serve`` runs it once before starting,
    so any ValueError it raises stops the server instead of this process."""
    objects = load_objects(str(state_path))
    if nodes is not None:  # first: the state's readiness must find the node view published
        nodes.load(objects)
    state.load(objects)


def start_event_service(state: QuotaState, sink: EventSink) -> EventService:
    """The writer of this instance's Events (webhook.quota.events), on a thread of its own."""
    def quota_of(namespace: str, quota_label: str) -> ObjectRef | None:
        quota = state.quota_of(namespace, quota_label)
        return None if quota is None else quota_target(quota.name, quota.namespace, quota.uid)

    service = EventService(sink, quota_of, polled=state.partly_admitted_gangs)
    service.start()
    return service


def run_service(path: Path, parent_pid: int, options: QuotaServiceOptions) -> None:
    """The service process's main: serve, load or start syncing, and exit when the parent does."""
    state = QuotaState.for_options(options)
    # Every result at zero from the start, so alerts on its rate see a series before the first write.
    for result in quota_metrics.LEDGER_WRITE_RESULTS:
        quota_metrics.LEDGER_WRITES.labels(result)
    nodes = NodeState(nodes_path(path))
    if options.state_path is not None:
        serve(state, path, events=start_event_service(state, LogSink()))
        load_state_file(state, options.state_path, nodes)
    else:
        from kubeaccess.kube import connect
        from webhook.quota.cluster_state import start_live_sync

        api = connect(str(options.kubeconfig_path) if options.kubeconfig_path else None, options.context)
        admitter: PodAdmitter | None = None
        if options.accounting is Accounting.STRICT:
            admitter, strict = start_strict(api, state, options, parent_pid, path)
            state.decider_problem = strict.readiness.problem  # /readyz: 503 while the ledger cannot be written
            threading.Thread(target=strict.readiness.run, args=(threading.Event(),),
                             daemon=True, name="ledger-check").start()
            threading.Thread(target=strict.reconciler.run, args=(max(state.ledger.ttl_seconds / 2, 1.0),
                                                                threading.Event()),
                             daemon=True, name="ledger-reconciler").start()
            threading.Thread(target=strict.committer.run_settler, args=(threading.Event(),),
                             daemon=True, name="ledger-escrow-settler").start()
        serve(state, path, admitter=admitter,
              events=start_event_service(state, ApiEventSink(api, reporting_instance())))
        start_live_sync(state, api, nodes=nodes)
    # Die with the master: poll the parent (cheap; avoids orphans when the master is SIGKILLed).
    # SIGTERM exits through the same cleanup as the parent's end.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    stopped = threading.Event()
    try:
        while os.getppid() == parent_pid:
            stopped.wait(1.0)
    finally:
        remove_private_files(path)


def start_strict(api: Any, state: QuotaState, options: QuotaServiceOptions, parent_pid: int,
                 socket_path: Path) -> tuple[PodAdmitter, StrictParts]:
    """Strict accounting, and the admitter the socket answers with: with ``--writer-lease`` the
    election and the listener the holder answers on (ValueError when it cannot listen), else every
    admission decided here, in the degraded mode. The escrow journal lives beside the socket, where
    the service the master starts after this one finds it."""
    from kubernetes import client

    from webhook.quota.strict.accounting import strict_parts
    from webhook.quota.strict.escrow import journal_path

    core = client.CoreV1Api(api)
    if not options.writer_lease:
        strict = strict_parts(state, core, options.ledger_namespace)
        log.info("strict accounting without a writer Lease: every replica decides here, in the degraded mode "
                 "(fresh reads, no escrow)")
        return strict.accounting, strict
    from webhook.quota.strict.forwarding import SingleWriter
    from webhook.quota.strict.peer import PeerClient, PeerListener, ServingKey, bind_peer_socket, join_address
    from webhook.quota.strict.writer_lease import WriterLease

    if options.tls_dir is None:
        raise ValueError("--writer-lease needs the serving certificate's directory")
    key = ServingKey(options.tls_dir / "tls.crt", options.tls_dir / "tls.key")
    try:
        bind = options.peer_address or ("::" if ":" in os.environ.get("POD_IP", "") else "0.0.0.0")
        key.server_context()  # a key or certificate that does not load stops the service before it serves
        sock = bind_peer_socket(bind, options.peer_port)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot listen for the other replicas on {options.peer_address or 'every interface'} "
                         f"port {options.peer_port}: {error}") from None
    address = join_address(advertised_host(options.peer_address), sock.getsockname()[1])
    # The pod's name and the server's master, not this process: a quota service its master restarts
    # takes its own Lease back at once, and two servers on one host (the tests) are two candidates.
    identity = f"{socket.gethostname()}/{parent_pid}"
    lease = WriterLease(api, options.ledger_namespace, options.writer_lease, identity, address)
    strict = strict_parts(state, core, options.ledger_namespace, journal=journal_path(socket_path),
                          forwarding=lambda: lease.writer_elsewhere() is not None)
    writer = SingleWriter(strict.accounting, lease, PeerClient(key))
    PeerListener(sock, key, writer).start()
    for result in quota_metrics.FORWARDED_RESULTS:  # at zero from the start, as the ledger writes are
        quota_metrics.FORWARDED_ADMISSIONS.labels(result)
    stop = threading.Event()
    threading.Thread(target=lease.run, args=(stop, writer.report_role), daemon=True, name="writer-lease").start()

    def release() -> None:
        stop.set()
        lease.release()

    atexit.register(release)
    log.info("strict accounting: writer lease %s/%s, this replica answers the others at %s",
             options.ledger_namespace, options.writer_lease, address)
    return writer, strict


def advertised_host(peer_address: str) -> str:
    """The host the other replicas reach this one at: the flag, else the pod's IP (the downward API's
    POD_IP), else what this host's name resolves to."""
    if peer_address:
        return peer_address
    if os.environ.get("POD_IP"):
        return os.environ["POD_IP"]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def remove_private_files(socket_path: Path, *, keep_directory: bool = False) -> None:
    """Remove what this service created beside its socket, then the directory if nothing else is there
    (kept for the service that replaces a dead one, with the escrow journal that one takes over).

    Not ``rmtree``: ``--socket`` may name any directory, and only these files are the service's.
    """
    from webhook.quota.strict.escrow import journal_path

    for created in (socket_path, *node_view_files(nodes_path(socket_path))):
        created.unlink(missing_ok=True)
    if not keep_directory:
        journal_path(socket_path).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty, or gone already
            socket_path.parent.rmdir()


def start_service_process(path: Path, options: QuotaServiceOptions) -> subprocess.Popen[bytes]:
    """Offline when ``options.state_path`` is set, else live (kubeconfig, or in-cluster without one).

    A fresh interpreter rather than multiprocessing: gunicorn forks its workers from this
    process, and multiprocessing's bookkeeping of children would be copied into every worker
    (whose exit hook then tries to join a process that is not its own).
    """
    command = [sys.executable, "-m", "webhook.quota.service", "--socket", str(path), "--parent-pid", str(os.getpid()),
               "--options", options.to_json()]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m webhook.quota.service",
                                     description="the quota service of one webhook server instance")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    # No defaults: start_service_process always passes the server's (QuotaServiceOptions.to_json).
    parser.add_argument("--options", required=True, help="the QuotaServiceOptions, as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from kubeaccess.kube import KubeAccessError

    try:
        run_service(args.socket, args.parent_pid, QuotaServiceOptions.from_json(args.options))
    except (ValueError, KubeAccessError) as error:
        # gpuquota serve loaded the same files before it started; they changed since.
        log.error("quota service: cannot start: %s", error)
        remove_private_files(args.socket, keep_directory=True)
        sys.exit(CANNOT_START_EXIT)


if __name__ == "__main__":
    main()
