"""read_body: the body of an admission POST from the WSGI environ, capped, as the server delivers it.

A real server cannot be made to end a TLS body early from Python (an SSL socket cannot half-close),
so the short-body and no-length cases are checked on the environ directly.
"""

from __future__ import annotations

import io

import pytest

from webhook.admission.body import BodyTooLarge, read_body
from webhook.admission.review import BadRequest


def environ(payload: bytes, length: str | None, *, terminated: bool = False) -> dict[str, object]:
    env: dict[str, object] = {"wsgi.input": io.BytesIO(payload), "wsgi.input_terminated": terminated}
    if length is not None:
        env["CONTENT_LENGTH"] = length
    return env


def test_the_declared_length_is_read_and_nothing_after_it() -> None:
    assert read_body(environ(b'{"kind":1}trailing', "10"), limit=100) == b'{"kind":1}'


def test_a_body_shorter_than_its_content_length_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match=r"^request body ended after 8 of 100 bytes$"):
        read_body(environ(b'{"kind":', "100"), limit=1000)


@pytest.mark.parametrize("length", ["ten", "-1"])
def test_a_content_length_that_is_not_a_size_is_a_bad_request(length: str) -> None:
    with pytest.raises(BadRequest, match="Content-Length"):
        read_body(environ(b"{}", length), limit=1000)


def test_a_declared_length_over_the_cap_is_refused_without_reading() -> None:
    stream = io.BytesIO(b"x" * 10)
    with pytest.raises(BodyTooLarge):
        read_body({"wsgi.input": stream, "CONTENT_LENGTH": "101"}, limit=100)
    assert stream.tell() == 0


def test_without_a_length_the_body_is_read_only_from_a_terminated_input() -> None:
    assert read_body(environ(b"{}", None, terminated=True), limit=100) == b"{}"
    # A server that does not mark the end would block the read: nothing is read, as werkzeug does.
    assert read_body(environ(b"{}", None), limit=100) == b""
    with pytest.raises(BodyTooLarge):
        read_body(environ(b"x" * 101, None, terminated=True), limit=100)
