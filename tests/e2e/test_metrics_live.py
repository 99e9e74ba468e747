"""The per-quota gauges of a live ``gpuquota serve`` against the real apiserver: the numbers
``gpuquota quota`` shows, and no series left once a quota is deleted."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from clusterhelpers import PARENT_LABEL, admits_quota, create_quota, eventually, whole_card_pod
from controlplane import ELASTICQUOTA_GROUP, ELASTICQUOTA_PLURAL, ELASTICQUOTA_VERSION, Api
from prometheus_client.parser import text_string_to_metric_families
from webhookproc import WebhookProcess

from cli.main import cli

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
IS_PARENT_LABEL = "quota.scheduling.koordinator.sh/is-parent"
GAUGES = {"gpuquota_quota_used": "used", "gpuquota_quota_limit": "limit", "gpuquota_quota_min": "min",
          "gpuquota_quota_reserved": "reserved"}

Series = dict[tuple[str, str, str], float]  # (figure, quota, resource) -> value


def quota_series(server: WebhookProcess, quotas: set[str]) -> Series:
    status, text = server.get("/metrics")
    assert status == 200, text
    found: Series = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name in GAUGES and sample.labels["quota"] in quotas:
                found[GAUGES[sample.name], sample.labels["quota"], sample.labels["resource"]] = sample.value
    return found


def test_live_gauges_match_gpuquota_quota_and_end_with_the_quota(api: Api, webhook_server: WebhookProcess,
                                                                  kubeconfig_path: Path, namespace: str) -> None:
    parent, leaf = f"p-{namespace}", f"l-{namespace}"
    create_quota(api, namespace, parent, {CORE: "600", RATIO: "600"}, labels={IS_PARENT_LABEL: "true"})
    create_quota(api, namespace, leaf, {"nvidia.com/gpu": "4"}, labels={PARENT_LABEL: parent})
    eventually(lambda: admits_quota(webhook_server, namespace, leaf), "the webhook knows the leaf quota")
    api.core.create_namespaced_pod(namespace, whole_card_pod("trainer", leaf, cards=2))

    # Once the watch has shown the pod, its 200 counts as used and its reservation is released.
    expected: Series = {}
    for resource in (CORE, RATIO):
        expected |= {("used", leaf, resource): 200, ("limit", leaf, resource): 400, ("reserved", leaf, resource): 0,
                     ("used", parent, resource): 200, ("limit", parent, resource): 600,
                     ("reserved", parent, resource): 0}
    eventually(lambda: quota_series(webhook_server, {parent, leaf}) == expected, "the gauges show the watched pod")

    # Every series names the tree's root.
    status, text = webhook_server.get("/metrics")
    assert status == 200
    trees = {sample.labels["tree"] for family in text_string_to_metric_families(text.decode())
             for sample in family.samples if sample.name in GAUGES and sample.labels["quota"] in (parent, leaf)}
    assert trees == {parent}

    # gpuquota quota shows the same rows and numbers.
    result = CliRunner().invoke(cli, ["quota", "--kubeconfig", str(kubeconfig_path), "-n", namespace, "-o", "json"])
    assert result.exit_code == 0, result.output
    shown: Series = {}
    for quota in json.loads(result.stdout)["quotas"]:
        for row in quota["resources"]:
            for figure in ("used", "limit", "min"):
                if row[figure] is not None:
                    shown[figure, quota["name"], row["name"]] = float(row[figure])
    assert shown == {key: value for key, value in expected.items() if key[0] != "reserved"}

    api.custom.delete_namespaced_custom_object(ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace,
                                               ELASTICQUOTA_PLURAL, leaf)

    eventually(lambda: not quota_series(webhook_server, {leaf}), "the deleted quota's series are gone")
    assert quota_series(webhook_server, {parent})[("limit", parent, CORE)] == 600
