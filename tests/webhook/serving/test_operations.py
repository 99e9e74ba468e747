"""Operations under load: certificate rotation with zero failed requests, graceful SIGTERM drain."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import threading
import time
from pathlib import Path

from reviews import body, pod, review
from webhookproc import LOOPBACK, REPO_ROOT, WebhookProcess, generate_certs

EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"
DEADLINE = 30.0
PAYLOAD = body(review(pod(resources={"nvidia.com/gpu": "1"})))


def serving_ca_subject(port: int, ca_bundle: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca_bundle))
    with context.wrap_socket(__import__("socket").create_connection((LOOPBACK, port), timeout=5),
                             server_hostname=LOOPBACK) as tls:
        return tls.getpeercert(binary_form=True) or b""


def test_rotation_while_a_load_runs_fails_no_request(tmp_path: Path) -> None:
    server = WebhookProcess(tmp_path / "server", serve_args=["--workers", "2", "--state", str(EXAMPLE_STATE)]).start()
    try:
        # Clients trust the old and the new CA during a rotation (the caBundle carries both), as
        # hack/install-self-managed-certs.sh arranges; only then can zero failures be asked for.
        next_certs = tmp_path / "next"
        generate_certs(next_certs)
        bundle = tmp_path / "bundle.crt"
        bundle.write_bytes(server.ca_file.read_bytes() + (next_certs / "ca.crt").read_bytes())
        context = ssl.create_default_context(cafile=str(bundle))
        stop = threading.Event()
        results: list[int | str] = []
        guard = threading.Lock()

        def load() -> None:
            while not stop.is_set():
                # A fresh connection every 20 requests: handshakes keep happening during the swap.
                connection = http.client.HTTPSConnection(LOOPBACK, server.port, timeout=10, context=context)
                try:
                    for _ in range(20):
                        connection.request("POST", "/mutate-pods", body=PAYLOAD,
                                           headers={"Content-Type": "application/json"})
                        answer = connection.getresponse()
                        outcome: int | str = answer.status
                        if json.loads(answer.read())["response"]["allowed"] is not True:
                            outcome = "not allowed"
                        with guard:
                            results.append(outcome)
                except (OSError, ValueError) as error:
                    with guard:
                        results.append(f"{type(error).__name__}: {error}")
                finally:
                    connection.close()

        threads = [threading.Thread(target=load) for _ in range(4)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + DEADLINE
        while True:  # the load runs before the swap
            with guard:
                if len(results) >= 100:
                    break
            assert time.monotonic() < deadline, "the load never got going"
            time.sleep(0.05)  # polling a condition with a deadline
        before = serving_ca_subject(server.port, bundle)
        for name in ("ca.crt", "ca.key", "tls.key", "tls.crt"):  # the key first, like a Secret update
            (next_certs / name).replace(server.cert_dir / name)
        deadline = time.monotonic() + DEADLINE
        while serving_ca_subject(server.port, bundle) == before:
            assert time.monotonic() < deadline, "the new certificate was never served"
            time.sleep(0.05)  # polling a condition with a deadline
        with guard:
            rotated_at = len(results)
        while True:  # keep the load on until as many requests ran after the swap as before it
            with guard:
                if len(results) >= 2 * rotated_at + 200:
                    break
            time.sleep(0.05)  # polling a condition with a deadline
        stop.set()
        for thread in threads:
            thread.join()
        failures = [r for r in results if r != 200]
        assert not failures, f"{len(failures)} of {len(results)} requests failed: {failures[:5]}\n{server.tail()}"
        assert rotated_at > 0
    finally:
        server.stop()


def server_receive_queue(server_port: int, client_port: int) -> int | None:
    """Bytes the kernel holds unread for the server's end of one connection (from /proc/net/tcp).

    0 means the server process has read what the client sent so far: the request is in a worker's
    hands, not waiting in the accept queue.
    """
    for line in Path("/proc/net/tcp").read_text(encoding="ascii").splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        remote_port = int(fields[2].split(":")[1], 16)
        if local_port == server_port and remote_port == client_port:
            return int(fields[4].split(":")[1], 16)
    return None


def test_sigterm_finishes_the_request_in_flight_then_exits(tmp_path: Path) -> None:
    server = WebhookProcess(tmp_path / "server", serve_args=["--workers", "1", "--state", str(EXAMPLE_STATE)]).start()
    connection = http.client.HTTPSConnection(LOOPBACK, server.port, timeout=20, context=server.ssl_context())
    # A request whose body is still arriving when the signal comes: it is in flight in a worker thread.
    connection.putrequest("POST", "/mutate-pods")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(len(PAYLOAD)))
    connection.endheaders(PAYLOAD[:100])
    client_port = connection.sock.getsockname()[1]
    deadline = time.monotonic() + DEADLINE
    while server_receive_queue(server.port, client_port) != 0:
        assert time.monotonic() < deadline, "the worker never read the request's first bytes"
        time.sleep(0.05)  # polling a condition with a deadline
    started = time.monotonic()
    os.kill(server.pid, signal.SIGTERM)
    connection.send(PAYLOAD[100:])
    answer = connection.getresponse()
    assert answer.status == 200
    assert json.loads(answer.read())["response"]["allowed"] is True
    connection.close()
    code = server.stop()
    assert code == 0
    assert time.monotonic() - started < 30  # within gunicorn's graceful_timeout (and the pod's grace period)
    assert "Handling signal: term" in server.log_text()
