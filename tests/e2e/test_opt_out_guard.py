"""The opt-out label guard (manifests/base/opt-out-label-guard.yaml) enforced by a real apiserver.

The policy is stored under a unique name for this test and removed after it; requests are made as
an impersonated user who may otherwise create and label namespaces.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import Api
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

GUARD = Path(__file__).resolve().parents[2] / "manifests" / "base" / "opt-out-label-guard.yaml"
LABEL = "gpuquota.koord-gpuquota.io/ignore"
USER, ADMIN = "alice", "bob"
DEADLINE = 30.0


def impersonating(kubeconfig_path: Path, user: str, group: str) -> k8s.CoreV1Api:
    api_client = k8s_config.new_client_from_config(config_file=str(kubeconfig_path))
    api_client.set_default_header("Impersonate-User", user)
    api_client.set_default_header("Impersonate-Group", group)
    return k8s.CoreV1Api(api_client)


@pytest.fixture
def guard(api: Api) -> Iterator[str]:
    """The policy and its binding under unique names, and RBAC letting alice and bob manage namespaces."""
    suffix = uuid.uuid4().hex[:6]
    policy, binding = [doc for doc in yaml.safe_load_all(GUARD.read_text(encoding="utf-8")) if doc]
    policy["metadata"]["name"] += f"-{suffix}"
    binding["metadata"]["name"] += f"-{suffix}"
    binding["spec"]["policyName"] = policy["metadata"]["name"]
    rbac = k8s.RbacAuthorizationV1Api(api.client)
    role = f"namespace-editor-{suffix}"
    rbac.create_cluster_role({"metadata": {"name": role}, "rules": [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create", "patch", "update"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": role}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}
                     for name in (USER, ADMIN)]})
    admission = api.admissionregistration
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    try:
        yield f"guard-{suffix}"
    finally:
        admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        admission.delete_validating_admission_policy(policy["metadata"]["name"])
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)


def namespace_body(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}}


def refusal(call: Any) -> str | None:
    try:
        call()
    except ApiException as error:
        return str(json.loads(error.body)["message"])
    return None


def test_only_opt_out_admins_may_set_or_remove_the_ignore_label(api: Api, kubeconfig_path: Path, guard: str) -> None:
    alice = impersonating(kubeconfig_path, USER, "developers")
    expected = (f"only members of gpuquota:opt-out-admins may set, change or remove the label {LABEL} on namespace "
                f"{guard}-a: it exempts every pod of the namespace from GPU quota")

    # The apiserver picks new policies up asynchronously: poll until the guard refuses.
    deadline = time.monotonic() + DEADLINE
    while (message := refusal(lambda: alice.create_namespace(
            namespace_body(f"{guard}-a", {LABEL: "true"}), dry_run="All"))) is None:
        assert time.monotonic() < deadline, "the policy was never enforced"
        time.sleep(0.2)  # polling a condition with a deadline
    assert expected in message

    # Other labels, and namespaces without the opt-out, are none of the guard's business.
    alice.create_namespace(namespace_body(f"{guard}-a", {"team": "vision"}))
    alice.patch_namespace(f"{guard}-a", {"metadata": {"labels": {"team": "nlp"}}})
    assert expected in (refusal(lambda: alice.patch_namespace(f"{guard}-a", {"metadata": {"labels": {LABEL: "true"}}}))
                        or "")

    # An opt-out admin may set it, and then alice may neither change nor remove it.
    admin = impersonating(kubeconfig_path, ADMIN, "gpuquota:opt-out-admins")
    admin.patch_namespace(f"{guard}-a", {"metadata": {"labels": {LABEL: "true"}}})
    assert expected in (refusal(lambda: alice.patch_namespace(f"{guard}-a", {"metadata": {"labels": {LABEL: None}}}))
                        or "")
    assert expected in (refusal(lambda: alice.patch_namespace(f"{guard}-a", {"metadata": {"labels": {LABEL: "no"}}}))
                        or "")
    alice.patch_namespace(f"{guard}-a", {"metadata": {"labels": {"team": "vision"}}})  # unrelated change still fine
    assert api.core.read_namespace(f"{guard}-a").metadata.labels[LABEL] == "true"
