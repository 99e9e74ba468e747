"""Admission throughput and latency over TLS + keep-alive: gpuquota serve vs a Go stdlib reference.

A third server, bench/floor_server.py, is a no-op WSGI app under the product's own gunicorn
settings: the distance from it to Go is the server stack's, from the product to it the product's
code. The closed-loop table ends with each round's ratios to Go at 8 connections.

Run with ``make bench`` (bench/run.sh). Needs wrk (Debian: ``apt-get install wrk``) and Go.
Prints two Markdown tables; docs/benchmarks.md holds a recorded run:

- closed loop: wrk at 1, 8 and 32 connections, as fast as the server answers (throughput);
- fixed rate: bench/loadgen, open loop at BENCH_RATES req/s (default 1000) over 8 connections,
  each request's latency timed from its scheduled send time, so queueing behind a slow response
  counts (wrk's percentiles leave it out: coordinated omission).

BENCH_DURATION (default 10s) is each row's measured time; BENCH_WARMUP (default 2s) precedes
each fixed-rate row at the same rate. BENCH_ROUNDS (default 1) repeats both tables' rows, the
servers alternating within each round: on a shared VM one run's tail latency can be three times
the next one's, so a result worth quoting is the median over rounds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The checkout's packages first: tests/webhook (the tests of the webhook's wings) would otherwise be
# found as a namespace package named webhook before the installed package's finder is asked.
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from controlplane import free_ports  # noqa: E402  (tests/controlplane.py)
from goreference import build_go_reference  # noqa: E402

from webhook.serving.settings import Settings  # noqa: E402

BIN = ROOT / ".venv" / "bin"
CONNECTIONS = (1, 8, 32)
DURATION = os.environ.get("BENCH_DURATION", "10s")
WARMUP = os.environ.get("BENCH_WARMUP", "2s")
RATES = tuple(int(rate) for rate in os.environ.get("BENCH_RATES", "1000").split(","))
FIXED_RATE_CONNECTIONS = 8
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1"))


def review(padding_vars: int = 60) -> dict[str, object]:
    """A realistic ~6 KB pod review: env, volumes, labels, probes, two whole cards.

    In team-vision, so /validate-pods makes a whole quota decision (the leaf and its parent
    ml-platform of examples/cluster). A dry run, so every call makes the same decision: offline no
    watch confirms a reservation, and real ones would pile up until the per-caller bound refused.
    """
    env = [{"name": f"TRAINER_SETTING_{i}", "value": f"value-{i}-" + "x" * 40} for i in range(padding_vars)]
    container = {"name": "trainer", "image": "registry.example/ml/trainer:2026.11.3", "env": env,
                 "command": ["python", "-m", "trainer", "--config", "/etc/trainer/config.yaml"],
                 "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"},
                               "limits": {"memory": "64Gi", "nvidia.com/gpu": "2"}},
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "cfg", "mountPath": "/etc/trainer"}]}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "trainer-0", "namespace": "team-vision",
                        "labels": {"app": "trainer", "team": "vision"}},
           "spec": {"containers": [container], "volumes": [{"name": "data", "emptyDir": {}},
                                                            {"name": "cfg", "configMap": {"name": "trainer"}}]}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "bench-uid", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": "team-vision", "operation": "CREATE", "userInfo": {"username": "bench"},
                        "object": pod, "dryRun": True}}


def check_answer(url: str, body: Path, ca: Path, *, patched: bool) -> None:
    """Stop unless the endpoint admits the review (with a patch, for a mutating one): wrk counts
    HTTP statuses only, and a denial is a 200 too."""
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(url, data=body.read_bytes(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as reply:
        response = json.load(reply)["response"]
    if not response["allowed"] or ("patch" in response) != patched:
        raise SystemExit(f"bench: {url} did not answer as the benchmark assumes: {response}")


def wait_healthy(url: str, ca: Path, *, any_status: bool = False) -> None:
    """Until ``url`` answers 2xx over verified TLS (any HTTP status with ``any_status``)."""
    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, context=context, timeout=2):
                return
        except urllib.error.HTTPError:
            if any_status:
                return
            time.sleep(0.2)
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def tree_pids(root: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(root)], capture_output=True, text=True).stdout
    children = [int(p) for p in out.split()]
    return [root] + [q for c in children for q in tree_pids(c)]


def cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return total / ticks


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def vm_cpu_ticks() -> tuple[int, int]:
    """(steal, total) clock ticks of the whole VM so far, from /proc/stat's first line."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user.
    return fields[7], sum(fields[:8])


def connections_per_process(port: int) -> list[int]:
    """How many established connections to ``port`` each server process holds, fewest first: the
    kernel hashes each new connection to one worker's SO_REUSEPORT socket, and a worker keeps it."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True).stdout
    held: dict[str, int] = {}
    for pid in re.findall(r"pid=(\d+)", out):
        held[pid] = held.get(pid, 0) + 1
    return sorted(held.values())


def _seconds(duration: str) -> float:
    """wrk's duration ("10s", "2m") in seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]] if duration[-1] in units else float(duration)


def wrk(url: str, connections: int, body: Path) -> dict[str, Any]:
    threads = min(connections, 2)
    steal_before, total_before = vm_cpu_ticks()
    run = subprocess.Popen(["wrk", "-t", str(threads), "-c", str(connections), "-d", DURATION, "--latency",
                            "-s", str(ROOT / "bench" / "post.lua"), url],
                           stdout=subprocess.PIPE, text=True, env={**os.environ, "BODY_FILE": str(body)})
    # wrk opens every connection before its first request; one second in, all are established.
    # Sampled again a second before the end, to show where the kernel's hash left them.
    port = urllib.parse.urlsplit(url).port or 443
    spreads: list[str] = []
    for wait in (1.0, max(_seconds(DURATION) - 2.0, 0.0)):
        try:
            run.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            spreads.append("-".join(map(str, connections_per_process(port))))
    out, _ = run.communicate()
    if run.returncode:
        raise SystemExit(f"bench: wrk failed on {url} (exit {run.returncode})")
    steal_after, total_after = vm_cpu_ticks()
    def latency(label: str) -> float:
        match = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)", out, re.M)
        assert match, out
        value, unit = float(match[1]), match[2]
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value
    requests = int(re.search(r"(\d+) requests in", out)[1])  # type: ignore[index]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1]), "p50": latency("50"),  # type: ignore[index]
            "p99": latency("99"), "requests": requests, "non2xx": int(errors[1]) if errors else 0,
            "steal": 100 * (steal_after - steal_before) / max(total_after - total_before, 1),
            "spread": " → ".join(dict.fromkeys(spreads)) or "?"}


Results = dict[tuple[str, str, int], dict[str, Any]]


def measure(name: str, url: str, pid: int, body: Path, throughput: Results) -> list[str]:
    """One closed-loop row per connection count; wrk's results also go to ``throughput`` for the ratios."""
    rows = []
    for connections in CONNECTIONS:
        pids = tree_pids(pid)
        before = cpu_seconds(pids)
        result = wrk(url, connections, body)
        used = cpu_seconds(tree_pids(pid)) - before
        throughput[(name, url, connections)] = result
        rows.append(f"| {name} | {url.rsplit('/', 1)[1]} | {connections} | {result['rps']:.0f} | {result['p50']:.2f} | "
                    f"{result['p99']:.2f} | {1e6 * used / max(result['requests'], 1):.0f} | "
                    f"{rss_mib(tree_pids(pid)):.0f} | {result['non2xx']} | {result['steal']:.1f} | "
                    f"{result['spread']} |")
    return rows


def loadgen(binary: Path, url: str, rate: int, body: Path, ca: Path) -> dict[str, Any]:
    out = subprocess.run([binary, "-url", url, "-body", body, "-ca", ca, "-rate", str(rate), "-duration", DURATION,
                          "-warmup", WARMUP, "-connections", str(FIXED_RATE_CONNECTIONS)],
                         capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def measure_fixed_rate(name: str, url: str, pid: int, body: Path, binary: Path, ca: Path) -> list[str]:
    rows = []
    for rate in RATES:
        before = cpu_seconds(tree_pids(pid))
        result = loadgen(binary, url, rate, body, ca)
        used = cpu_seconds(tree_pids(pid)) - before
        # The CPU readings span the warm-up too, so they are shared over its requests as well.
        served = max(result["completed"] + result["warmup_completed"], 1)
        latency, errors = result["latency_ms"], result["errors"]
        rows.append(f"| {name} | {url.rsplit('/', 1)[1]} | {rate} | {result['achieved_rate']:.0f} | "
                    f"{latency['p50']:.2f} | {latency['p90']:.2f} | {latency['p99']:.2f} | {latency['p99.9']:.2f} | "
                    f"{latency['max']:.2f} | {errors['transport']}/{errors['non_2xx']}/{result['dropped']} | "
                    f"{1e6 * used / served:.0f} | {1e6 * result['loadgen_cpu_s'] / served:.0f} | "
                    f"{result['max_send_lag_ms']:.1f} |")
    return rows


def main() -> None:
    if not shutil.which("wrk"):
        raise SystemExit("bench: wrk not found (Debian: apt-get install wrk)")
    # Free ports, not fixed ones: gunicorn binds with SO_REUSEPORT, so a second bench's server on a
    # fixed port would share it silently and the kernel would spread both benches' connections over both.
    floor_port, ours_port, go_port = free_ports(3)
    ours_url, floor_url, go_url = (f"https://127.0.0.1:{port}" for port in (ours_port, floor_port, go_port))
    work = Path(tempfile.mkdtemp(prefix="gpuquota-bench-"))
    body = work / "review.json"
    body.write_text(json.dumps(review()))
    certs = work / "certs"
    subprocess.run([BIN / "gpuquota", "certs", "generate", "--out", certs, "--dns", "localhost", "--ip", "127.0.0.1"],
                   check=True, capture_output=True)
    goref = build_go_reference(work / "go-reference")
    generator = work / "loadgen"
    subprocess.run(["go", "build", "-o", generator, "."], cwd=ROOT / "bench" / "loadgen", check=True)
    servers = [
        subprocess.Popen([BIN / "gpuquota", "serve", "--state", ROOT / "examples" / "cluster", "--cert-dir", certs,
                          "--port", str(ours_port), "--log-level", "warning"], start_new_session=True),
        subprocess.Popen([goref, "-addr", f"127.0.0.1:{go_port}", "-cert", certs / "tls.crt",
                          "-key", certs / "tls.key"], start_new_session=True),
        subprocess.Popen([BIN / "python", ROOT / "bench" / "floor_server.py", certs, str(floor_port)],
                         start_new_session=True),
    ]
    try:
        wait_healthy(f"{ours_url}/readyz", certs / "ca.crt")
        wait_healthy(f"{floor_url}/readyz", certs / "ca.crt")  # the floor app answers any path
        wait_healthy(f"{go_url}/", certs / "ca.crt", any_status=True)  # the Go reference 404s a GET /
        for url, patched in ((f"{ours_url}/mutate-pods", True),
                             (f"{ours_url}/validate-pods", False),
                             (f"{go_url}/mutate-pods", True)):
            check_answer(url, body, certs / "ca.crt", patched=patched)
        print(f"body: {body.stat().st_size} bytes; {DURATION} per row; {os.cpu_count()} cores; wrk on the same host")
        print("| round | server | endpoint | connections | req/s | p50 ms | p99 ms | server CPU µs/req "
              "| server RSS MiB | non-2xx | VM steal % | connections per process (1 s in → 1 s before the end) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        defaults = Settings()  # what `gpuquota serve` runs with no flags, as here
        ours = f"gpuquota (gunicorn gthread {defaults.workers}x{defaults.threads})"
        floor, go = "floor: no-op app, same gunicorn", "Go stdlib reference"
        targets = [(ours, f"{ours_url}/mutate-pods", servers[0].pid),
                   (ours, f"{ours_url}/validate-pods", servers[0].pid),
                   (floor, f"{floor_url}/mutate-pods", servers[2].pid),
                   (go, f"{go_url}/mutate-pods", servers[1].pid)]
        ratios = []
        for round_ in range(1, ROUNDS + 1):
            throughput: Results = {}
            print("\n".join(f"| {round_} {row}" for name, url, pid in targets
                            for row in measure(name, url, pid, body, throughput)), flush=True)
            reference = throughput[(go, targets[3][1], 8)]["rps"]
            ratios.append(f"| {round_} | " + " | ".join(
                f"{100 * row['rps'] / reference:.0f} % ({row['spread']}, steal {row['steal']:.1f} %)"
                for row in (throughput[(name, url, 8)] for name, url, _pid in targets[:3]))
                + f" | {throughput[(go, targets[3][1], 8)]['steal']:.1f} % |")
        print("\nthroughput at 8 connections as a share of the Go reference's in the same round "
              "(in brackets: connections per worker, VM steal during the row)")
        print("| round | gpuquota mutate-pods | gpuquota validate-pods | floor (no-op app) | Go row's steal |")
        print("|---|---|---|---|---|")
        print("\n".join(ratios), flush=True)
        print(f"\nfixed rate (open loop): bench/loadgen, {FIXED_RATE_CONNECTIONS} keep-alive HTTP/1.1 connections, "
              f"{WARMUP} warm-up then {DURATION} per row; latency from each request's scheduled send time; "
              "loadgen on the same host")
        print("| round | server | endpoint | target req/s | achieved req/s | p50 ms | p90 ms | p99 ms | p99.9 ms "
              "| max ms | errors (transport/non-2xx/dropped) | server CPU µs/req | loadgen CPU µs/req "
              "| loadgen max lag ms |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        ca = certs / "ca.crt"
        for round_ in range(1, ROUNDS + 1):
            print("\n".join(f"| {round_} {row}" for name, url, pid in targets
                            for row in measure_fixed_rate(name, url, pid, body, generator, ca)), flush=True)
    finally:
        for server in servers:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
