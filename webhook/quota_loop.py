"""The quota service's connections, answered by one thread.

Every decision takes the quota state's lock, so a thread per connection bought no parallelism: it
only added GIL handoffs and wake-ups between threads that then waited for each other. One loop
reads whatever the workers have sent and answers it all in one wake-up. Measured with
bench/quota_roundtrip.py (docs/benchmarks.md): with four or eight client threads, 1.2-1.7 times the
calls per second of a thread per connection for a quarter to a third less service CPU per call;
with one client, the same.

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .quota_wire import FrameReader, kernel_timeouts, send_frame

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
                key.fileobj.close()  # type: ignore[union-attr]
            self.selector.close()
            if self.pool is not None:
                self.pool.shutdown(wait=False)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return  # closed while a client was connecting; the loop sees it next round
        kernel_timeouts(conn, SEND_TIMEOUT_SECONDS, receive=False)
        self.selector.register(conn, selectors.EVENT_READ, FrameReader(conn))

    def _serve(self, reader: FrameReader) -> None:
        try:
            messages = reader.read_available()
            if messages is None:
                self._drop(reader)
                return
            for message in messages:
                if self.pool is not None and self.answer_slowly is not None and self.slow(message):
                    self.pool.submit(self._answer_in_pool, reader, message)
                else:
                    send_frame(reader.sock, self.answer(message))
        except Exception as error:  # one bad connection must never stop the loop serving the rest
            log.warning("quota service: dropping connection: %s: %s", type(error).__name__, error)
            self._drop(reader)

    def _answer_in_pool(self, reader: FrameReader, message: Any) -> None:
        assert self.answer_slowly is not None
        try:
            send_frame(reader.sock, self.answer_slowly(message))
        except Exception as error:
            # The client sees the connection close and refuses the pod (fails closed); the loop
            # notices the closed socket on its next read of it.
            log.warning("quota service: dropping connection: %s: %s", type(error).__name__, error)
            with contextlib.suppress(OSError):  # the loop may have closed it already
                reader.sock.shutdown(socket.SHUT_RDWR)

    def _drop(self, reader: FrameReader) -> None:
        self.selector.unregister(reader.sock)
        reader.sock.close()
