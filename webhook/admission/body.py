"""The body of an admission review, read from the WSGI environ and capped at MAX_BODY_BYTES.

The cap: the largest review the API server sends is an UPDATE: it carries object and oldObject, each up
to etcd's 1.5 MiB limit on a stored object (protobuf), and their JSON runs about twice the
protobuf: 2 objects x 2 x 1.5 MiB = 6 MiB. The envelope (uid, kinds, userInfo, options) is a few
KiB; the other 2 MiB are for objects whose JSON is more than twice their protobuf. A larger body
can only be an attack or a mistake; a smaller cap would refuse a large pod's label change, which
a fail-closed validating webhook turns into a refused update.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.admission.review import BadRequest

MAX_BODY_BYTES = 8 * 1024 * 1024


class BodyTooLarge(Exception):
    """A body over the cap; answered with HTTP 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")


def read_body(environ: Mapping[str, Any], limit: int) -> bytes:
    """The request body, refusing anything over ``limit`` before it is all in memory."""
    stream = environ["wsgi.input"]
    declared = environ.get("CONTENT_LENGTH") or ""
    if declared:
        try:
            length = int(declared)
        except ValueError:
            raise BadRequest(f"Content-Length {declared!r} is not a number") from None
        if length > limit:
            raise BodyTooLarge(limit)
        if length < 0:
            raise BadRequest(f"Content-Length {declared!r} is negative")
    elif not environ.get("wsgi.input_terminated"):
        # Without a length, only a server that marks the end of the input (gunicorn does, for
        # chunked bodies) lets us read to the end; others would block. Werkzeug reads nothing too.
        return b""
    else:
        length = -1
    chunks: list[bytes] = []
    total = 0
    while length < 0 or total < length:
        want = 64 * 1024 if length < 0 else length - total
        chunk = stream.read(min(want, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            # Chunked: only the read itself can enforce the cap.
            raise BodyTooLarge(limit)
    if 0 <= length != total:
        raise BadRequest(f"request body ended after {total} of {length} bytes")
    return b"".join(chunks)
