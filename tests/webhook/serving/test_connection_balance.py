"""Workers shed connections beyond their share, so the kernel's hash gets another try.

The rule and the shared table are tested directly; then a real ``gpuquota serve`` with two
workers is given a spread the kernel would rarely choose (every connection on one worker) by a
client that keeps only the connections landing there, and must even it out once the client
behaves like the API server (reconnecting whenever an answer says ``Connection: close``).
"""

from __future__ import annotations

import http.client
import multiprocessing
import re
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reviews import body, pod, review
from webhookproc import LOOPBACK, REPO_ROOT, WebhookProcess

from webhook.serving.connection_balance import (
    CHECK_INTERVAL,
    SHED_INTERVAL_SECONDS,
    ConnectionTable,
    Shedder,
    over_share,
)

EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"
REVIEW = body(review(pod()))


@pytest.mark.parametrize(("mine", "everyone", "expected"), [
    (8, [8, 0], True),  # all on one of two
    (5, [5, 3], True),  # share 4
    (4, [4, 4], False),
    (5, [5, 4], False),  # 9 on two: share 5
    (3, [3, 2, 2, 1], True),  # share 2
    (2, [2, 2, 2, 2], False),
    (2, [2, 0, 0, 0], True),  # share 1
    (1, [1, 0, 0, 0], False),  # one connection is where it is
    (9, [9], False),  # one worker has nobody to give connections to
    (0, [0, 0], False),
])
def test_a_worker_is_over_its_share_above_the_even_spread_rounded_up(mine: int, everyone: list[int],
                                                                       expected: bool) -> None:
    assert over_share(mine, everyone) is expected


def test_the_table_hands_out_each_slot_once_and_counts_only_slots_in_use() -> None:
    table = ConnectionTable(slots=3)
    slots = [table.claim(), table.claim(), table.claim()]
    assert sorted(s for s in slots if s is not None) == [0, 1, 2]
    assert table.claim() is None
    table.publish(0, 5)
    table.publish(2, 1)
    assert table.counts() == [5, 0, 1]
    table.release(1)
    assert table.counts() == [5, 1]
    assert table.held(0) == 5 and table.held(2) == 1
    assert table.claim() == 1
    assert table.counts() == [5, 0, 1]


def _publish_in_child(table: ConnectionTable, slot: int) -> None:
    table.publish(slot, 7)


def test_a_forked_worker_publishes_into_the_masters_table() -> None:
    table = ConnectionTable(slots=2)
    slot = table.claim()
    assert slot is not None
    child = multiprocessing.get_context("fork").Process(target=_publish_in_child, args=(table, slot))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert table.counts() == [7]


def test_a_worker_sheds_once_it_stays_over_its_share_and_then_once_per_interval() -> None:
    table = ConnectionTable(slots=2)
    mine, other = table.claim(), table.claim()
    assert mine is not None and other is not None
    now = [100.0]
    shedder = Shedder(table, mine, clock=lambda: now[0])

    def holding(connections: int) -> bool:
        shedder.publish(connections)  # as the worker's main thread does
        return shedder.should_close()

    table.publish(other, 3)
    assert holding(3) is False  # 3 of 6: the share
    table.publish(other, 0)
    now[0] += 0.2
    assert holding(6) is False  # 6 of 6 (share 3), but seen for the first time
    now[0] += CHECK_INTERVAL / 2
    assert holding(6) is False  # the table is not looked at again this soon
    now[0] += SHED_INTERVAL_SECONDS
    assert holding(6) is True  # still over a second later
    now[0] += 0.2
    assert holding(6) is False  # too soon after the last one
    now[0] += SHED_INTERVAL_SECONDS
    assert holding(5) is True
    table.publish(other, 4)
    now[0] += SHED_INTERVAL_SECONDS
    assert holding(5) is False  # 5 of 9: share 5
    table.publish(other, 0)
    now[0] += SHED_INTERVAL_SECONDS
    assert holding(6) is False  # over again: it must last another interval first


# --- a real server -----------------------------------------------------------------------------

@pytest.fixture()
def two_workers(tmp_path: Path) -> Iterator[WebhookProcess]:
    server = WebhookProcess(tmp_path, serve_args=["--state", str(EXAMPLE_STATE), "--workers", "2"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def worker_of(server_port: int, connection: http.client.HTTPSConnection) -> int:
    """The pid of the server process holding the other end of ``connection``."""
    assert connection.sock is not None
    client_port = connection.sock.getsockname()[1]
    out = subprocess.run(["ss", "-tnpH", "state", "established",
                          f"( sport = :{server_port} and dport = :{client_port} )"],
                         capture_output=True, text=True, check=True).stdout
    [pid] = re.findall(r"pid=(\d+)", out)
    return int(pid)


def spread(server_port: int) -> list[int]:
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{server_port} )"],
                         capture_output=True, text=True, check=True).stdout
    held: dict[str, int] = {}
    for pid in re.findall(r"pid=(\d+)", out):
        held[pid] = held.get(pid, 0) + 1
    return sorted(held.values())


def admit(connection: http.client.HTTPSConnection) -> bool:
    """Send one review; whether the server keeps the connection open afterwards."""
    connection.request("POST", "/mutate-pods", REVIEW, {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    response.read()
    return response.getheader("Connection", "").lower() != "close"


def test_connections_piled_on_one_worker_are_spread_out(two_workers: WebhookProcess) -> None:
    port, context = two_workers.port, two_workers.ssl_context()

    def connect() -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(LOOPBACK, port, context=context, timeout=10)

    # An adversarial client: keep only the connections the kernel hashed to one worker.
    piled: list[http.client.HTTPSConnection] = []
    crowded = 0
    deadline = time.monotonic() + 60
    while len(piled) < 5 and time.monotonic() < deadline:
        connection = connect()
        kept = admit(connection)
        pid = worker_of(port, connection) if kept else 0
        crowded = crowded or pid
        if kept and pid == crowded:
            piled.append(connection)
        else:
            connection.close()
    assert len(piled) == 5, "could not put 5 connections on one worker"

    # Now the API server's behaviour: use every connection, replace each one the server closes.
    sheds = 0
    connections = piled
    while time.monotonic() < deadline:
        held = spread(port)
        if sheds and len(held) == 2 and max(held) <= -(-sum(held) // 2):
            break
        for index, connection in enumerate(connections):
            if not admit(connection):
                sheds += 1
                connection.close()
                connections[index] = connect()
    held = spread(port)
    assert sheds >= 1 and len(held) == 2 and max(held) <= -(-sum(held) // 2), (sheds, held)
    for connection in connections:
        connection.close()

    status, metrics = two_workers.get("/metrics")
    assert status == 200
    [shed_total] = re.findall(rb"^gpuquota_connections_shed_total ([0-9.e+]+)$", metrics, re.MULTILINE)
    assert float(shed_total) >= sheds


def test_a_single_connection_is_never_closed(two_workers: WebhookProcess) -> None:
    """One connection is the even share wherever it lands; a busy one must keep its TLS session."""
    context: ssl.SSLContext = two_workers.ssl_context()
    connection = http.client.HTTPSConnection(LOOPBACK, two_workers.port, context=context, timeout=10)
    started = time.monotonic()
    while time.monotonic() - started < 2.5 * SHED_INTERVAL_SECONDS:  # long enough to shed twice
        assert admit(connection)
    connection.close()
