"""The wire between the replicas under a writer Lease: a forwarder's client and the writer's listener.

Who may ask: the listener is reachable from the pod network, and an admission takes quota room,
so each request carries a token that only a holder of the serving key can compute (an HMAC keyed
with the key file's bytes). The token is sent only to a listener that presents this replica's own
serving certificate, which proves it holds that key too; all replicas mount one Secret. While a
rotated Secret reaches the replicas at different moments they do not agree, and each decides
itself (degraded) until they do.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuquota_core.pod_admission import PodAdmission, Verdict
from webhook.quota.wire import FrameReader, send_frame, verdict_from_wire

if TYPE_CHECKING:  # forwarding imports this module: the listener answers with its SingleWriter
    from webhook.quota.strict.forwarding import SingleWriter

log = logging.getLogger("gpuquota.quota")
# A holder on the pod network answers a connect within milliseconds; one that does not is down or
# partitioned, and this replica decides itself instead of spending the admission's time on it.
CONNECT_TIMEOUT_SECONDS = 0.25
# Without a deadline from the worker (never in a server, where the client sets one): its timeout.
LONGEST_FORWARD_SECONDS = 2.0
# The holder answers this long before the forwarder stops waiting: the reply's way back.
ANSWER_MARGIN_SECONDS = 0.05
TOKEN_CONTEXT = b"koord-gpuquota ledger writer v1"
# Frames a peer may send: an admission is a few hundred bytes.
MAX_PEER_FRAME = 256 * 1024
# Connections the listener serves at once: each forwarder keeps one per thread of its quota service
# (webhook.quota.loop.STRICT_THREADS), so this is room for several forwarders, and a bound on the
# threads anyone who can reach the port can make it hold.
MAX_PEER_CONNECTIONS = 512
# A new connection must complete its handshake and send its first request within this.
FIRST_REQUEST_SECONDS = 2.0


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
        budget = max(seconds - ANSWER_MARGIN_SECONDS, 0.0)
        reply = self._ask(address, {"op": "admit_pod", "admission": admission, "seconds": budget,
                                    "answer_by_wall": time.time() + budget}, seconds)
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

    def withdraw_unanswered(self, address: str, admissions: list[PodAdmission]) -> bool:
        """Whether the holder took the report (it has synced); PeerUnavailable when it cannot be asked."""
        reply = self._ask(address, {"op": "withdraw_unanswered", "admissions": admissions}, LONGEST_FORWARD_SECONDS)
        if not isinstance(reply, dict) or not isinstance(reply.get("taken"), bool):
            self._close()
            raise PeerUnavailable(f"the writer at {address} answered {str(reply)[:200]!r}")
        return bool(reply["taken"])

    def _ask(self, address: str, message: dict[str, Any], seconds: float) -> Any:
        """Send ``message`` (with this replica's token) and read the reply within ``seconds``."""
        connection: tuple[str, ssl.SSLSocket, FrameReader, str] | None = getattr(self._local, "connection", None)
        try:
            if connection is None or connection[0] != address:
                self._close()
                connection = self._local.connection = self._connect(address)
            _, sock, reader, token = connection
            sock.settimeout(seconds)
            send_frame(sock, {**message, "token": token})
            return reader.read()
        except (OSError, ValueError) as error:  # TimeoutError and ssl.SSLError are OSErrors
            self._close()
            raise PeerUnavailable(f"{type(error).__name__}: {error}") from None

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


def bind_peer_socket(host: str, port: int) -> socket.socket:
    """The listening socket of the writer's listener (bound before the Lease, which advertises its port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


class PeerListener:
    """The writer's side: answers forwarded admissions and reports (``SingleWriter``), whether or
    not it holds the Lease now (a forwarder that read the Lease a moment ago is still answered
    correctly). A thread per connection: the forwarders keep one per thread, so there are few."""

    def __init__(self, listener: socket.socket, key: ServingKey, answers: SingleWriter,
                 monotonic: Callable[[], float] = time.monotonic, clock: Callable[[], float] = time.time) -> None:
        self.key = key
        self.answers = answers
        self.monotonic, self.clock = monotonic, clock
        self.listener = listener
        self.port: int = listener.getsockname()[1]
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
        if message.get("op") == "withdraw_unanswered":
            admissions = message.get("admissions")
            if not isinstance(admissions, list):
                raise ValueError("admissions must be a list")
            return {"taken": self.answers.withdraw_unanswered([PodAdmission(**each) for each in admissions])}
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
        return self.answers.admit_forwarded(admission, self.monotonic() + left)
