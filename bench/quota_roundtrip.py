"""The round trip from a worker to the quota service, without HTTP: calls/s and CPU per call.

Starts the quota service as ``gpuquota serve`` does (a fresh interpreter on a private Unix
socket, offline state from examples/cluster) and calls ``admit_pod`` (a dry run, so nothing is
reserved and every call is the same decision) from THREADS threads of this process, each on its
own connection as a gunicorn worker's threads are, for SECONDS seconds.

    .venv/bin/python bench/quota_roundtrip.py [THREADS] [SECONDS] [ROUNDS]    # defaults: 4 8 2

Two kinds of admission in the same run, alternating over ROUNDS rounds of SECONDS each: a plain
pod, and a member of a gang of two (whose decision reads its gang and the room its whole
minimum takes). Prints one line per kind and round: calls/s, this process's CPU per call (the
worker's side) and the service process's CPU per call. Compare runs of two versions in the same
session, alternating.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuquota_core.pod_admission import PodAdmission  # noqa: E402
from webhook.quota.client import QuotaClient  # noqa: E402
from webhook.quota.options import QuotaServiceOptions  # noqa: E402
from webhook.quota.service import private_socket_path, start_service_process  # noqa: E402

ADMISSION = PodAdmission(
    uid="bench", operation="CREATE", namespace="team-vision", name="bench", pod_uid="", labels={},
    canonical_requests={"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200",
                        "cpu": "4", "memory": "16Gi"},
    dry_run=True)
GANG_MEMBER = dataclasses.replace(ADMISSION, gang_annotations={
    "gang.scheduling.koordinator.sh/name": "bench", "gang.scheduling.koordinator.sh/min-available": "2"})


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(client: QuotaClient, service_pid: int, kind: str, admission: PodAdmission, threads: int,
            seconds: float) -> None:
    calls = [0] * threads
    stop_at = time.monotonic() + seconds

    def call(index: int) -> None:
        count = 0
        while time.monotonic() < stop_at:
            if not client.admit_pod(admission).allowed:
                raise SystemExit(f"the benchmark's admission ({kind}) was refused")
            count += 1
        calls[index] = count

    own, theirs = time.process_time(), process_cpu_seconds(service_pid)
    workers = [threading.Thread(target=call, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    total = sum(calls)
    print(f"{kind:<12} threads={threads} calls/s {total / seconds:,.0f}  "
          f"client CPU/call {1e6 * (time.process_time() - own) / total:.0f} us  "
          f"service CPU/call {1e6 * (process_cpu_seconds(service_pid) - theirs) / total:.0f} us", flush=True)


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
    path = private_socket_path()
    service = start_service_process(path, QuotaServiceOptions(state_path=ROOT / "examples" / "cluster"))
    try:
        client = QuotaClient(path)
        deadline = time.monotonic() + 30
        while not client.ready()[0]:
            if time.monotonic() > deadline:
                raise SystemExit("quota service did not become ready within 30 s")
            time.sleep(0.05)
        rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
        for _ in range(rounds):
            for kind, admission in (("plain pod", ADMISSION), ("gang member", GANG_MEMBER)):
                measure(client, service.pid, kind, admission, threads, seconds)
    finally:
        service.terminate()
        service.wait(timeout=10)


if __name__ == "__main__":
    main()
