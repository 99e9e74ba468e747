"""What ``gpuquota preflight`` decides about an install, from objects read from the cluster (no I/O).

The webhook configurations are the one part of an install that can hurt the rest of the cluster:
validation fails closed, so from the moment they exist every GPU pod needs the webhook to answer.
preflight therefore judges, before they are written, everything that can keep the apiserver from
getting an answer: the image (a pod that cannot pull it never serves), ready pods, the Service's
endpoints, the serving certificate, the NetworkPolicy, and finally a real call made by the apiserver
itself (the probe, kubeaccess/preflight.py). Each check is one :class:`Check` with a message that
names the objects and numbers it judged; the command writes the configurations only when all passed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Where the shipped manifests point until a user sets their own image: .invalid is reserved
# (RFC 2606), so no registry can ever serve it.
PLACEHOLDER_REGISTRY = "registry.invalid"
# The peer the optional NetworkPolicy ships with (TEST-NET-1): it matches no apiserver on purpose.
PLACEHOLDER_PEER_CIDR = "192.0.2.1/32"
# What the kubelet writes into a container's waiting state when it cannot get the image.
IMAGE_PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                                 "RegistryUnavailable"})
WEBHOOK_CONFIGURATION_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
ADMISSION_GROUP_VERSION = "admissionregistration.k8s.io/v1"


class PreflightInputError(ValueError):
    """The configurations given to install are not what preflight can install; the message says why."""


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    passed: bool
    message: str


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _name(obj: Mapping[str, Any]) -> str:
    return str(_mapping(obj.get("metadata")).get("name", "?"))


# -- label selectors (metav1.LabelSelector) ---------------------------------------------------------

def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, Any] | None) -> bool:
    """metav1.LabelSelector semantics: an empty selector selects everything."""
    labels = _mapping(labels)
    selector = _mapping(selector)
    for label, value in _mapping(selector.get("matchLabels")).items():
        if labels.get(label) != value:
            return False
    for item in _list(selector.get("matchExpressions")):
        expression = _mapping(item)
        key, operator = str(expression.get("key", "")), expression.get("operator")
        values = _list(expression.get("values"))
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


# -- the Deployment and its pods ----------------------------------------------------------------------

def deployment_images(deployment: Mapping[str, Any]) -> list[str]:
    pod_spec = _mapping(_mapping(_mapping(deployment.get("spec")).get("template")).get("spec"))
    return [str(_mapping(c).get("image", "")) for c in _list(pod_spec.get("containers"))]


def pods_of(deployment: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Deployment's pods: selected by its selector and not being deleted."""
    selector = _mapping(_mapping(deployment.get("spec")).get("selector"))
    return [pod for pod in pods
            if selector_matches(selector, _mapping(pod.get("metadata")).get("labels"))
            and not _mapping(pod.get("metadata")).get("deletionTimestamp")]


def check_image(namespace: str, deployment: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> Check:
    if deployment is None:
        return Check("image", False, f"no Deployment {namespace}/gpuquota-webhook: apply the manifests of step 1 first")
    images = deployment_images(deployment)
    placeholders = [image for image in images if image.split("/", 1)[0] == PLACEHOLDER_REGISTRY]
    if placeholders:
        return Check("image", False, f"Deployment {namespace}/{_name(deployment)} runs the placeholder image "
                                     f"{placeholders[0]}, which no registry serves: build and push yours "
                                     "(make image IMAGE=...; make push IMAGE=...) and set it (kustomize images:, "
                                     "or helm --set image.repository=...)")
    for pod in pods_of(deployment, pods):
        status = _mapping(pod.get("status"))
        for container in _list(status.get("containerStatuses")) + _list(status.get("initContainerStatuses")):
            waiting = _mapping(_mapping(_mapping(container).get("state")).get("waiting"))
            reason = waiting.get("reason")
            if reason in IMAGE_PULL_FAILURES:
                detail = f": {waiting['message']}" if waiting.get("message") else ""
                return Check("image", False, f"pod {namespace}/{_name(pod)} cannot pull "
                                             f"{_mapping(container).get('image') or images[0]} ({reason}{detail})")
    return Check("image", True, f"{', '.join(images)}: no pod of Deployment {namespace}/{_name(deployment)} "
                                "is failing to pull it")


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(_mapping(c).get("type") == "Ready" and _mapping(c).get("status") == "True"
               for c in _list(_mapping(pod.get("status")).get("conditions")))


def _pod_state(pod: Mapping[str, Any]) -> str:
    status = _mapping(pod.get("status"))
    for container in _list(status.get("containerStatuses")):
        waiting = _mapping(_mapping(_mapping(container).get("state")).get("waiting"))
        if waiting.get("reason"):
            return str(waiting["reason"])
    if not _mapping(pod.get("spec")).get("nodeName"):
        return "not scheduled"
    return str(status.get("phase") or "no status")


def check_pods(namespace: str, deployment: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> Check:
    if deployment is None:
        return Check("pods", False, f"no Deployment {namespace}/gpuquota-webhook")
    wanted = _mapping(deployment.get("spec")).get("replicas", 1)
    own = pods_of(deployment, pods)
    ready = [pod for pod in own if _ready(pod)]
    if not ready:
        states = ", ".join(f"{_name(pod)} {_pod_state(pod)}" for pod in own) or "no pod exists"
        return Check("pods", False, f"0 of {wanted} replicas of {namespace}/{_name(deployment)} ready ({states})")
    return Check("pods", True, f"{len(ready)} of {wanted} replicas of {namespace}/{_name(deployment)} ready")


# -- the Service ----------------------------------------------------------------------------------------

def check_service(namespace: str, name: str, service: Mapping[str, Any] | None,
                  endpoint_slices: Sequence[Mapping[str, Any]]) -> Check:
    if service is None:
        return Check("service", False, f"no Service {namespace}/{name}, which the webhook configurations call")
    ready = sorted({str(address)
                    for endpoint_slice in endpoint_slices
                    for endpoint in _list(endpoint_slice.get("endpoints"))
                    # The API's rule: a missing ready condition counts as ready.
                    if _mapping(_mapping(endpoint).get("conditions")).get("ready", True) is not False
                    for address in _list(_mapping(endpoint).get("addresses"))})
    if not ready:
        return Check("service", False, f"Service {namespace}/{name} has no ready endpoint: the apiserver would "
                                       "have no pod to call")
    return Check("service", True, f"Service {namespace}/{name} has {len(ready)} ready endpoint(s): {', '.join(ready)}")


# -- the NetworkPolicy -------------------------------------------------------------------------------------

def _port_opened(rule: Mapping[str, Any], port_names: set[str], port_numbers: set[int]) -> bool:
    ports = _list(rule.get("ports"))
    if not ports:
        return True  # no ports: every port
    for port in ports:
        port = _mapping(port)
        if port.get("protocol", "TCP") != "TCP":
            continue
        value = port.get("port")
        if value is None or value in port_names or value in port_numbers:
            return True
        end = port.get("endPort")
        if isinstance(value, int) and isinstance(end, int) and any(value <= n <= end for n in port_numbers):
            return True
    return False


def _admitted_by(peer: Mapping[str, Any], address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    block = _mapping(peer.get("ipBlock"))
    if not block:
        return False  # pod and namespace selectors never match a host-network or managed apiserver
    try:
        if address not in ipaddress.ip_network(str(block.get("cidr")), strict=False):
            return False
        excepted = [ipaddress.ip_network(str(other), strict=False) for other in _list(block.get("except"))]
        return not any(address in network for network in excepted)
    except ValueError:
        return False


def check_network_policy(namespace: str, policies: Sequence[Mapping[str, Any]], pod_labels: Mapping[str, Any],
                         port_names: set[str], port_numbers: set[int], apiserver_addresses: Sequence[str],
                         addresses_from: str) -> Check:
    """Whether the NetworkPolicies selecting the webhook pods let the apiserver's addresses in.

    Only what the API shows can be checked: ipBlock peers against the addresses the apiserver is
    known by (the endpoints of Service default/kubernetes, or the ones given). A managed control
    plane may call from other addresses; give those with --apiserver-address.
    """
    selecting = [p for p in policies
                 if selector_matches(_mapping(_mapping(p.get("spec")).get("podSelector")), pod_labels)
                 and "Ingress" in (_list(_mapping(p.get("spec")).get("policyTypes")) or ["Ingress"])]
    if not selecting:
        return Check("networkpolicy", True, f"no NetworkPolicy in {namespace} selects the webhook pods")
    names = ", ".join(f"{namespace}/{_name(p)}" for p in selecting)
    rules = [_mapping(rule) for p in selecting for rule in _list(_mapping(p.get("spec")).get("ingress"))
             if _port_opened(_mapping(rule), port_names, port_numbers)]
    placeholder = [rule for rule in rules
                   if any(_mapping(_mapping(peer).get("ipBlock")).get("cidr") == PLACEHOLDER_PEER_CIDR
                          for peer in _list(rule.get("from")))]
    if placeholder:
        return Check("networkpolicy", False, f"NetworkPolicy {names} still holds the placeholder peer "
                                             f"{PLACEHOLDER_PEER_CIDR}: replace /spec/ingress/0/from with the "
                                             "addresses your apiserver calls from (docs/deploy.md, NetworkPolicy)")
    if any(not _list(rule.get("from")) for rule in rules):
        return Check("networkpolicy", True, f"NetworkPolicy {names} admits every peer to the webhook's port")
    if not apiserver_addresses:
        return Check("networkpolicy", False, f"NetworkPolicy {names} selects the webhook pods, and the apiserver's "
                                             f"addresses are unknown ({addresses_from}): give --apiserver-address")
    parsed: list[tuple[str, ipaddress.IPv4Address | ipaddress.IPv6Address]] = []
    for text in apiserver_addresses:
        try:
            parsed.append((text, ipaddress.ip_address(text)))
        except ValueError:
            return Check("networkpolicy", False, f"{text} is not an IP address ({addresses_from})")
    shut_out = [text for text, address in parsed
                if not any(_admitted_by(_mapping(peer), address) for rule in rules for peer in _list(rule.get("from")))]
    if shut_out:
        return Check("networkpolicy", False, f"NetworkPolicy {names} admits no peer that covers the apiserver's "
                                             f"address {', '.join(shut_out)} ({addresses_from}) to the webhook's "
                                             "port: add an ipBlock for it (docs/deploy.md, NetworkPolicy)")
    return Check("networkpolicy", True, f"NetworkPolicy {names} admits the apiserver's address(es) "
                                        f"{', '.join(text for text, _ in parsed)} ({addresses_from})")


# -- the configurations to install ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """Where the probe asks the apiserver to call: the clientConfig of the fail-closed pod webhook."""

    client_config: Mapping[str, Any]
    webhook: str


def read_configurations(documents: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The webhook configurations to install, or PreflightInputError naming what else is there."""
    configurations: list[dict[str, Any]] = []
    for document in documents:
        kind, api_version = document.get("kind"), document.get("apiVersion")
        if kind not in WEBHOOK_CONFIGURATION_KINDS or api_version != ADMISSION_GROUP_VERSION:
            raise PreflightInputError(f"{kind or 'an object without kind'} {_name(document)}: only "
                                      f"{ADMISSION_GROUP_VERSION} Mutating- and ValidatingWebhookConfigurations "
                                      "are installed by preflight (step 2; apply the rest with kubectl)")
        webhooks = _list(document.get("webhooks"))
        if not webhooks or not all(isinstance(_mapping(w).get("clientConfig"), Mapping) for w in webhooks):
            raise PreflightInputError(f"{kind} {_name(document)}: every webhook needs a clientConfig")
        configurations.append(dict(document))
    if not configurations:
        raise PreflightInputError("no webhook configuration to install in the input")
    return configurations


def default_target(namespace: str) -> ProbeTarget:
    """Without configurations: the Service and path the shipped ones call for pod validation."""
    return ProbeTarget({"service": {"name": "gpuquota-webhook", "namespace": namespace, "path": "/validate-pods",
                                    "port": 443}}, "gpu-quota.gpuquota.koord-gpuquota.io")


def probe_target(configurations: Sequence[Mapping[str, Any]]) -> ProbeTarget:
    """The webhook whose outage hurts: the first fail-closed validating webhook for pods, else the first."""
    candidates = [_mapping(webhook) for document in configurations
                  if document.get("kind") == "ValidatingWebhookConfiguration"
                  for webhook in _list(document.get("webhooks"))]
    candidates += [_mapping(webhook) for document in configurations
                   if document.get("kind") == "MutatingWebhookConfiguration"
                   for webhook in _list(document.get("webhooks"))]

    def for_pods(webhook: Mapping[str, Any]) -> bool:
        return any("pods" in _list(_mapping(rule).get("resources")) for rule in _list(webhook.get("rules")))

    ordered = [w for w in candidates if for_pods(w) and w.get("failurePolicy", "Fail") == "Fail"] + candidates
    chosen = ordered[0]
    return ProbeTarget(_mapping(chosen.get("clientConfig")), str(chosen.get("name", "?")))


def called_service(target: ProbeTarget) -> tuple[str, str] | None:
    service = _mapping(target.client_config.get("service"))
    if not service:
        return None
    return str(service.get("namespace", "")), str(service.get("name", ""))


def with_ca_bundle(configurations: Sequence[Mapping[str, Any]], ca_bundle: str) -> list[dict[str, Any]]:
    """Copies whose webhooks without a caBundle get ``ca_bundle`` (base64 PEM); others keep theirs."""
    filled: list[dict[str, Any]] = []
    for document in configurations:
        copy = dict(document)
        copy["webhooks"] = []
        for webhook in _list(document.get("webhooks")):
            webhook = dict(_mapping(webhook))
            client_config = dict(_mapping(webhook.get("clientConfig")))
            if not client_config.get("caBundle"):
                client_config["caBundle"] = ca_bundle
            webhook["clientConfig"] = client_config
            copy["webhooks"].append(webhook)
        filled.append(copy)
    return filled


def probe_check(target: ProbeTarget, sentinel_error: str | None, probe_error: str | None, probe_name: str) -> Check:
    """The probe's verdict from what the apiserver answered to the probe pod's dry-run create.

    ``probe_error`` is None when the create succeeded. A denial by the probe webhook is an answer too
    (the webhook judged the pod); only a failed call is not.
    """
    where = _describe(target)
    if sentinel_error is not None:
        return Check("webhook", False, f"the apiserver never applied the probe configuration: {sentinel_error}")
    if probe_error is None or f'admission webhook "{probe_name}" denied the request' in probe_error:
        return Check("webhook", True, f"the apiserver called {where} and got an answer")
    return Check("webhook", False, f"the apiserver cannot call {where}: {probe_error}")


def _describe(target: ProbeTarget) -> str:
    service = _mapping(target.client_config.get("service"))
    if service:
        return (f"service {service.get('namespace')}/{service.get('name')}:{service.get('port', 443)}"
                f"{service.get('path', '')}")
    return str(target.client_config.get("url"))
