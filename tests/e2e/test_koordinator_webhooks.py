"""Issue 35 §3e: koord-manager's webhooks and ours on one apiserver.

A control plane of this module's own (other tests share the session's apiserver, and koord-manager's
webhooks judge whatever their selectors match) with Koordinator's CRDs, our webhook as shipped
(``gpuquota serve --kubeconfig``, registered through the project's configurations) and two
koord-managers built from Koordinator's module, one per feature-gate scenario below. Each judges
only namespaces labelled with its scenario; a namespace without the label is judged by ours alone,
and one with the label and our opt-out label by theirs alone.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from admissionchain import (
    delete_webhook_configurations,
    local_webhook_configurations,
    register_webhook_configurations,
    wait_until_webhook_is_called,
)
from click.testing import CliRunner
from clusterhelpers import create_quota, read_quota
from controlplane import (
    Api,
    Binaries,
    ControlPlane,
    create_gpu_node,
    make_api,
)
from koordinator import (
    Gpu,
    KoordinatorBuild,
    create_gpu_device,
    install_koordinator_crds,
    koordinator_allocatable,
    quota_annotation,
    wait_for,
)
from koordmanager import (
    GPU_SHARED,
    KoordManager,
    create_quota_once_parent_known,
    start_koord_manager,
    stored_configurations,
)
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from webhookproc import WebhookProcess

from cli.main import cli
from gpuquota_core.canonical import ORIGINAL_RESOURCES_ANNOTATION

# The feature gates of each koord-manager, named here and nowhere else. Koordinator's defaults
# (all three off) and the gates that make its pod and quota webhooks judge what ours judges:
# ValidatePodDeviceResource (its GPU request validation), EnableQuotaAdmission (its quota admission,
# pkg/webhook/pod/validating/evaluate_quota.go) and ElasticQuotaEnableUpdateResourceKey (a child's
# max keys a subset of its parent's, the gate `migrate --update-resource-key-gate` is for).
DEFAULTS = "koordinator-defaults"
GATED = "quota-admission-and-device-validation"
SCENARIOS: dict[str, dict[str, bool]] = {
    DEFAULTS: {"ValidatePodDeviceResource": False, "EnableQuotaAdmission": False,
               "ElasticQuotaEnableUpdateResourceKey": False},
    GATED: {"ValidatePodDeviceResource": True, "EnableQuotaAdmission": True,
            "ElasticQuotaEnableUpdateResourceKey": True},
}
SCENARIO_LABEL = "koordinator-e2e.koord-gpuquota.io/scenario"
OUR_OPT_OUT_LABEL = "gpuquota.koord-gpuquota.io/ignore"
OUR_MUTATING_CONFIGURATION = "gpuquota-webhook"
OUR_MUTATING_WEBHOOK = "canonical-gpu.gpuquota.koord-gpuquota.io"
OUR_VALIDATING_WEBHOOK = "gpu-quota.gpuquota.koord-gpuquota.io"
THEIR_POD_WEBHOOKS = ("vpod.koordinator.sh", "mpod-create.koordinator.sh")
GPU_CORE = "koordinator.sh/gpu-core"
GPU_RATIO = "koordinator.sh/gpu-memory-ratio"
PARENT_LABEL = "quota.scheduling.koordinator.sh/parent"
IS_PARENT_LABEL = "quota.scheduling.koordinator.sh/is-parent"
KOORD_NODE = "koord-gpu-0"
VENDOR_NODE = "vendor-gpu-0"
NODE_FAMILY_LABEL = "koordinator-e2e.koord-gpuquota.io/gpu-family"
# Room for every shape below. No gpu-memory-ratio in it: ours refuses a pod asking gpu-memory in
# bytes against a ratio max (bytes cannot be converted), which would hide what theirs does with it.
ROOMY_MAX = {"cpu": "1000", GPU_CORE: "1000000"}


# -- the cluster ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plane(control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    # No kube-scheduler or controller manager: nothing here needs a pod bound, only admitted.
    control_plane = ControlPlane(control_plane_binaries, base_dir=tmp_path_factory.mktemp("koord-webhooks"))
    control_plane.start()
    try:
        yield control_plane
    finally:
        control_plane.stop()


@pytest.fixture(scope="module")
def kapi(plane: ControlPlane, koordinator_build: KoordinatorBuild) -> Iterator[Api]:
    handle = make_api(plane.kubeconfig_path)
    install_koordinator_crds(handle, koordinator_build)
    # A node as koordlet and koord-manager's GPUDeviceResource plugin report it (Device + allocatable),
    # so that our `rewrite: auto` rewrites; and one running only the NVIDIA device plugin.
    gpus = [Gpu(minor) for minor in range(8)]
    create_gpu_node(handle.core, KOORD_NODE, {"cpu": "64", "memory": "512Gi", **koordinator_allocatable(gpus)},
                    labels={NODE_FAMILY_LABEL: "koordinator"})
    create_gpu_device(handle, KOORD_NODE, gpus)
    create_gpu_node(handle.core, VENDOR_NODE, {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
                    labels={NODE_FAMILY_LABEL: "vendor"})
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture(scope="module")
def ours(plane: ControlPlane, kapi: Api, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    """Our webhook as shipped, through the project's own configurations (its namespaceSelector too)."""
    server = WebhookProcess(tmp_path_factory.mktemp("ours"),
                            serve_args=["--kubeconfig", str(plane.kubeconfig_path), "--workers", "2"])
    server.start()
    documents = local_webhook_configurations(server.url, server.ca_bundle)
    register_webhook_configurations(kapi, documents)
    try:
        wait_until_webhook_is_called(kapi, make_namespace(kapi, None))
        yield server
    finally:
        delete_webhook_configurations(kapi, documents)
        server.stop()


@pytest.fixture(scope="module")
def theirs(plane: ControlPlane, kapi: Api, koordinator_build: KoordinatorBuild,
           ours: WebhookProcess) -> dict[str, KoordManager]:
    return {scenario: start_koord_manager(plane, kapi, koordinator_build, feature_gates=gates,
                                          namespace_labels={SCENARIO_LABEL: scenario}, name=f"koord-manager-{scenario}")
            for scenario, gates in SCENARIOS.items()}


def make_namespace(api: Api, scenario: str | None, *, ours_too: bool = True) -> str:
    """A namespace judged by ours (unless ``ours_too`` is false) and by the koord-manager of ``scenario``."""
    labels = {} if scenario is None else {SCENARIO_LABEL: scenario}
    if not ours_too:
        labels[OUR_OPT_OUT_LABEL] = "true"
    name = f"{'ours' if scenario is None else scenario[:12]}-{uuid.uuid4().hex[:8]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=labels)))
    return name


def their_admission_knows(kapi: Api, scenario: str, quota: str, over: Mapping[str, str]) -> None:
    """Wait until the koord-manager of ``scenario`` finds ``quota`` when it admits a pod: its quota
    admission reads quotas from its watch cache and refuses a pod of a quota not there yet
    (``elastic quota <name> not found``). Probed with dry-run pods asking ``over`` (more than the
    quota's max) from a namespace only it judges: refused ``exceeded quota`` once it knows the quota,
    and a refused dry run charges nothing."""
    if not SCENARIOS[scenario]["EnableQuotaAdmission"]:
        return
    namespace = make_namespace(kapi, scenario, ours_too=False)
    probe = Shape((dict(over),)).pod("knows-quota")
    probe["metadata"]["labels"] = {"quota.scheduling.koordinator.sh/name": quota}

    def refused_over_quota() -> bool:
        try:
            kapi.core.create_namespaced_pod(namespace, probe, dry_run="All")
        except ApiException as exc:
            # Its message: "exceeded quota: <namespace>/<quota>, requested: ..."
            return "vpod.koordinator.sh" in str(exc.body) and f"/{quota}, requested: " in str(exc.body)
        raise AssertionError(f"a dry run over {quota}'s max was admitted (and charged)")
    wait_for(refused_over_quota, f"koord-manager of {scenario} knows quota {quota}")


# -- pods ------------------------------------------------------------------------------------------

Resources = Mapping[str, str]


@dataclass(frozen=True)
class Shape:
    """A pod's GPU requests (requests = limits), one mapping per app container, plus init containers."""

    containers: tuple[Resources, ...]
    init_containers: tuple[Resources, ...] = ()
    node_family: str | None = None

    @property
    def key(self) -> str:
        def render(resources: Resources) -> str:
            return "{" + ",".join(f"{name}={value}" for name, value in sorted(resources.items())) + "}"
        text = " ".join(render(c) for c in self.containers)
        if self.init_containers:
            text += " init " + " ".join(render(c) for c in self.init_containers)
        return text + (f" on {self.node_family}" if self.node_family else "")

    def pod(self, name: str) -> dict[str, Any]:
        def container(prefix: str, index: int, resources: Resources) -> dict[str, Any]:
            return {"name": f"{prefix}{index}", "image": "registry.example/train:1",
                    "resources": {"requests": {"cpu": "100m", **resources}, "limits": dict(resources)}}
        spec: dict[str, Any] = {"containers": [container("main", i, r) for i, r in enumerate(self.containers)]}
        if self.init_containers:
            spec["initContainers"] = [container("init", i, r) for i, r in enumerate(self.init_containers)]
        if self.node_family:
            spec["nodeSelector"] = {NODE_FAMILY_LABEL: self.node_family}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


FIXED_SHAPES: tuple[Shape, ...] = (
    Shape(({"nvidia.com/gpu": "1"},)),
    Shape(({"nvidia.com/gpu": "2"},)),
    Shape(({"nvidia.com/gpu": "1"},), node_family="vendor"),
    Shape(({"nvidia.com/gpu": "0"},)),
    Shape(({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1"})),
    Shape(({"koordinator.sh/gpu": "50"},)),
    Shape(({"koordinator.sh/gpu": "100"},)),
    Shape(({"koordinator.sh/gpu": "200"},)),
    Shape(({"koordinator.sh/gpu": "0"},)),
    Shape(({"koordinator.sh/gpu": "150"},)),
    Shape(({GPU_RATIO: "50"},)),
    Shape(({GPU_RATIO: "100"},)),
    Shape(({GPU_RATIO: "200"},)),
    Shape(({GPU_RATIO: "150"},)),
    Shape(({GPU_RATIO: "0"},)),
    Shape(({GPU_CORE: "50", GPU_RATIO: "50"},)),
    Shape(({GPU_CORE: "100", GPU_RATIO: "100"},)),
    Shape(({GPU_CORE: "200", GPU_RATIO: "200"},)),
    Shape(({GPU_CORE: "100", GPU_RATIO: "50"},)),
    Shape(({GPU_CORE: "50"},)),
    Shape(({"koordinator.sh/gpu-memory": "16Gi"},)),
    Shape(({GPU_CORE: "100", "koordinator.sh/gpu-memory": "16Gi"},)),
    Shape(({GPU_CORE: "200", "koordinator.sh/gpu-memory": "32Gi"},)),
    Shape(({"koordinator.sh/gpu-memory": "16Gi", GPU_RATIO: "50"},)),
    Shape(({GPU_SHARED: "2", GPU_CORE: "100", GPU_RATIO: "100"},)),
    Shape(({GPU_SHARED: "2", GPU_RATIO: "150"},)),
    Shape(({GPU_SHARED: "1"},)),
    Shape(({GPU_SHARED: "0", GPU_RATIO: "50"},)),
    Shape(({"kubernetes.io/gpu": "100"},)),
    Shape(({"kubernetes.io/gpu-core": "50", "kubernetes.io/gpu-memory-ratio": "50"},)),
    Shape(({"kubernetes.io/gpu-memory-ratio": "100"},)),
    Shape(({"nvidia.com/gpu": "1", GPU_RATIO: "100"},)),
    Shape(({"nvidia.com/gpu": "1", "amd.com/gpu": "1"},)),
    Shape(({"nvidia.com/gpu": "1"},), init_containers=({"nvidia.com/gpu": "2"},)),
    Shape(({GPU_RATIO: "50"},), init_containers=({"nvidia.com/gpu": "1"},)),
)
VOCABULARY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nvidia.com/gpu", ("0", "1", "2", "4")),
    ("koordinator.sh/gpu", ("0", "25", "100", "300", "101")),
    (GPU_CORE, ("0", "50", "100", "200", "150")),
    (GPU_RATIO, ("0", "25", "50", "100", "200", "250")),
    ("koordinator.sh/gpu-memory", ("8Gi", "80Gi")),
    (GPU_SHARED, ("1", "2")),
    ("kubernetes.io/gpu", ("50", "100")),
    ("kubernetes.io/gpu-memory-ratio", ("50", "200")),
)


def generated_shapes(seed: int, count: int) -> list[Shape]:
    """``count`` single-container shapes of one to three GPU names drawn from VOCABULARY."""
    chooser = random.Random(seed)
    shapes: list[Shape] = []
    while len(shapes) < count:
        names = chooser.sample(VOCABULARY, chooser.choice((1, 1, 2, 2, 3)))
        shape = Shape(({name: chooser.choice(values) for name, values in names},))
        if shape not in shapes and shape not in FIXED_SHAPES:
            shapes.append(shape)
    return shapes


SHAPES = (*FIXED_SHAPES, *generated_shapes(seed=35, count=25))


@dataclass
class Outcome:
    admitted: bool
    message: str = ""
    resources: list[dict[str, dict[str, str]]] = field(default_factory=list)

    @property
    def refused_by(self) -> str:
        found = re.search(r'admission webhook "([^"]+)" denied', self.message)
        return found.group(1) if found else ""


def create(api: Api, namespace: str, shape: Shape, name: str) -> Outcome:
    try:
        stored = api.core.create_namespaced_pod(namespace, shape.pod(name))
    except ApiException as exc:
        body = json.loads(exc.body) if exc.body else {}
        return Outcome(False, str(body.get("message", exc.reason)))
    resources = [{"requests": dict(c.resources.requests or {}), "limits": dict(c.resources.limits or {})}
                 for c in stored.spec.containers]
    return Outcome(True, resources=resources)


def mutate_calls(server: WebhookProcess) -> dict[str, float]:
    """gpuquota_admission_requests_total for /mutate-pods CREATE, by result."""
    status, body = server.get("/metrics")
    assert status == 200
    calls: dict[str, float] = {}
    for line in body.decode().splitlines():
        found = re.match(r'gpuquota_admission_requests_total\{(.*)\} (\S+)$', line)
        if found and 'endpoint="/mutate-pods"' in found.group(1) and 'operation="CREATE"' in found.group(1):
            result = re.search(r'result="([^"]+)"', found.group(1))
            assert result is not None
            calls[result.group(1)] = calls.get(result.group(1), 0.0) + float(found.group(2))
    return calls


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key, 0.0)}


# -- what koord-manager installs, and the order of the two mutators --------------------------------

def test_koord_manager_serves_the_webhooks_its_gates_enable_at_its_url(
        kapi: Api, theirs: dict[str, KoordManager]) -> None:
    for manager in theirs.values():
        mutating, validating = stored_configurations(kapi, manager)
        assert {w["name"]: w["clientConfig"].get("url") for w in mutating["webhooks"]} == {
            "melasticquota.koordinator.sh": f"{manager.url}/mutate-scheduling-sigs-k8s-io-v1alpha1-elasticquota",
            "mpod-create.koordinator.sh": f"{manager.url}/mutate-pod",
            "mpod-update.koordinator.sh": f"{manager.url}/mutate-pod",
        }, manager.name
        # Its node, configmap and reservation webhooks are dropped: their gates are off by default.
        assert {w["name"]: w["clientConfig"].get("url") for w in validating["webhooks"]} == {
            "velasticquota.koordinator.sh": f"{manager.url}/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota",
            "vpod.koordinator.sh": f"{manager.url}/validate-pod",
        }, manager.name


def test_only_our_mutator_asks_to_be_reinvoked(
        kapi: Api, theirs: dict[str, KoordManager]) -> None:
    ours_config = kapi.client.sanitize_for_serialization(
        kapi.admissionregistration.read_mutating_webhook_configuration(OUR_MUTATING_CONFIGURATION))
    assert [w["reinvocationPolicy"] for w in ours_config["webhooks"]] == ["IfNeeded"]
    for manager in theirs.values():
        mutating, _ = stored_configurations(kapi, manager)
        # Koordinator's files set none; the apiserver's default is Never.
        assert {w["reinvocationPolicy"] for w in mutating["webhooks"]} == {"Never"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_stored_pod_when_both_mutate(kapi: Api, ours: WebhookProcess, theirs: dict[str, KoordManager],
                                         scenario: str) -> None:
    namespace = make_namespace(kapi, scenario)
    before = mutate_calls(ours)
    outcome = create(kapi, namespace, Shape(({"nvidia.com/gpu": "2"},)), "two-cards")
    after = mutate_calls(ours)

    # The apiserver calls mutating configurations in name order ("gpuquota-webhook" first): ours
    # rewrote nvidia.com/gpu to the canonical names; theirs, called next, added gpu.shared (two cards:
    # 200/100; had it run first it would have left nvidia.com/gpu alone, and never been called again);
    # the apiserver called ours again because theirs changed the pod, and ours left it.
    assert outcome.admitted, outcome.message
    expected = {GPU_CORE: "200", GPU_RATIO: "200", GPU_SHARED: "2"}
    assert outcome.resources == [{"requests": {"cpu": "100m", **expected}, "limits": expected}]
    assert delta(after, before) == {"patched": 1.0, "allowed": 1.0}
    stored = kapi.core.read_namespaced_pod("two-cards", namespace)
    assert json.loads(stored.metadata.annotations[ORIGINAL_RESOURCES_ANNOTATION]) == {"containers": {
        "main0": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}}}

    # Pinned to a node with only the NVIDIA device plugin, ours leaves the pod as written; theirs
    # never touches nvidia.com/gpu; nobody changed it, so ours is called once.
    before = mutate_calls(ours)
    outcome = create(kapi, namespace, Shape(({"nvidia.com/gpu": "1"},), node_family="vendor"), "vendor-only")
    assert outcome.admitted, outcome.message
    assert outcome.resources == [{"requests": {"cpu": "100m", "nvidia.com/gpu": "1"},
                                  "limits": {"nvidia.com/gpu": "1"}}]
    assert sum(delta(mutate_calls(ours), before).values()) == 1.0


# -- every pod ours admits, theirs admits ----------------------------------------------------------

ZERO_SHARE = "the requested GPU must be greater than zero"


def their_refusal(shape: Shape, gates: Mapping[str, bool]) -> str | None:
    """What koord-manager's pod webhooks refuse of a pod ours admits: the differences table of docs/koordinator.md.

    With ValidatePodDeviceResource, a container whose ``gpu.shared`` is zero: written so, or injected
    by its own mutator, which derives ``gpu.shared`` for a gpu-core above 100 from the (absent)
    gpu-memory-ratio when the memory is asked in bytes (pkg/webhook/pod/mutating/
    device_resource_spec.go). Ours reads a zero as asking for nothing.
    """
    if not gates["ValidatePodDeviceResource"]:
        return None
    for container in shape.containers:
        if container.get(GPU_SHARED) == "0":
            return ZERO_SHARE
        core = int(container.get(GPU_CORE, "0"))
        if (GPU_SHARED not in container and GPU_RATIO not in container and "koordinator.sh/gpu-memory" in container
                and core > 100 and core % 100 == 0):
            return ZERO_SHARE
    return None


def judged_two_ways(kapi: Api, scenario: str) -> list[tuple[Shape, Outcome, Outcome]]:
    """Each shape created in a namespace judged by ours alone and in one judged by both; each
    namespace has a quota of its name (so both quota admissions judge the pod) with room for all."""
    alone_namespace, both_namespace = make_namespace(kapi, None), make_namespace(kapi, scenario)
    for namespace in (alone_namespace, both_namespace):
        create_quota(kapi, namespace, namespace, ROOMY_MAX)
    their_admission_knows(kapi, scenario, both_namespace, {"cpu": "2000"})
    return [(shape, create(kapi, alone_namespace, shape, f"shape-{index}"),
             create(kapi, both_namespace, shape, f"shape-{index}")) for index, shape in enumerate(SHAPES)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_pod_ours_admits_is_admitted_beside_theirs(kapi: Api, ours: WebhookProcess,
                                                         theirs: dict[str, KoordManager], scenario: str) -> None:
    gates = SCENARIOS[scenario]
    differences: list[str] = []
    admitted_by_ours = 0
    for shape, alone, both in judged_two_ways(kapi, scenario):
        if alone.admitted:
            admitted_by_ours += 1
            expected = their_refusal(shape, gates)
            if both.admitted and expected is None:
                continue
            if not both.admitted and expected is not None and both.refused_by == "vpod.koordinator.sh" \
                    and expected in both.message:
                continue
            differences.append(f"{shape.key}: ours admits; beside theirs "
                               f"{'admitted' if both.admitted else both.message}; expected {expected or 'admitted'}")
        elif both.admitted:
            differences.append(f"{shape.key}: ours alone refuses ({alone.message}), beside theirs admitted "
                               f"{both.resources}")
    assert differences == []
    assert admitted_by_ours >= len(SHAPES) // 2  # the comparison is about something


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_zero_gpu_shared_beside_theirs(kapi: Api, ours: WebhookProcess, theirs: dict[str, KoordManager],
                                         scenario: str) -> None:
    """docs/koordinator.md row: ``gpu.shared: 0``, also the one koord-manager injects itself for gpu-core 200 with
    gpu-memory in bytes. Ours admits both; theirs stores them without ValidatePodDeviceResource and
    refuses them with it."""
    namespace = make_namespace(kapi, scenario)
    written = create(kapi, namespace, Shape(({GPU_RATIO: "50", GPU_SHARED: "0"},)), "written-zero")
    injected = create(kapi, namespace, Shape(({GPU_CORE: "200", "koordinator.sh/gpu-memory": "32Gi"},)),
                      "injected-zero")
    if SCENARIOS[scenario]["ValidatePodDeviceResource"]:
        for outcome in (written, injected):
            assert not outcome.admitted
            assert outcome.message == ('admission webhook "vpod.koordinator.sh" denied the request: '
                                       'pod.spec.containers[*].resources.requests: Invalid value: "0": '
                                       f"{ZERO_SHARE}")
    else:
        assert written.resources == [{"requests": {"cpu": "100m", GPU_RATIO: "50", GPU_SHARED: "0"},
                                      "limits": {GPU_RATIO: "50", GPU_SHARED: "0"}}]
        bytes_share = {GPU_CORE: "200", "koordinator.sh/gpu-memory": "32Gi", GPU_SHARED: "0"}
        assert injected.resources == [{"requests": {"cpu": "100m", **bytes_share}, "limits": bytes_share}]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_disagreeing_spellings_are_refused_by_our_mutator_beside_theirs(
        kapi: Api, ours: WebhookProcess, theirs: dict[str, KoordManager], scenario: str) -> None:
    """docs/koordinator.md row: ``koordinator.sh/gpu: 2, gpu-core: 1``. Their mutator, called after ours, would
    write gpu-core and gpu-memory-ratio from koordinator.sh/gpu before our validation saw the pod,
    which would then admit it in that reading. Our mutator refuses it first, with the answer our
    validation gives, so the pod is refused alike with and without koord-manager, and never stored."""
    shape = Shape(({"koordinator.sh/gpu": "2", GPU_CORE: "1"},))
    alone = create(kapi, make_namespace(kapi, None), shape, "disagree")
    both_namespace = make_namespace(kapi, scenario)
    both = create(kapi, both_namespace, shape, "disagree")
    # Koordinator's reading, where only theirs judges: what ours would admit had it not refused first.
    theirs_alone = create(kapi, make_namespace(kapi, scenario, ours_too=False), shape, "disagree")

    for outcome in (alone, both):
        assert outcome.refused_by == OUR_MUTATING_WEBHOOK, outcome.message
        assert "[rule: spellings-disagree]" in outcome.message
    assert alone.message == both.message
    assert kapi.core.list_namespaced_pod(both_namespace).items == []
    koordinator_reading = {GPU_CORE: "2", GPU_RATIO: "2", GPU_SHARED: "1"}
    assert theirs_alone.resources == [{"requests": {"cpu": "100m", **koordinator_reading},
                                       "limits": koordinator_reading}]


# -- ElasticQuotas written by `gpuquota migrate apply` ---------------------------------------------

def migrate(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["migrate", "apply", "--kubeconfig", str(kubeconfig), *args])
    return result.exit_code, result.stdout, result.stderr


def legacy_tree(kapi: Api, namespace: str, levels: Sequence[tuple[int, int]]) -> list[str]:
    """A chain of legacy quotas (nvidia.com/gpu max, min), parent first; each created once the parent is
    in their webhook's view (it judges a child against a topology fed by a watch)."""
    names: list[str] = []
    for depth, (cards_max, cards_min) in enumerate(levels):
        name = f"l{depth}-{namespace}"
        labels = {IS_PARENT_LABEL: "true"} if depth < len(levels) - 1 else {}
        if names:
            labels[PARENT_LABEL] = names[-1]

        create_quota_once_parent_known(kapi, namespace, name, {"nvidia.com/gpu": str(cards_max)},
                                       min_={"nvidia.com/gpu": str(cards_min)}, labels=labels)
        names.append(name)
    return names


@pytest.mark.parametrize(("scenario", "mode"), [(DEFAULTS, "--all-at-once"), (GATED, "--update-resource-key-gate")])
def test_every_quota_migrate_apply_writes_passes_their_elasticquota_webhook(
        plane: ControlPlane, kapi: Api, ours: WebhookProcess, theirs: dict[str, KoordManager],
        scenario: str, mode: str, tmp_path: Path) -> None:
    namespace = make_namespace(kapi, scenario)
    names = legacy_tree(kapi, namespace, [(8, 4), (6, 3), (4, 2)])
    # Theirs filled in what it fills on create: the root as parent of the top quota.
    assert read_quota(kapi, namespace, names[0])["metadata"]["labels"][PARENT_LABEL] == "koordinator-root-quota"

    code, out, err = migrate(plane.kubeconfig_path, "-n", namespace, "--backup", str(tmp_path / "backup.yaml"), mode)

    assert code == 0, f"{out}\n{err}\n{theirs[scenario].log_path}"
    for name, cards in zip(names, (8, 6, 4), strict=True):
        stored = read_quota(kapi, namespace, name)
        assert stored["spec"]["max"] == {GPU_CORE: str(100 * cards), GPU_RATIO: str(100 * cards)}, name
    assert [read_quota(kapi, namespace, n)["metadata"]["labels"].get(PARENT_LABEL) for n in names] == [
        "koordinator-root-quota", names[0], names[1]]


# -- quota admission side by side ------------------------------------------------------------------

def test_their_quota_admission_does_not_count_vendor_cards_against_a_canonical_max(
        kapi: Api, ours: WebhookProcess, theirs: dict[str, KoordManager]) -> None:
    """The seed's problem at admission: with EnableQuotaAdmission alone, three nvidia.com/gpu: 1 pods
    are admitted under a max of two cards in gpu-memory-ratio; with ours beside it, two."""
    one_card = Shape(({"nvidia.com/gpu": "1"},))
    admitted = {}
    for label, ours_too in (("theirs alone", False), ("both", True)):
        namespace = make_namespace(kapi, GATED, ours_too=ours_too)
        create_quota(kapi, namespace, namespace, {GPU_RATIO: "200"})
        their_admission_knows(kapi, GATED, namespace, {GPU_RATIO: "300"})
        outcomes = [create(kapi, namespace, one_card, f"card-{index}") for index in range(3)]
        admitted[label] = [outcome.admitted for outcome in outcomes]
        if ours_too:
            assert outcomes[2].refused_by in (OUR_VALIDATING_WEBHOOK, "vpod.koordinator.sh"), outcomes[2].message
            # Theirs counted the two rewritten pods in its own annotation.
            assert quota_annotation(read_quota(kapi, namespace, namespace), "child-request") == {GPU_RATIO: "200"}
    assert admitted == {"theirs alone": [True, True, True], "both": [True, True, False]}


def test_their_quota_admission_does_not_enforce_a_max_that_names_only_gpu_core(
        kapi: Api, ours: WebhookProcess, theirs: dict[str, KoordManager]) -> None:
    """docs/koordinator.md row: a max that names only ``koordinator.sh/gpu-core``. EnableQuotaAdmission
    skips a quota whose max names none of the resources it manages for pods, and gpu-core is not
    one of them (pkg/webhook/quotaevaluate/evaluator.go): two cards are admitted under a one-card
    gpu-core max, where the same max in gpu-memory-ratio, or beside cpu, refuses them. Ours refuses
    them under each."""
    two_cards = Shape(({GPU_CORE: "200", GPU_RATIO: "200"},))
    maxes = {GPU_CORE: {GPU_CORE: "100"}, GPU_RATIO: {GPU_RATIO: "100"}, "cpu": {"cpu": "10", GPU_CORE: "100"}}
    outcomes: dict[tuple[str, str], Outcome] = {}
    for key, max_ in maxes.items():
        for label, ours_too in (("theirs alone", False), ("both", True)):
            namespace = make_namespace(kapi, GATED, ours_too=ours_too)
            create_quota(kapi, namespace, namespace, max_)
            # A max their admission skips cannot show that it is in their view; a quota created after
            # it can, and their watch delivers the two in the order they were created.
            later = f"after-{namespace}"
            create_quota(kapi, make_namespace(kapi, GATED, ours_too=False), later, {"cpu": "10"})
            their_admission_knows(kapi, GATED, later, {"cpu": "20"})
            outcomes[(key, label)] = create(kapi, namespace, two_cards, "two-cards")

    assert outcomes[(GPU_CORE, "theirs alone")].admitted, outcomes[(GPU_CORE, "theirs alone")].message
    refused_by_ours = outcomes[(GPU_CORE, "both")]
    assert refused_by_ours.refused_by == OUR_VALIDATING_WEBHOOK, refused_by_ours.message
    assert "exceeded quota: " in refused_by_ours.message
    assert refused_by_ours.message.endswith(f"limited: {GPU_CORE}=100")
    # Their admission is on, and refuses the same pod under the same max in gpu-memory-ratio, and
    # under the gpu-core max once the max also names a resource it manages (cpu).
    for key in (GPU_RATIO, "cpu"):
        refused_by_theirs = outcomes[(key, "theirs alone")]
        assert refused_by_theirs.refused_by == "vpod.koordinator.sh", refused_by_theirs.message
        assert "exceeded quota" in refused_by_theirs.message
        assert not outcomes[(key, "both")].admitted


def test_their_quota_admission_charges_pods_that_are_never_stored(
        kapi: Api, ours: WebhookProcess, theirs: dict[str, KoordManager]) -> None:
    """EnableQuotaAdmission adds every pod it admits to the quota's child-request annotation, its
    admission's "used", with no regard for the outcome: a pod ours refuses beside it, and a
    server-side dry run (its configuration declares sideEffects None, so the apiserver calls it for
    dry runs) are charged although nothing is stored. Ours reserves neither."""
    namespace = make_namespace(kapi, GATED)
    create_quota(kapi, namespace, namespace, {GPU_RATIO: "1000"})
    their_admission_knows(kapi, GATED, namespace, {GPU_RATIO: "1100"})

    refused = create(kapi, namespace, Shape(({GPU_RATIO: "150"},)), "refused-by-ours")
    kapi.core.create_namespaced_pod(namespace, Shape(({GPU_RATIO: "50"},)).pod("dry-run"), dry_run="All")

    assert refused.refused_by == OUR_VALIDATING_WEBHOOK, refused.message
    assert kapi.core.list_namespaced_pod(namespace).items == []
    assert quota_annotation(read_quota(kapi, namespace, namespace), "child-request") == {GPU_RATIO: "200"}
    # Nothing is stored, yet a pod of the whole room is refused, by theirs alone (ours admits it).
    whole_room = create(kapi, namespace, Shape(({GPU_RATIO: "1000"},)), "whole-room")
    assert whole_room.message == (
        f'admission webhook "vpod.koordinator.sh" denied the request: exceeded quota: {namespace}/{namespace}, '
        f"requested: {GPU_RATIO}=1k, used: {GPU_RATIO}=200, limited: {GPU_RATIO}=1k")  # its Quantity.String()
