"""read_pod_admission: one call reads a reviewed pod (and the stored pod of an UPDATE) into its GPU
problems, the PodAdmission the quota decision reads and the spec's memo key."""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import pytest
from reviews import pod

from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.pod_admission import PodAdmission, read_pod_admission
from gpuquota_core.pod_records import canonical_pod_requests, spec_shape_key
from gpuquota_core.podspec import PodShapeError
from gpuquota_core.quota_objects import POD_QUOTA_LABEL

CORE = "koordinator.sh/gpu-core"
RATIO = "koordinator.sh/gpu-memory-ratio"
MEMORY = "koordinator.sh/gpu-memory"
TWO_CARDS = {CORE: "200", RATIO: "200"}


def create(obj: dict[str, Any], **review: Any) -> Any:
    fields = {"uid": "review-1", "operation": "CREATE", "namespace": "team-vision", "name": "trainer-0", **review}
    return read_pod_admission(obj, None, DEFAULT_CONFIG, **fields)


def update(obj: dict[str, Any], old: dict[str, Any] | None) -> Any:
    return read_pod_admission(obj, old, DEFAULT_CONFIG, uid="review-2", operation="UPDATE",
                              namespace="team-vision", name="trainer-0")


def test_a_create_is_read_into_the_admission_the_quota_decision_needs() -> None:
    obj = pod(resources={"nvidia.com/gpu": "2"}, labels={POD_QUOTA_LABEL: "vision", "app": "train"})
    obj["metadata"]["uid"] = "pod-uid-7"

    reading = create(obj, dry_run=True, caller="10.0.0.7")

    assert reading.problems == () and reading.grandfathered is False
    assert reading.admission == PodAdmission(
        uid="review-1", operation="CREATE", namespace="team-vision", name="trainer-0", pod_uid="pod-uid-7",
        labels={POD_QUOTA_LABEL: "vision", "app": "train"}, canonical_requests=TWO_CARDS, dry_run=True,
        caller="10.0.0.7")
    assert reading.shape == spec_shape_key(obj["spec"], DEFAULT_CONFIG) is not None


def test_what_the_review_leaves_empty_the_pods_metadata_says() -> None:
    obj = pod(name="", namespace="team-nlp")
    obj["metadata"] = {"generateName": "worker-", "namespace": "team-nlp", "labels": {"ok": "yes", "n": 3}}

    admission = create(obj, namespace="", name="").admission

    assert (admission.namespace, admission.name, admission.labels) == ("team-nlp", "worker-", {"ok": "yes"})
    assert create(obj, namespace="team-vision", name="trainer-0").admission.name == "trainer-0"


def test_gpu_memory_in_bytes_without_a_model_is_an_unknown_footprint() -> None:
    admission = create(pod(resources={MEMORY: "8Gi"})).admission

    assert admission.canonical_requests == {MEMORY: "8Gi"} and admission.unknown_gpu_memory is True


def test_gpu_problems_are_found_and_the_admission_is_still_read() -> None:
    reading = create(pod(resources={"nvidia.com/gpu": "1.5"}))

    assert [problem.rule for problem in reading.problems] == ["not-integer", "not-integer"]
    assert reading.problems[0].message.startswith('container "main" resources.requests[nvidia.com/gpu]: 1.5 ')
    assert reading.grandfathered is False
    assert reading.admission is not None and reading.admission.canonical_requests == {"nvidia.com/gpu": "1500m"}


def test_an_update_carries_the_stored_pods_labels_and_requests() -> None:
    old = pod(resources={"nvidia.com/gpu": "1"}, labels={POD_QUOTA_LABEL: "old-quota"})
    new = pod(resources={"nvidia.com/gpu": "2"}, labels={POD_QUOTA_LABEL: "vision"})

    admission = update(new, old).admission

    assert admission.operation == "UPDATE" and admission.canonical_requests == TWO_CARDS
    assert admission.old_labels == {POD_QUOTA_LABEL: "old-quota"}
    assert admission.old_canonical_requests == {CORE: "100", RATIO: "100"}


def test_a_create_never_reads_an_old_pod() -> None:
    reading = read_pod_admission(pod(resources={"nvidia.com/gpu": "1.5"}), pod(resources={"nvidia.com/gpu": "1.5"}),
                                 DEFAULT_CONFIG, uid="u", operation="CREATE")

    assert reading.grandfathered is False
    assert reading.admission.old_labels is None and reading.admission.old_canonical_requests is None


def test_problems_the_stored_pod_already_had_are_grandfathered_new_ones_are_not() -> None:
    stored = pod(resources={"nvidia.com/gpu": "1.5"})
    relabelled = copy.deepcopy(stored)
    relabelled["metadata"]["labels"] = {"finalized": "yes"}
    worse = pod(containers=[*stored["spec"]["containers"],
                            {"name": "side", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}}])

    assert update(relabelled, stored).grandfathered is True
    assert update(worse, stored).grandfathered is False
    assert update(relabelled, None).grandfathered is False  # no stored pod to compare with


def test_a_stored_pod_whose_spec_cannot_be_read_grandfathers_nothing_and_has_unknown_requests() -> None:
    stored = {"metadata": {"name": "trainer-0"}, "spec": ["not", "an", "object"]}

    reading = update(pod(resources={"nvidia.com/gpu": "1.5"}), stored)

    assert reading.grandfathered is False and reading.problems
    assert reading.admission.old_labels == {} and reading.admission.old_canonical_requests is None


@pytest.mark.parametrize(("new_metadata", "old_metadata", "path"), [
    ("not an object", {}, "metadata"),
    ({"name": "trainer-0"}, ["not", "an", "object"], "oldObject.metadata"),
], ids=["metadata", "old-metadata"])
def test_metadata_that_cannot_be_read_is_kept_as_a_value_beside_the_problems(
        new_metadata: object, old_metadata: object, path: str) -> None:
    new = pod(resources={"nvidia.com/gpu": "1.5"})
    new["metadata"] = new_metadata
    old = pod(resources={"nvidia.com/gpu": "1"})
    old["metadata"] = old_metadata

    reading = update(new, old)

    assert isinstance(reading.admission, PodShapeError) and reading.admission.path == path
    assert [problem.rule for problem in reading.problems] == ["not-integer", "not-integer"]


def test_a_spec_that_is_not_an_object_cannot_be_read_at_all() -> None:
    with pytest.raises(PodShapeError, match=r"^spec: expected an object, got list$"):
        create({"metadata": {"name": "x"}, "spec": []})


def test_a_spec_without_a_plain_shape_is_read_afresh_with_the_same_answers() -> None:
    # A mapping that is not JSON's plain dict: read all the same, but not remembered by shape.
    container = OrderedDict(name="main", resources={"limits": {"nvidia.com/gpu": "2"}})
    obj = {"metadata": {"name": "x"}, "spec": {"containers": [container]}}

    reading = create(obj)

    assert reading.shape is None
    assert reading.admission.canonical_requests == {name: str(amount) for name, amount in
                                                    canonical_pod_requests(obj["spec"], DEFAULT_CONFIG).items()}
    assert reading.admission.canonical_requests == TWO_CARDS


def test_replicas_of_one_workload_share_the_memo_key_and_the_reading() -> None:
    one, two = (create(pod(name=name, resources={"nvidia.com/gpu": "2"}), name="") for name in ("w-1", "w-2"))

    assert one.shape == two.shape
    assert one.admission.canonical_requests == two.admission.canonical_requests == TWO_CARDS
    assert (one.admission.name, two.admission.name) == ("w-1", "w-2")
