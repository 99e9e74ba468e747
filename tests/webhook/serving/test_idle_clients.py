"""Idle and slow clients do not starve admissions (a real ``gpuquota serve``, default workers and threads).

Connections that send nothing (plain TCP, TLS with the handshake done, kept-alive ones after an
answer) and a client that sends its request a byte at a time are held open while ordinary
admissions are timed: each must be answered well within the API server's webhook timeout (10 s by
default), and the probes too.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from reviews import body, pod, review
from webhookproc import LOOPBACK, REPO_ROOT, WebhookProcess

IDLE_TCP = 500
IDLE_TLS = 500
# Kept-alive connections that have each been answered once and then stay idle, as the API
# server's pooled connections do after a burst (up to its 90 s idle timeout).
POOLED = 64
ADMISSIONS = 30
# The API server's default webhook timeout is 10 s; "well within" is a fifth of it.
ANSWER_WITHIN_SECONDS = 2.0
CANONICAL = {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    process = WebhookProcess(tmp_path_factory.mktemp("idle"), serve_args=["--state", str(REPO_ROOT / "examples" /
                                                                                          "cluster")])
    process.start()
    try:
        yield process
    finally:
        process.stop()


def open_idle(server: WebhookProcess, stack: contextlib.ExitStack) -> None:
    context = server.ssl_context()
    for _ in range(POOLED):
        pooled = stack.enter_context(contextlib.closing(
            http.client.HTTPSConnection(LOOPBACK, server.port, context=context, timeout=30)))
        timed_admission(server, pooled)
    for _ in range(IDLE_TCP):
        stack.enter_context(socket.create_connection((LOOPBACK, server.port), timeout=10))
    for _ in range(IDLE_TLS):
        raw = socket.create_connection((LOOPBACK, server.port), timeout=10)
        stack.enter_context(context.wrap_socket(raw, server_hostname=LOOPBACK))  # the handshake completes here


def slow_loris(server: WebhookProcess, stop: threading.Event) -> None:
    """One request whose head arrives a byte every 0.2 s, for as long as the test runs."""
    request = (b"POST /validate-pods HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               + b"".join(b"X-Padding-%d: %s\r\n" % (n, b"p" * 40) for n in range(2000)))
    with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, server.port), timeout=10) as raw, \
            server.ssl_context().wrap_socket(raw, server_hostname=LOOPBACK) as tls:
        for byte in request:
            if stop.wait(0.2):
                return
            tls.sendall(bytes([byte]))


def timed_admission(server: WebhookProcess, connection: http.client.HTTPSConnection) -> float:
    started = time.monotonic()
    connection.request("POST", "/mutate-pods", body=body(review(pod(resources=CANONICAL))),
                       headers={"Content-Type": "application/json"})
    reply = connection.getresponse()
    assert reply.status == 200 and json.loads(reply.read())["response"]["allowed"] is True
    return time.monotonic() - started


def timed_probe(server: WebhookProcess, path: str) -> float:
    started = time.monotonic()
    status, _ = server.get(path)
    assert status == 200, path
    return time.monotonic() - started


def test_idle_and_slow_clients_do_not_starve_admissions_or_probes(server: WebhookProcess) -> None:
    stop = threading.Event()
    loris = threading.Thread(target=slow_loris, args=(server, stop), daemon=True)
    with contextlib.ExitStack() as idle:
        open_idle(server, idle)
        loris.start()
        try:
            latencies = []
            for round_number in range(ADMISSIONS):
                # New connections (hashed to any worker) and one kept alive, as the API server holds.
                fresh = http.client.HTTPSConnection(LOOPBACK, server.port, context=server.ssl_context(), timeout=30)
                try:
                    latencies.append(timed_admission(server, fresh))
                    if round_number % 3 == 0:
                        latencies.append(timed_admission(server, fresh))
                finally:
                    fresh.close()
            probes = [timed_probe(server, path) for path in ("/healthz", "/readyz") * 5]
        finally:
            stop.set()
            loris.join(timeout=10)

    assert max(latencies) < ANSWER_WITHIN_SECONDS, sorted(latencies)[-5:]
    assert max(probes) < ANSWER_WITHIN_SECONDS, probes


def test_a_request_that_arrives_too_slowly_is_cut_off_at_the_read_deadline(server: WebhookProcess) -> None:
    from webhook.serving.gunicorn_worker import READ_DEADLINE_SECONDS

    request = b"POST /validate-pods HTTP/1.1\r\nHost: localhost\r\n" + b"X-Slow: " + b"s" * 1000
    with socket.create_connection((LOOPBACK, server.port), timeout=10) as raw, \
            server.ssl_context().wrap_socket(raw, server_hostname=LOOPBACK) as tls:
        started = time.monotonic()
        tls.settimeout(0.5)
        closed_after = None
        for byte in request:
            try:
                tls.sendall(bytes([byte]))
                if tls.recv(1) == b"":  # the server closed the connection
                    closed_after = time.monotonic() - started
                    break
            except TimeoutError:
                continue  # still open: nothing to read yet
            except OSError:
                closed_after = time.monotonic() - started
                break
    assert closed_after is not None and READ_DEADLINE_SECONDS <= closed_after < READ_DEADLINE_SECONDS + 5
