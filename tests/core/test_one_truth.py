"""The audit and the webhook never disagree: on generated quotas, pods and workloads, what
``gpuquota audit`` reports of each object is what the webhook's handlers answer for it.

The webhook side is the real request path in-process: an AdmissionReview body (tests/reviews.py)
through the admission endpoint (codec, handler), the quota service's socket (``quota_service.serve``
and ``QuotaClient``) and its ``QuotaState``. Pods go through ``/mutate-pods`` first and then, patched,
through ``/validate-pods``, as the API server sends them.

What each verdict means:

* a pod or a workload's template: refused (code, reason, message) or admitted when created now,
  with its quotas otherwise empty (``dryRun``, so nothing is reserved; how full a quota is, is the
  audit's ``quota-over-limit``). The audit's ``pod-invalid-gpu-request`` is the webhook's 422
  ``Invalid`` (400 when the pod cannot be read at all) and ``pod-quota-refused`` its quota
  decision, with the same message;
* a quota, CREATEd among all the others: refused exactly when the audit reports it as refused by
  the webhook, in a repeated name or in a parent cycle, for those reasons. A missing parent is an
  audit finding the webhook does not refuse on purpose (its watch may not have delivered a parent
  created just before: gpuquota_core/quota_integrity.py), so it is left out of the comparison;
* a quota, UPDATEd where it is the stored copy of its name: the webhook's problems are the audit's
  ``quota-refused-by-webhook`` problems, word for word.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import reviews
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuquota_core.audit import audit_objects
from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.jsonpatch import apply
from gpuquota_core.placement import NodeView
from gpuquota_core.quota_integrity import DUPLICATE_NAME, PARENT_CYCLE
from gpuquota_core.quota_objects import quota_from_object
from webhook.admission.status import status_of
from webhook.quota.client import QuotaClient
from webhook.quota.service import serve
from webhook.quota.state import QuotaState
from webhook.serving.app import admission_endpoints, create_app

EXAMPLES = int(os.environ.get("GPUQUOTA_PROPERTY_EXAMPLES", "300")) // 3
PROFILE = settings(max_examples=EXAMPLES, deadline=None,
                   derandomize=os.environ.get("GPUQUOTA_PROPERTY_RANDOM") != "1",
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

PREFIX = "quota.scheduling.koordinator.sh/"
CORE, RATIO, MEMORY = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio", "koordinator.sh/gpu-memory"
NAMESPACES = ["ns-a", "ns-b", "team-a"]
QUOTA_NAMES = ["org", "team-a", "team-b", "koordinator-default-quota"]
QUOTA_REFUSALS = {"quota-refused-by-webhook", DUPLICATE_NAME, PARENT_CYCLE}
POD_REFUSALS = {"pod-invalid-gpu-request", "pod-quota-refused"}  # gang-* checks are about gangs, not one pod
# Nodes advertising the canonical names, so the webhook rewrites as it would in such a cluster
# (with none listed it leaves requests as written); the audit reads the same Node objects. Two GPU
# vendors: an NVIDIA node without a vendor label (Koordinator reads it as NVIDIA) and an AMD one,
# so a rewrite that keeps the vendor adds its node affinity.
NODES = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"},
          "status": {"allocatable": {CORE: "800", RATIO: "800", MEMORY: "640Gi"}}},
         {"apiVersion": "v1", "kind": "Node",
          "metadata": {"name": "amd-0", "labels": {"node.koordinator.sh/gpu-vendor": "amd"}},
          "status": {"allocatable": {"amd.com/gpu": "4", CORE: "400", RATIO: "400", MEMORY: "768Gi"}}}]

amounts = st.sampled_from(["-100", "0", "50", "100", "150", "200", "400", "1"])
resource_lists = st.dictionaries(st.sampled_from([CORE, RATIO, "nvidia.com/gpu", "cpu"]), amounts, max_size=3)


@st.composite
def quotas(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A few quotas; the same name may come twice (in different namespaces), parents may be missing
    or loop, some are marked as migrating."""
    chosen = draw(st.lists(st.tuples(st.sampled_from(QUOTA_NAMES), st.sampled_from(NAMESPACES)), max_size=5,
                           unique=True))
    objects = []
    for name, namespace in chosen:
        labels = {}
        parent = draw(st.sampled_from(["", *QUOTA_NAMES, "gone"]))
        if parent:
            labels[PREFIX + "parent"] = parent
        if draw(st.booleans()):
            labels[PREFIX + "is-parent"] = "true"
        annotations = {}
        if draw(st.integers(0, 4)) == 0:
            annotations["gpuquota.koord-gpuquota.io/migration"] = "in-progress"
        if draw(st.integers(0, 4)) == 0:
            annotations[PREFIX + "namespaces"] = orjson.dumps([draw(st.sampled_from(NAMESPACES))]).decode()
        objects.append({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                                     "annotations": annotations},
                        "spec": {"min": draw(resource_lists), "max": draw(resource_lists)}})
    return objects


pod_amounts = st.sampled_from(["1", "2", "50", "100", "150", "200", "300", "0.5", "-1", "1Gi"])
gpu_requests = st.dictionaries(st.sampled_from([CORE, RATIO, MEMORY, "nvidia.com/gpu", "koordinator.sh/gpu.shared",
                                                "koordinator.sh/gpu", "amd.com/gpu", "cpu"]), pod_amounts, max_size=3)


@st.composite
def pod_parts(draw: st.DrawFn) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Labels and containers of a pod or a template."""
    label = draw(st.sampled_from([None, *QUOTA_NAMES, "missing"]))
    containers = []
    for index in range(draw(st.integers(1, 2))):
        asked = draw(gpu_requests)
        resources: dict[str, Any] = {"limits": dict(asked)}
        if draw(st.booleans()):
            resources["requests"] = dict(asked)
        containers.append({"name": f"c{index}", "image": "x", "resources": resources})
    return ({PREFIX + "name": label} if label else {}), containers


@st.composite
def pod_specs(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, Any]]:
    """Labels and spec: containers, sometimes an init container (plain or a restartable sidecar)."""
    labels, containers = draw(pod_parts())
    spec: dict[str, Any] = {"containers": containers}
    if draw(st.integers(0, 3)) == 0:
        _, (init, *_) = draw(pod_parts())
        init = {**init, "name": "init"}
        if draw(st.booleans()):
            init["restartPolicy"] = "Always"
        spec["initContainers"] = [init]
    return labels, spec


# Gang members (Koordinator's annotations, or the lightweight labels): with their quotas otherwise
# empty, a member is admitted only if its gang's whole minimum fits (the audit's pod-quota-refused).
gangs = st.one_of(st.just({}), st.just({}), st.fixed_dictionaries({
    "gang.scheduling.koordinator.sh/name": st.sampled_from(["g1", "g2"]),
    "gang.scheduling.koordinator.sh/min-available": st.sampled_from(["1", "2", "4", "0", "x"])}))


@st.composite
def pods_and_workloads(draw: st.DrawFn) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for index in range(draw(st.integers(0, 4))):
        labels, spec = draw(pod_specs())
        namespace = draw(st.sampled_from(NAMESPACES))
        annotations = draw(gangs)
        if draw(st.integers(0, 5)) == 0:
            labels = {**labels, "pod-group.scheduling.sigs.k8s.io/name": "g3",
                      "pod-group.scheduling.sigs.k8s.io/min-available": draw(st.sampled_from(["2", "3"]))}
        if draw(st.booleans()):
            objects.append({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": f"pod-{index}", "namespace": namespace, "labels": labels,
                                         "annotations": annotations},
                            "spec": spec})
        else:
            objects.append({"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": f"deploy-{index}", "namespace": namespace},
                            "spec": {"template": {"metadata": {"labels": labels, "annotations": annotations},
                                                  "spec": spec}}})
    return objects


class Webhook:
    """The admission endpoints in-process, in front of a quota service on a real Unix socket."""

    def __init__(self, quota_objects: list[dict[str, Any]], socket_path: Path) -> None:
        self.state = QuotaState()
        self.state.replace_kind("ElasticQuota", quota_objects)
        self.state.replace_kind("Pod", [])  # "otherwise empty": see the module docstring
        self.listener = serve(self.state, socket_path)
        client = QuotaClient(socket_path)
        assert client.ready()[0]  # the service loop is running (closing it earlier races its start)
        nodes = NodeView.from_objects(NODES)
        self.endpoints = admission_endpoints(create_app(config=DEFAULT_CONFIG, quota=client, nodes=lambda: nodes))

    def post(self, path: str, document: dict[str, Any]) -> dict[str, Any]:
        body = reviews.body(document)
        environ = {"wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)), "REMOTE_ADDR": "127.0.0.1"}
        answer = self.endpoints[path].serve(environ)
        assert answer.status == 200, answer.body
        payload = answer.body
        response: dict[str, Any] = orjson.loads(payload)["response"]
        return response

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The API server's path: mutate, apply the patch, validate (dry run: nothing reserved)."""
        mutated = self.post("/mutate-pods", reviews.review(pod, dry_run=True))
        if not mutated["allowed"]:
            return mutated
        if "patch" in mutated:
            pod = apply(pod, orjson.loads(base64.b64decode(mutated["patch"])))
        return self.post("/validate-pods", reviews.review(pod, dry_run=True))

    def review_quota(self, quota: dict[str, Any], operation: str) -> dict[str, Any]:
        return self.post("/validate-elasticquotas", reviews.review(
            quota, operation=operation, old=quota if operation == "UPDATE" else None, kind="ElasticQuota",
            group="scheduling.sigs.k8s.io", version="v1alpha1", resource="elasticquotas"))

    def close(self) -> None:
        self.listener.close()


@contextmanager
def webhook(quota_objects: list[dict[str, Any]], directory: Path) -> Iterator[Webhook]:
    served = Webhook(quota_objects, directory / "quota.sock")
    try:
        yield served
    finally:
        served.close()
        (directory / "quota.sock").unlink(missing_ok=True)


def findings_on(report: Any, kind: str, namespace: str, name: str) -> dict[str, Any]:
    return {f.check: f for f in report.findings if (f.kind, f.namespace, f.name) == (kind, namespace, name)}


def pod_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod the API server admits for ``obj``: itself, or one created from its template."""
    if obj["kind"] == "Pod":
        return obj
    template = obj["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{obj['metadata']['name']}-", "namespace": obj["metadata"]["namespace"],
                         "labels": template["metadata"]["labels"], "annotations": template["metadata"]["annotations"]},
            "spec": template["spec"]}


@PROFILE
@given(quota_objects=quotas(), workloads=pods_and_workloads())
def test_the_audit_reports_a_pod_or_template_exactly_as_the_webhook_answers_it(
        quota_objects: list[dict[str, Any]], workloads: list[dict[str, Any]], tmp_path: Path) -> None:
    report = audit_objects([*NODES, *quota_objects, *workloads])
    with webhook(quota_objects, tmp_path) as served:
        for obj in workloads:
            metadata = obj["metadata"]
            found = {check: f for check, f in findings_on(report, obj["kind"], metadata["namespace"],
                                                          metadata["name"]).items() if check in POD_REFUSALS}
            answer = served.create_pod(pod_of(obj))
            assert len(found) <= 1, found  # the webhook gives one answer; so does the audit
            if not found:
                assert answer["allowed"], (obj, answer)
                continue
            assert not answer["allowed"], (obj, found)
            status = answer["status"]
            [(check, finding)] = found.items()
            if check == "pod-quota-refused":
                assert (status["code"], status["reason"], status["message"]) == (
                    status_of(finding.details["reason"]), finding.details["reason"], finding.message)
            elif "rules" in finding.details:
                problems = finding.details["problems"]
                assert finding.message == "; ".join(problems)
                assert (status["code"], status["reason"]) == (422, "Invalid")
                assert status["message"] == "; ".join(
                    f"{problem} [rule: {rule}]" for problem, rule in zip(problems, finding.details["rules"],
                                                                          strict=True))
            else:  # the spec cannot be read at all
                assert (status["code"], status["reason"]) == (400, "BadRequest")
                assert status["message"] == f"cannot read the pod: {finding.message}"


def placement_kind(problem: str, quota: dict[str, Any]) -> str | None:
    """Which tree check a problem of the webhook's quota review is, None for the quota's own values."""
    info = quota_from_object(quota)
    if problem.startswith(f"ElasticQuota name {info.name} is already used by "):
        return DUPLICATE_NAME
    if problem.startswith("the parent labels of ElasticQuotas "):
        return PARENT_CYCLE
    return None


@PROFILE
@given(quota_objects=quotas())
def test_the_audit_reports_a_quota_exactly_as_the_webhook_answers_it(quota_objects: list[dict[str, Any]],
                                                                     tmp_path: Path) -> None:
    report = audit_objects(quota_objects)
    for index, quota in enumerate(quota_objects):
        metadata = quota["metadata"]
        found = {check: f for check, f in findings_on(report, "ElasticQuota", metadata["namespace"],
                                                      metadata["name"]).items() if check in QUOTA_REFUSALS}
        others = quota_objects[:index] + quota_objects[index + 1:]
        # CREATE among all the others.
        with webhook(others, tmp_path) as served:
            answer = served.review_quota(quota, "CREATE")
        if not found:
            assert answer["allowed"], (quota, others, answer)
        else:
            assert not answer["allowed"] and answer["status"]["code"] == 422, (quota, found)
            # The webhook's message: the quota's own problems, as the audit lists them, then at
            # most one about its place in the tree.
            own = found["quota-refused-by-webhook"].details["problems"] if "quota-refused-by-webhook" in found else []
            message, prefix = answer["status"]["message"], "; ".join(own)
            assert message.startswith(prefix), (message, own)
            rest = message[len(prefix):].removeprefix("; ")
            placement = {placement_kind(rest, quota)} if rest else set()
            assert None not in placement, rest
            # The webhook names one reason for the place (the first it meets); the audit names each.
            assert placement <= set(found) and (placement or set(found) == {"quota-refused-by-webhook"})
            if DUPLICATE_NAME in found:
                assert placement == {DUPLICATE_NAME}
        # UPDATE where it is the stored copy of its name.
        stored = [o for o in others if o["metadata"]["name"] != metadata["name"]] + [quota]
        with webhook(stored, tmp_path) as served:
            answer = served.review_quota(quota, "UPDATE")
        if "quota-refused-by-webhook" in found:
            assert not answer["allowed"]
            assert answer["status"]["message"] == found["quota-refused-by-webhook"].message
        else:
            assert answer["allowed"], (quota, answer)


@pytest.mark.parametrize("copies", [1, -1])
def test_a_repeated_name_is_refused_by_the_webhook_in_either_order(copies: int, tmp_path: Path) -> None:
    first = {"kind": "ElasticQuota", "metadata": {"name": "team", "namespace": "a"}, "spec": {"max": {CORE: "1"}}}
    second = {**first, "metadata": {"name": "team", "namespace": "b"}}
    stored, created = [first, second][::copies]
    with webhook([stored], tmp_path) as served:
        answer = served.review_quota(created, "CREATE")
    assert not answer["allowed"]
    assert answer["status"]["message"].startswith(f"ElasticQuota name team is already used by "
                                                  f"{stored['metadata']['namespace']}/team")
