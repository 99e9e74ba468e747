"""The webhook's cluster-state cache at scale: initial sync time, RSS and cost per watch event.

    .venv/bin/python bench/cache_scale.py [--pods 10000,100000] [--nodes 5000] [--repeat 3]
                                          [--create-budget 600]

Starts a throwaway etcd + kube-apiserver (tests/controlplane.py), creates 2,000 ElasticQuotas
(20 parents x 99 leaves + the 20 parents = 1,980 + 20), ``--nodes`` Node objects as kubelets and
Koordinator report them (``node_object``: ~15 labels, a status with conditions, addresses, node
info and the image list a kubelet reports, a few taints on a fraction, GPUs in either family or
both), and then pods in steps up to each count given (raw JSON POSTs over keep-alive TLS from
several processes x threads; pods have no nodeName and no scheduler runs, so nothing schedules or
runs them). After each step it measures, ``--repeat`` times and each time in a *fresh* process
(``measure`` below), exactly what the quota service does in live mode:
``webhook.quota.cluster_state.start_live_sync`` with the quota state and the node view
(``webhook.quota.node_view.NodeState``) until ``QuotaState.ready()`` and the first nodes.json is
published, the RSS at that point, the size of nodes.json, and the cost of ``apply_event`` for
MODIFIED pod, quota and node (status heartbeat) events. Variant ``live-nodeless`` syncs without the
node view, to size what it costs; ``live-nodepageN`` lists the Nodes N a page (a what-if,
``start_sync_paging_nodes``). Prints a JSON line per measurement and a Markdown summary
(medians); docs/benchmarks.md holds a recorded run.

Variant ``served`` measures the whole product instead: ``gpuquota serve --kubeconfig`` as an
operator starts it (tests/webhookproc.py; gunicorn master, quota service, ``--workers`` workers),
the time from launch to ``/readyz`` answering 200, then RSS and PSS of every process in its tree
(PSS shares the pages processes share, such as the code forked from the master, among them, so its sum is what the
tree really costs), once synced and again after 8 keep-alive connections sent 4,000 dry-run
admission reviews (allowed, or denied by an exceeded quota), so every worker has imported and served what it serves.

If pod creation does not reach a count within ``--create-budget`` seconds (per step), the step is
measured at what was created and says so.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import multiprocessing
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PARENTS = 20
LEAVES_PER_PARENT = 99
NAMESPACES = PARENTS  # one namespace per parent; its leaves live there
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
CREATE_PROCESSES = 4
CREATE_THREADS = 8
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")
# (instance type, GPU product, cards, GPU memory MiB per card)
GPU_SHAPES = (("p4d.24xlarge", "NVIDIA-A100-SXM4-40GB", 8, 40960),
              ("p4de.24xlarge", "NVIDIA-A100-SXM4-80GB", 8, 81920),
              ("p5.48xlarge", "NVIDIA-H100-80GB-HBM3", 8, 81920),
              ("g5.12xlarge", "NVIDIA-A10G", 4, 23028))
# What kubelet reports by default (--node-status-max-images=50): on GPU nodes the list is full.
NODE_IMAGES = 50


def _kib(field: str, pid: int | str = "self", path: str = "status") -> int:
    """A ``field: N kB`` line of /proc/<pid>/<path> (status, smaps_rollup), in KiB."""
    for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


# --- populating the apiserver -------------------------------------------------------------------

def _ssl_context(pki_dir: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki_dir / "apiserver-ca.crt"))
    context.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))
    return context


def leaf_name(parent: int, leaf: int) -> str:
    return f"team-{parent:02d}-leaf-{leaf:02d}"


def quota_objects() -> list[tuple[str, dict[str, Any]]]:
    """(namespace, ElasticQuota) for the whole tree: parents in canonical keys, leaves mixed."""
    objects: list[tuple[str, dict[str, Any]]] = []
    for p in range(PARENTS):
        namespace = f"team-{p:02d}"
        parent = f"team-{p:02d}"
        objects.append((namespace, {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": parent, "namespace": namespace,
                         "labels": {"quota.scheduling.koordinator.sh/is-parent": "true"}},
            "spec": {"max": {"koordinator.sh/gpu-core": "100000", "koordinator.sh/gpu-memory-ratio": "100000",
                             "cpu": "100k", "memory": "1000Ti"},
                     "min": {"koordinator.sh/gpu-core": "1000", "koordinator.sh/gpu-memory-ratio": "1000"}}}))
        for leaf in range(LEAVES_PER_PARENT):
            objects.append((namespace, {
                "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                "metadata": {"name": leaf_name(p, leaf), "namespace": namespace,
                             "labels": {"quota.scheduling.koordinator.sh/parent": parent}},
                "spec": {"max": {"koordinator.sh/gpu-core": "1000", "koordinator.sh/gpu-memory-ratio": "1000",
                                 "cpu": "1000", "memory": "10Ti"},
                         "min": {"koordinator.sh/gpu-core": "10", "koordinator.sh/gpu-memory-ratio": "10"}}}))
    return objects


def node_object(index: int) -> dict[str, Any]:
    """A GPU node as kubelet, the NVIDIA GPU feature discovery and Koordinator leave it.

    Every fourth node advertises only ``nvidia.com/gpu`` (the device plugin alone), two in four
    only ``koordinator.sh/gpu-*`` (Koordinator's GPU sharing), one in four both; a fifth carry
    the GPU taint, one in twenty a team's dedicated taint, one in a hundred is cordoned.
    """
    name = f"gpu-node-{index:05d}"
    zone = ZONES[index % len(ZONES)]
    instance, product, cards, card_mib = GPU_SHAPES[index % len(GPU_SHAPES)]
    family = ("vendor", "koordinator", "koordinator", "both")[(index // len(GPU_SHAPES)) % 4]
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": instance, "beta.kubernetes.io/instance-type": instance,
        "topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": zone,
        "node-pool": f"gpu-{instance.split('.')[0]}-{index % 10}",
        "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(cards),
        "nvidia.com/gpu.memory": str(card_mib), "nvidia.com/cuda.driver.major": "550",
        "node.koordinator.sh/gpu-vendor": "nvidia", "node.koordinator.sh/gpu-model": product,
    }
    gpu: dict[str, str] = {}
    if family in ("vendor", "both"):
        gpu["nvidia.com/gpu"] = str(cards)
    if family in ("koordinator", "both"):
        gpu.update({"koordinator.sh/gpu": str(100 * cards), "koordinator.sh/gpu-core": str(100 * cards),
                    "koordinator.sh/gpu-memory-ratio": str(100 * cards),
                    "koordinator.sh/gpu-memory": f"{cards * card_mib}Mi"})
    resources = {"cpu": "96", "memory": "1121804576Ki", "pods": "110", "ephemeral-storage": "7500Gi",
                 "hugepages-1Gi": "0", "hugepages-2Mi": "0", **gpu}
    allocatable = {**resources, "cpu": "95690m", "memory": "1110318880Ki", "ephemeral-storage": "6912Gi"}
    taints = []
    if index % 5 == 0:
        taints.append({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
    if index % 20 == 7:
        taints.append({"key": "dedicated", "value": f"team-{index % PARENTS:02d}", "effect": "NoSchedule"})
    if index % 100 == 3:
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
                       "timeAdded": "2026-12-01T08:00:00Z"})
    beat = "2026-12-06T08:00:00Z"
    conditions = [{"type": kind, "status": "False", "reason": f"Kubelet{reason}", "message": message,
                   "lastHeartbeatTime": beat, "lastTransitionTime": "2026-11-20T10:00:00Z"}
                  for kind, reason, message in (
                      ("MemoryPressure", "HasSufficientMemory", "kubelet has sufficient memory available"),
                      ("DiskPressure", "HasNoDiskPressure", "kubelet has no disk pressure"),
                      ("PIDPressure", "HasSufficientPID", "kubelet has sufficient PID available"))]
    conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                       "message": "kubelet is posting ready status", "lastHeartbeatTime": beat,
                       "lastTransitionTime": "2026-11-20T10:00:00Z"})
    images = [{"names": [f"registry.example/team-{i % PARENTS:02d}/train-{i:02d}@sha256:{index * 64 + i:064x}",
                         f"registry.example/team-{i % PARENTS:02d}/train-{i:02d}:v1.{i}.{index % 7}"],
               "sizeBytes": 5_000_000_000 + 7919 * i} for i in range(NODE_IMAGES)]
    address = f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                     "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"podCIDR": f"100.{index // 256 % 256}.{index % 256}.0/24",
                 "podCIDRs": [f"100.{index // 256 % 256}.{index % 256}.0/24"],
                 "providerID": f"aws:///{zone}/i-{index:017x}", "taints": taints,
                 **({"unschedulable": True} if index % 100 == 3 else {})},
        "status": {
            "capacity": resources, "allocatable": allocatable, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": address},
                          {"type": "Hostname", "address": name},
                          {"type": "InternalDNS", "address": f"ip-{address.replace('.', '-')}.ec2.internal"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": f"{index:032x}", "systemUUID": f"ec2{index:05x}-0000-4000-8000-000000000000",
                         "bootID": f"{index:08x}-1111-4222-8333-444444444444",
                         "kernelVersion": "6.1.115-126.197.amzn2023.x86_64",
                         "osImage": "Amazon Linux 2023.6.20241121", "containerRuntimeVersion": "containerd://1.7.23",
                         "kubeletVersion": "v1.31.2-eks-94953ac", "kubeProxyVersion": "v1.31.2-eks-94953ac",
                         "operatingSystem": "linux", "architecture": "amd64"},
            "images": images}}


def pod_object(index: int) -> tuple[str, dict[str, Any]]:
    """A minimal pending pod; half ask in legacy ``nvidia.com/gpu`` (no webhook rewrites them here)."""
    p, leaf = index % PARENTS, (index // PARENTS) % LEAVES_PER_PARENT
    namespace = f"team-{p:02d}"
    gpu = {"nvidia.com/gpu": "1"} if index % 2 else {"koordinator.sh/gpu-core": "50",
                                                       "koordinator.sh/gpu-memory-ratio": "50"}
    return namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"bench-{index:06d}", "namespace": namespace,
                     "labels": {QUOTA_LABEL: leaf_name(p, leaf), "app": "bench"}},
        "spec": {"containers": [{"name": "main", "image": "registry.example/bench:1",
                                 "resources": {"requests": {"cpu": "500m", "memory": "1Gi", **gpu},
                                               "limits": {"memory": "1Gi", **gpu}}}]}}


def _post_worker(server: str, pki_dir: str, items: list[tuple[str, str]], results: Any) -> None:
    """One process: CREATE_THREADS keep-alive connections POSTing its share of (path, body)."""
    host, port = server.removeprefix("https://").rsplit(":", 1)
    context = _ssl_context(Path(pki_dir))
    lock = threading.Lock()
    position = [0]
    failures: list[str] = []

    def run() -> None:
        connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=60)
        while True:
            with lock:
                if position[0] >= len(items):
                    break
                path, body = items[position[0]]
                position[0] += 1
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            payload = response.read()
            if response.status not in (200, 201, 409):
                failures.append(f"{response.status} {path}: {payload[:200]!r}")
        connection.close()

    threads = [threading.Thread(target=run) for _ in range(CREATE_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(failures)


def post_all(server: str, pki_dir: Path, items: list[tuple[str, str]]) -> tuple[float, list[str]]:
    """POST every (path, JSON body) from CREATE_PROCESSES processes; returns (seconds, failures)."""
    queue: Any = multiprocessing.Queue()
    chunks = [items[i::CREATE_PROCESSES] for i in range(CREATE_PROCESSES)]
    start = time.monotonic()
    workers = [multiprocessing.Process(target=_post_worker, args=(server, str(pki_dir), chunk, queue))
               for chunk in chunks if chunk]
    for worker in workers:
        worker.start()
    failures = [f for _ in workers for f in queue.get()]
    for worker in workers:
        worker.join()
    return time.monotonic() - start, failures


def create_pods(server: str, pki_dir: Path, start: int, stop: int, budget: float) -> tuple[int, float]:
    """Create pods start..stop-1 in batches until done or out of budget; returns (created up to, seconds)."""
    began = time.monotonic()
    batch = 5000
    index = start
    while index < stop and time.monotonic() - began < budget:
        end = min(index + batch, stop)
        items = []
        for i in range(index, end):
            namespace, pod = pod_object(i)
            items.append((f"/api/v1/namespaces/{namespace}/pods", json.dumps(pod)))
        _, failures = post_all(server, pki_dir, items)
        if failures:
            raise SystemExit(f"pod creation failed ({len(failures)}), first: {failures[0]}")
        index = end
        elapsed = time.monotonic() - began
        print(f"  created {index} pods ({(index - start) / elapsed:.0f}/s this step)", file=sys.stderr, flush=True)
    return index, time.monotonic() - began


def create_nodes(server: str, pki_dir: Path, count: int) -> float:
    """Create ``count`` Node objects, status included (the create keeps what a kubelet registers)."""
    items = [("/api/v1/nodes", json.dumps(node_object(i))) for i in range(count)]
    seconds, failures = post_all(server, pki_dir, items)
    if failures:
        raise SystemExit(f"node creation failed ({len(failures)}), first: {failures[0]}")
    return seconds


# --- measuring, in a fresh process ---------------------------------------------------------------

# What quota accounting reads of a pod (gpuquota_core.pod_records.pod_record, pod_is_counted); the rest
# (managedFields, env, volumes, status conditions) is most of a pod's size.
POD_FIELDS = {"metadata": ("name", "namespace", "uid", "labels", "resourceVersion"),
              "spec": ("containers", "initContainers", "overhead", "nodeSelector", "affinity"),
              "status": ("phase",)}


def trimmed(pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "Pod"}
    for section, keys in POD_FIELDS.items():
        source = pod.get(section) or {}
        out[section] = {key: source[key] for key in keys if key in source}
    for container in out["spec"].get("containers", []) + out["spec"].get("initContainers", []):
        for heavy in [key for key in container if key not in ("name", "resources", "restartPolicy")]:
            del container[heavy]
    return out


def paged_sync(state: Any, api: Any, nodes: Any = None) -> None:
    """The what-if variant: list 500 at a time and keep only the fields accounting reads.

    Not what the product does (webhook/quota/cluster_state.py lists each kind in one response and
    keeps it referenced while it watches); measured to size that change. With ``nodes`` (a
    NodeState), the nodes too, 500 a page, published as the service publishes them.
    """
    import orjson
    from kubernetes import client

    from webhook.quota.cluster_state import list_into, lister_for
    from webhook.quota.node_view import NODE_KIND

    def pages(lister: Any, trim: Any) -> Any:
        token = ""
        while True:
            page = orjson.loads(lister(limit=500, _preload_content=False,
                                       **({"_continue": token} if token else {})).data)
            yield from (trim(item) for item in page["items"])
            token = page["metadata"].get("continue") or ""
            if not token:
                return

    custom = client.CustomObjectsApi(api)
    quotas = pages(lambda **kw: custom.list_cluster_custom_object("scheduling.sigs.k8s.io", "v1alpha1",
                                                                  "elasticquotas", **kw),
                   lambda item: {**item, "kind": "ElasticQuota"})
    state.replace_kind("ElasticQuota", quotas)
    state.replace_kind("Pod", pages(client.CoreV1Api(api).list_pod_for_all_namespaces, trimmed))
    if nodes is not None:
        list_into(nodes, lister_for(api, NODE_KIND), NODE_KIND, page_size=500)
        nodes.publish()


def start_sync_paging_nodes(state: Any, api: Any, nodes: Any, page_size: int) -> threading.Event:
    """The what-if of variant ``live-nodepageN``: start_live_sync as shipped for pods and quotas,
    and the same Node loop and publishing thread, but listing the Nodes ``page_size`` a page.

    A Node object is several times the size of a pod (labels, conditions, images, managedFields),
    so a page of the pods' size holds far more bytes; measured to size a per-kind page size.
    """
    from webhook.quota.cluster_state import WATCH_SECONDS, lister_for, start_live_sync, sync_kind
    from webhook.quota.node_view import NODE_KIND

    stop = start_live_sync(state, api)
    threading.Thread(target=nodes.publish_while, args=(stop,), daemon=True, name="node-view").start()
    threading.Thread(target=sync_kind, args=(nodes, lister_for(api, NODE_KIND), NODE_KIND, stop, WATCH_SECONDS),
                     kwargs={"page_size": page_size}, daemon=True, name=f"sync-{NODE_KIND}").start()
    return stop


def measure(kubeconfig: str, events: int, variant: str = "live", with_nodes: bool = True,
            node_page_size: int = 0) -> dict[str, Any]:
    """Initial sync of a QuotaState (and the node view) from the live cluster, its RSS, and
    apply_event's cost per event.

    ``with_nodes``: as the service runs, Nodes synced by the same loop into a NodeState that
    publishes nodes.json beside the socket (webhook.quota.service.run_service); the sync counts
    as done when the quota state is ready and the first nodes.json is written.
    ``node_page_size``: when set, the what-if of ``start_sync_paging_nodes``.
    """

    from kubeaccess import kube
    from webhook.quota.cluster_state import start_live_sync
    from webhook.quota.node_view import NodeState, nodes_path
    from webhook.quota.service import remove_private_files
    from webhook.quota.state import QuotaState

    gc.collect()
    rss_before = _kib("VmRSS")
    state = QuotaState()
    socket_path = Path(tempfile.mkdtemp(prefix="gpuquota-bench-")) / "quota.sock"
    nodes = NodeState(nodes_path(socket_path)) if with_nodes else None
    start = time.monotonic()
    if variant == "live":
        if node_page_size and nodes is not None:
            stop = start_sync_paging_nodes(state, kube.connect(kubeconfig, None), nodes, node_page_size)
        else:
            stop = start_live_sync(state, kube.connect(kubeconfig, None), nodes=nodes)
        while not (state.ready()[0] and (nodes is None or nodes.path.exists())):
            time.sleep(0.01)
    else:
        stop = threading.Event()
        paged_sync(state, kube.connect(kubeconfig, None), nodes)
        assert state.ready()[0]
    sync_seconds = time.monotonic() - start
    peak_kib = _kib("VmHWM")
    rss_synced = _kib("VmRSS")
    gc.collect()
    rss_after_gc = _kib("VmRSS")
    pods_cached, quotas_cached = len(state.usage), len(state.tree.quotas)
    nodes_cached, nodes_file_kib = 0, 0.0
    if nodes is not None:
        import orjson

        published = nodes.path.read_bytes()
        listed = orjson.loads(published)["nodes"]
        nodes_cached, nodes_file_kib = len(listed), len(published) / 1024
        # Each row is [name, labels, taints, resources]: a node without resources would mean the
        # create lost the status, and the view would be measured smaller than it is.
        if any(not resources for *_, resources in listed):
            raise SystemExit("a published node advertises no extended resource: its status was not stored")

    # Real objects as the watch delivers them (apiserver defaults, managedFields and all).
    api = kube.connect(kubeconfig, None)
    import orjson
    from kubernetes import client
    core = client.CoreV1Api(api)
    sample_pods = orjson.loads(core.list_pod_for_all_namespaces(limit=1000, _preload_content=False).data)["items"]
    sample_quotas = orjson.loads(client.CustomObjectsApi(api).list_cluster_custom_object(
        "scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", limit=200, _preload_content=False).data)["items"]
    result: dict[str, Any] = {"variant": variant, "pods_cached": pods_cached,
                              "quotas_cached": quotas_cached, "nodes_cached": nodes_cached,
                              "nodes_json_kib": round(nodes_file_kib, 1),
                              "sync_seconds": round(sync_seconds, 2), "rss_before_mib": round(rss_before / 1024, 1),
                              "peak_rss_mib": round(peak_kib / 1024, 1), "rss_synced_mib": round(rss_synced / 1024, 1),
                              "rss_after_gc_mib": round(rss_after_gc / 1024, 1)}
    targets: list[tuple[str, Any, list[dict[str, Any]]]] = [("Pod", state, sample_pods),
                                                             ("ElasticQuota", state, sample_quotas)]
    if nodes is not None:
        # Most Node events are kubelet's status heartbeats: nothing the placement reads changes.
        sample_nodes = orjson.loads(core.list_node(limit=1000, _preload_content=False).data)["items"]
        targets.append(("Node", nodes, sample_nodes))
    for kind, target, sample in targets:
        for obj in sample:
            obj["kind"] = kind
        began = time.perf_counter()
        for n in range(events):
            obj = sample[n % len(sample)]
            obj["metadata"]["resourceVersion"] = str(10_000_000 + n)  # as a real MODIFIED event would
            if kind == "Node":
                for condition in obj["status"].get("conditions") or []:
                    condition["lastHeartbeatTime"] = f"2026-12-06T09:{n // 60 % 60:02d}:{n % 60:02d}Z"
            target.apply_event(kind, "MODIFIED", obj)
        result[f"{kind.lower()}_event_us"] = round(1e6 * (time.perf_counter() - began) / events, 1)
    result.setdefault("node_event_us", 0.0)
    stop.set()
    remove_private_files(socket_path)
    return result


def measure_in_subprocess(kubeconfig: Path, events: int, variant: str, with_nodes: bool = True,
                          node_page_size: int = 0) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "measure", str(kubeconfig), "--events", str(events),
                          "--variant", variant,
                          *([] if with_nodes else ["--no-nodes"]), "--node-page-size", str(node_page_size)],
                         capture_output=True, text=True, check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# --- the whole server ------------------------------------------------------------------------------

SERVED_REVIEWS = 4000
SERVED_CONNECTIONS = 8


def process_memory(root: int) -> list[dict[str, Any]]:
    """RSS, PSS and peak RSS (MiB) of each process in the tree, with the title gunicorn gives it."""
    from run import tree_pids  # bench/run.py, this script's directory

    rows = []
    for pid in tree_pids(root):
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        rows.append({"pid": pid, "title": title[:60],
                     "rss_mib": round(_kib("VmRSS", pid) / 1024, 1),
                     "pss_mib": round(_kib("Pss", pid, "smaps_rollup") / 1024, 1),
                     "peak_rss_mib": round(_kib("VmHWM", pid) / 1024, 1)})
    return rows


def admission_review(index: int) -> bytes:
    from reviews import body, review  # tests/reviews.py: reviews as the API server builds them

    _, pod = pod_object(index)
    pod["metadata"]["name"] = f"served-{index:06d}"
    return body(review(pod, dry_run=True, uid=f"served-{index}"))


def send_reviews(host: str, port: int, context: ssl.SSLContext) -> None:
    """SERVED_REVIEWS reviews over SERVED_CONNECTIONS keep-alive connections, mutate and validate alike."""
    failures: list[str] = []

    def connection(offset: int) -> None:
        conn = http.client.HTTPSConnection(host, port, context=context, timeout=30)
        for n in range(offset, SERVED_REVIEWS, SERVED_CONNECTIONS):
            path = "/mutate-pods" if n % 2 else "/validate-pods"
            conn.request("POST", path, admission_review(n), {"Content-Type": "application/json"})
            reply = conn.getresponse()
            body = reply.read()
            # At 100,000 pods the leaves are over their max, so a denial is as much an answer as an allow.
            answer = json.loads(body).get("response", {}) if reply.status == 200 else {}
            if answer.get("uid") != f"served-{n}" or not (answer.get("allowed") or answer.get("status", {})
                                                           .get("reason") == "QuotaExceeded"):
                failures.append(f"{path} {reply.status}: {body[:200]!r}")
        conn.close()

    threads = [threading.Thread(target=connection, args=(i,)) for i in range(SERVED_CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"served: {len(failures)} reviews not answered as expected, first: {failures[0]}")


def measure_served(kubeconfig: Path, work_dir: Path, workers: int | None) -> dict[str, Any]:
    from webhookproc import LOOPBACK, WebhookProcess

    from webhook.serving.settings import Settings

    server = WebhookProcess(work_dir, serve_args=["--kubeconfig", str(kubeconfig),
                                                  *(["--workers", str(workers)] if workers else [])])
    started = time.monotonic()
    server.start(ready_path="/readyz")
    try:
        ready_seconds = time.monotonic() - started
        synced = process_memory(server.pid)
        send_reviews(LOOPBACK, server.port, server.ssl_context())
        served = process_memory(server.pid)
    finally:
        server.stop()
    for row in served:
        print(json.dumps({"served_process": row}), file=sys.stderr, flush=True)

    def total(rows: list[dict[str, Any]], key: str) -> float:
        return round(sum(row[key] for row in rows), 1)

    return {"variant": "served", "workers": workers or Settings().workers, "processes": len(served),
            "ready_seconds": round(ready_seconds, 2),
            "rss_synced_mib": total(synced, "rss_mib"), "pss_synced_mib": total(synced, "pss_mib"),
            "rss_served_mib": total(served, "rss_mib"), "pss_served_mib": total(served, "pss_mib"),
            "peak_rss_sum_mib": total(served, "peak_rss_mib"),
            "largest_process_peak_mib": max(row["peak_rss_mib"] for row in served)}


# --- driver ----------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("measure", help="(internal) one measurement in this process")
    one.add_argument("kubeconfig")
    one.add_argument("--events", type=int, default=20000)
    one.add_argument("--variant", choices=("live", "paged"), default="live")
    one.add_argument("--no-nodes", dest="with_nodes", action="store_false")
    one.add_argument("--node-page-size", type=int, default=0)
    parser.add_argument("--pods", default="10000,100000", help="pod counts to measure at, comma-separated")
    parser.add_argument("--nodes", type=int, default=5000, help="Node objects to create before the pods")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--variants", default="live,paged",
                        help="live: webhook.quota.cluster_state as shipped (with the node view); "
                             "live-nodeless: without the node view; live-nodepageN: the what-if of listing "
                             "the Nodes N a page; paged: the what-if of paged_sync (either with -nodeless); "
                             "served: the whole gpuquota serve process tree")
    parser.add_argument("--create-budget", type=float, default=600.0, help="seconds of pod creation per step")
    parser.add_argument("--workers", default="",
                        help="served: gunicorn worker counts to measure, comma-separated (default: what "
                             "gpuquota serve starts by default)")
    args = parser.parse_args()
    if args.command == "measure":
        print(json.dumps(measure(args.kubeconfig, args.events, args.variant, args.with_nodes,
                                 args.node_page_size)))
        return

    from controlplane import ControlPlane, install_elasticquota_crd, locate_binaries, make_api

    plane = ControlPlane(locate_binaries())
    served_dir = Path(tempfile.mkdtemp(prefix="gpuquota-bench-served-"))
    plane.start()
    try:
        api = make_api(plane.kubeconfig_path)
        install_elasticquota_crd(api)
        for p in range(NAMESPACES):
            api.core.create_namespace({"metadata": {"name": f"team-{p:02d}"}})
        api.close()
        quotas = [(f"/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{ns}/elasticquotas", json.dumps(q))
                  for ns, q in quota_objects()]
        seconds, failures = post_all(plane.server, plane.pki_dir, quotas)
        if failures:
            raise SystemExit(f"quota creation failed: {failures[0]}")
        print(f"created {len(quotas)} ElasticQuotas in {seconds:.1f}s", file=sys.stderr, flush=True)
        if args.nodes:
            seconds = create_nodes(plane.server, plane.pki_dir, args.nodes)
            print(f"created {args.nodes} Nodes in {seconds:.1f}s", file=sys.stderr, flush=True)
        created = 0
        rows: list[dict[str, Any]] = []
        served_rows: list[dict[str, Any]] = []
        for target in (int(n) for n in args.pods.split(",")):
            created, seconds = create_pods(plane.server, plane.pki_dir, created, target, args.create_budget)
            print(f"pods: {created} (target {target}) after {seconds:.0f}s of creation "
                  f"({CREATE_PROCESSES} processes x {CREATE_THREADS} keep-alive connections)", file=sys.stderr,
                  flush=True)
            for variant in args.variants.split(","):
                if variant == "served":
                    for workers in [int(n) for n in args.workers.split(",") if n] or [None]:
                        for attempt in range(args.repeat):
                            run = measure_served(plane.kubeconfig_path,
                                                 served_dir / f"{target}-{workers}-{attempt}", workers)
                            print(json.dumps({"target": target, "attempt": attempt + 1, **run}), flush=True)
                            served_rows.append({"target": target, "created": created, **run})
                    continue
                runs = []
                sync, *options = variant.split("-")
                with_nodes = "nodeless" not in options
                node_page_size = next((int(o.removeprefix("nodepage")) for o in options if o.startswith("nodepage")), 0)
                for attempt in range(args.repeat):
                    run = measure_in_subprocess(plane.kubeconfig_path, args.events, sync, with_nodes, node_page_size)
                    run["variant"] = variant
                    print(json.dumps({"target": target, "attempt": attempt + 1, **run}), flush=True)
                    runs.append(run)
                median = {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]
                          if key != "variant"}
                rows.append({"target": target, "variant": variant, "created": created,
                             "created_seconds": round(seconds), **median})
        if rows:
            print("\n| sync | pods | quotas | nodes | initial sync s | peak RSS MiB | RSS synced MiB "
                  "| RSS after gc MiB | nodes.json KiB | pod MODIFIED µs | quota MODIFIED µs | node MODIFIED µs |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for row in rows:
            print(f"| {row['variant']} | {row['pods_cached']:.0f} | {row['quotas_cached']:.0f} | "
                  f"{row['nodes_cached']:.0f} | {row['sync_seconds']} | "
                  f"{row['peak_rss_mib']} | {row['rss_synced_mib']} | {row['rss_after_gc_mib']} | "
                  f"{row['nodes_json_kib']} | {row['pod_event_us']} | {row['elasticquota_event_us']} | "
                  f"{row['node_event_us']} |")
        if served_rows:
            print("\n| pods | workers | processes | launch to ready s | RSS synced MiB | PSS synced MiB "
                  "| RSS served MiB | PSS served MiB | sum of peaks MiB | largest peak MiB |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for row in served_rows:
                print(f"| {row['created']} | {row['workers']} | {row['processes']} | {row['ready_seconds']} | "
                      f"{row['rss_synced_mib']} | "
                      f"{row['pss_synced_mib']} | {row['rss_served_mib']} | {row['pss_served_mib']} | "
                      f"{row['peak_rss_sum_mib']} | {row['largest_process_peak_mib']} |")
    finally:
        plane.cleanup()
        shutil.rmtree(served_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
