"""Registering webhook configurations with the test apiserver (not a test module)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from controlplane import Api
from kubernetes.client.exceptions import ApiException

WEBHOOK_CONFIGURATIONS = Path(__file__).resolve().parents[1] / "manifests" / "webhooks" / "webhook-configurations.yaml"
WEBHOOK_READY_TIMEOUT = 60.0


def local_webhook_configurations(url: str, ca_bundle: str, *, name_suffix: str = "",
                                 namespace_selector: Mapping[str, Any] | None = None,
                                 source: Path = WEBHOOK_CONFIGURATIONS) -> list[dict[str, Any]]:
    """The project's own configurations (``source``: another checkout's, for a variant) with clientConfig
    pointing at ``url`` (the envtest way)."""
    documents = [doc for doc in yaml.safe_load_all(source.read_text(encoding="utf-8")) if doc]
    for document in documents:
        document["metadata"]["name"] += name_suffix
        for webhook in document["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": url + path, "caBundle": ca_bundle}
            if namespace_selector is not None:
                webhook["namespaceSelector"] = dict(namespace_selector)
    return documents


def register_webhook_configurations(api: Api, documents: list[dict[str, Any]]) -> None:
    for document in documents:
        if document["kind"] == "MutatingWebhookConfiguration":
            api.admissionregistration.create_mutating_webhook_configuration(document)
        else:
            api.admissionregistration.create_validating_webhook_configuration(document)


def delete_webhook_configurations(api: Api, documents: list[dict[str, Any]]) -> None:
    for document in documents:
        name = document["metadata"]["name"]
        try:
            if document["kind"] == "MutatingWebhookConfiguration":
                api.admissionregistration.delete_mutating_webhook_configuration(name)
            else:
                api.admissionregistration.delete_validating_webhook_configuration(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def gpu_probe_pod(name: str) -> dict[str, Any]:
    gpu = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "probe", "image": "registry.example/probe:1",
                                     "resources": {"requests": gpu, "limits": gpu}}]}}


def wait_until_webhook_is_called(api: Api, namespace: str, timeout: float = WEBHOOK_READY_TIMEOUT) -> None:
    """Poll with dry-run creates until the apiserver's answer shows our mutation.

    The apiserver picks up new webhook configurations asynchronously; a dry-run create is the
    cheapest request that goes through the whole admission chain and leaves nothing behind.
    """
    deadline = time.monotonic() + timeout
    while True:
        stored = api.core.create_namespaced_pod(namespace, gpu_probe_pod("webhook-probe"), dry_run="All")
        if "koordinator.sh/gpu-core" in (stored.spec.containers[0].resources.requests or {}):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the apiserver did not call the webhook within {timeout:.0f}s")
        time.sleep(0.2)  # polling a condition with a deadline, not synchronising on time
