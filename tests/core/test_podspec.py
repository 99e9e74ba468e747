"""Reading containers out of untrusted pod JSON, and summing them per pod like kube-scheduler."""

from __future__ import annotations

from typing import Any

import pytest

from gpuquota_core.podspec import MAX_CONTAINERS, ContainerResources, PodShapeError, pod_requests, read_containers
from gpuquota_core.quantity import Quantity

GPU = "nvidia.com/gpu"
CORE = "koordinator.sh/gpu-core"
RATIO = "koordinator.sh/gpu-memory-ratio"


def q(text: str) -> Quantity:
    return Quantity.parse(text)


def box(name: str, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None,
        **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "resources": resources, **extra}


def totals(spec: dict[str, Any]) -> dict[str, str]:
    return {name: str(value) for name, value in sorted(pod_requests(spec).items())}


def test_containers_come_back_in_spec_order_with_kind_index_and_labels() -> None:
    spec = {"initContainers": [box("setup", {"cpu": "1"}), box("proxy", {"cpu": "1"}, restartPolicy="Always")],
            "containers": [box("main", {GPU: "1"}, {GPU: "1"}), {"image": "x"}]}

    containers = read_containers(spec)

    assert [(c.kind, c.index, c.name, c.restartable) for c in containers] == [
        ("initContainers", 0, "setup", False), ("initContainers", 1, "proxy", True),
        ("containers", 0, "main", False), ("containers", 1, "#1", False)]
    assert containers[2].requests == {GPU: q("1")} and containers[2].limits == {GPU: q("1")}
    assert containers[3].requests == {} and containers[3].limits == {}
    assert (containers[0].path, containers[0].label) == ("spec.initContainers[0]", 'init container "setup"')
    assert (containers[2].path, containers[2].label) == ("spec.containers[0]", 'container "main"')


def test_a_limit_without_request_is_the_request() -> None:
    container = ContainerResources("containers", 0, "main", {"cpu": q("1")}, {"cpu": q("2"), GPU: q("1")})

    assert container.effective_requests() == {"cpu": q("1"), GPU: q("1")}


def test_null_and_missing_sections_are_empty() -> None:
    assert read_containers({}) == []
    assert read_containers({"containers": None, "initContainers": None}) == []
    [container] = read_containers({"containers": [{"name": "a", "resources": None}]})
    assert (container.requests, container.limits) == ({}, {})
    [container] = read_containers({"containers": [{"name": "a", "resources": {"requests": None}}]})
    assert container.requests == {}


SHAPE_ERRORS = [
    pytest.param([], "spec", "expected an object, got list", id="spec-not-object"),
    pytest.param({"containers": {}}, "spec.containers", "expected a list, got dict", id="containers-not-list"),
    pytest.param({"containers": "x"}, "spec.containers", "expected a list, got str", id="containers-string"),
    pytest.param({"initContainers": 3}, "spec.initContainers", "expected a list, got int", id="init-not-list"),
    pytest.param({"containers": [7]}, "spec.containers[0]", "expected an object, got int", id="container-int"),
    pytest.param({"containers": [{"name": 3}]}, "spec.containers[0].name", "expected a string", id="name-int"),
    pytest.param({"containers": [{"resources": []}]}, "spec.containers[0].resources",
                 "expected an object, got list", id="resources-list"),
    pytest.param({"containers": [{"resources": {"limits": "1"}}]}, "spec.containers[0].resources.limits",
                 "expected an object, got str", id="limits-string"),
    pytest.param({"containers": [{"resources": {"requests": {GPU: "one"}}}]},
                 f"spec.containers[0].resources.requests[{GPU}]",
                 "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': 'one'",
                 id="bad-quantity"),
    pytest.param({"containers": [{"resources": {"requests": {GPU: None}}}]},
                 f"spec.containers[0].resources.requests[{GPU}]",
                 "quantity must be a string or integer, not NoneType", id="null-quantity"),
    pytest.param({"containers": [{"resources": {"requests": {GPU: "1e308"}}}]},
                 f"spec.containers[0].resources.requests[{GPU}]",
                 "quantity '1e308' is out of range (exponent beyond ±64)", id="1e308"),
    pytest.param({"containers": [{"resources": {"requests": {1: "1"}}}]}, "spec.containers[0].resources.requests",
                 "resource names must be strings", id="name-not-string"),
    pytest.param({"containers": [{}] * (MAX_CONTAINERS + 1)}, "spec.containers",
                 f"more than {MAX_CONTAINERS} containers", id="too-many-containers"),
]


@pytest.mark.parametrize(("spec", "path", "problem"), SHAPE_ERRORS)
def test_wrong_shapes_raise_pod_shape_error_naming_the_field(spec: Any, path: str, problem: str) -> None:
    with pytest.raises(PodShapeError) as error:
        read_containers(spec)

    assert (error.value.path, error.value.problem) == (path, problem)
    assert str(error.value) == f"{path}: {problem}"


def test_the_path_prefix_is_the_callers() -> None:
    with pytest.raises(PodShapeError, match=r"^spec\.template\.spec\.containers: expected a list"):
        read_containers({"containers": 1}, "spec.template.spec")


def test_app_containers_add_up() -> None:
    spec = {"containers": [box("a", {GPU: "1", "cpu": "1"}), box("b", {GPU: "2", "cpu": "500m"})]}

    assert totals(spec) == {"cpu": "1500m", GPU: "3"}


def test_an_init_container_only_counts_when_it_is_the_largest() -> None:
    small = {"initContainers": [box("init", {GPU: "1"})], "containers": [box("main", {GPU: "2"})]}
    large = {"initContainers": [box("init", {GPU: "4"}), box("init2", {GPU: "3"})],
             "containers": [box("main", {GPU: "2", "cpu": "1"})]}

    assert totals(small) == {GPU: "2"}
    # The max is per resource: the init container's GPUs, the app container's cpu.
    assert totals(large) == {"cpu": "1", GPU: "4"}


def test_sidecars_run_beside_app_containers_and_later_init_containers() -> None:
    spec = {"initContainers": [box("proxy", {GPU: "1"}, restartPolicy="Always"),
                               box("warmup", {GPU: "2"}),
                               box("early", {CORE: "50"})],
            "containers": [box("main", {GPU: "1"})]}

    # App: main 1 + sidecar 1 = 2. Init peak: warmup 2 + sidecar started before it 1 = 3.
    assert totals(spec) == {CORE: "50", GPU: "3"}


def test_a_sidecar_started_after_an_init_container_does_not_run_beside_it() -> None:
    spec = {"initContainers": [box("warmup", {GPU: "2"}), box("proxy", {GPU: "1"}, restartPolicy="Always")],
            "containers": [box("main", {GPU: "1"})]}

    assert totals(spec) == {GPU: "2"}


def test_restart_policy_other_than_always_is_an_ordinary_init_container() -> None:
    spec = {"initContainers": [box("init", {GPU: "1"}, restartPolicy="OnFailure")],
            "containers": [box("main", {GPU: "1"})]}

    assert totals(spec) == {GPU: "1"}


def test_overhead_comes_on_top_and_zeros_are_dropped() -> None:
    spec = {"containers": [box("main", {GPU: "0", "cpu": "1"}, {GPU: "0"})], "overhead": {"cpu": "250m"}}

    assert totals(spec) == {"cpu": "1250m"}


def test_limits_count_as_requests_when_requests_are_absent() -> None:
    spec = {"containers": [box("main", limits={GPU: "2"}), box("side", {CORE: "50"}, {CORE: "50", RATIO: "50"})]}

    assert totals(spec) == {CORE: "50", RATIO: "50", GPU: "2"}


def test_pod_requests_reuses_parsed_containers_and_checks_overhead() -> None:
    spec: dict[str, Any] = {"containers": [box("main", {GPU: "1"})]}
    parsed = read_containers(spec)
    assert pod_requests({"containers": "ignored when containers are given"}, parsed) == {GPU: q("1")}
    with pytest.raises(PodShapeError, match=r"^spec\.overhead: expected an object, got list$"):
        pod_requests({"overhead": []})
    with pytest.raises(PodShapeError, match=r"^spec: expected an object, got str$"):
        pod_requests("not a spec")
