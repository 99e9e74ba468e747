"""How wrk's kept-alive connections fall on the workers, and what shedding does about it.

Starts ``gpuquota serve`` on the example cluster with ``--workers N``, then runs wrk against
``/validate-pods`` ROWS times (8 connections, ``BENCH_DURATION`` each, default 10s) and prints, per
row, the throughput, the connections per worker one second in and a second before the end (as
``make bench`` does, from ``ss``), and how many connections the workers shed during the row
(``gpuquota_connections_shed_total``; see webhook/serving/connection_balance.py).

Usage: .venv/bin/python bench/connection_spread.py [workers, default 2] [rows, default 12]
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # bench/run.py: the review, wrk and the spread, as make bench measures them


def shed_total(url: str, ca: Path) -> float:
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"{url}/metrics", context=context, timeout=10) as reply:
        text = reply.read().decode()
    match = re.search(r"^gpuquota_connections_shed_total ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match[1]) if match else 0.0


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    work = Path(tempfile.mkdtemp(prefix="gpuquota-bench-spread-"))
    body = work / "review.json"
    body.write_text(json.dumps(run.review()))
    certs = work / "certs"
    subprocess.run([run.BIN / "gpuquota", "certs", "generate", "--out", certs, "--dns", "localhost",
                    "--ip", "127.0.0.1"], check=True, capture_output=True)
    [port] = run.free_ports(1)
    url = f"https://127.0.0.1:{port}"
    server = subprocess.Popen([run.BIN / "gpuquota", "serve", "--state", run.ROOT / "examples" / "cluster",
                               "--cert-dir", certs, "--port", str(port), "--log-level", "warning",
                               "--workers", str(workers)], start_new_session=True)
    try:
        run.wait_healthy(f"{url}/readyz", certs / "ca.crt")
        print(f"{workers} workers, wrk with 8 connections, {run.DURATION} per row")
        print("| row | req/s | connections per worker (1 s in → 1 s before the end) | shed during the row |")
        print("|---|---|---|---|")
        shed_before = shed_total(url, certs / "ca.crt")
        for row in range(1, rows + 1):
            result = run.wrk(f"{url}/validate-pods", 8, body)
            shed_after = shed_total(url, certs / "ca.crt")
            print(f"| {row} | {result['rps']:.0f} | {result['spread']} | {shed_after - shed_before:.0f} |", flush=True)
            shed_before = shed_after
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
