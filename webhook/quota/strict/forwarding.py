"""Admissions forwarded to the replica that writes the ledgers (``--writer-lease``).

A replica that does not hold the writer Lease (``webhook.quota.strict.writer_lease``) sends each
pod admission its workers ask it to decide to the holder's quota service, over TLS, and answers
with the holder's verdict: one writer per ledger object, so no write conflicts. Only the quota
decision travels; the HTTP work of a review stays on the replica the API server called.

Forwarding is never needed for a correct answer, only for a cheap one. Whenever the holder cannot
be asked (none, not reachable, its certificate or key not this replica's, its answer not back in
time) this replica decides itself, as every replica did before: the ledger's preconditions keep
that correct, whoever else writes. An admission the holder received but did not answer in time is
decided here too; if the holder admitted it meanwhile its reservation is counted twice until
the watch confirms the pod or the TTL ends, which can refuse a pod, never admit one too many, and
the holder withdraws an admission it decides after the deadline it was given.

Who may ask: the listener is reachable from the pod network, and an admission takes quota room,
so each request carries a token that only a holder of the serving key can compute (an HMAC keyed
with the key file's bytes). The token is sent only to a listener that presents this replica's own
serving certificate, which proves it holds that key too; all replicas mount one Secret. While a
rotated Secret reaches the replicas at different moments they do not agree, and each decides
itself until they do.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuquota_core.pod_admission import PodAdmission, Verdict
from webhook.quota import metrics
from webhook.quota.strict.writer_lease import WriterLease
from webhook.quota.wire import FrameReader, send_frame, verdict_from_wire

log = logging.getLogger("gpuquota.quota")
# A holder on the pod network answers a connect within milliseconds; one that does not is down or
# partitioned, and this replica decides itself instead of spending the admission's time on it.
CONNECT_TIMEOUT_SECONDS = 0.25
# At most this share of an admission's time is spent waiting for the holder, so that a holder that
# hangs still leaves enough to decide here.
FORWARD_SHARE = 0.5
# Without a deadline from the worker (never in a server, where the client sets one): its timeout.
LONGEST_FORWARD_SECONDS = 2.0
# The holder answers this long before the forwarder stops waiting: the reply's way back.
ANSWER_MARGIN_SECONDS = 0.05
# After the holder could not be asked, it is not tried again for this long: each admission meanwhile
# would pay the failed attempt first. Shorter than the Lease's duration, so a holder that comes back
# is used again before another replica would take over.
AVOID_SECONDS = 1.0
TOKEN_CONTEXT = b"koord-gpuquota ledger writer v1"
# Frames a peer may send: an admission is a few hundred bytes.
MAX_PEER_FRAME = 256 * 1024
# Connections the listener serves at once: each forwarder keeps one per thread of its quota service
# (webhook.quota.loop.STRICT_THREADS), so this is room for several forwarders, and a bound on the
# threads anyone who can reach the port can make it hold.
MAX_PEER_CONNECTIONS = 512
# A new connection must complete its handshake and send its first request within this.
FIRST_REQUEST_SECONDS = 2.0


class PodAdmitter(Protocol):
    def admit_pod(self, admission: PodAdmission, answer_by: float = math.inf) -> Verdict: ...

    def withdraw_unanswered(self, admissions: list[PodAdmission]) -> bool: ...


class PeerUnavailable(Exception):
    """The holder could not be asked, or gave no answer in time."""


@dataclass(frozen=True)
class ServingKey:
    """The serving certificate and key files, read again on each use so a rotated Secret is followed."""

    cert_path: Path
    key_path: Path

    def token(self) -> str:
        return hmac.new(self.key_path.read_bytes(), TOKEN_CONTEXT, hashlib.sha256).hexdigest()

    def certificate_der(self) -> bytes:
        """The first certificate of the chain file, DER-encoded: what a peer must present."""
        text = self.cert_path.read_text(encoding="ascii")
        begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
        first = text[text.index(begin):text.index(end) + len(end)]
        return ssl.PEM_cert_to_DER_cert(first)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert_path), str(self.key_path))
        return context


def _client_context() -> ssl.SSLContext:
    # The listener is authenticated by pinning, after the handshake: it must present exactly this
    # replica's own certificate (its handshake proved it holds the key). A chain check would accept
    # any certificate of the same CA, and the peer address is an IP no name in it would match.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"; ValueError for anything else."""
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit():
        raise ValueError(f"not host:port: {address!r}")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class PeerClient:
    """Asks the holder's listener; one kept connection per thread (the protocol is lockstep)."""

    def __init__(self, key: ServingKey) -> None:
        self.key = key
        self._context = _client_context()
        self._local = threading.local()

    def admit_pod(self, address: str, admission: PodAdmission, seconds: float) -> Verdict:
        """The holder's verdict, asked to be back within ``seconds``; PeerUnavailable otherwise."""
        connection: tuple[str, ssl.SSLSocket, FrameReader, str] | None = getattr(self._local, "connection", None)
        try:
            if connection is None or connection[0] != address:
                self._close()
                connection = self._local.connection = self._connect(address)
            _, sock, reader, token = connection
            sock.settimeout(seconds)
            budget = max(seconds - ANSWER_MARGIN_SECONDS, 0.0)
            send_frame(sock, {"op": "admit_pod", "token": token, "admission": admission, "seconds": budget,
                              "answer_by_wall": time.time() + budget})
            reply = reader.read()
        except (OSError, ValueError) as error:  # TimeoutError and ssl.SSLError are OSErrors
            self._close()
            raise PeerUnavailable(f"{type(error).__name__}: {error}") from None
        if isinstance(reply, dict) and reply.get("late"):
            raise PeerUnavailable(f"the writer at {address} read the admission after its deadline")
        if not isinstance(reply, dict) or "allowed" not in reply:
            self._close()
            raise PeerUnavailable(f"the writer at {address} answered {str(reply)[:200]!r}")
        try:
            return verdict_from_wire(reply)
        except TypeError as error:  # a writer of another release, mid-upgrade: decide here
            self._close()
            raise PeerUnavailable(f"the writer at {address} answered a verdict this release cannot read: "
                                  f"{error}") from None

    def _connect(self, address: str) -> tuple[str, ssl.SSLSocket, FrameReader, str]:
        own, token = self.key.certificate_der(), self.key.token()
        raw = socket.create_connection(split_address(address), timeout=CONNECT_TIMEOUT_SECONDS)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = self._context.wrap_socket(raw)
        except BaseException:
            raw.close()
            raise
        if sock.getpeercert(binary_form=True) != own:
            sock.close()
            raise ssl.SSLError(f"the listener at {address} does not present this replica's serving certificate")
        return address, sock, FrameReader(sock), token

    def _close(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            with contextlib.suppress(OSError):
                connection[1].close()


class SingleWriter:
    """The quota service's PodAdmitter with a writer Lease: forwards to the holder, or decides here."""

    def __init__(self, local: PodAdmitter, lease: WriterLease, peers: PeerClient,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.local = local
        self.lease = lease
        self.peers = peers
        self.monotonic = monotonic
        self._avoid: dict[str, float] = {}  # address -> monotonic time until which it is not asked

    def admit_pod(self, admission: PodAdmission, answer_by: float = math.inf) -> Verdict:
        address = self.lease.writer_elsewhere()
        now = self.monotonic()
        if address is None or self._avoid.get(address, 0.0) > now:
            return self.local.admit_pod(admission, answer_by)
        seconds = min((answer_by - now) * FORWARD_SHARE, LONGEST_FORWARD_SECONDS)
        try:
            verdict = self.peers.admit_pod(address, admission, seconds)
        except PeerUnavailable as error:
            metrics.FORWARDED_ADMISSIONS.labels("decided_here").inc()
            if self._avoid.get(address, 0.0) <= now:
                log.warning("strict accounting: the ledger writer at %s cannot be asked (%s); deciding here "
                            "for %.1fs", address, error, AVOID_SECONDS)
            self._avoid[address] = self.monotonic() + AVOID_SECONDS
            return self.local.admit_pod(admission, answer_by)
        metrics.FORWARDED_ADMISSIONS.labels("forwarded").inc()
        return verdict

    def withdraw_unanswered(self, admissions: list[PodAdmission]) -> bool:
        # Written here, not by the writer: it is rare, and this replica's write removes the writer's
        # entries as well as its own (a withdrawal of an unanswered admission matches any replica's).
        return self.local.withdraw_unanswered(admissions)


class PeerListener:
    """The writer's side: answers forwarded admissions with this replica's own decision, whether or
    not it holds the Lease now (a forwarder that read the Lease a moment ago is still answered
    correctly). A thread per connection: the forwarders keep one per thread, so there are few."""

    def __init__(self, host: str, port: int, key: ServingKey, local: PodAdmitter,
                 monotonic: Callable[[], float] = time.monotonic, clock: Callable[[], float] = time.time) -> None:
        self.key = key
        self.local = local
        self.monotonic, self.clock = monotonic, clock
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(128)
        self.port: int = self.listener.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_PEER_CONNECTIONS)
        key.server_context()  # a key or certificate that does not load stops the service before it serves

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, daemon=True, name="peer-listener").start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                conn.close()  # at the cap: the forwarder decides itself
                continue
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True, name="peer-connection").start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        try:
            # The handshake and the first request within a bound: a connection that proved nothing
            # must not hold a thread. Then a forwarder's kept connection may wait for its next one.
            conn.settimeout(FIRST_REQUEST_SECONDS)
            sock = self.key.server_context().wrap_socket(conn, server_side=True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            token = self.key.token()
            reader = FrameReader(sock, max_frame=MAX_PEER_FRAME)
            while (message := reader.read()) is not None:
                send_frame(sock, self._answer(message, token))
                sock.settimeout(None)
        except Exception as error:  # a bad peer, a reset, garbage: only this connection ends
            log.info("strict accounting: peer connection from %s closed: %s: %s", peer, type(error).__name__, error)
        finally:
            self._slots.release()
            with contextlib.suppress(OSError):
                conn.close()

    def _answer(self, message: Any, token: str) -> Any:
        if not isinstance(message, dict) or not hmac.compare_digest(str(message.get("token", "")), token):
            raise PermissionError("a request without this replica's token")
        if message.get("op") != "admit_pod":
            raise ValueError(f"unknown operation {message.get('op')!r}")
        seconds, answer_by_wall = message.get("seconds"), message.get("answer_by_wall")
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds <= 60:
            raise ValueError(f"seconds must be a number from 0 to 60, not {seconds!r}")
        if not isinstance(answer_by_wall, int | float) or isinstance(answer_by_wall, bool):
            raise ValueError(f"answer_by_wall must be a number, not {answer_by_wall!r}")
        admission = PodAdmission(**message["admission"])
        # Read late (this process was paused, or starved, while it waited in the socket): the
        # forwarder has stopped waiting and decides itself, so nothing is decided here. The wall
        # clocks of two hosts differ a little; where they differ a lot, this only makes the
        # forwarders decide themselves, never admits late.
        left = min(float(seconds), answer_by_wall - self.clock())
        if left <= 0:
            return {"late": True}
        return self.local.admit_pod(admission, self.monotonic() + left)
