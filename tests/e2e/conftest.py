"""Fixtures for tests against a real kube-apiserver + etcd (see tests/controlplane.py).

One control plane serves the whole session, with a kube-scheduler and a kube-controller-manager;
tests isolate themselves with the function-scoped ``namespace`` fixture and unique cluster-scoped
names (``gpu_node`` deletes its Nodes again).

The scheduler binds any pending pod of the session that fits a Node. A Node made by ``gpu_node``
without ``pods`` in its allocatable takes no pod at all; a test that needs its pods on its own
Nodes taints them and tolerates the taint (tests/e2e/test_scheduling.py).
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

# tests/ is not a package, so make its helper modules importable from here and from test modules.
_TESTS_DIR = Path(__file__).resolve().parents[1]
if str(_TESTS_DIR) not in sys.path:
    sys.path.append(str(_TESTS_DIR))  # after the packages: see tests/conftest.py

from admissionchain import (  # noqa: E402
    delete_webhook_configurations,
    local_webhook_configurations,
    register_webhook_configurations,
    wait_until_webhook_is_called,
)
from controlplane import (  # noqa: E402
    Api,
    Binaries,
    BuildUnavailableError,
    ControlPlane,
    GpuNodeFactory,
    create_canonical_gpu_node,
    create_gpu_node,
    install_elasticquota_crd,
    locate_binaries,
    make_api,
)
from koordinator import KoordinatorBuild, locate_koordinator  # noqa: E402
from webhookproc import WebhookProcess  # noqa: E402

E2E_DIR = Path(__file__).resolve().parent
T = TypeVar("T")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: the marker must be on the items before `-m` deselection looks at them.
    for item in items:
        if item.path.is_relative_to(E2E_DIR):
            item.add_marker(pytest.mark.e2e)


def built_or_skipped(locate: Callable[[], T], what: str) -> T:
    """``locate()``; without the build and without Go to make it, a local run skips (CI fails)."""
    try:
        return locate()
    except BuildUnavailableError as exc:
        if os.environ.get("CI"):
            raise
        reason = str(exc).splitlines()[-1]
        pytest.skip(f"no {what} and no Go to build them: {reason}")


@pytest.fixture(scope="session")
def control_plane_binaries() -> Binaries:
    return built_or_skipped(locate_binaries, "kube-apiserver/etcd")


@pytest.fixture(scope="session")
def koordinator_build() -> KoordinatorBuild:
    """koord-scheduler, koord-manager and Koordinator's config files, built by hack/build-koordinator.sh."""
    return built_or_skipped(locate_koordinator, "koord-scheduler/koord-manager")


@pytest.fixture(scope="session")
def control_plane_apiserver_args() -> list[str]:
    """Extra kube-apiserver flags for the session's control plane (e.g. --admission-control-config-file).

    Change them here rather than overriding this fixture in a deeper conftest: the control plane is
    session-scoped, so whichever directory asked first would decide the flags for every test.
    """
    return []


@pytest.fixture(scope="session")
def control_plane(
    control_plane_binaries: Binaries,
    control_plane_apiserver_args: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ControlPlane]:
    plane = ControlPlane(
        control_plane_binaries,
        extra_apiserver_args=control_plane_apiserver_args,
        base_dir=tmp_path_factory.mktemp("control-plane"),
        with_controllers=True,
    )
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kubeconfig_path(control_plane: ControlPlane) -> Path:
    return control_plane.kubeconfig_path


@pytest.fixture(scope="session")
def api(kubeconfig_path: Path) -> Iterator[Api]:
    handle = make_api(kubeconfig_path)
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture(scope="session")
def elasticquota_crd(api: Api) -> k8s.V1CustomResourceDefinition:
    return install_elasticquota_crd(api)


@pytest.fixture
def namespace(api: Api, request: pytest.FixtureRequest) -> str:
    # Namespaces are never deleted: one holding a pod bound to a Node would sit in Terminating, since
    # no kubelet ever confirms that pod gone.
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{stem or 't'}-{uuid.uuid4().hex[:6]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    return name


@pytest.fixture
def gpu_node(api: Api) -> Iterator[GpuNodeFactory]:
    """``gpu_node(name, allocatable, capacity=None, labels=None, taints=()) -> V1Node``; deleted after the test.

    Nodes are cluster-scoped and the control plane lives for the whole session, so leftovers would
    show up in every later test that lists Nodes.
    """
    created: list[str] = []

    def make(
        name: str,
        allocatable: Mapping[str, str | int],
        capacity: Mapping[str, str | int] | None = None,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
    ) -> k8s.V1Node:
        # Recorded first: a create that succeeds before the status patch fails must still be cleaned up.
        created.append(name)
        return create_gpu_node(api.core, name, allocatable, capacity=capacity, labels=labels, taints=taints)

    yield make
    for name in created:
        try:
            api.core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


# -- the webhook, registered with the real apiserver --------------------------------------------

CANONICAL_NODE = "gpuquota-e2e-canonical"


@pytest.fixture(scope="session")
def canonical_gpu_node(api: Api) -> Iterator[str]:
    """A Node advertising the canonical names, untainted and unlabelled, for the whole session.

    With ``rewrite: auto`` (the default) a live webhook rewrites a pod only when a node it can
    reach advertises koordinator.sh/gpu-core and gpu-memory-ratio; the tests of live servers that
    expect a rewrite need one. Tests of the decision itself pin their pods with their own nodes.
    """
    create_canonical_gpu_node(api.core, CANONICAL_NODE)
    yield CANONICAL_NODE
    try:
        api.core.delete_node(CANONICAL_NODE)
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture(scope="session")
def webhook_server(api: Api, kubeconfig_path: Path, elasticquota_crd: k8s.V1CustomResourceDefinition,
                   canonical_gpu_node: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    """``gpuquota serve`` in live mode, registered through the project's own configurations."""
    server = WebhookProcess(tmp_path_factory.mktemp("webhook"),
                            serve_args=["--kubeconfig", str(kubeconfig_path), "--workers", "2"])
    server.start()
    documents = local_webhook_configurations(server.url, server.ca_bundle)
    register_webhook_configurations(api, documents)
    probe_namespace = f"webhook-probe-{uuid.uuid4().hex[:6]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=probe_namespace)))
    try:
        wait_until_webhook_is_called(api, probe_namespace)
        yield server
    finally:
        delete_webhook_configurations(api, documents)
        server.stop()
