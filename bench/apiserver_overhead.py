"""What the webhooks add to a pod create through a real kube-apiserver, local vs strict accounting.

Starts the test control plane (tests/controlplane.py; the binaries of hack/build-control-plane.sh),
one ``gpuquota serve --accounting local``, one ``--accounting strict`` and bench/go-reference, and
gives every mode its own namespace, selected by the webhook configurations' ``namespaceSelector``:

- ``none``: no webhook applies;
- ``go-mutating`` / ``gpuquota-mutating``: only a mutating configuration, pointing at the Go
  reference or at the local ``gpuquota serve`` (the pair splits what one webhook call costs
  between the apiserver and the server);
- ``go-both``: the project's mutating and validating configurations, pointing at the Go reference
  (whose validating path only decodes and allows): the floor of a create that passes two webhooks;
- ``local`` / ``strict``: the project's mutating and validating configurations, pointing at the
  local or the strict server.

Then it times sequential creates of a one-card ``nvidia.com/gpu`` pod over one kept-alive
connection, one create per mode per cycle in a shuffled order, so drift (etcd growing, other load
on the machine) falls on every mode alike and each mode's overhead is the median of its paired
differences against ``none`` in the same cycle. Prints a Markdown table.

To weigh a change to the local server, ``--baseline CHECKOUT`` adds the mode ``baseline``: one more
local server, running the code of another checkout of this repository (say a ``git worktree`` of
the commit before the change; same virtualenv, run from that checkout's directory with it first on
PYTHONPATH), timed in the same cycles as ``local``. ``--modes`` limits the run to some modes (``none`` always runs).

Usage: .venv/bin/python bench/apiserver_overhead.py [cycles, default 400] [workers, default the server's]
       [--baseline CHECKOUT] [--modes none,local,baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from admissionchain import (  # noqa: E402
    local_webhook_configurations,
    register_webhook_configurations,
    wait_until_webhook_is_called,
)
from controlplane import (  # noqa: E402
    ControlPlane,
    create_canonical_gpu_node,
    install_elasticquota_crd,
    locate_binaries,
    make_api,
)
from goreference import GoReference, start_go_reference  # noqa: E402
from kubernetes import client as k8s  # noqa: E402
from webhookproc import WebhookProcess  # noqa: E402

RATIO = "koordinator.sh/gpu-memory-ratio"
WARMUP = 30


def gpu_pod(name: str, namespace: str) -> dict[str, Any]:
    """A one-card pod charged to its namespace's quota (quota names are cluster-wide: one per namespace)."""
    gpu = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"quota.scheduling.koordinator.sh/name": namespace}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/train:1",
                                     "resources": {"requests": gpu, "limits": gpu}}]}}


MODE_LABEL = "gpuquota-bench-mode"
# mode -> (server, which configurations); the namespace of a mode is "bench-<mode>".
PLAN = {"none": ("", ""), "go-mutating": ("go", "mutating"), "gpuquota-mutating": ("local", "mutating"),
        "go-both": ("go", "all"), "local": ("local", "all"), "strict": ("strict", "all")}
TITLES = {"none": "no webhook", "go-mutating": "mutating only, Go stdlib reference",
          "gpuquota-mutating": "mutating only, gpuquota",
          "go-both": "both webhooks, Go stdlib reference (validating: decode and allow)",
          "local": "webhooks, local accounting",
          "strict": "webhooks, strict accounting",
          "baseline": "webhooks, local accounting, baseline checkout"}


def create_pod(core: k8s.CoreV1Api, namespace: str, name: str) -> float:
    """One create, in ms. The response is read to the end, so urllib3 keeps the connection for the next."""
    started = time.perf_counter()
    response = core.create_namespaced_pod(namespace, gpu_pod(name, namespace), _preload_content=False)
    response.read()
    elapsed = time.perf_counter() - started
    response.release_conn()
    if response.status != 201:
        raise SystemExit(f"create in {namespace} answered {response.status}")
    return elapsed * 1000


def passive_opens() -> int:
    """TCP connections this host accepted so far (/proc/net/snmp), to show the client reuses its one."""
    header, values = (line.split() for line in Path("/proc/net/snmp").read_text().splitlines()
                      if line.startswith("Tcp:"))
    return int(dict(zip(header, values, strict=True))["PassiveOpens"])


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def mutated(api: Any, namespace: str) -> bool:
    stored = api.core.create_namespaced_pod(namespace, gpu_pod("probe", namespace), dry_run="All")
    return "koordinator.sh/gpu-core" in (stored.spec.containers[0].resources.requests or {})


def baseline_checkout(path: Path) -> Path:
    """``path`` made absolute, after checking it is a checkout of this repository (ValueError if not).

    Absolute because a baseline server runs from its own directory, where a relative PYTHONPATH would
    miss it (the server would then import this checkout's modules through the editable install)."""
    checkout = path.resolve()
    if not (checkout / "webhook" / "quota" / "service.py").is_file():
        raise ValueError(f"{checkout} is not a checkout of this repository")
    return checkout


def baseline_env(checkout: Path) -> dict[str, str]:
    """The environment of a server run from ``checkout``: its modules come first on the path, in the
    server and in the quota service it starts."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cycles", type=int, nargs="?", default=400)
    # Comparing worker counts in the same hour is the only fair comparison on this VM (its speed drifts).
    parser.add_argument("workers", nargs="?")
    parser.add_argument("--baseline", type=Path, help="another checkout, served as the mode 'baseline'")
    parser.add_argument("--modes", help="comma-separated modes to time (default: all)")
    options = parser.parse_args()
    cycles = options.cycles
    worker_args = ["--workers", options.workers] if options.workers else []
    plan = dict(PLAN)
    if options.baseline is not None:
        try:
            options.baseline = baseline_checkout(options.baseline)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        plan["baseline"] = ("baseline", "all")
    if options.modes:
        wanted = {"none", *options.modes.split(",")}
        unknown = wanted - set(plan)
        if unknown:
            raise SystemExit(f"unknown modes: {', '.join(sorted(unknown))} (known: {', '.join(plan)})")
        plan = {mode: target for mode, target in plan.items() if mode in wanted}
    accountings = {target for target, _ in plan.values() if target in ("local", "strict", "baseline")}
    work = Path(tempfile.mkdtemp(prefix="gpuquota-bench-overhead-"))
    plane = ControlPlane(locate_binaries(), base_dir=work / "cp")
    plane.start()
    api = make_api(plane.kubeconfig_path)
    servers: dict[str, WebhookProcess] = {}
    go: GoReference | None = None
    results: dict[str, list[float]] = {mode: [] for mode in plan}
    try:
        install_elasticquota_crd(api)
        for mode in plan:
            namespace = f"bench-{mode}"
            api.core.create_namespace({"metadata": {"name": namespace, "labels": {MODE_LABEL: mode}}})
            # Room for every pod: the benchmark times admissions, never a refusal.
            api.custom.create_namespaced_custom_object("scheduling.sigs.k8s.io", "v1alpha1", namespace,
                                                       "elasticquotas", {
                "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                "metadata": {"name": namespace, "namespace": namespace},
                "spec": {"max": {RATIO: str(100 * 10 * (cycles + WARMUP)),
                                 "koordinator.sh/gpu-core": str(100 * 10 * (cycles + WARMUP))}}})
        # With ``rewrite: auto`` the webhook rewrites a pod only when a node it can reach advertises
        # the canonical names, as the Go reference always does: one such node makes them comparable.
        create_canonical_gpu_node(api.core, "bench-canonical")
        for server in sorted(accountings):
            env = baseline_env(options.baseline) if server == "baseline" else {}
            checkout = options.baseline if server == "baseline" else ROOT
            servers[server] = WebhookProcess(work / server, env=env, cwd=checkout, serve_args=[
                "--kubeconfig", str(plane.kubeconfig_path),
                "--accounting", "strict" if server == "strict" else "local",
                "--ledger-namespace", "bench-strict", *worker_args]).start()
        if any(target == "go" for target, _ in plan.values()):
            go = start_go_reference(work / "go-reference")
        for mode, (target, which) in plan.items():
            if not target:
                continue
            endpoint = go if target == "go" else servers[target]
            assert endpoint is not None  # started above whenever a mode points at it
            documents = local_webhook_configurations(endpoint.url, endpoint.ca_bundle, name_suffix=f"-{mode}",
                                                     namespace_selector={"matchLabels": {MODE_LABEL: mode}})
            if which == "mutating":
                documents = [d for d in documents if d["kind"] == "MutatingWebhookConfiguration"]
            register_webhook_configurations(api, documents)
            wait_until_webhook_is_called(api, f"bench-{mode}")
        assert not mutated(api, "bench-none"), "a webhook applies to the no-webhook namespace"
        order = list(plan)
        shuffle = random.Random(8)
        opened = passive_opens()
        for cycle in range(WARMUP + cycles):
            shuffle.shuffle(order)
            for mode in order:
                elapsed = create_pod(api.core, f"bench-{mode}", f"pod-{cycle}")
                if cycle >= WARMUP:
                    results[mode].append(elapsed)
        opened = passive_opens() - opened
    finally:
        if go is not None:
            go.stop()
        for server in servers.values():
            server.stop()
        api.close()
        plane.stop()
        # etcd's data, logs, certificates; the Go reference's binary.
        for server_dir in (work / "cp", work / "go-reference", *(work / server for server in servers)):
            shutil.rmtree(server_dir, ignore_errors=True)
    base = results["none"]
    print(f"{cycles} cycles of one create per mode, shuffled order (after {WARMUP} warm-up cycles), one client, "
          f"one kept-alive connection ({opened} TCP connections accepted on this host while timing)\n")
    print("| mode | p50 ms | p90 ms | p99 ms | overhead ms (median of paired differences) |")
    print("|---|---|---|---|---|")
    for mode, samples in results.items():
        paired = statistics.median(mine - theirs for mine, theirs in zip(samples, base, strict=True))
        print(f"| {TITLES[mode]} | {statistics.median(samples):.2f} | {percentile(samples, 0.9):.2f} | "
              f"{percentile(samples, 0.99):.2f} | {paired:+.2f} |")
    (work / "samples.json").write_text(json.dumps(results), encoding="utf-8")
    print(f"\nsamples: {work / 'samples.json'}")


if __name__ == "__main__":
    main()
