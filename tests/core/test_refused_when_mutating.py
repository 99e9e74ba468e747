"""A container that names its GPUs twice (spellings that disagree, a deprecated name beside its new
one) is refused by the mutating call itself, in the validating call's words.

Koordinator's pod webhook, which the API server calls between our two, turns ``koordinator.sh/gpu``
into gpu-core and gpu-memory-ratio over what the container already says; left for validation, such
a pod would be admitted in that reading (tests/e2e/test_koordinator_webhooks.py shows it beside
koord-manager).
"""

from __future__ import annotations

from typing import Any

import pytest
from reviews import pod

from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.mutation import admission_mutation
from gpuquota_core.pod_records import remembered_gpu_problems

DISAGREE = {"koordinator.sh/gpu": "2", "koordinator.sh/gpu-core": "1"}
WHOLE_CARD = {"nvidia.com/gpu": "1"}


def with_second_container(first: dict[str, str], second: dict[str, str]) -> dict[str, Any]:
    obj = pod(resources=first)
    obj["spec"]["containers"].append({"name": "sidecar", "image": "x",
                                      "resources": {"requests": dict(second), "limits": dict(second)}})
    return obj


@pytest.mark.parametrize("resources", [
    pytest.param(DISAGREE, id="koordinator-gpu-and-core"),
    pytest.param({"nvidia.com/gpu": "1", "koordinator.sh/gpu-memory-ratio": "50"}, id="vendor-and-ratio"),
    pytest.param({"kubernetes.io/gpu": "100", "koordinator.sh/gpu-core": "50",
                  "koordinator.sh/gpu-memory-ratio": "50"}, id="legacy-name-and-share"),
    # Found beside koord-manager (tests/e2e/test_koordinator_webhooks.py): its webhook stored this
    # as gpu-core 50, gpu-memory-ratio 50, which our validation then admitted.
    pytest.param({"koordinator.sh/gpu": "0", "koordinator.sh/gpu-memory-ratio": "100", "kubernetes.io/gpu": "50"},
                 id="deprecated-name-beside-its-new-one"),
])
def test_a_pod_that_names_its_gpus_twice_is_refused_with_every_problem_validation_gives(
        resources: dict[str, str]) -> None:
    obj = with_second_container(resources, WHOLE_CARD)

    mutation = admission_mutation(obj, DEFAULT_CONFIG, None)

    problems = remembered_gpu_problems(obj["spec"], DEFAULT_CONFIG)
    assert {"spellings-disagree", "duplicate-name"} & {p.rule for p in problems}
    assert list(mutation.refusal) == problems
    # Nothing is rewritten, not even the container that asks for whole cards alone.
    assert not mutation.changed and mutation.patch == () and mutation.warnings == ()


@pytest.mark.parametrize("resources", [
    pytest.param({"koordinator.sh/gpu": "100", "koordinator.sh/gpu-core": "100"}, id="agreeing-spellings"),
    pytest.param({"koordinator.sh/gpu-core": "50"}, id="refused-by-validation-for-another-rule"),
    pytest.param({"nvidia.com/gpu": "1", "amd.com/gpu": "1"}, id="two-vendors"),
])
def test_only_gpus_named_twice_are_refused_when_mutating(resources: dict[str, str]) -> None:
    # The other problems reach the validating call unchanged: Koordinator's pod webhook turns no
    # valid pod into one of them and none of them into a valid pod, so validation stays their one judge.
    assert admission_mutation(pod(resources=resources), DEFAULT_CONFIG, None).refusal == ()


def test_an_init_container_whose_spellings_disagree_is_refused_too() -> None:
    obj = pod(resources=WHOLE_CARD)
    obj["spec"]["initContainers"] = [{"name": "init", "image": "x",
                                      "resources": {"requests": dict(DISAGREE), "limits": dict(DISAGREE)}}]

    assert {p.rule for p in admission_mutation(obj, DEFAULT_CONFIG, None).refusal} == {"spellings-disagree"}
