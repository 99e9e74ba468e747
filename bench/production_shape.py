"""The production shape against the apiserver's own ResourceQuota admission, in one control plane.

Starts the test control plane (tests/controlplane.py; the binaries of hack/build-control-plane.sh),
one ``gpuquota serve --accounting local`` and three ``--accounting strict`` replicas behind HAProxy
(tests/loadbalancer.py, as tests/e2e/test_faults.py runs them), each server with its own defaults
unless ``--workers`` is given. The strict replicas take the writer Lease of their checkout's shipped
Deployment (manifests/base/deployment.yaml ``--writer-lease``), each listener on a free loopback port:
the shape users run. Every mode has its own namespaces:

- ``none``: nothing applies (the baseline the sequential creates are paired against);
- ``native``: a ResourceQuota on ``requests.nvidia.com/gpu`` and no webhook;
- ``local`` / ``strict``: the project's webhook configurations, selected by a namespace label,
  pointing at the local server or at HAProxy; the pods charge ElasticQuotas.
- ``koord`` / ``koord3``: Koordinator's own quota admission (koord-manager with
  ``EnableQuotaAdmission``, built by hack/build-koordinator.sh, run by tests/koordmanager.py): one
  koord-manager, or three behind HAProxy as its chart deploys them, its webhook configurations
  selected by the namespace label. Its admission counts resource names as written, so its quotas
  name the pods' own ``nvidia.com/gpu`` (the best it can do for this workload; a
  ``gpu-memory-ratio`` max would not count these pods at all), and it checks the leaf only.
- ``go-both``: the two-webhook limit. bench/go-reference (Go stdlib, bench/goreference.py) behind the
  project's mutating and validating configurations, selected by the namespace label: it does the
  same rewrite and its validating path decodes and allows, so this is the least a create passing our
  two webhooks can cost. No quota applies, so it has no burst with room for fewer; the table shows
  every mode's sequential overhead against it as well as against native.

Every create is the same one-card ``nvidia.com/gpu`` pod (one Node advertises the canonical names,
so our webhook rewrites it as in a cluster where Koordinator's device plugin runs). It measures:

1. sequential creates over one kept-alive connection, one per mode per cycle in a shuffled order
   (as bench/apiserver_overhead.py): each mode's cost is the median of its paired differences
   against ``none`` in the same cycle;
2. bursts of ``--burst-size`` creates from ``--clients`` threads, each into a fresh namespace:
   with room for all (pods stored per second, pods refused, and the CPU time every process of the
   control plane, our servers and HAProxy spent, per admitted pod, from /proc/<pid>/stat), and
   with room for ``--room`` (pods stored). Ours charge a two-level tree: two leaves of room for
   the whole burst under a parent of the room, so the parent is the limit that binds and the
   count at the ancestor is the one checked. Native's room is its namespace's ResourceQuota.

The bursts of a repetition (every mode, both kinds) run in a shuffled order. Prints a Markdown
table of medians with their ranges and each mode against native (its sequential overhead against
go-both's too, when go-both runs), and where the samples are.

To weigh what changes do on this shape, each ``--variant NAME=CHECKOUT`` (repeatable) adds the
mode ``strict-NAME``: three more ``--accounting strict`` replicas behind their own HAProxy and with
their own ledger namespace (``gpuquota-ledger-NAME``), running the code of another checkout of this
repository (say a ``git worktree`` with one mechanism taken out; same virtualenv, run from that
checkout's directory with it first on PYTHONPATH, so its webhook/ and gpuquota_core/ are the ones
imported), measured exactly as ``strict``, in the same cycles and shuffled among the same bursts,
and shown against native and against ``strict``. Several variants in one run share one control
plane and one stretch of time, so their figures compare with each other as well as with ``strict``.
``--baseline CHECKOUT`` is ``--variant baseline=CHECKOUT`` (the mode ``strict-baseline``). A variant
runs with its checkout's own webhook configurations. ``--balance NAME=first`` puts every connection of
variant NAME on its first replica while it is up (the other two stand by, watching): one writer per
ledger object with no forwarding, the most an owner per quota tree could give on the ledger's side.
``--modes`` limits the run to some modes (``none`` always runs; a server no chosen mode needs is not
started). The Koordinator modes and ``go-both`` run only when ``--modes`` names them (bench/run.sh,
``make bench``, names them).

Usage: .venv/bin/python bench/production_shape.py [--repetitions 10] [--bursts 10] [--cycles 300]
       [--burst-size 300] [--clients 32] [--room 100] [--issue-sizes] [--workers N]
       [--baseline CHECKOUT] [--variant NAME=CHECKOUT ...] [--balance NAME=first ...]
       [--modes none,native,go-both,strict,strict-baseline,strict-NAME,koord,koord3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from admissionchain import (  # noqa: E402
    WEBHOOK_CONFIGURATIONS,
    local_webhook_configurations,
    register_webhook_configurations,
    wait_until_webhook_is_called,
)
from apiserver_overhead import baseline_checkout, baseline_env, create_pod  # noqa: E402
from clusterhelpers import (  # noqa: E402
    PARENT_LABEL,
    QUOTA_LABEL,
    RATIO,
    admits_quota,
    create_quota,
    refusal_reason,
    whole_card_pod,
)
from controlplane import (  # noqa: E402
    LOOPBACK,
    Api,
    ControlPlane,
    create_canonical_gpu_node,
    install_elasticquota_crd,
    locate_binaries,
    make_api,
)
from goreference import GoReference, start_go_reference  # noqa: E402
from koordinator import install_koordinator_crds, locate_koordinator  # noqa: E402
from koordmanager import (  # noqa: E402
    KoordManager,
    create_quota_once_parent_known,
    start_koord_manager,
    start_koord_manager_replicas,
)
from kubernetes import client as k8s  # noqa: E402
from kubernetes import config as k8s_config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from loadbalancer import HAProxy, start_replicas_behind_haproxy  # noqa: E402
from webhookproc import WebhookProcess  # noqa: E402

VARIANT_PREFIX = "strict-"  # a variant NAME is measured as the mode strict-NAME
BALANCE_ALGORITHMS = ("roundrobin", "first", "leastconn")  # what --balance may ask HAProxy for
BASELINE = "baseline"  # --baseline CHECKOUT is --variant baseline=CHECKOUT
STRICT_BASELINE = VARIANT_PREFIX + BASELINE
# A variant's name ends up in namespace, quota and webhook configuration names (with its burst's
# kind and numbers after it, within a namespace's 63 characters): a short DNS label.
VARIANT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,22}[a-z0-9])?")
MODES = ("native", "local", "strict")  # what runs unless --modes or --variant says otherwise
KOORDINATOR = ("koord", "koord3")  # Koordinator's own quota admission, only when --modes names them
# The Go reference behind our two configurations, only when --modes names it: the sequential overheads'
# second yardstick beside native, the least two webhook calls can add.
GO_BOTH = "go-both"
OPT_IN = (GO_BOTH, *KOORDINATOR)
# How the table names a reference when it gives a mode's ratio to it.
REFERENCE_NAMES = {"native": "native", "strict": "strict", GO_BOTH: "the two-webhook limit",
                   "koord3": "koord-manager ×3"}
VENDOR_GPU = "nvidia.com/gpu"
IS_PARENT_LABEL = "quota.scheduling.koordinator.sh/is-parent"
# Named in the table's title; EnableQuotaAdmission is what makes koord-manager admit by quota.
KOORDINATOR_GATES = {"EnableQuotaAdmission": True}
UNADMITTED = "none"  # the namespace every sequential create is paired against
TITLES = {"native": "native ResourceQuota (`requests.nvidia.com/gpu`)", "local": "ours, local, 1 server",
          "strict": "ours, strict, 3 replicas + HAProxy",
          "koord": "Koordinator (koord-manager, EnableQuotaAdmission), 1 replica",
          "koord3": "Koordinator (koord-manager, EnableQuotaAdmission), 3 replicas + HAProxy",
          GO_BOTH: "the two-webhook limit: Go stdlib reference behind our two configurations (validating: "
                   "decode and allow)"}
# Per mode with servers of its own, the names of its process groups in the CPU table: its servers, then its HAProxy.
GROUPS = {"local": ("local server", ""), "strict": ("strict replicas", "HAProxy"),
          "koord": ("koord-manager", ""), "koord3": ("koord-manager replicas", "koord-manager's HAProxy"),
          GO_BOTH: ("Go reference", "")}
MODE_LABEL = "gpuquota-bench-mode"
PLANE_GROUP = "apiserver + etcd"
NATIVE_RESOURCE = "requests.nvidia.com/gpu"
LEDGER_NAMESPACE = "gpuquota-ledger"
WARMUP_CYCLES = 20
READY_DEADLINE = 60.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The quota service's counters the table reads (webhook/quota/metrics.py), as their samples are named.
WATCH_EVENTS_TOTAL = "gpuquota_watch_events_total"
LEDGER_WRITES_TOTAL = "gpuquota_ledger_writes_total"
USAGE_RECHARGED_TOTAL = "gpuquota_usage_recharged_pods_total"
# The issue's sizes: 16 repetitions, 20 bursts with room for all per mode.
ISSUE_REPETITIONS, ISSUE_BURSTS = 16, 20
DEFAULT_ROUNDS = 10  # repetitions, and bursts with room for all per mode, unless told otherwise


def is_variant(mode: str) -> bool:
    return mode.startswith(VARIANT_PREFIX)


def is_ours(mode: str) -> bool:
    """Whether our webhook admits the mode's pods (local, strict and every variant of strict)."""
    return mode in ("local", "strict") or is_variant(mode)


def selected_by_label(mode: str) -> bool:
    """Whether webhook configurations select the mode's namespaces by its label (every mode but native)."""
    return is_ours(mode) or mode in OPT_IN


def has_room(mode: str) -> bool:
    """Whether a quota limits the mode's pods, so that it has bursts with room for fewer (not go-both)."""
    return mode != GO_BOTH


def variant_name(mode: str) -> str:
    return mode.removeprefix(VARIANT_PREFIX)


def title(mode: str) -> str:
    if mode == STRICT_BASELINE:
        return "baseline checkout: ours, strict, 3 replicas + HAProxy"
    return f"variant {variant_name(mode)}: ours, strict, 3 replicas + HAProxy" if is_variant(mode) else TITLES[mode]


def process_groups(mode: str) -> tuple[str, str]:
    """The names of a mode's process groups in the CPU table: its servers, then its HAProxy."""
    if is_variant(mode):
        return f"{variant_name(mode)} strict replicas", f"{variant_name(mode)}'s HAProxy"
    return GROUPS[mode]


def own_groups(mode: str) -> set[str]:
    """The process groups a mode would run alone: the apiserver and etcd, and its servers and balancer."""
    return {PLANE_GROUP, *(process_groups(mode) if mode in GROUPS or is_variant(mode) else ())} - {""}


def ledger_namespace(mode: str) -> str:
    """Every variant's replicas keep a ledger of their own beside strict's."""
    return f"{LEDGER_NAMESPACE}-{variant_name(mode)}" if is_variant(mode) else LEDGER_NAMESPACE


def variant_checkouts(specs: Iterable[str]) -> dict[str, Path]:
    """Mode (``strict-NAME``) -> checkout, from ``NAME=CHECKOUT`` specs in the order given; ValueError
    naming the spec when one is malformed, names no checkout of this repository, or repeats a name."""
    checkouts: dict[str, Path] = {}
    for spec in specs:
        name, separator, path = spec.partition("=")
        if not separator or not path:
            raise ValueError(f"--variant {spec!r}: expected NAME=CHECKOUT")
        if not VARIANT_NAME.fullmatch(name):
            raise ValueError(f"--variant {spec!r}: the name must be 1 to 24 lower-case letters, digits and "
                             "inner hyphens (it names the mode strict-NAME and its namespaces)")
        mode = VARIANT_PREFIX + name
        if mode in checkouts:
            raise ValueError(f"--variant {spec!r}: the name {name} is given twice"
                             + (" (--baseline is --variant baseline=CHECKOUT)" if name == BASELINE else ""))
        try:
            checkouts[mode] = baseline_checkout(Path(path))
        except ValueError as error:
            raise ValueError(f"--variant {spec!r}: {error}") from None
    return checkouts


def chosen_modes(wanted: str | None, variants: Iterable[str]) -> tuple[str, ...]:
    """The modes to measure, in the table's order (``none`` aside): every default one and every variant
    when ``wanted`` is None, else those it names (ValueError for an unknown mode, or for none)."""
    known = ("native", GO_BOTH, "local", "strict", *variants, *KOORDINATOR)
    if wanted is None:
        return tuple(mode for mode in known if mode in MODES or is_variant(mode))
    chosen = set(wanted.split(",")) - {UNADMITTED}
    if unknown := chosen - set(known):
        needs = [f"{mode} needs --variant {variant_name(mode)}=CHECKOUT"
                 for mode in sorted(unknown) if is_variant(mode)]
        raise ValueError(f"unknown modes: {', '.join(sorted(unknown))} (known: {', '.join(known)})"
                         + (f"; {'; '.join(needs)}" if needs else ""))
    if not chosen:
        raise ValueError(f"--modes names no mode besides {UNADMITTED}")
    return tuple(mode for mode in known if mode in chosen)


def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + READY_DEADLINE
    while not condition():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not true after {READY_DEADLINE:.0f}s: {what}")
        time.sleep(0.05)  # polling a condition with a deadline


# -- CPU time of a process tree ------------------------------------------------------------------

def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, utime + stime in clock ticks) of every process readable now."""
    table: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
        table[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return table


def cpu_ticks(groups: dict[str, list[int]]) -> dict[str, dict[int, int]]:
    """Per group, the CPU ticks of every process in the trees under its root pids (threads count in their
    process), all from one reading of /proc."""
    table = process_table()
    return {group: tree_ticks(table, roots) for group, roots in groups.items()}


def tree_ticks(table: dict[int, tuple[int, int]], roots: Iterable[int]) -> dict[int, int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: dict[int, int] = {}
    pending = [pid for pid in roots if pid in table]
    while pending:
        pid = pending.pop()
        if pid not in found:
            found[pid] = table[pid][1]
            pending.extend(children.get(pid, []))
    return found


def cpu_ms_between(before: dict[int, int], after: dict[int, int]) -> float:
    """Milliseconds of CPU spent between two readings (a process started between them counts from zero)."""
    return sum(ticks - before.get(pid, 0) for pid, ticks in after.items()) * 1000 / CLOCK_TICKS


# -- what our quota services counted ------------------------------------------------------------------

# A counter's sample: its name, then its labels' values in the order of their names
# ((WATCH_EVENTS_TOTAL, kind, type); (LEDGER_WRITES_TOTAL, result)).
CounterKey = tuple[str, ...]


def counters(exposition: str) -> Counter[CounterKey]:
    """Every counter sample (``*_total``) of one scrape of a server's /metrics."""
    return Counter({(sample.name, *(sample.labels[label] for label in sorted(sample.labels))): sample.value
                    for family in text_string_to_metric_families(exposition) for sample in family.samples
                    if family.type == "counter" and sample.name.endswith("_total")})


def scraped_counters(server: WebhookProcess) -> Counter[CounterKey]:
    """The counters of the server's quota service (its workers' /metrics show them)."""
    status, body = server.get("/metrics")
    if status != 200:
        raise RuntimeError(f"server {server.port}: /metrics answered {status}: {body[:200]!r}")
    return counters(body.decode())


def counted_between(before: Counter[CounterKey], after: Counter[CounterKey]) -> Counter[CounterKey]:
    after = after.copy()
    after.subtract(before)
    return +after


# -- the rig ----------------------------------------------------------------------------------------

@dataclass
class Rig:
    plane: ControlPlane
    api: Api
    burst_core: k8s.CoreV1Api
    servers: dict[str, list[WebhookProcess]] = field(default_factory=dict)  # per mode of ours, once started
    balancers: dict[str, HAProxy] = field(default_factory=dict)  # per mode behind HAProxy
    koord_managers: dict[str, list[KoordManager]] = field(default_factory=dict)  # per Koordinator mode
    go_reference: GoReference | None = None  # go-both's server, once started

    def servers_of(self, mode: str) -> list[WebhookProcess]:
        return self.servers.get(mode, [])

    def measured_groups(self) -> dict[str, list[int]]:
        # koord-manager runs as a component of the plane (its processes are among the plane's).
        koord = {manager.pid for managers in self.koord_managers.values() for manager in managers}
        groups = {PLANE_GROUP: [pid for pid in self.plane.pids if pid not in koord]}
        groups |= {process_groups(mode)[0]: [server.pid for server in servers]
                   for mode, servers in self.servers.items()}
        groups |= {process_groups(mode)[0]: [manager.pid for manager in managers]
                   for mode, managers in self.koord_managers.items()}
        groups |= {process_groups(mode)[1]: [balancer.process.pid] for mode, balancer in self.balancers.items()}
        if self.go_reference is not None:
            groups[process_groups(GO_BOTH)[0]] = [self.go_reference.pid]
        return groups


def burst_client(kubeconfig: Path, clients: int) -> k8s.CoreV1Api:
    """A client whose connection pool holds one kept-alive connection per burst thread."""
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = clients
    return k8s.CoreV1Api(k8s.ApiClient(configuration))


def start_plane(work: Path, clients: int, modes: tuple[str, ...]) -> Rig:
    plane = ControlPlane(locate_binaries(), base_dir=work / "cp")
    plane.start()
    api = make_api(plane.kubeconfig_path)
    if any(mode in KOORDINATOR for mode in modes):
        install_koordinator_crds(api, locate_koordinator())  # its ElasticQuota CRD, as on its clusters
    else:
        install_elasticquota_crd(api)
    create_canonical_gpu_node(api.core, "bench-canonical")
    api.core.create_namespace({"metadata": {"name": LEDGER_NAMESPACE}})
    return Rig(plane, api, burst_client(plane.kubeconfig_path, clients))


def shipped_writer_args(checkout: Path) -> list[str]:
    """The writer Lease of the checkout's shipped Deployment (manifests/base), if it has one, as flags
    for replicas on one host: each listener on a free loopback port instead of the pod's 8444."""
    deployment = yaml.safe_load((checkout / "manifests" / "base" / "deployment.yaml").read_text(encoding="utf-8"))
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    if "--writer-lease" not in args:
        return []
    return ["--writer-lease", args[args.index("--writer-lease") + 1], "--peer-address", LOOPBACK, "--peer-port", "0"]


def start_servers(rig: Rig, work: Path, modes: tuple[str, ...], worker_args: list[str],
                  variants: dict[str, Path], balances: dict[str, str] | None = None) -> None:
    """The servers of the chosen modes of ours (a variant's from its checkout) and go-both's Go reference,
    each kept in ``rig`` as soon as it serves (so stop_rig stops whatever came up), and the webhook
    configurations pointing at them; then Koordinator's."""
    kubeconfig = ["--kubeconfig", str(rig.plane.kubeconfig_path)]
    urls: dict[str, tuple[str, str]] = {}
    # A variant runs with its own checkout's webhook configurations, so a variant may change them too.
    configurations = {mode: checkout / WEBHOOK_CONFIGURATIONS.relative_to(ROOT) for mode, checkout in variants.items()}
    if "local" in modes:
        local = WebhookProcess(work / "local", serve_args=[*kubeconfig, "--accounting", "local", *worker_args])
        rig.servers["local"] = [local.start()]
        urls["local"] = (local.url, local.ca_bundle)
    for mode in (mode for mode in modes if mode == "strict" or is_variant(mode)):
        ledger, env, cwd = ledger_namespace(mode), {}, None
        if is_variant(mode):
            cwd, env = variants[mode], baseline_env(variants[mode])
            rig.api.core.create_namespace({"metadata": {"name": ledger}})
        replicas, balancer = start_replicas_behind_haproxy(work / mode, [
            *kubeconfig, "--accounting", "strict", "--ledger-namespace", ledger, *shipped_writer_args(cwd or ROOT),
            *worker_args], env=env, cwd=cwd, balance=(balances or {}).get(mode, "roundrobin"))
        rig.servers[mode], rig.balancers[mode] = replicas, balancer
        urls[mode] = (balancer.url, replicas[0].ca_bundle)
    if GO_BOTH in modes:
        rig.go_reference = start_go_reference(work / GO_BOTH)
        urls[GO_BOTH] = (rig.go_reference.url, rig.go_reference.ca_bundle)
    for mode, (url, ca_bundle) in urls.items():
        register_webhook_configurations(rig.api, local_webhook_configurations(
            url, ca_bundle, name_suffix=f"-{mode}", namespace_selector={"matchLabels": {MODE_LABEL: mode}},
            source=configurations.get(mode, WEBHOOK_CONFIGURATIONS)))
    labels = {mode: {MODE_LABEL: mode} for mode in KOORDINATOR}
    if "koord" in modes:
        rig.koord_managers["koord"] = [start_koord_manager(
            rig.plane, rig.api, locate_koordinator(), feature_gates=KOORDINATOR_GATES, namespace_labels=labels["koord"],
            name="koord-manager-bench")]
    if "koord3" in modes:
        replicas, balancer = start_koord_manager_replicas(
            rig.plane, rig.api, locate_koordinator(), feature_gates=KOORDINATOR_GATES,
            namespace_labels=labels["koord3"], name="koord-manager-bench3")
        rig.koord_managers["koord3"], rig.balancers["koord3"] = replicas, balancer


def stop_rig(rig: Rig | None, work: Path) -> None:
    if rig is not None:
        for balancer in rig.balancers.values():
            balancer.stop()
        for servers in rig.servers.values():
            for server in servers:
                server.stop()
        if rig.go_reference is not None:
            rig.go_reference.stop()
        rig.api.close()
        rig.plane.stop()
    # etcd's data, logs, certificates (koord-manager's are under cp), one directory per mode of ours and
    # go-both's (the Go reference's binary and certificates).
    for directory in work.iterdir():
        if directory.is_dir():
            shutil.rmtree(directory, ignore_errors=True)


def create_namespace(api: Api, name: str, mode: str) -> None:
    labels = {MODE_LABEL: mode} if selected_by_label(mode) else {}
    api.core.create_namespace({"metadata": {"name": name, "labels": labels}})


def create_native_quota(api: Api, namespace: str, cards: int) -> None:
    """A ResourceQuota with its status written as the resourcequota controller (not running here) would:
    the apiserver's admission refuses every pod of a namespace whose quota has no usage yet."""
    api.core.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "gpu"}, "spec": {"hard": {NATIVE_RESOURCE: str(cards)}}})
    api.core.patch_namespaced_resource_quota_status("gpu", namespace, {
        "status": {"hard": {NATIVE_RESOURCE: str(cards)}, "used": {NATIVE_RESOURCE: "0"}}})


def refused_for_quota(api: Api, namespace: str, quota: str, cards: int) -> bool:
    """Whether a dry-run create of ``cards`` cards is refused for exceeding a quota (reserves nothing, in
    Koordinator's admission too: it charges a dry run it admits, not one it refuses)."""
    try:
        api.core.create_namespaced_pod(namespace, whole_card_pod("probe", quota, cards), dry_run="All")
    except ApiException as error:
        # 403 from ours and the apiserver's ResourceQuota; koord-manager answers its refusals with 400.
        return error.status in (400, 403) and "exceeded quota" in str(error.body)
    return False


def create_koordinator_quota(api: Api, namespace: str, name: str, cards: int, labels: dict[str, str]) -> None:
    """A quota of ``cards`` nvidia.com/gpu (its admission counts names as written)."""
    create_quota_once_parent_known(api, namespace, name, {VENDOR_GPU: str(cards)}, labels=labels)


def admitted_dry_run(api: Api, namespace: str, quota: str) -> bool:
    try:
        api.core.create_namespaced_pod(namespace, whole_card_pod("probe", quota), dry_run="All")
    except ApiException:
        return False
    return True


@dataclass
class Target:
    """Where one burst creates its pods: a namespace and the quotas (ours) its pods charge."""

    namespace: str
    leaves: tuple[str, ...]
    room: int


def prepare_burst_target(rig: Rig, mode: str, namespace: str, room: int, burst_size: int) -> Target:
    """A fresh namespace with room for ``room`` one-card pods, admitting (and refusing beyond room) when returned;
    go-both's admits every pod, whatever ``room`` says."""
    create_namespace(rig.api, namespace, mode)
    if mode == GO_BOTH:
        # No quota and nothing refused: ready once the apiserver calls the Go reference for the namespace.
        wait_until_webhook_is_called(rig.api, namespace)
        return Target(namespace, (namespace,), room)
    if mode == "native":
        create_native_quota(rig.api, namespace, room)
        target = Target(namespace, (namespace,), room)  # the label is the same pod's; nothing reads it here
    elif mode in KOORDINATOR:
        # The same tree in the pods' own name. No dry-run admission probe: koord-manager charges every
        # dry run it admits (see refused_for_quota); a refused one shows it knows the leaf.
        parent, leaves = f"org-{namespace}", (f"a-{namespace}", f"b-{namespace}")
        create_koordinator_quota(rig.api, namespace, parent, room, {IS_PARENT_LABEL: "true"})
        for leaf in leaves:
            create_koordinator_quota(rig.api, namespace, leaf, burst_size, {PARENT_LABEL: parent})
            eventually(lambda q=leaf: refused_for_quota(rig.api, namespace, q, burst_size + 1),
                       f"{namespace} refuses {burst_size + 1} cards in {leaf}")
        return Target(namespace, leaves, room)
    else:
        parent, leaves = f"org-{namespace}", (f"a-{namespace}", f"b-{namespace}")
        create_quota(rig.api, namespace, parent, {RATIO: str(100 * room)},
                     labels={"quota.scheduling.koordinator.sh/is-parent": "true"})
        for leaf in leaves:  # each leaf has room for the whole burst: the parent binds
            create_quota(rig.api, namespace, leaf, {RATIO: str(100 * burst_size)}, labels={PARENT_LABEL: parent})
        for server in rig.servers_of(mode):
            for leaf in leaves:
                eventually(lambda s=server, q=leaf: admits_quota(s, namespace, q), f"server {server.port} sees {leaf}")
        target = Target(namespace, leaves, room)
    eventually(lambda: admitted_dry_run(rig.api, namespace, target.leaves[0]), f"{namespace} admits a pod")
    eventually(lambda: refused_for_quota(rig.api, namespace, target.leaves[0], room + 1),
               f"{namespace} refuses {room + 1} cards")
    return target


# -- measurements -------------------------------------------------------------------------------------

@dataclass
class BurstResult:
    mode: str
    kind: str  # "all" (room for every create) or "room" (room for fewer)
    seconds: float
    stored: int
    refused: Counter[str]
    cpu_ms_by_group: dict[str, float]
    at_ancestor: int
    per_leaf: list[int]
    # Per mode of ours, per server of it: what its quota service counted from just before the burst
    # until its watch had shown the burst's pods.
    counted: dict[str, list[Counter[CounterKey]]] = field(default_factory=dict)

    @property
    def cpu_ms(self) -> float:
        return sum(self.cpu_ms_by_group.values())


def create_one(core: k8s.CoreV1Api, namespace: str, body: dict[str, Any]) -> str:
    """"stored", or the HTTP status and reason of a refusal."""
    try:
        response = core.create_namespaced_pod(namespace, body, _preload_content=False)
        response.read()
        response.release_conn()
    except ApiException as error:
        if error.status in (400, 403) and "exceeded quota" in str(error.body):
            return f"{error.status} exceeded quota"
        return f"{error.status} {refusal_reason(error)}"
    return "stored"


def run_burst(rig: Rig, mode: str, kind: str, target: Target, size: int, clients: int) -> BurstResult:
    bodies = [whole_card_pod(f"p{index}", target.leaves[index % len(target.leaves)]) for index in range(size)]
    # Scraped outside the CPU window: a scrape is work of our servers that no admission causes.
    counted_before = {ours: [scraped_counters(server) for server in servers] for ours, servers in rig.servers.items()}
    with ThreadPoolExecutor(max_workers=clients) as pool:
        groups = rig.measured_groups()
        cpu_before = cpu_ticks(groups)
        started = time.perf_counter()
        outcomes = Counter(pool.map(lambda body: create_one(rig.burst_core, target.namespace, body), bodies))
        seconds = time.perf_counter() - started
        cpu_after = cpu_ticks(groups)
    pods = rig.api.core.list_namespaced_pod(target.namespace).items
    by_quota = Counter((pod.metadata.labels or {}).get(QUOTA_LABEL, "") for pod in pods)
    stored = outcomes.pop("stored", 0)
    if stored != len(pods):
        raise SystemExit(f"{target.namespace}: {stored} creates answered stored, {len(pods)} pods listed")
    cpu_ms = {group: cpu_ms_between(cpu_before[group], cpu_after[group]) for group in groups}
    counted = {ours: [watched_through(server, before, stored)
                      for server, before in zip(rig.servers[ours], befores, strict=True)]
               for ours, befores in counted_before.items()}
    return BurstResult(mode, kind, seconds, stored, outcomes, cpu_ms,
                       len(pods), [by_quota[leaf] for leaf in target.leaves], counted)


def watched_through(server: WebhookProcess, before: Counter[CounterKey], stored: int) -> Counter[CounterKey]:
    """What the server counted since ``before``, once it has had a Pod ADDED event per stored pod (a
    watch shows a pod a little after its create is answered), or when the deadline ends the wait."""
    deadline = time.monotonic() + READY_DEADLINE
    while True:
        counted = counted_between(before, scraped_counters(server))
        if counted[(WATCH_EVENTS_TOTAL, "Pod", "ADDED")] >= stored or time.monotonic() >= deadline:
            return counted
        time.sleep(0.05)  # polling a condition with a deadline


@dataclass
class Samples:
    modes: tuple[str, ...]
    paired_ms: dict[str, list[list[float]]] = field(init=False)
    bursts: list[BurstResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.paired_ms = {mode: [] for mode in self.modes}


def sequential_namespaces(rig: Rig, modes: tuple[str, ...], room: int) -> None:
    """One namespace per mode (and the unadmitted one) for the sequential creates, with room for all of them."""
    for mode in (UNADMITTED, *modes):
        namespace = f"seq-{mode}"
        create_namespace(rig.api, namespace, mode)
        if mode == "native":
            create_native_quota(rig.api, namespace, room)
        elif mode in KOORDINATOR:
            create_koordinator_quota(rig.api, namespace, namespace, room, {})
            eventually(lambda n=namespace: refused_for_quota(rig.api, n, n, room + 1), f"{namespace} refuses")
        elif is_ours(mode):
            # bench/apiserver_overhead.py's pod charges the quota named after its namespace.
            create_quota(rig.api, namespace, namespace, {RATIO: str(100 * room)})
            for server in rig.servers_of(mode):
                eventually(lambda s=server, n=namespace: admits_quota(s, n, n), f"{server.port} sees {namespace}")
            wait_until_webhook_is_called(rig.api, namespace)
        elif mode == GO_BOTH:
            wait_until_webhook_is_called(rig.api, namespace)
    if "native" in modes:
        eventually(lambda: admitted_dry_run(rig.api, "seq-native", "seq-native"), "seq-native admits a pod")
    assert not refused_for_quota(rig.api, f"seq-{UNADMITTED}", "none", room + 1), \
        "a quota applies to the unadmitted namespace"


def sequential_cycles(rig: Rig, modes: tuple[str, ...], cycles: int, first: int, shuffle: random.Random
                      ) -> dict[str, list[float]]:
    """``cycles`` cycles of one create per mode in a shuffled order; each mode's paired differences in ms."""
    order = [UNADMITTED, *modes]
    paired: dict[str, list[float]] = {mode: [] for mode in modes}
    for cycle in range(first, first + cycles):
        shuffle.shuffle(order)
        elapsed = {mode: create_pod(rig.api.core, f"seq-{mode}", f"pod-{cycle}") for mode in order}
        for mode in modes:
            paired[mode].append(elapsed[mode] - elapsed[UNADMITTED])
    return paired


# -- the table --------------------------------------------------------------------------------------

def spread(values: list[float], digits: int) -> str:
    middle = statistics.median(values)
    if len(values) == 1:
        return f"{middle:.{digits}f}"
    return f"{middle:.{digits}f} [{min(values):.{digits}f} – {max(values):.{digits}f}]"


def compared(mode: str, values: dict[str, list[float]], *, against_limit: bool = False) -> str:
    """How ``mode``'s median compares with native's (every other mode), with strict's (every variant), with
    koord-manager ×3's (every mode of ours: the peer a platform team weighs it against) and, when
    ``against_limit``, with go-both's (every other mode), for those of them measured in this run."""
    applies = {"native": True, "strict": is_variant(mode), "koord3": is_ours(mode), GO_BOTH: against_limit}
    references = [reference for reference, wanted in applies.items() if wanted and reference in values
                  and reference != mode]
    ratios = []
    for reference in references:
        theirs = statistics.median(values[reference])
        name = REFERENCE_NAMES[reference]
        ratios.append(f"{name}'s median is not above zero: no ratio" if theirs <= 0
                      else f"**{statistics.median(values[mode]) / theirs:.2f}x** {name}")
    return f" ({', '.join(ratios)})" if ratios else ""


def table(samples: Samples, args: argparse.Namespace) -> str:
    def bursts(mode: str, kind: str) -> list[BurstResult]:
        return [result for result in samples.bursts if result.mode == mode and result.kind == kind]

    modes = samples.modes
    overhead = {mode: [value for cycle in samples.paired_ms[mode] for value in cycle] for mode in modes}
    per_repetition = {mode: [statistics.median(cycle) for cycle in samples.paired_ms[mode]] for mode in modes}
    rate = {mode: [r.stored / r.seconds for r in bursts(mode, "all")] for mode in modes}
    cpu = {mode: [r.cpu_ms / r.stored for r in bursts(mode, "all")] for mode in modes}
    alone = {mode: own_groups(mode) for mode in modes}
    own_cpu = {mode: [sum(ms for group, ms in r.cpu_ms_by_group.items() if group in alone[mode]) / r.stored
                      for r in bursts(mode, "all")] for mode in modes}
    rows = {
        "added to a sequential create, p50 ms (paired against a namespace no admission applies to, same cycle;"
        " range: the repetitions' p50s)":
            {mode: f"{statistics.median(overhead[mode]):+.2f}" + (
                f" [{min(per_repetition[mode]):+.2f} – {max(per_repetition[mode]):+.2f}]"
                if len(per_repetition[mode]) > 1 else "") + compared(mode, overhead, against_limit=True)
             for mode in modes},
        f"burst of {args.burst_size} creates, {args.clients} clients, room for all: pods/s":
            {mode: spread(rate[mode], 1) + compared(mode, rate) for mode in modes},
        "pods refused with room for all (per burst: median, max; bursts with any refusal)":
            {mode: refusals(bursts(mode, "all")) for mode in modes},
        f"room for {args.room}, {args.burst_size} creates: stored (leaf, and at the ancestor)":
            {mode: stored_cell(bursts(mode, "room"), args.room, mode) if has_room(mode)
             else "n/a (no quota: it admits every pod)" for mode in modes},
        "CPU per admitted pod, all processes (apiserver, etcd, the webhook servers, HAProxy), ms":
            {mode: spread(cpu[mode], 2) + compared(mode, cpu) for mode in modes},
        "CPU per admitted pod, the apiserver, etcd and the mode's own servers and HAProxy (as if it ran alone: "
        "the other modes' servers, which watch these pods too, left out), ms":
            {mode: spread(own_cpu[mode], 2) + compared(mode, own_cpu) for mode in modes},
    }
    lines = ["| | " + " | ".join(title(mode) for mode in modes) + " |", "|---" * (len(modes) + 1) + "|"]
    lines += [f"| {title} | " + " | ".join(cells[mode] for mode in modes) + " |" for title, cells in rows.items()]
    groups = list(samples.bursts[0].cpu_ms_by_group)
    lines += ["", "CPU per admitted pod by process group, ms (bursts with room for all; medians). Every server "
              "watches every pod, so each also works for the bursts of the other modes.", "",
              "| | " + " | ".join(groups) + " |", "|---" * (len(groups) + 1) + "|"]
    for mode in modes:
        per_pod = {group: [r.cpu_ms_by_group[group] / r.stored for r in bursts(mode, "all")] for group in groups}
        lines.append(f"| {title(mode)} | " + " | ".join(f"{statistics.median(per_pod[g]):.2f}" for g in groups) + " |")
    for ours in samples.bursts[0].counted:
        lines += ["", counted_table(ours, {mode: bursts(mode, "all") for mode in modes})]
    return "\n".join(lines)


def counted_table(ours: str, bursts: dict[str, list[BurstResult]]) -> str:
    """Per admitted pod in each mode's bursts (room for all; medians): the watch events each server of
    ``ours`` applied, by kind and type, and the pods each charged again after a change of the quota tree
    (both the mean of its servers), and the ledger writes of its servers together, by result. A column
    whose every cell is zero is left out (bookmarks, mostly)."""
    def summed(result: BurstResult) -> Counter[CounterKey]:
        return sum(result.counted[ours], Counter())

    seen = sorted({key for results in bursts.values() for result in results for key in summed(result)})
    columns = [(f"{key[1]} {key[2]}", key, True) for key in seen if key[0] == WATCH_EVENTS_TOTAL]
    columns += [("pods charged again", key, True) for key in seen if key[0] == USAGE_RECHARGED_TOTAL]
    columns += [(f"ledger writes, {key[1]}", key, False) for key in seen if key[0] == LEDGER_WRITES_TOTAL]

    def per_pod(results: list[BurstResult], key: CounterKey, each: bool) -> str:
        """``each``: per server of ``ours`` (its mean), else all its servers together."""
        counts = [summed(result)[key] / (len(result.counted[ours]) if each else 1) / result.stored
                  for result in results]
        return f"{statistics.median(counts):.2f}"

    cells = {mode: [per_pod(results, key, each) for _, key, each in columns] for mode, results in bursts.items()}
    kept = [index for index in range(len(columns)) if any(row[index] != "0.00" for row in cells.values())]
    lines = [f"What the quota services of {process_groups(ours)[0]} counted per admitted pod (bursts with room for "
             "all; medians), from just before a burst until each one's watch showed the burst's pods: the watch "
             "events each applied, by kind and type, and the pods each charged again after a change of the quota "
             "tree; the ledger writes of them all, by result.", "",
             "| bursts of | " + " | ".join(columns[index][0] for index in kept) + " |", "|---" * (len(kept) + 1) + "|"]
    lines += [f"| {title(mode)} | " + " | ".join(row[index] for index in kept) + " |" for mode, row in cells.items()]
    return "\n".join(lines)


def refusals(results: list[BurstResult]) -> str:
    counts = [sum(result.refused.values()) for result in results]
    reasons: Counter[str] = Counter()
    for result in results:
        reasons.update(result.refused)
    why = f" ({', '.join(f'{reason}: {n}' for reason, n in sorted(reasons.items()))})" if reasons else ""
    return (f"{statistics.median(counts):g}, {max(counts)}; "
            f"{sum(1 for count in counts if count)} of {len(counts)} bursts{why}")


def stored_cell(results: list[BurstResult], room: int, mode: str) -> str:
    totals = sorted({result.at_ancestor for result in results})
    cell = " or ".join(str(total) for total in totals) + f" of {room}"
    if mode == "native":
        return cell + " (the namespace's ResourceQuota)"
    leaves = [count for result in results for count in result.per_leaf]
    return cell + f" at the ancestor; leaves {min(leaves)} – {max(leaves)} each"


# -- main -------------------------------------------------------------------------------------------

def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, help="rounds, each: a share of the sequential cycles, then "
                                                         f"every mode's bursts shuffled (default {DEFAULT_ROUNDS})")
    parser.add_argument("--bursts", type=int, help="bursts with room for all, per mode, spread over the "
                                                   f"repetitions (default {DEFAULT_ROUNDS})")
    parser.add_argument("--cycles", type=int, default=300, help="sequential cycles per repetition")
    parser.add_argument("--burst-size", type=int, default=300)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--room", type=int, default=100, help="room of the bursts with room for fewer")
    parser.add_argument("--issue-sizes", action="store_true",
                        help=f"issue 29's sizes: {ISSUE_REPETITIONS} repetitions, {ISSUE_BURSTS} bursts "
                             "(unless --repetitions or --bursts says otherwise)")
    parser.add_argument("--workers", type=int, help="workers of every server (default: the server's own)")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help=f"another checkout of this repository, served as the mode {STRICT_BASELINE} "
                             f"(--variant {BASELINE}=CHECKOUT)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=CHECKOUT",
                        help=f"another checkout of this repository, served as the mode {VARIANT_PREFIX}NAME; "
                             "repeatable")
    parser.add_argument("--balance", action="append", default=[], metavar="NAME=ALGORITHM",
                        help="HAProxy's balance algorithm in front of variant NAME (default roundrobin; first: "
                             "every connection to the first replica that is up, the others standing by); repeatable")
    parser.add_argument("--modes", help=f"comma-separated modes to measure (default: {', '.join(MODES)} and every "
                                        f"variant; {UNADMITTED} always runs; also known: {', '.join(OPT_IN)})")
    args = parser.parse_args(argv)
    if args.repetitions is None:
        args.repetitions = ISSUE_REPETITIONS if args.issue_sizes else DEFAULT_ROUNDS
    if args.bursts is None:
        args.bursts = ISSUE_BURSTS if args.issue_sizes else DEFAULT_ROUNDS
    if args.room >= args.burst_size:
        parser.error("--room must be less than --burst-size: the room-for-fewer bursts must meet their limit")
    specs = [f"{BASELINE}={args.baseline}"] if args.baseline is not None else []
    try:
        args.variants = variant_checkouts([*specs, *args.variant])
        args.modes = chosen_modes(args.modes, args.variants)
    except ValueError as error:
        parser.error(str(error))
    # Variants no chosen mode measures are not started.
    args.variants = {mode: checkout for mode, checkout in args.variants.items() if mode in args.modes}
    args.balances = {}
    for spec in args.balance:
        name, _, algorithm = spec.partition("=")
        if VARIANT_PREFIX + name not in args.variants or algorithm not in BALANCE_ALGORITHMS:
            parser.error(f"--balance {spec!r}: expected NAME=ALGORITHM for a measured variant NAME and one of "
                         f"{', '.join(BALANCE_ALGORITHMS)}")
        args.balances[VARIANT_PREFIX + name] = algorithm
    return args


def described_checkout(checkout: Path) -> str:
    """The checkout's path, and its commit and whether it has uncommitted changes when it is a git checkout."""
    head = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h %s"],
                          capture_output=True, text=True, check=False)
    if head.returncode != 0:
        return str(checkout)
    changed = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True, check=False).stdout.strip()
    return f"{checkout} at {head.stdout.strip()}" + (" with uncommitted changes" if changed else "")


def main(argv: list[str]) -> None:
    args = parse(argv)
    shuffle = random.Random(args.seed)
    worker_args = ["--workers", str(args.workers)] if args.workers else []
    modes: tuple[str, ...] = args.modes
    work = Path(tempfile.mkdtemp(prefix="gpuquota-bench-production-"))
    samples = Samples(modes)
    rig: Rig | None = None
    try:
        rig = start_plane(work, args.clients, modes)
        start_servers(rig, work, modes, worker_args, args.variants, args.balances)
        # Twice the creates: the sequential phase times the quota work, it does not test the room (the
        # bursts do), and an exact fit turned one transient over-count into a failed run (issue 37's note).
        sequential_namespaces(rig, modes, 2 * (args.repetitions * args.cycles + WARMUP_CYCLES + 1))
        sequential_cycles(rig, modes, WARMUP_CYCLES, 0, shuffle)
        # One unmeasured burst per mode opens the client's connections and warms every server.
        for mode in modes:
            run_burst(rig, mode, "warm-up", prepare_burst_target(rig, mode, f"{mode}-warm", args.clients,
                                                                 args.clients + 1), args.clients, args.clients)
        for repetition in range(args.repetitions):
            paired = sequential_cycles(rig, modes, args.cycles, WARMUP_CYCLES + repetition * args.cycles, shuffle)
            for mode in modes:
                samples.paired_ms[mode].append(paired[mode])
            full = len(range(repetition, args.bursts, args.repetitions))  # this repetition's share of the bursts
            jobs = [(mode, "all", index) for mode in modes for index in range(full)] + \
                   [(mode, "room", 0) for mode in modes if has_room(mode)]
            shuffle.shuffle(jobs)
            for mode, kind, index in jobs:
                room = args.burst_size if kind == "all" else args.room
                target = prepare_burst_target(rig, mode, f"{mode}-{kind}-r{repetition}-{index}", room, args.burst_size)
                result = run_burst(rig, mode, kind, target, args.burst_size, args.clients)
                samples.bursts.append(result)
                print(f"repetition {repetition + 1}: {mode} {kind}: {result.stored} stored in {result.seconds:.2f}s, "
                      f"{sum(result.refused.values())} refused, {result.cpu_ms:.0f} ms CPU", file=sys.stderr)
    finally:
        stop_rig(rig, work)
    print(f"{args.repetitions} repetitions; sequential: {args.cycles} cycles per repetition of one create per mode "
          f"and one into a namespace no admission applies to, shuffled (after {WARMUP_CYCLES} warm-up cycles), "
          f"one kept-alive connection; bursts: {args.bursts} per mode with room for all and "
          f"{args.repetitions} with room for {args.room}"
          + (f" ({GO_BOTH} none: no quota applies)" if GO_BOTH in modes else "")
          + f", {args.burst_size} creates from {args.clients} threads "
          f"each, every repetition's bursts in a shuffled order; medians [min – max]\n")
    for mode, checkout in args.variants.items():
        balance = f", HAProxy balance {args.balances[mode]}" if mode in args.balances else ""
        print(f"{title(mode)}: the code of {described_checkout(checkout)}{balance}\n")
    print(table(samples, args))
    samples_path = work / "samples.json"
    samples_path.write_text(json.dumps({
        "args": {**vars(args), "variants": {mode: str(checkout) for mode, checkout in args.variants.items()}},
        "paired_ms": samples.paired_ms,
        "bursts": [{**vars(result), "refused": dict(result.refused),
                    "counted": {ours: [{" ".join(key): value for key, value in server.items()} for server in counted]
                                for ours, counted in result.counted.items()}}
                   for result in samples.bursts]}), encoding="utf-8")
    print(f"\nsamples: {samples_path}")


if __name__ == "__main__":
    main(sys.argv[1:])
