"""Readiness of a strict replica tells whether it can decide: its ledger namespace must be writable
(docs/reliability.md, "Readiness"), checked against a real apiserver through a real ``gpuquota serve``."""

from __future__ import annotations

import json
from pathlib import Path

from clusterhelpers import eventually
from controlplane import Api
from kubernetes import client as k8s
from webhookproc import WebhookProcess


def test_a_replica_whose_ledger_namespace_does_not_exist_is_unready_until_it_does(
        api: Api, namespace: str, kubeconfig_path: Path, elasticquota_crd: object, tmp_path: Path) -> None:
    ledger_namespace = f"ledger-{namespace}"
    server = WebhookProcess(tmp_path, serve_args=["--kubeconfig", str(kubeconfig_path), "--workers", "1",
                                                  "--accounting", "strict", "--ledger-namespace", ledger_namespace])
    server.start(ready_path="/healthz")  # serving, but not ready: that is the point

    def readiness() -> tuple[int, str]:
        status, body = server.get("/readyz")
        return status, str(json.loads(body)["reason"])

    try:
        missing = (503, f"cannot write ledger ConfigMaps in namespace {ledger_namespace}: 404 Not Found")
        eventually(lambda: readiness() == missing, f"/readyz says {missing}")
        api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ledger_namespace)))
        try:
            eventually(lambda: readiness() == (200, "quota state synced"), "ready once the namespace exists")
        finally:
            api.core.delete_namespace(ledger_namespace)
    finally:
        server.stop()
