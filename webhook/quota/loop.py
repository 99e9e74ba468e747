"""The quota service's connections, answered by one thread.

Every decision takes the quota state's lock, so a thread per connection bought no parallelism: it
only added GIL handoffs and wake-ups between threads that then waited for each other. One loop
reads whatever the workers have sent and answers it all in one wake-up. With several clients at
once it answers more calls per second than a thread per connection did, for less service CPU per
call, and with one client as many (bench/quota_roundtrip.py; figures in docs/benchmarks.md,
"Mechanisms kept").

The exception is strict accounting: its admissions wait for a write to the API server, shared by
the admissions that queued up behind it (a group commit), so they are answered from a pool of
threads and the loop never waits on the network.

The protocol is lockstep: a client sends one request on a connection and reads its reply before
it sends the next (``QuotaClient`` does), so replies need no ids.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from webhook.quota.wire import FrameReader, kernel_timeouts, send_frame

log = logging.getLogger("gpuquota.quota")
# Group commits batch the admissions waiting at once, so the pool is sized for every connection
# a server instance can open (workers x threads) with room to spare.
STRICT_THREADS = 64
# How often the loop looks whether its listener was closed (closing it is how it is stopped).
STOP_CHECK_SECONDS = 1.0
# A reply is a few hundred bytes and the client is waiting for it, so a send that blocks this long
# means a client that stopped reading: it is dropped rather than left to stall every other one.
SEND_TIMEOUT_SECONDS = 2.0

Handler = Callable[[Any], Any]


class _Connection:
    """One client connection; closed only once no pool thread still has a reply to send on it.

    Closing a socket while another thread is about to write to it could hand its descriptor
    number to the next accepted connection, and the late reply would reach a client that asked
    something else. A client that times out and reconnects does exactly that sequence.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.reader = FrameReader(sock)
        self.sock = sock
        self._lock = threading.Lock()
        self._replies_pending = 0
        self._closing = False

    def reply_later(self) -> None:
        with self._lock:
            self._replies_pending += 1

    def replied(self) -> None:
        with self._lock:
            self._replies_pending -= 1
            close = self._closing and not self._replies_pending
        if close:
            self.sock.close()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            close = not self._replies_pending
        if close:
            self.sock.close()


class ServiceLoop:
    """Accepts on ``listener`` and answers each message with ``answer``, or in the pool with ``answer_slowly``.

    ``slow(message)`` says which messages go to the pool; without ``answer_slowly`` none do.
    """

    def __init__(self, listener: socket.socket, answer: Handler, answer_slowly: Handler | None = None,
                 slow: Callable[[Any], bool] = lambda message: False) -> None:
        self.listener = listener
        self.answer = answer
        self.answer_slowly = answer_slowly
        self.slow = slow
        self.pool = (ThreadPoolExecutor(STRICT_THREADS, thread_name_prefix="quota-strict")
                     if answer_slowly is not None else None)
        self.selector = selectors.DefaultSelector()

    def run(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        try:
            while self.listener.fileno() != -1:
                for key, _ in self.selector.select(STOP_CHECK_SECONDS):
                    if key.data is None:
                        self._accept()
                    else:
                        self._serve(key.data)
        finally:
            for key in list(self.selector.get_map().values()):
                if key.data is not None:
                    key.data.close()
            self.selector.close()
            if self.pool is not None:
                self.pool.shutdown(wait=False)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return  # closed while a client was connecting; the loop sees it next round
        kernel_timeouts(conn, SEND_TIMEOUT_SECONDS, receive=False)
        self.selector.register(conn, selectors.EVENT_READ, _Connection(conn))

    def _serve(self, connection: _Connection) -> None:
        try:
            messages = connection.reader.read_available()
            if messages is None:
                self._drop(connection)
                return
            for message in messages:
                if self.pool is not None and self.slow(message):
                    connection.reply_later()
                    self.pool.submit(self._answer_in_pool, connection, message)
                else:
                    send_frame(connection.sock, self.answer(message))
        except Exception as error:  # one bad connection must never stop the loop serving the rest
            log.warning("quota service: dropping connection: %s: %s", type(error).__name__, error)
            self._drop(connection)

    def _answer_in_pool(self, connection: _Connection, message: Any) -> None:
        assert self.answer_slowly is not None
        try:
            send_frame(connection.sock, self.answer_slowly(message))
        except Exception as error:
            # The client sees the connection end and refuses the pod (fails closed); the loop
            # reads the end and drops the connection.
            log.warning("quota service: dropping connection: %s: %s", type(error).__name__, error)
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
        finally:
            connection.replied()

    def _drop(self, connection: _Connection) -> None:
        self.selector.unregister(connection.sock)
        connection.close()
