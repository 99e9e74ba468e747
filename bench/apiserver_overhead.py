"""What the webhooks add to a pod create through a real kube-apiserver, local vs strict accounting.

Starts the test control plane (tests/controlplane.py; the binaries of hack/build-control-plane.sh),
then times sequential GPU pod creates (one client, keep-alive, raw JSON) three ways: no webhook
registered, the project's webhook configurations pointing at one ``gpuquota serve --accounting
local``, and at one ``--accounting strict``. Prints a Markdown table of p50/p90/p99 and the overhead
over the baseline. Usage: .venv/bin/python bench/apiserver_overhead.py [creates per mode, default 400]
[rounds, default 4]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
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
from controlplane import ControlPlane, locate_binaries, make_api, wait_for_crd_established  # noqa: E402
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
    accounting_of = {"no webhook": "", "webhooks, local accounting": "local", "webhooks, strict accounting": "strict"}
    modes = tuple(accounting_of)
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
        # Rounds alternate the three modes, so drift over the run (etcd growing, the machine's other
        # load) falls on all of them alike instead of on whichever ran last.
        for round_ in range(rounds):
            for mode in modes:
                accounting = accounting_of[mode]
                documents: list[dict[str, Any]] = []
                if accounting:
                    server = servers[accounting]
                    documents = local_webhook_configurations(server.url, server.ca_bundle,
                                                             name_suffix=f"-{uuid.uuid4().hex[:6]}")
                    register_webhook_configurations(api, documents)
                    wait_until_webhook_is_called(api, namespace)
                else:
                    deadline = time.monotonic() + 60
                    while mutated(api, namespace):  # configurations are dropped asynchronously
                        assert time.monotonic() < deadline
                        time.sleep(0.2)
                try:
                    tag = f"r{round_}-{accounting or 'base'}"
                    results[mode] += time_creates(api.core, namespace, count // rounds, tag)
                finally:
                    delete_webhook_configurations(api, documents)
    finally:
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
