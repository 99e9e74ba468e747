"""Length-prefixed JSON frames (4-byte big-endian length, orjson body) over a stream socket.

Every admission a worker validates makes one round trip to the quota service, so the wire is
built to cost as few system calls as it can: one ``sendall`` per frame, and a reader that takes
whatever the socket holds in one ``recv`` (a whole frame, nearly always) instead of reading the
header and the body separately. Each call that blocks hands the GIL to another thread and takes
it back afterwards, and under load those handoffs, not the bytes, are what a round trip costs.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import orjson

from gpuquota_core.pod_admission import Verdict

MAX_FRAME = 4 * 1024 * 1024
# Large enough for any reply and any pod admission in one recv; a larger frame just takes more.
RECV_SIZE = 64 * 1024
_HEADER = struct.Struct(">I")


def send_frame(sock: socket.socket, message: Any) -> None:
    body = orjson.dumps(message)
    sock.sendall(_HEADER.pack(len(body)) + body)


def kernel_timeouts(sock: socket.socket, seconds: float, *, receive: bool = True) -> None:
    """Make the kernel time out this blocking socket's sends (and receives) after ``seconds``.

    Python's own socket timeout polls before every send and recv: one more call per operation
    that gives up the GIL. A timed-out call raises BlockingIOError. On a Unix socket the send
    timeout also bounds ``connect`` (a listener whose backlog is full).
    """
    # A zero timeval means "wait forever" to the kernel: at least one microsecond.
    interval = struct.pack("ll", *divmod(max(1, round(seconds * 1_000_000)), 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, interval)
    if receive:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, interval)


# A frame holding JSON null decodes to None, so "no whole frame yet" needs its own value.
_INCOMPLETE: Any = object()


class FrameReader:
    """The frames of one connection, each recv taking what the socket holds, kept beyond a frame."""

    def __init__(self, sock: socket.socket, max_frame: int = MAX_FRAME) -> None:
        self.sock = sock
        self.max_frame = max_frame
        self._pending = bytearray()

    def read(self) -> Any | None:
        """The next message (blocking), or None when the peer closed the connection between frames."""
        while True:
            message = self._take_frame()
            if message is not _INCOMPLETE:
                return message
            if not self._receive():
                return None

    def read_available(self) -> list[Any] | None:
        """One recv (for a socket known to be readable): the frames now whole, or None at EOF."""
        if not self._receive():
            return None
        messages = []
        while (message := self._take_frame()) is not _INCOMPLETE:
            messages.append(message)
        return messages

    def _receive(self) -> bool:
        chunk = self.sock.recv(RECV_SIZE)
        if not chunk:
            if self._pending:
                raise ConnectionError("connection closed inside a frame")
            return False
        self._pending += chunk
        return True

    def _take_frame(self) -> Any:
        pending = self._pending
        if len(pending) < _HEADER.size:
            return _INCOMPLETE
        (length,) = _HEADER.unpack_from(pending)
        if length > self.max_frame:
            raise ValueError(f"frame of {length} bytes is larger than {self.max_frame}")
        end = _HEADER.size + length
        if len(pending) < end:
            return _INCOMPLETE
        message = orjson.loads(pending[_HEADER.size:end])
        del pending[:end]
        return message


def verdict_from_wire(reply: dict[str, Any]) -> Verdict:
    """A Verdict as the service writes it (its fields; warnings as a list). TypeError for fields
    this release does not know (a peer of another release)."""
    return Verdict(**{**reply, "warnings": tuple(reply.get("warnings") or ())})
