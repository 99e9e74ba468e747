"""The CLI on a large offline snapshot: ``gpuquota audit all``, ``gpuquota migrate plan`` and
``gpuquota convert`` (``-o yaml`` against ``-o json`` on the same pods file).

    .venv/bin/python bench/cli_scale.py [--nodes 5000] [--quotas 2000] [--pods 100000] [--repeat 3]
                                        [--format yaml|json|both] [--keep DIR]
                                        [--commands audit,migrate,convert]

Writes a snapshot the way ``kubectl get ... -o yaml`` (or ``-o json``) would (one ``kind: List``
file per kind) into a temporary directory under /tmp, then runs each command ``--repeat`` times as
a subprocess of the installed ``gpuquota`` and reports wall time and the peak RSS of that one
child (``os.wait4``'s rusage, so one run's peak never hides the next). Prints a JSON line per run
and a Markdown table of medians; docs/benchmarks.md holds a recorded run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPUQUOTA = ROOT / ".venv" / "bin" / "gpuquota"
PARENTS = 20
NAMESPACES = 40


def node(index: int) -> dict[str, Any]:
    """Half whole-card nodes (nvidia.com/gpu), half GPU-share nodes (koordinator.sh/gpu-*)."""
    shared = index % 2 == 1
    gpus = {"koordinator.sh/gpu-core": "800", "koordinator.sh/gpu-memory-ratio": "800",
            "koordinator.sh/gpu-memory": "640Gi"} if shared else {"nvidia.com/gpu": "8"}
    resources = {"cpu": "96", "memory": "768Gi", "pods": "110", "ephemeral-storage": "1Ti", **gpus}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"gpu-node-{index:05d}", "uid": f"00000000-0000-4000-8000-{index:012d}",
                         "labels": {"kubernetes.io/hostname": f"gpu-node-{index:05d}",
                                    "node.koordinator.sh/gpu-shared": "true" if shared else "false",
                                    "node.koordinator.sh/gpu-model": "A100-SXM4-80GB"}},
            "spec": {"podCIDR": f"10.{index // 256}.{index % 256}.0/24"},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "lastHeartbeatTime": "2026-12-03T09:00:00Z"}],
                       "nodeInfo": {"kubeletVersion": "v1.36.3", "containerRuntimeVersion": "containerd://2.1.4"}}}


def quotas(count: int) -> list[dict[str, Any]]:
    """PARENTS parents and (count - PARENTS) leaves; a tenth of the leaves still in nvidia.com/gpu."""
    objects: list[dict[str, Any]] = []
    canonical = {"koordinator.sh/gpu-core": "100000", "koordinator.sh/gpu-memory-ratio": "100000"}
    for p in range(PARENTS):
        objects.append({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                        "metadata": {"name": f"org-{p:02d}", "namespace": "koordinator-system",
                                     "labels": {"quota.scheduling.koordinator.sh/is-parent": "true"}},
                        "spec": {"max": {"cpu": "100k", **canonical}, "min": {"cpu": "1k"}}})
    for leaf in range(count - PARENTS):
        legacy = leaf % 10 == 0
        gpu = {"nvidia.com/gpu": "10"} if legacy else {"koordinator.sh/gpu-core": "1000",
                                                        "koordinator.sh/gpu-memory-ratio": "1000"}
        objects.append({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                        "metadata": {"name": f"team-{leaf:04d}", "namespace": f"ns-{leaf % NAMESPACES:02d}",
                                     "labels": {"quota.scheduling.koordinator.sh/parent": f"org-{leaf % PARENTS:02d}"}},
                        "spec": {"max": {"cpu": "1000", **gpu}, "min": {"cpu": "10"}}})
    return objects


def pod(index: int, leaves: int, nodes: int) -> dict[str, Any]:
    """A running pod as kubectl prints it; half legacy nvidia.com/gpu, 40 % canonical, 10 % CPU-only."""
    kind = index % 10
    gpu: dict[str, str] = ({} if kind == 0 else {"nvidia.com/gpu": "1"} if kind % 2 else
                           {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"})
    leaf = index % leaves
    name = f"job-{index:06d}"
    container = {"name": "main", "image": "registry.example/ml/trainer:2026.11.3",
                 "command": ["python", "-m", "trainer"],
                 "env": [{"name": "RANK", "value": str(index % 8)}, {"name": "JOB", "value": name}],
                 "resources": {"requests": {"cpu": "4", "memory": "32Gi", **gpu},
                               "limits": {"memory": "32Gi", **gpu}},
                 "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io"}],
                 "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                 "imagePullPolicy": "IfNotPresent"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": f"ns-{leaf % NAMESPACES:02d}",
                         "uid": f"00000000-0000-4000-9000-{index:012d}", "resourceVersion": str(100000 + index),
                         "creationTimestamp": "2026-12-03T08:00:00Z",
                         "labels": {"quota.scheduling.koordinator.sh/name": f"team-{leaf:04d}", "app": "trainer"},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{index:06d}",
                                              "uid": f"00000000-0000-4000-a000-{index:012d}", "controller": True}]},
            "spec": {"containers": [container], "nodeName": f"gpu-node-{index % nodes:05d}",
                     "restartPolicy": "Never", "schedulerName": "koord-scheduler", "priority": 0,
                     "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                      "effect": "NoExecute", "tolerationSeconds": 300}],
                     "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                         {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}]},
            "status": {"phase": "Running", "podIP": f"10.{index // 65536}.{index // 256 % 256}.{index % 256}",
                       "startTime": "2026-12-03T08:00:05Z", "qosClass": "Burstable",
                       "conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": "2026-12-03T08:00:09Z"}]}}


def write_snapshot(directory: Path, fmt: str, nodes: int, quota_count: int, pods: int) -> None:
    """One List file per kind (how long the dump takes is not what is measured)."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    directory.mkdir(parents=True, exist_ok=True)
    leaves = quota_count - PARENTS
    kinds = {"nodes": [node(i) for i in range(nodes)], "elasticquotas": quotas(quota_count),
             "pods": [pod(i, leaves, nodes) for i in range(pods)]}
    for name, items in kinds.items():
        listing = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
        with (directory / f"{name}.{fmt}").open("w", encoding="utf-8") as out:
            if fmt == "json":
                json.dump(listing, out, indent=4)  # kubectl -o json indents by 4
            else:
                yaml.dump(listing, out, Dumper=dumper, sort_keys=False, default_flow_style=False)


def timed(command: list[str]) -> dict[str, float]:
    """Wall seconds and this child's own peak RSS (ru_maxrss is KiB on Linux)."""
    started = time.monotonic()
    # stderr to a file, not a pipe: convert writes a line per rewritten pod, more than a pipe holds
    # while nobody reads it before the child has ended.
    with Path(os.devnull).open("wb") as sink, tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdout=sink, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        errors.seek(0)
        stderr = errors.read().decode(errors="replace")
        process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    if process.returncode not in (0, 1):  # 1: findings at or above --fail-on, which is expected here
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}: {stderr.strip()}")
    return {"seconds": round(seconds, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--quotas", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=100000)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command; 0 only writes the snapshot")
    parser.add_argument("--format", choices=("yaml", "json", "both"), default="both")
    parser.add_argument("--keep", type=Path, help="write the snapshot here and keep it (default: a temp dir)")
    parser.add_argument("--commands", default="audit,migrate",
                        help="which to run, joined by commas: audit, migrate, convert (the pods file, -o yaml "
                             "and -o json)")
    args = parser.parse_args()
    wanted = set(args.commands.split(","))
    if not wanted <= {"audit", "migrate", "convert"}:
        parser.error(f"--commands: unknown {', '.join(sorted(wanted - {'audit', 'migrate', 'convert'}))}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="gpuquota-cli-bench-"))
    rows: list[str] = []
    try:
        for fmt in (("yaml", "json") if args.format == "both" else (args.format,)):
            directory = work / fmt
            # In a child: the generated objects would otherwise stay in this process's RSS, and a
            # forked child starts with its parent's peak as its own ru_maxrss.
            writer = multiprocessing.Process(target=write_snapshot,
                                             args=(directory, fmt, args.nodes, args.quotas, args.pods))
            started = time.monotonic()
            writer.start()
            writer.join()
            seconds = time.monotonic() - started
            if writer.exitcode != 0:
                raise SystemExit(f"writing the {fmt} snapshot failed (exit {writer.exitcode})")
            size = sum(f.stat().st_size for f in directory.iterdir()) / 2**20
            print(f"{fmt}: {args.nodes} nodes, {args.quotas} quotas, {args.pods} pods, {size:.0f} MiB, "
                  f"written in {seconds:.0f}s", file=sys.stderr, flush=True)
            pods_file = str(directory / f"pods.{fmt}")
            commands = {"audit all": [str(GPUQUOTA), "audit", "all", "-f", str(directory), "-o", "json"],
                        "migrate plan": [str(GPUQUOTA), "migrate", "plan", "-f", str(directory), "-o", "json"],
                        "convert -o json": [str(GPUQUOTA), "convert", "-f", pods_file, "-o", "json"],
                        "convert -o yaml": [str(GPUQUOTA), "convert", "-f", pods_file, "-o", "yaml"]}
            for label, command in commands.items():
                if label.split()[0] not in wanted:
                    continue
                runs = []
                for attempt in range(args.repeat):
                    run = timed(command)
                    print(json.dumps({"command": label, "format": fmt, "attempt": attempt + 1, **run}), flush=True)
                    runs.append(run)
                if not runs:  # --repeat 0: only write the snapshot (with --keep, to reuse it)
                    continue
                median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
                rows.append(f"| `{label}` | {fmt} ({size:.0f} MiB) | {median['seconds']} | "
                            f"{min(r['seconds'] for r in runs)}-{max(r['seconds'] for r in runs)} | "
                            f"{median['cpu_seconds']} | {median['peak_rss_mib']} |")
        print("\n| command | snapshot | wall s (median) | wall s (range) | CPU s | peak RSS MiB |")
        print("|---|---|---|---|---|---|")
        print("\n".join(rows))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
