"""A live ``gpuquota serve`` whose quota service is killed: the master starts a new one, which lists the
cluster afresh, against a real apiserver (docs/accounting.md "Across workers: one quota service")."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from clusterhelpers import QUOTA_LABEL, RATIO, admits_quota, create_quota, eventually
from controlplane import Api
from reviews import pod, review
from webhookproc import WebhookProcess, post_review, quota_service_pid


def share_pod(name: str, quota: str, ratio: str) -> dict[str, Any]:
    gpu = {"koordinator.sh/gpu-core": ratio, RATIO: ratio}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {QUOTA_LABEL: quota}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/infer:1",
                                     "resources": {"requests": gpu, "limits": gpu}}]}}


def replaced(server: WebhookProcess, old: int) -> bool:
    try:
        return quota_service_pid(server.pid) != old
    except AssertionError:  # between the old one's exit and the new one's start
        return False


def test_a_killed_live_quota_service_is_replaced_and_counts_the_stored_pods_again(
        api: Api, namespace: str, kubeconfig_path: Path, elasticquota_crd: object, tmp_path: Path) -> None:
    quota = f"q-{namespace}"
    create_quota(api, namespace, quota, {RATIO: "300"})
    for name in ("a", "b"):
        api.core.create_namespaced_pod(namespace, share_pod(name, quota, "100"))
    server = WebhookProcess(tmp_path, serve_args=["--kubeconfig", str(kubeconfig_path), "--workers", "2"])
    server.start()
    try:
        eventually(lambda: admits_quota(server, namespace, quota), "the server knows the quota")
        service = quota_service_pid(server.pid)
        os.kill(service, signal.SIGKILL)
        killed = time.monotonic()
        eventually(lambda: replaced(server, service) and server.get("/readyz")[0] == 200
                   and admits_quota(server, namespace, quota), "a new quota service, synced and deciding")
        print(f"\nlive: healed {time.monotonic() - killed:.2f}s after the quota service was killed")

        # Its state is a fresh list: the two stored pods count against the quota again.
        document = review(pod("big", namespace, labels={QUOTA_LABEL: quota}, resources={RATIO: "200"}))
        refused = post_review(server, "/validate-pods", document)
        assert refused["allowed"] is False
        assert f"used: {RATIO}=200, limited: {RATIO}=300" in refused["status"]["message"]
    finally:
        server.stop()
