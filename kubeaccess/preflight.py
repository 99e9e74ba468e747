"""The cluster side of ``gpuquota preflight``: read what the checks judge, make the probe call, install.

The probe is the check nothing else can replace: it has the apiserver itself call the webhook, over
the same clientConfig and caBundle the configurations will use, so DNS, the Service, the NetworkPolicy,
TLS and the pods are all on the path. It stores a short-lived ValidatingWebhookConfiguration with two
webhooks that select only preflight's own dry-run pods (an objectSelector with a random token), so no
other request ever reaches them:

- the sentinel calls an address where nothing listens (https://127.0.0.1:1); a dry-run pod for it
  fails with "failed calling webhook" exactly when the apiserver has loaded the configuration, which
  it does asynchronously. The two webhooks are one object, so then the probe is loaded too;
- the probe calls the webhook under test. Its dry-run pod is created (the webhook allowed it) or denied
  by the probe (the webhook answered "no"), or the call fails, with the apiserver's reason.

The configuration is deleted again whatever happens.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuquota_core.preflight import (
    Check,
    ProbeTarget,
    called_service,
    check_image,
    check_network_policy,
    check_pods,
    check_service,
    probe_check,
    with_ca_bundle,
)

from .kube import api_error_message

DEPLOYMENT = "gpuquota-webhook"
SECRET = "gpuquota-webhook-tls"
PROBE_WEBHOOK = "probe.preflight.gpuquota.koord-gpuquota.io"
SENTINEL_WEBHOOK = "sentinel.preflight.gpuquota.koord-gpuquota.io"
PROBE_LABEL = "preflight.gpuquota.koord-gpuquota.io/probe"
# Nothing listens on port 1 of the apiserver's own loopback: the call is refused at once.
SENTINEL_URL = "https://127.0.0.1:1/preflight-sentinel"
# How long the apiserver may take to load a new webhook configuration (it watches them).
CONFIGURATION_LOAD_TIMEOUT = 30.0
POLL_INTERVAL = 0.2
PROBE_TIMEOUT_SECONDS = 10
FIELD_MANAGER = "gpuquota-preflight"


@dataclass(frozen=True, slots=True)
class Findings:
    checks: list[Check]
    ca_bundle: str | None


def _plain(api: client.ApiClient, obj: Any) -> dict[str, Any]:
    """A client model as the API writes it (camelCase keys), for the core's pure checks."""
    plain: dict[str, Any] = api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return plain


def _read(reader: Any, *args: Any) -> Any | None:
    try:
        return reader(*args)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _addresses(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted({str(address) for endpoint_slice in slices for endpoint in endpoint_slice.get("endpoints") or []
                   for address in endpoint.get("addresses") or []})


def inspect(api: client.ApiClient, namespace: str, target: ProbeTarget,
            apiserver_addresses: Sequence[str]) -> Findings:
    """Every check but the probe, from what the API shows."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    discovery, networking = client.DiscoveryV1Api(api), client.NetworkingV1Api(api)
    deployment_model = _read(apps.read_namespaced_deployment, DEPLOYMENT, namespace)
    deployment = _plain(api, deployment_model) if deployment_model is not None else None
    pods = [_plain(api, pod) for pod in core.list_namespaced_pod(namespace).items]
    checks = [check_image(namespace, deployment, pods), check_pods(namespace, deployment, pods)]

    service_reference = called_service(target)
    if service_reference is None:
        checks.append(Check("service", True, f"the configurations call {target.client_config.get('url')}, no Service"))
    else:
        service_namespace, service_name = service_reference
        service = _read(core.read_namespaced_service, service_name, service_namespace)
        slices = discovery.list_namespaced_endpoint_slice(
            service_namespace, label_selector=f"kubernetes.io/service-name={service_name}").items
        checks.append(check_service(service_namespace, service_name, _plain(api, service) if service else None,
                                    [_plain(api, s) for s in slices]))

    secret = _read(core.read_namespaced_secret, SECRET, namespace)
    ca_bundle = (secret.data or {}).get("ca.crt") if secret is not None else None
    if target.client_config.get("caBundle"):
        ca_bundle = str(target.client_config["caBundle"])
        checks.append(Check("certificate", True, "the configurations carry their own caBundle"))
    elif ca_bundle:
        checks.append(Check("certificate", True, f"Secret {namespace}/{SECRET} holds the serving CA (ca.crt), "
                                                 "which becomes the configurations' caBundle"))
    else:
        checks.append(Check("certificate", False,
                            f"Secret {namespace}/{SECRET} has no ca.crt yet: cert-manager has not issued the "
                            "certificate, or run hack/install-self-managed-certs.sh"))

    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    pod_labels = (template.get("metadata") or {}).get("labels") or {}
    ports = [port for container in (template.get("spec") or {}).get("containers") or []
             for port in container.get("ports") or []]
    if apiserver_addresses:
        addresses, addresses_from = list(apiserver_addresses), "--apiserver-address"
    else:
        kubernetes_slices = discovery.list_namespaced_endpoint_slice(
            "default", label_selector="kubernetes.io/service-name=kubernetes").items
        addresses = _addresses([_plain(api, s) for s in kubernetes_slices])
        addresses_from = "the endpoints of Service default/kubernetes"
    policies = [_plain(api, p) for p in networking.list_namespaced_network_policy(namespace).items]
    port_names = {str(p["name"]) for p in ports if p.get("name")}
    port_numbers = {int(p["containerPort"]) for p in ports if "containerPort" in p}
    checks.append(check_network_policy(namespace, policies, pod_labels, port_names, port_numbers, addresses,
                                       addresses_from))
    return Findings(checks, ca_bundle)


def _probe_pod(name: str, token: str) -> dict[str, Any]:
    """A pod that passes the "restricted" Pod Security level anywhere; created with dryRun only."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {PROBE_LABEL: token}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "probe", "image": "registry.invalid/gpuquota-preflight-probe",
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def _webhook(name: str, client_config: Mapping[str, Any], token: str, timeout: int) -> dict[str, Any]:
    return {
        "name": name, "admissionReviewVersions": ["v1"], "clientConfig": dict(client_config),
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                   "scope": "Namespaced"}],
        "failurePolicy": "Fail", "sideEffects": "NoneOnDryRun", "timeoutSeconds": timeout,
        "objectSelector": {"matchLabels": {PROBE_LABEL: token}},
    }


def _dry_run_create(core: client.CoreV1Api, namespace: str, pod: dict[str, Any]) -> str | None:
    """None when the dry-run create succeeded, else the apiserver's message."""
    try:
        # A plain dict body: the client serialises it as it is.
        core.create_namespaced_pod(namespace, cast(Any, pod), dry_run="All")
    except ApiException as error:
        return api_error_message(error)
    return None


def probe(api: client.ApiClient, target: ProbeTarget, ca_bundle: str | None, probe_namespace: str) -> Check:
    """Have the apiserver call the webhook of ``target`` once, through a configuration of preflight's own."""
    if not ca_bundle:
        return Check("webhook", False, "not probed: no caBundle to call the webhook with (see the certificate check)")
    token = secrets.token_hex(6)
    name = f"gpuquota-preflight-{token}"
    admission = client.AdmissionregistrationV1Api(api)
    core = client.CoreV1Api(api)
    configuration = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "koord-gpuquota"}},
        "webhooks": [
            _webhook(PROBE_WEBHOOK, {**target.client_config, "caBundle": ca_bundle}, f"{token}-probe",
                     PROBE_TIMEOUT_SECONDS),
            _webhook(SENTINEL_WEBHOOK, {"url": SENTINEL_URL}, f"{token}-sentinel", 1),
        ],
    }
    try:
        admission.create_validating_webhook_configuration(cast(Any, configuration))
    except ApiException as error:
        return Check("webhook", False, f"cannot store the probe configuration {name}: {api_error_message(error)}")
    try:
        sentinel_error: str | None = f"not in effect after {CONFIGURATION_LOAD_TIMEOUT:.0f} s"
        deadline = time.monotonic() + CONFIGURATION_LOAD_TIMEOUT
        while time.monotonic() < deadline:
            answer = _dry_run_create(core, probe_namespace, _probe_pod(f"{name}-sentinel", f"{token}-sentinel"))
            if answer is not None and f'failed calling webhook "{SENTINEL_WEBHOOK}"' in answer:
                sentinel_error = None
                break
            if answer is not None:
                sentinel_error = f"dry-run pod in {probe_namespace} refused: {answer}"
                break
            # Created: the apiserver has not loaded the configuration yet; ask again shortly.
            time.sleep(POLL_INTERVAL)
        probe_error = None
        if sentinel_error is None:
            probe_error = _dry_run_create(core, probe_namespace, _probe_pod(f"{name}-probe", f"{token}-probe"))
        return probe_check(target, sentinel_error, probe_error, PROBE_WEBHOOK)
    finally:
        try:
            admission.delete_validating_webhook_configuration(name)
        except ApiException as error:
            if error.status != 404:
                raise


def install(api: client.ApiClient, configurations: Sequence[Mapping[str, Any]], ca_bundle: str) -> list[str]:
    """Server-side apply of the configurations, each webhook without a caBundle given ``ca_bundle``."""
    admission = client.AdmissionregistrationV1Api(api)
    written: list[str] = []
    for document in with_ca_bundle(configurations, ca_bundle):
        name = str(document["metadata"]["name"])
        apply: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force": True,
                                 "_content_type": "application/apply-patch+yaml"}
        if document["kind"] == "MutatingWebhookConfiguration":
            admission.patch_mutating_webhook_configuration(name, document, **apply)
            written.append(f"mutatingwebhookconfiguration.admissionregistration.k8s.io/{name}")
        else:
            admission.patch_validating_webhook_configuration(name, document, **apply)
            written.append(f"validatingwebhookconfiguration.admissionregistration.k8s.io/{name}")
    return written
