"""warn mode through the real apiserver: the pod is stored and the caller gets a Warning header.

The warning reaches the client as an HTTP ``Warning: 299 - "..."`` header, which kubectl prints
as ``Warning: ...``. The kubernetes Python client does not surface warnings on its models, so the
create is made with ``_preload_content=False`` and the header is read from the raw response.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admissionchain import (
    delete_webhook_configurations,
    local_webhook_configurations,
    register_webhook_configurations,
    wait_until_webhook_is_called,
)
from controlplane import Api
from kubernetes import client as k8s
from webhookproc import REPO_ROOT, WebhookProcess

EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"
IGNORE_LABEL = "gpuquota.koord-gpuquota.io/ignore"
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
NINE_CARDS = {"koordinator.sh/gpu-core": "900", "koordinator.sh/gpu-memory-ratio": "900"}
# team-nlp of the example cluster: 4 cards, 2 in use.
WARNING = ('299 - "gpuquota would deny (QuotaExceeded, enforcement: warn): exceeded quota: team-nlp/team-nlp, '
           "requested: koordinator.sh/gpu-core=900,koordinator.sh/gpu-memory-ratio=900, "
           "used: koordinator.sh/gpu-core=200,koordinator.sh/gpu-memory-ratio=200, "
           'limited: koordinator.sh/gpu-core=400,koordinator.sh/gpu-memory-ratio=400"')


@pytest.fixture
def warn_namespace(api: Api, tmp_path: Path) -> Iterator[str]:
    """A namespace only a private webhook in warn mode judges (the session's webhook skips it)."""
    name = f"warn-{uuid.uuid4().hex[:8]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={IGNORE_LABEL: "true"})))
    config = tmp_path / "conversion.yaml"
    config.write_text("enforcement:\n  checks:\n    QuotaExceeded: warn\n", encoding="utf-8")
    server = WebhookProcess(tmp_path / "webhook", serve_args=["--state", str(EXAMPLE_STATE), "--config", str(config)])
    server.start()
    documents = local_webhook_configurations(server.url, server.ca_bundle, name_suffix="-warn",
                                             namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": name}})
    register_webhook_configurations(api, documents)
    try:
        wait_until_webhook_is_called(api, name)
        yield name
    finally:
        delete_webhook_configurations(api, documents)
        server.stop()


def over_quota_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {QUOTA_LABEL: "team-nlp"}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/train:1",
                                     "resources": {"requests": dict(NINE_CARDS), "limits": dict(NINE_CARDS)}}]}}


def test_warn_mode_stores_the_pod_and_the_caller_sees_the_warning(api: Api, warn_namespace: str) -> None:
    response = api.core.create_namespaced_pod(warn_namespace, over_quota_pod("over"), _preload_content=False)

    assert response.status == 201
    # The mutating webhook's warning first: the example cluster's gpu-mixed-0 reports both GPU families.
    assert response.headers.get("Warning") == (
        '299 - "gpuquota: this pod can be scheduled on gpu-mixed-0, which advertise(s) both a vendor GPU name and '
        "koordinator.sh/gpu-* for the same cards: the device plugin and Koordinator may hand out one card twice "
        f'(audit check node-mixed-gpu-resources)", {WARNING}')
    created = json.loads(response.data)
    assert created["metadata"]["name"] == "over"
    stored = api.core.read_namespaced_pod("over", warn_namespace)
    assert stored.spec.containers[0].resources.requests == NINE_CARDS
