"""The gthread worker whose threads wait on their own kept-alive connection (webhook.serving.gunicorn_worker).

Against a real ``gpuquota serve`` with one worker and few threads, so that connections outnumber
threads: every connection must still be answered promptly, a stopping server must not wait for
idle connections, and an idle connection must be closed after ``--keepalive`` seconds.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import signal
import time
from pathlib import Path

from reviews import body, pod, review
from webhookproc import LOOPBACK, REPO_ROOT, WebhookProcess

EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"
PAYLOAD = body(review(pod(resources={"nvidia.com/gpu": "1"})))
# Far below the 120 s keep-alive a waiting thread would otherwise sit out, far above a normal answer.
ANSWER_WITHIN = 10.0


def start(tmp_path: Path, *, threads: int, keepalive: int = 120) -> WebhookProcess:
    return WebhookProcess(tmp_path / "server", serve_args=[
        "--state", str(EXAMPLE_STATE), "--workers", "1", "--threads", str(threads),
        "--keepalive", str(keepalive)]).start()


def connect(server: WebhookProcess) -> http.client.HTTPSConnection:
    # Connected by its first request, as the API server does: a connection that completes its TLS
    # handshake and then sends nothing holds a thread in stock gthread too.
    return http.client.HTTPSConnection(LOOPBACK, server.port, timeout=ANSWER_WITHIN,
                                       context=server.ssl_context())


def mutate(connection: http.client.HTTPSConnection) -> float:
    """One /mutate-pods call on a kept-alive connection; returns how long the answer took."""
    started = time.monotonic()
    connection.request("POST", "/mutate-pods", body=PAYLOAD, headers={"Content-Type": "application/json"})
    answer = connection.getresponse()
    reply = json.loads(answer.read())
    assert answer.status == 200
    assert reply["response"]["patchType"] == "JSONPatch"
    assert answer.getheader("Connection", "").lower() != "close"
    return time.monotonic() - started


def test_connections_outnumbering_threads_are_all_answered(tmp_path: Path) -> None:
    server = start(tmp_path, threads=2)
    try:
        connections = [connect(server) for _ in range(6)]
        # The answers carry the current Date.
        connections[0].request("GET", "/healthz")
        answer = connections[0].getresponse()
        answer.read()
        assert abs(email.utils.parsedate_to_datetime(answer.getheader("Date")).timestamp() - time.time()) < 5
        # Round-robin: after its first answer each of the first two connections holds a thread
        # waiting for its next request, so the other four are answered only if those threads
        # give their connections back when a request queues up behind them.
        durations = [mutate(connection) for _ in range(3) for connection in connections]
        assert len(durations) == 18
        assert max(durations) < ANSWER_WITHIN
        for connection in connections:
            connection.close()
    finally:
        server.stop()


def test_a_stopping_server_does_not_wait_for_its_idle_connections(tmp_path: Path) -> None:
    server = start(tmp_path, threads=2)
    connections = [connect(server) for _ in range(2)]
    for connection in connections:
        mutate(connection)  # both threads now wait on these connections
    started = time.monotonic()
    os.kill(server.pid, signal.SIGTERM)
    code = server.stop()
    stopped_after = time.monotonic() - started
    for connection in connections:
        connection.close()
    assert code == 0
    # gunicorn lets kept-alive connections linger 2 s at a stop; a thread still waiting on one
    # would hold the worker until the 30 s graceful timeout.
    assert stopped_after < 15, f"stopped after {stopped_after:.1f} s\n{server.tail()}"


def test_an_idle_connection_is_closed_after_the_keepalive_timeout(tmp_path: Path) -> None:
    server = start(tmp_path, threads=2, keepalive=1)
    try:
        connection = connect(server)
        mutate(connection)
        waited_from = time.monotonic()
        assert connection.sock is not None
        connection.sock.settimeout(ANSWER_WITHIN)
        try:
            closed = connection.sock.recv(1) == b""
        except (TimeoutError, ConnectionResetError) as error:
            closed = isinstance(error, ConnectionResetError)
        idle_for = time.monotonic() - waited_from
        connection.close()
        assert closed, "the server kept an idle connection open past its keep-alive"
        assert 0.5 < idle_for < 5, f"closed after {idle_for:.2f} s of idleness, with --keepalive 1"
    finally:
        server.stop()


def test_requests_on_one_connection_are_answered_by_the_thread_waiting_on_it(tmp_path: Path) -> None:
    server = start(tmp_path, threads=1)
    try:
        connection = connect(server)
        # With one thread, the waiting thread is the only one there is: a hand-off bug would
        # show as a hang here, an accounting bug (a thread counted twice) as a refusal to wait.
        durations = [mutate(connection) for _ in range(50)]
        assert max(durations) < ANSWER_WITHIN
        connection.close()
        # And a second connection still gets that thread once the first one is idle.
        other = connect(server)
        assert mutate(other) < ANSWER_WITHIN
        other.close()
    finally:
        server.stop()
