"""Admission reviews answered by the worker itself, without WSGI (StickyThreadWorker.handle_request).

Through a real ``gpuquota serve`` over verified TLS: a review sent with a Content-Length (the way
the API server sends it) is answered directly, one sent chunked goes through gunicorn's WSGI path,
and both answers must be the same byte for byte but for the Date. Keep-alive rules, HTTP/1.0 and
pipelining are checked on raw sockets. Which path a request takes is checked in-process on requests
parsed by gunicorn's own parser, since both paths answer alike by design.
"""

from __future__ import annotations

import collections
import http.client
import json
import socket
import ssl
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from gunicorn.config import Config
from gunicorn.http.parser import RequestParser
from gunicorn.workers.gthread import ThreadWorker
from reviews import body, pod, review
from webhookproc import LOOPBACK, WebhookProcess

from webhook.serving.gunicorn_worker import StickyThreadWorker
from webhook.serving.routes import Answer

REVIEW = body(review(pod(resources={"nvidia.com/gpu": "2"}), uid="uid-direct-1"))


@pytest.fixture
def tls(offline_webhook: WebhookProcess) -> Iterator[ssl.SSLSocket]:
    with socket.create_connection((LOOPBACK, offline_webhook.port), timeout=10) as raw, \
            offline_webhook.ssl_context().wrap_socket(raw, server_hostname=LOOPBACK) as wrapped:
        yield wrapped


def with_length(path: str, payload: bytes, *, version: str = "1.1", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/{version}\r\nHost: localhost\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


def chunked(path: str, payload: bytes) -> bytes:
    pieces = [payload[start:start + 1000] for start in range(0, len(payload), 1000)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode() + framed + b"0\r\n\r\n"


def answer(sock: ssl.SSLSocket) -> tuple[str, list[tuple[str, str]], bytes]:
    """(status line, headers in order, body) of the next answer on ``sock``."""
    reply = http.client.HTTPResponse(sock)  # type: ignore[arg-type]  # it only calls makefile()
    reply.begin()
    status_line = f"HTTP/{reply.version // 10}.{reply.version % 10} {reply.status} {reply.reason}"
    return status_line, reply.getheaders(), reply.read()


def without_date(reply: tuple[str, list[tuple[str, str]], bytes]) -> tuple[Any, ...]:
    status, headers, content = reply
    return status, [(name, value) for name, value in headers if name != "Date"], content


def closed_by_server(sock: ssl.SSLSocket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLEOFError):
        return True


@pytest.mark.parametrize("path", ["/mutate-pods", "/validate-pods"])
def test_a_direct_answer_is_the_wsgi_answer_but_for_the_date(tls: ssl.SSLSocket, path: str) -> None:
    tls.sendall(with_length(path, REVIEW))
    direct = answer(tls)
    tls.sendall(chunked(path, REVIEW))  # the same review, through gunicorn's WSGI path
    through_wsgi = answer(tls)

    assert without_date(direct) == without_date(through_wsgi)
    status, headers, content = direct
    assert status == "HTTP/1.1 200 OK"
    assert [name for name, _ in headers] == ["Server", "Date", "Connection", "Content-Type", "Content-Length"]
    assert dict(headers)["Connection"] == "keep-alive"
    assert json.loads(content)["response"]["uid"] == "uid-direct-1"
    assert dict(headers)["Content-Length"] == str(len(content))


def test_a_refused_body_is_answered_alike_both_ways(tls: ssl.SSLSocket) -> None:
    tls.sendall(with_length("/validate-pods", b"{not json"))
    direct = answer(tls)
    tls.sendall(chunked("/validate-pods", b"{not json"))
    through_wsgi = answer(tls)

    assert without_date(direct) == without_date(through_wsgi)
    status, headers, content = direct
    assert status == "HTTP/1.1 400 Bad Request"
    assert [name for name, _ in headers] == ["Server", "Date", "Connection", "Content-Type", "Content-Length"]
    assert json.loads(content)["reason"] == "BadRequest"


def test_connection_close_is_honoured(tls: ssl.SSLSocket) -> None:
    tls.sendall(with_length("/mutate-pods", REVIEW, extra="Connection: close\r\n"))
    status, headers, content = answer(tls)

    assert status == "HTTP/1.1 200 OK"
    assert dict(headers)["Connection"] == "close"
    assert json.loads(content)["response"]["patchType"] == "JSONPatch"
    assert closed_by_server(tls)


def test_an_http_1_0_review_is_answered_in_1_0_and_the_connection_closed(tls: ssl.SSLSocket) -> None:
    tls.sendall(with_length("/validate-pods", REVIEW, version="1.0"))
    status, headers, content = answer(tls)

    assert status == "HTTP/1.0 200 OK"
    assert dict(headers)["Connection"] == "close"
    assert json.loads(content)["response"]["allowed"] is True
    assert closed_by_server(tls)


def test_pipelined_reviews_are_answered_in_order(tls: ssl.SSLSocket) -> None:
    second = body(review(pod(resources={"nvidia.com/gpu": "1"}), uid="uid-direct-2"))
    tls.sendall(with_length("/mutate-pods", REVIEW) + with_length("/validate-pods", second)
                + with_length("/mutate-pods", b"{not json"))

    uids = [json.loads(answer(tls)[2])["response"]["uid"] for _ in range(2)]
    status, _, content = answer(tls)

    assert uids == ["uid-direct-1", "uid-direct-2"]
    assert status == "HTTP/1.1 400 Bad Request"
    assert json.loads(content)["reason"] == "BadRequest"


# -- which path a request takes (in-process, on gunicorn's own parser) ---------------------------

class RecordingEndpoint:
    def __init__(self) -> None:
        self.environs: list[dict[str, Any]] = []

    def serve(self, environ: dict[str, Any]) -> Answer:
        environ = dict(environ, body=environ["wsgi.input"].read())
        self.environs.append(environ)
        return Answer(200, b'{"ok":true}')


class Connection:
    def __init__(self, sock: socket.socket, client: Any) -> None:
        self.sock, self.client = sock, client


def parsed(raw: bytes, peer: tuple[str, int] = ("10.0.0.7", 40123)) -> Any:
    return next(RequestParser(Config(), iter([raw]), peer))


def bare_worker(endpoint: RecordingEndpoint, max_requests: int = sys.maxsize) -> StickyThreadWorker:
    """A worker with only what handle_request reads, serving ``endpoint`` at /mutate-pods."""
    worker = StickyThreadWorker.__new__(StickyThreadWorker)
    worker.cfg, worker.nr, worker.max_requests, worker.alive = Config(), 0, max_requests, True
    worker.keepalived_conns, worker.max_keepalived = collections.deque(), 100
    worker._direct = {"/mutate-pods": endpoint}
    return worker


def served_by(raw: bytes, monkeypatch: pytest.MonkeyPatch,
              client: Any = ("10.0.0.7", 40123)) -> tuple[str, RecordingEndpoint, bytes, bool]:
    """Which path served ``raw`` ("direct" or "wsgi"), the endpoint, the bytes written, keep-alive."""
    endpoint = RecordingEndpoint()
    worker = bare_worker(endpoint)
    through_wsgi: list[Any] = []
    monkeypatch.setattr(ThreadWorker, "handle_request", lambda self, req, conn: through_wsgi.append(req) or True)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        keep = worker.handle_request(parsed(raw), Connection(ours, client))
        ours.shutdown(socket.SHUT_WR)
        written = theirs.recv(65536)
    return ("wsgi" if through_wsgi else "direct"), endpoint, written, keep


def test_a_review_with_a_length_is_served_directly_with_the_peer_address(monkeypatch: pytest.MonkeyPatch) -> None:
    path, endpoint, written, keep = served_by(with_length("/mutate-pods", b'{"x":1}'), monkeypatch)

    assert path == "direct" and keep is True
    assert endpoint.environs == [{"wsgi.input": endpoint.environs[0]["wsgi.input"], "CONTENT_LENGTH": "7",
                                  "REMOTE_ADDR": "10.0.0.7", "body": b'{"x":1}'}]
    head, _, content = written.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 200 OK"
    assert b"\r\nConnection: keep-alive\r\nContent-Type: application/json\r\nContent-Length: 11" in head
    assert content == b'{"ok":true}'


def test_a_unix_socket_peer_is_named_as_gunicorn_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _, endpoint, _, _ = served_by(with_length("/mutate-pods", b"{}"), monkeypatch, client=b"/run/peer.sock")

    assert endpoint.environs[0]["REMOTE_ADDR"] == "/run/peer.sock"


@pytest.mark.parametrize("raw", [
    chunked("/mutate-pods", b'{"x":1}'),  # no length: WSGI marks where the input ends
    with_length("/mutate-pods", b"{}", extra="Expect: 100-continue\r\n"),  # gunicorn sends the 100
    b"GET /mutate-pods HTTP/1.1\r\nHost: localhost\r\n\r\n",  # answered 405 by the routes
    with_length("/healthz", b"{}"),  # not an admission path
    with_length("/mutate-pods%2F", b"{}"),  # unquoted only by WSGI
], ids=["chunked", "expect-continue", "get", "other-path", "quoted-path"])
def test_anything_else_goes_through_wsgi(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    path, endpoint, written, _ = served_by(raw, monkeypatch)

    assert path == "wsgi"
    assert endpoint.environs == [] and written == b""


def test_a_worker_due_to_restart_closes_the_connection_after_its_last_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    worker = bare_worker(RecordingEndpoint(), max_requests=1)
    worker.log = type("Log", (), {"info": staticmethod(lambda *args: None)})()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        keep = worker.handle_request(parsed(with_length("/mutate-pods", b"{}")), Connection(ours, ("10.0.0.7", 1)))
        written = theirs.recv(65536)

    assert keep is False and worker.alive is False
    assert b"\r\nConnection: close\r\n" in written

