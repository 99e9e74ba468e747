"""Length-prefixed JSON frames (4-byte big-endian length, orjson body) over a stream socket."""

from __future__ import annotations

import socket
import struct
from typing import Any

import orjson

MAX_FRAME = 4 * 1024 * 1024
_HEADER = struct.Struct(">I")


def send_frame(sock: socket.socket, message: Any) -> None:
    body = orjson.dumps(message)
    sock.sendall(_HEADER.pack(len(body)) + body)


def recv_frame(sock: socket.socket) -> Any | None:
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes is larger than {MAX_FRAME}")
    body = _recv_exact(sock, length)
    if body is None:
        raise ConnectionError("connection closed inside a frame")
    return orjson.loads(body)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(remaining)
        if not chunk:
            if remaining == size:
                return None
            raise ConnectionError("connection closed inside a frame")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
