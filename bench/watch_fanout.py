"""What one more watcher of every pod costs the apiserver and etcd per pod created, and itself.

Starts the test control plane (tests/controlplane.py) and up to ``--most`` watchers, each a process
running the quota service's own list and watch of the cluster (``webhook.quota.cluster_state``, into
a ``QuotaState``), as every strict replica runs it. Each repetition runs, in a shuffled order, one
burst of ``--burst-size`` creates of the one-card pod of bench/production_shape.py from ``--clients``
threads into a fresh namespace (no admission applies) for each watcher count of ``--counts``: that
many watchers are started and synced before the burst and stopped after it, and its pods deleted,
so no watcher's backlog or list falls into another burst. CPU: utime + stime from /proc over the
burst, per pod stored, of the apiserver and etcd, and of the watchers.

Usage: .venv/bin/python bench/watch_fanout.py [--repetitions 8] [--counts 1,3] [--burst-size 300]
       [--clients 32]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT)]

from clusterhelpers import whole_card_pod  # noqa: E402
from controlplane import ControlPlane, install_elasticquota_crd, locate_binaries, make_api  # noqa: E402
from production_shape import burst_client, cpu_ms_between, cpu_ticks, create_one  # noqa: E402

WATCHER = """
import sys, threading
from kubeaccess.kube import connect
from webhook.quota.cluster_state import start_live_sync
from webhook.quota.state import QuotaState
state = QuotaState()
start_live_sync(state, connect(sys.argv[1], None))
while not state.synced:
    threading.Event().wait(0.05)
print("synced", flush=True)
threading.Event().wait()
"""


def burst(core: object, api: object, namespace: str, size: int, clients: int,
          groups: dict[str, list[int]]) -> tuple[int, dict[str, float]]:
    api.core.create_namespace({"metadata": {"name": namespace}})  # type: ignore[attr-defined]
    bodies = [whole_card_pod(f"p{index}", "none") for index in range(size)]
    with ThreadPoolExecutor(max_workers=clients) as pool:
        before = cpu_ticks(groups)
        outcomes = list(pool.map(lambda body: create_one(core, namespace, body), bodies))  # type: ignore[arg-type]
        after = cpu_ticks(groups)
    stored = outcomes.count("stored")
    if stored != size:
        raise SystemExit(f"{namespace}: {stored} of {size} creates stored")
    return stored, {group: cpu_ms_between(before[group], after[group]) / stored for group in groups}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=8)
    parser.add_argument("--counts", default="1,3")
    parser.add_argument("--burst-size", type=int, default=300)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    counts = [int(each) for each in args.counts.split(",")]
    plane = ControlPlane(locate_binaries())
    plane.start()
    watchers: list[subprocess.Popen[bytes]] = []
    try:
        api = make_api(plane.kubeconfig_path)
        install_elasticquota_crd(api)
        core = burst_client(plane.kubeconfig_path, args.clients)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        samples: dict[int, list[dict[str, float]]] = {count: [] for count in counts}
        for repetition in range(args.repetitions):
            for count in random.sample(counts, len(counts)):
                watchers = [subprocess.Popen([sys.executable, "-c", WATCHER, str(plane.kubeconfig_path)], env=env,
                                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
                            for _ in range(count)]
                for watcher in watchers:
                    assert watcher.stdout is not None and watcher.stdout.readline() == b"synced\n"
                time.sleep(1)  # the watch requests follow the lists; let them settle outside the window
                groups = {"apiserver + etcd": plane.pids, "watchers": [w.pid for w in watchers]}
                namespace = f"fanout-{repetition}-{count}"
                stored, per_pod = burst(core, api, namespace, args.burst_size, args.clients, groups)
                for watcher in watchers:
                    watcher.kill()
                    watcher.wait()
                api.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
                samples[count].append(per_pod)
                print(f"repetition {repetition + 1}: {count} watchers: {stored} stored, "
                      + ", ".join(f"{group} {ms:.2f} ms/pod" for group, ms in per_pod.items()), file=sys.stderr)
        print("| pod watchers | apiserver + etcd, ms per pod | the watchers, ms per pod |\n|---|---|---|")
        for count in counts:
            cells = [f"{statistics.median(s[g] for s in samples[count]):.2f} "
                     f"[{min(s[g] for s in samples[count]):.2f} – {max(s[g] for s in samples[count]):.2f}]"
                     for g in ("apiserver + etcd", "watchers")]
            print(f"| {count} | " + " | ".join(cells) + " |")
    finally:
        for watcher in watchers:
            watcher.kill()
        plane.stop()


if __name__ == "__main__":
    main()
