"""The pure checks of ``gpuquota preflight`` (gpuquota_core/preflight.py), object by object.

The cluster side (the probe through a real apiserver, the install) is tests/e2e/test_preflight.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuquota_core.preflight import (
    PreflightInputError,
    check_image,
    check_network_policy,
    check_pods,
    check_service,
    probe_target,
    read_configurations,
    selector_matches,
    with_ca_bundle,
)

LABELS = {"app.kubernetes.io/name": "koord-gpuquota", "app.kubernetes.io/component": "webhook"}


def deployment(image: str = "registry.example.com/team/koord-gpuquota:0.1.0") -> dict[str, Any]:
    return {"metadata": {"name": "gpuquota-webhook"},
            "spec": {"replicas": 3, "selector": {"matchLabels": LABELS},
                     "template": {"metadata": {"labels": LABELS},
                                  "spec": {"containers": [{"name": "webhook", "image": image}]}}}}


def pod(name: str, waiting: str | None = None, ready: bool = False, labels: dict[str, str] = LABELS) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending" if not ready else "Running",
                              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if waiting:
        status["containerStatuses"] = [{"name": "webhook", "image": "registry.example.com/team/koord-gpuquota:0.1.0",
                                        "state": {"waiting": {"reason": waiting, "message": "back-off 5m0s"}}}]
    return {"metadata": {"name": name, "labels": labels}, "spec": {"nodeName": "n1"}, "status": status}


def test_the_shipped_placeholder_image_is_refused() -> None:
    check = check_image("gq", deployment("registry.invalid/koord-gpuquota:0.1.0"), [])

    assert not check.passed
    assert "placeholder image registry.invalid/koord-gpuquota:0.1.0" in check.message
    assert "make image IMAGE=" in check.message


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_a_pod_that_cannot_pull_fails_the_image_check(reason: str) -> None:
    check = check_image("gq", deployment(), [pod("a", ready=True), pod("b", waiting=reason)])

    assert not check.passed
    assert check.message == (f"pod gq/b cannot pull registry.example.com/team/koord-gpuquota:0.1.0 "
                             f"({reason}: back-off 5m0s)")


def test_other_waiting_states_and_other_pods_do_not_fail_the_image_check() -> None:
    others = [pod("c", waiting="ContainerCreating"), pod("x", waiting="ImagePullBackOff", labels={"app": "other"})]

    assert check_image("gq", deployment(), others).passed


def test_pods_need_one_ready_replica() -> None:
    assert check_pods("gq", deployment(), [pod("a", waiting="ContainerCreating")]).message == \
        "0 of 3 replicas of gq/gpuquota-webhook ready (a ContainerCreating)"
    assert check_pods("gq", deployment(), [pod("a", ready=True), pod("b")]).passed
    assert not check_pods("gq", None, []).passed


def test_service_needs_a_ready_endpoint() -> None:
    service = {"metadata": {"name": "gpuquota-webhook"}}
    unready = {"endpoints": [{"addresses": ["10.1.0.5"], "conditions": {"ready": False}}]}
    ready = {"endpoints": [{"addresses": ["10.1.0.6"], "conditions": {"ready": True}}]}

    assert check_service("gq", "gpuquota-webhook", None, []).message == \
        "no Service gq/gpuquota-webhook, which the webhook configurations call"
    assert not check_service("gq", "gpuquota-webhook", service, [unready]).passed
    assert check_service("gq", "gpuquota-webhook", service, [unready, ready]).message == \
        "Service gq/gpuquota-webhook has 1 ready endpoint(s): 10.1.0.6"


def policy(*peers: dict[str, Any], port: Any = "https") -> dict[str, Any]:
    return {"metadata": {"name": "gpuquota-webhook"},
            "spec": {"podSelector": {"matchLabels": LABELS}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": list(peers), "ports": [{"port": port, "protocol": "TCP"}]}]}}


def network(policies: list[dict[str, Any]], addresses: list[str]) -> tuple[bool, str]:
    check = check_network_policy("gq", policies, LABELS, {"https"}, {8443}, addresses,
                                 "the endpoints of default/kubernetes")
    return check.passed, check.message


KUBE_SYSTEM_APISERVER_PODS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                              "podSelector": {"matchLabels": {"component": "kube-apiserver"}}}


def test_the_old_default_peer_does_not_admit_a_host_network_apiserver() -> None:
    """The peer the base used to ship (kube-system pods labelled component=kube-apiserver) matches no
    kubeadm or managed apiserver: preflight says so instead of letting every GPU pod be refused."""
    passed, message = network([policy(KUBE_SYSTEM_APISERVER_PODS)], ["10.20.0.11"])

    assert not passed
    assert "admits no peer that covers the apiserver's address 10.20.0.11" in message


def test_the_placeholder_peer_is_refused() -> None:
    passed, message = network([policy({"ipBlock": {"cidr": "192.0.2.1/32"}})], ["10.20.0.11"])

    assert not passed
    assert "still holds the placeholder peer 192.0.2.1/32" in message


def test_ip_blocks_that_cover_every_apiserver_address_pass() -> None:
    covering = policy({"ipBlock": {"cidr": "10.20.0.0/24", "except": ["10.20.0.128/25"]}})

    assert network([covering], ["10.20.0.11", "10.20.0.12"])[0]
    passed, message = network([covering], ["10.20.0.11", "10.20.0.200"])
    assert not passed and "address 10.20.0.200 " in message
    # A rule for another port admits nothing to the webhook's.
    assert not network([policy({"ipBlock": {"cidr": "10.20.0.0/24"}}, port=9090)], ["10.20.0.11"])[0]
    assert network([policy({"ipBlock": {"cidr": "10.20.0.0/24"}}, port=8443)], ["10.20.0.11"])[0]


def test_no_policy_or_an_open_rule_passes_and_unknown_addresses_fail() -> None:
    assert network([], []) == (True, "no NetworkPolicy in gq selects the webhook pods")
    assert network([policy()], [])[0]  # from: [] admits every peer
    other_pods = policy({"ipBlock": {"cidr": "10.20.0.0/24"}})
    other_pods["spec"]["podSelector"] = {"matchLabels": {"app": "other"}}
    assert network([other_pods], [])[0]
    passed, message = network([policy({"ipBlock": {"cidr": "10.20.0.0/24"}})], [])
    assert not passed and "give --apiserver-address" in message


def test_selector_semantics() -> None:
    labels = {"a": "1", "b": "2"}
    assert selector_matches({}, labels)
    assert selector_matches({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]},
                                                  {"key": "c", "operator": "DoesNotExist"}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["2"]}]}, labels)
    assert not selector_matches({"matchLabels": {"a": "2"}}, labels)


def configuration(kind: str, *webhooks: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": "gpuquota-webhook"},
            "webhooks": list(webhooks)}


def webhook(name: str, path: str, resource: str, policy_: str, ca: str | None = None) -> dict[str, Any]:
    client_config: dict[str, Any] = {"service": {"name": "gpuquota-webhook", "namespace": "gq", "path": path}}
    if ca:
        client_config["caBundle"] = ca
    return {"name": name, "clientConfig": client_config, "failurePolicy": policy_,
            "rules": [{"resources": [resource]}]}


def test_the_probe_calls_the_fail_closed_pod_webhook_and_missing_ca_bundles_are_filled() -> None:
    documents = [configuration("MutatingWebhookConfiguration", webhook("m", "/mutate-pods", "pods", "Ignore")),
                 configuration("ValidatingWebhookConfiguration",
                               webhook("q", "/validate-elasticquotas", "elasticquotas", "Fail"),
                               webhook("p", "/validate-pods", "pods", "Fail", ca="b3du"))]

    target = probe_target(read_configurations(documents))

    assert (target.webhook, target.client_config["service"]["path"]) == ("p", "/validate-pods")
    filled = with_ca_bundle(documents, "Q0E=")
    assert [w["clientConfig"]["caBundle"] for d in filled for w in d["webhooks"]] == ["Q0E=", "Q0E=", "b3du"]
    assert "caBundle" not in documents[0]["webhooks"][0]["clientConfig"]  # the input is left alone


def test_only_webhook_configurations_are_installed() -> None:
    with pytest.raises(PreflightInputError, match="Deployment gpuquota-webhook: only admissionregistration"):
        read_configurations([{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gpuquota-webhook"}}])
    with pytest.raises(PreflightInputError, match="every webhook needs a clientConfig"):
        read_configurations([configuration("ValidatingWebhookConfiguration", {"name": "x"})])
