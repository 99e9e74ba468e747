"""What the webhooks add to a pod create through a real kube-apiserver, local vs strict accounting.

Starts the test control plane (tests/controlplane.py; the binaries of hack/build-control-plane.sh),
then times sequential GPU pod creates (one client, keep-alive, raw JSON): no webhook registered;
only the mutating configuration, pointing at bench/go-reference or at ``gpuquota serve`` (the two
split what one webhook call costs between the apiserver and the server); and the project's
configurations pointing at one ``gpuquota serve --accounting local`` or ``--accounting strict``.
The modes alternate in rounds. Prints a Markdown table of p50/p90/p99 and the overhead.

Usage: .venv/bin/python bench/apiserver_overhead.py [creates per mode, default 400] [rounds, default 4]
"""

from __future__ import annotations

import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import yaml  # noqa: E402
from admissionchain import (  # noqa: E402
    delete_webhook_configurations,
    local_webhook_configurations,
    register_webhook_configurations,
    wait_until_webhook_is_called,
)
from controlplane import ControlPlane, free_ports, locate_binaries, make_api, wait_for_crd_established  # noqa: E402
from kubernetes import client as k8s  # noqa: E402
from webhookproc import WebhookProcess  # noqa: E402

RATIO = "koordinator.sh/gpu-memory-ratio"
WARMUP = 30


def gpu_pod(name: str) -> dict[str, Any]:
    gpu = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"quota.scheduling.koordinator.sh/name": "bench"}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/train:1",
                                     "resources": {"requests": gpu, "limits": gpu}}]}}


def time_creates(core: k8s.CoreV1Api, namespace: str, count: int, tag: str) -> list[float]:
    samples = []
    for index in range(WARMUP + count):
        body = gpu_pod(f"{tag}-{index}")
        started = time.perf_counter()
        core.create_namespaced_pod(namespace, body, _preload_content=False)
        elapsed = time.perf_counter() - started
        if index >= WARMUP:
            samples.append(elapsed * 1000)
    return samples


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


GO_PROCESSES: list[subprocess.Popen[bytes]] = []


def start_go_reference(work: Path, cert_dir: Path) -> str:
    """bench/go-reference (net/http + crypto/tls, the same whole-card rewrite) on a free port."""
    binary = work / "go-reference"
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=ROOT / "bench" / "go-reference", check=True)
    port = free_ports(1)[0]
    GO_PROCESSES.append(subprocess.Popen([str(binary), "-addr", f"127.0.0.1:{port}", "-cert",
                                          str(cert_dir / "tls.crt"), "-key", str(cert_dir / "tls.key")],
                                         stderr=subprocess.DEVNULL))
    url = f"https://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/mutate-pods", timeout=2, context=context)
        except urllib.error.HTTPError:
            return url  # it answers (400 for an empty body): up
        except OSError:
            assert time.monotonic() < deadline, "the Go reference did not start"
            time.sleep(0.1)


def mutated(api: Any, namespace: str) -> bool:
    stored = api.core.create_namespaced_pod(namespace, gpu_pod("probe"), dry_run="All")
    return "koordinator.sh/gpu-core" in (stored.spec.containers[0].resources.requests or {})


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    work = Path(tempfile.mkdtemp(prefix="gpuquota-bench-overhead-"))
    plane = ControlPlane(locate_binaries(), base_dir=work / "cp")
    plane.start()
    api = make_api(plane.kubeconfig_path)
    # mode -> (server, which configurations): the two mutating-only modes split the overhead of one
    # webhook call between the apiserver (the Go reference's row) and this server (the difference).
    plan = {"no webhook": ("", ""), "mutating only, Go stdlib reference": ("go", "mutating"),
            "mutating only, gpuquota": ("local", "mutating"), "webhooks, local accounting": ("local", "all"),
            "webhooks, strict accounting": ("strict", "all")}
    modes = tuple(plan)
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    servers: dict[str, WebhookProcess] = {}
    try:
        crd = yaml.safe_load((ROOT / "manifests/base/crd-elasticquota.yaml").read_text(encoding="utf-8"))
        api.apiextensions.create_custom_resource_definition(crd)
        wait_for_crd_established(api.apiextensions, crd["metadata"]["name"])
        namespace = "bench"
        api.core.create_namespace({"metadata": {"name": namespace}})
        api.custom.create_namespaced_custom_object("scheduling.sigs.k8s.io", "v1alpha1", namespace, "elasticquotas", {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": "bench", "namespace": namespace},
            "spec": {"max": {RATIO: str(100 * 10 * (count + WARMUP) * len(modes)),
                             "koordinator.sh/gpu-core": "100000000"}}})
        for accounting in ("local", "strict"):
            servers[accounting] = WebhookProcess(work / accounting, serve_args=[
                "--kubeconfig", str(plane.kubeconfig_path), "--accounting", accounting,
                "--ledger-namespace", namespace]).start()
        go_url = start_go_reference(work, servers["local"].cert_dir)
        # Rounds alternate the three modes, so drift over the run (etcd growing, the machine's other
        # load) falls on all of them alike instead of on whichever ran last.
        for round_ in range(rounds):
            for mode in modes:
                target, which = plan[mode]
                documents: list[dict[str, Any]] = []
                if target:
                    url = go_url if target == "go" else servers[target].url
                    ca_bundle = servers["local" if target == "go" else target].ca_bundle  # Go serves local's cert
                    documents = local_webhook_configurations(url, ca_bundle,
                                                             name_suffix=f"-{uuid.uuid4().hex[:6]}")
                    if which == "mutating":
                        documents = [d for d in documents if d["kind"] == "MutatingWebhookConfiguration"]
                    register_webhook_configurations(api, documents)
                    wait_until_webhook_is_called(api, namespace)
                else:
                    deadline = time.monotonic() + 60
                    while mutated(api, namespace):  # configurations are dropped asynchronously
                        assert time.monotonic() < deadline
                        time.sleep(0.2)
                try:
                    tag = f"r{round_}-{modes.index(mode)}"
                    results[mode] += time_creates(api.core, namespace, count // rounds, tag)
                finally:
                    delete_webhook_configurations(api, documents)
    finally:
        for process in GO_PROCESSES:
            process.terminate()
        for server in servers.values():
            server.stop()
        api.close()
        plane.stop()
    base = statistics.median(results["no webhook"])
    print(f"{count} sequential creates per mode in {rounds} alternating rounds (each after {WARMUP} warm-up), "
          f"one client, keep-alive\n")
    print("| mode | p50 ms | p90 ms | p99 ms | p50 overhead ms |")
    print("|---|---|---|---|---|")
    for mode, samples in results.items():
        p50 = statistics.median(samples)
        print(f"| {mode} | {p50:.2f} | {percentile(samples, 0.9):.2f} | {percentile(samples, 0.99):.2f} | "
              f"{p50 - base:+.2f} |")
    (work / "samples.json").write_text(json.dumps(results), encoding="utf-8")
    print(f"\nsamples: {work / 'samples.json'}")


if __name__ == "__main__":
    main()
