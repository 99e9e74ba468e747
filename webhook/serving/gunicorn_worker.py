"""gunicorn's gthread worker, with threads that keep waiting on their own connection while they can.

Stock gthread hands a kept-alive connection back to the worker's poller after every response: the
poller thread wakes on the next request, submits it to the thread pool, a pool thread wakes to
serve it, and its completion wakes the poller again through a pipe. On an otherwise idle server,
which is how the API server calls a webhook most of the time (one review at a time per
connection), that chain of three thread wake-ups is most of a call's latency: a thread that
simply waits for its connection's next request answers a single connection clearly faster (see
docs/benchmarks.md, "Mechanisms kept").

So here a thread that has answered a request waits on that connection itself (``poll`` on its
socket) instead of returning it, as long as that cannot starve anyone:

- it only starts waiting when no request is queued for a thread;
- when a request is queued while every thread is busy or waiting, one waiting thread is woken
  (a byte on a pipe it polls too), gives its connection back to the poller as stock gthread
  would, and takes the queued request;
- a stopping worker wakes every waiting thread the same way;
- a connection idle for ``keepalive`` seconds is closed, the same limit the poller applies.

Requests are parsed by gthread's own code, and everything but admission reviews is served through
WSGI as gthread serves it. An admission review (a POST to one of the app's admission paths with a
Content-Length body, which is every call the API server makes) is answered by
:meth:`StickyThreadWorker.handle_request` directly: WSGI's environ of ~40 entries, its Response
object, ``start_response`` and the two writes (headers, then body) are a large share of a worker's
Python time under load for an endpoint that reads three values (the body, its length, the peer's
address) and returns one answer. That answer is the route's own, composed once
(:class:`webhook.serving.routes.Answer`: status, headers, body; the WSGI path writes the same
value), behind the status line and headers gunicorn puts first, with gunicorn's keep-alive rules.
gunicorn's ``pre_request``/``post_request`` hooks and its access log are not run for these
answers: the server configures neither (each decision is logged by the app, one structured line
per review), so turning either on would need this path to call it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import selectors
import ssl
import threading
import time
from functools import partial
from typing import Any

from gunicorn import SERVER, util
from gunicorn.http.body import LengthReader
from gunicorn.workers.gthread import _DEFER, TConn, ThreadWorker

# How long a thread may spend reading one request (head and body) or a TLS handshake. The API
# server sends a review at once (its own timeout is 10 s by default); only a stalled or
# deliberately slow client takes longer, and it must not keep a thread from the others.
READ_DEADLINE_SECONDS = 10.0
# How long a write (an answer) may wait for the peer to take it.
WRITE_TIMEOUT_SECONDS = 30.0


class DeadlineSSLSocket(ssl.SSLSocket):
    """The server's TLS connections (``SSLContext.sslsocket_class``): reads never wait for ever.

    gthread serves a connection in a blocking socket: a client that completes its handshake and
    sends nothing, or sends a request a byte at a time, would hold a thread for as long as it
    liked, and a worker has only a few. Here blocking mode means a deadline: the handshake and
    each request (set when gthread puts the socket in blocking mode to read one) must arrive
    within READ_DEADLINE_SECONDS in total. A read past it fails as a reset connection, which
    gthread closes quietly.
    """

    _read_deadline = float("inf")

    def setblocking(self, flag: bool) -> None:
        if not flag:
            super().setblocking(False)
            return
        self._read_deadline = time.monotonic() + READ_DEADLINE_SECONDS
        self.settimeout(READ_DEADLINE_SECONDS)

    def do_handshake(self, block: bool = False) -> None:
        self._read_deadline = time.monotonic() + READ_DEADLINE_SECONDS
        self._before_read()
        super().do_handshake(block)

    def _before_read(self) -> None:
        current = self.gettimeout()
        if current == 0.0:
            return  # non-blocking: the poller's business
        remaining = self._read_deadline - time.monotonic()
        if remaining <= 0:
            raise ConnectionResetError(errno.ECONNRESET, "client too slow: no complete request within "
                                                         f"{READ_DEADLINE_SECONDS:g}s")
        if current is None or remaining < current:
            # Only ever shorter: gunicorn's graceful close drains with its own, shorter timeout.
            self.settimeout(remaining)

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        self._before_read()
        try:
            return super().recv(buflen, flags)
        except TimeoutError:
            raise ConnectionResetError(errno.ECONNRESET, "client too slow") from None

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        self._before_read()
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError:
            raise ConnectionResetError(errno.ECONNRESET, "client too slow") from None

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self.gettimeout() != 0.0:
            self.settimeout(WRITE_TIMEOUT_SECONDS)
        super().sendall(data, flags)


def _peer_address(client: tuple[str, int] | str | bytes) -> str:
    """REMOTE_ADDR as gunicorn's WSGI environ gives it (a unix socket's peer is a name, not a pair)."""
    if isinstance(client, bytes):
        return client.decode()
    return client if isinstance(client, str) else client[0]


class StickyThreadWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn ships no type hints
    alive: bool  # set by gunicorn's Worker; cleared here when the worker is to restart

    def init_process(self) -> None:
        self._counts = threading.Lock()
        self._queued = 0  # requests submitted to the pool that no thread has taken yet
        self._busy = 0  # threads serving a request
        self._waiting = 0  # threads waiting on their connection for its next request
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        super().init_process()  # runs the worker until it stops

    def load_wsgi(self) -> None:
        super().load_wsgi()
        # Imported here, once the app is loaded: the master imports this module before metrics are set up.
        from webhook.serving.app import admission_endpoints

        # SCRIPT_NAME would shift the path the app sees and the PROXY protocol the peer's address:
        # with either, every request takes the WSGI path, which applies them.
        plain = not os.environ.get("SCRIPT_NAME") and self.cfg.proxy_protocol in ("off", False)
        self._direct = dict(admission_endpoints(self.wsgi)) if plain else {}

    def handle_request(self, req: Any, conn: Any) -> bool:
        endpoint = self._direct.get(req.path) if req.method == "POST" else None
        if (endpoint is None or req._expected_100_continue or not isinstance(req.body.reader, LengthReader)
                or "SCRIPT_NAME" in (name for name, _ in req.headers)):
            return bool(super().handle_request(req, conn))
        # The same decisions gthread takes before it calls the app.
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.alive = False
        close = (req.should_close() or not self.alive or not self.cfg.keepalive  # alive covers max_requests
                 or len(self.keepalived_conns) >= self.max_keepalived)
        peer = _peer_address(conn.client)
        answer = endpoint.serve({"wsgi.input": req.body, "CONTENT_LENGTH": str(req.body.reader.length),
                                 "REMOTE_ADDR": peer})
        # The answer's own status line and headers (webhook.serving.routes), behind the ones gunicorn
        # puts first in every answer it writes.
        major, minor = req.version
        own_headers = "".join(f"{name}: {value}\r\n" for name, value in answer.headers)
        head = (f"HTTP/{major}.{minor} {answer.status_line}\r\nServer: {SERVER}\r\n"
                f"Date: {util.http_date()}\r\nConnection: {'close' if close else 'keep-alive'}\r\n"
                f"{own_headers}\r\n")
        conn.sock.sendall(head.encode("latin-1") + answer.body)  # one TLS record where gunicorn writes two
        return not close

    def _wake_one(self, count: int = 1) -> None:
        # A full pipe holds wake-ups enough already: waiting threads will see one.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_write, b"w" * count)

    def accept(self, listener: Any) -> None:
        """A new connection waits in the poller until it sends something, not in a thread.

        gthread hands it to a thread at once, which waits up to five seconds for its first bytes:
        a burst of connections that send nothing (a TCP health check, a scanner, a client that
        stalls) would hold every thread that long.
        """
        try:
            client, address = listener.accept()
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client, address, listener.getsockname())  # non-blocking from here
        self._park(conn)

    def _park(self, conn: Any) -> None:
        """Wait in the poller (no thread) until the connection is readable, for keepalive seconds at most."""
        conn.timeout = time.monotonic() + self.cfg.keepalive
        self.pending_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.on_pending_socket_readable, conn))

    def _open(self, conn: Any) -> Any:
        """The TLS handshake of a new connection (bounded by DeadlineSSLSocket); then True when a
        request can be read now, _DEFER to wait in the poller for one, False to close."""
        try:
            conn.sock.setblocking(True)
            conn.init()
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            self.log.debug("TLS handshake failed or timed out: %s", error)
            return False
        if conn.is_http2 or conn.parser.unreader.buf.getvalue():
            return True
        if hasattr(conn.sock, "pending") and conn.sock.pending():
            return True
        readable, _, _ = select.select([conn.sock], [], [], 0)
        if readable:
            return True
        conn.data_ready = False
        return _DEFER  # a client that only connected: wait for its request in the poller

    def enqueue_req(self, conn: Any) -> None:
        with self._counts:
            self._queued += 1
            starved = self._waiting > 0 and self._busy + self._waiting + self._queued > self.cfg.threads
        if starved:
            self._wake_one()
        super().enqueue_req(conn)

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        self._wake_one(self.cfg.threads)

    def is_parent_alive(self) -> bool:
        # gthread's main loop asks this every second and, when the master is gone, leaves its loop
        # to drain, but with ``alive`` still set: threads waiting on their connection would go on
        # waiting for up to ``keepalive`` seconds, and the worker would outlive its server that long.
        # Stop as SIGTERM would, so they hand their connections back now.
        if super().is_parent_alive():
            return True
        self.alive = False
        self._wake_one(self.cfg.threads)
        return False

    def handle(self, conn: Any) -> Any:
        with self._counts:
            self._queued -= 1
            self._busy += 1
        try:
            if not conn.initialized:
                opened = self._open(conn)
                if opened is not True:
                    return opened
            while True:
                keep = super().handle(conn)
                if keep is not True or not self.alive:
                    return keep
                next_request = self._wait_for_next_request(conn)
                if next_request is None:
                    return False  # idle for the whole keep-alive: close, as the poller would
                if not next_request:
                    return keep  # back to the poller
        finally:
            with self._counts:
                self._busy -= 1

    def _wait_for_next_request(self, conn: Any) -> bool | None:
        """True when the connection's next request is readable, False to hand the connection back
        to the poller, None when it stayed idle for the keep-alive timeout."""
        if conn.parser.unreader.buf.getvalue() or (hasattr(conn.sock, "pending") and conn.sock.pending()):
            return True  # already read (a pipelined request, or bytes in the TLS buffer)
        with self._counts:
            if self._queued > 0:
                return False
            self._busy -= 1
            self._waiting += 1
        try:
            poller = select.poll()
            poller.register(conn.sock.fileno(), select.POLLIN)
            poller.register(self._wake_read, select.POLLIN)
            deadline = time.monotonic() + self.cfg.keepalive
            while self.alive:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                events = poller.poll(remaining * 1000)
                if any(fd != self._wake_read for fd, _ in events):
                    return True  # readable, or closed by the peer: gthread's code tells which
                if events:
                    try:
                        os.read(self._wake_read, 1)
                        return False  # this thread is wanted elsewhere
                    except BlockingIOError:
                        pass  # another waiting thread took that wake-up
            return False
        finally:
            with self._counts:
                self._waiting -= 1
                self._busy += 1
