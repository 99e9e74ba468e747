"""``gpuquota quota`` and ``gpuquota explain`` against the real apiserver with the webhook registered:
a live two-level tree, a vendor pod the webhook rewrote, a share pod, a strict-ledger reservation."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from clusterhelpers import PARENT_LABEL, admits_quota, create_quota, eventually, whole_card_pod
from controlplane import Api
from kubernetes.client.exceptions import ApiException
from webhookproc import WebhookProcess

from cli.main import cli
from gpuquota_core import shared_ledger
from gpuquota_core.ledger import GangReservation, Reservation
from gpuquota_core.quantity import Quantity
from gpuquota_core.shared_ledger import MANAGED_BY, MANAGED_BY_LABEL, TREE_LABEL

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
IS_PARENT_LABEL = "quota.scheduling.koordinator.sh/is-parent"


def gpuquota(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def _explain_stdin(kubeconfig_path: Path, pod: dict[str, Any]) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["explain", "-f", "-", "--kubeconfig", str(kubeconfig_path), "-o", "json"],
                                input=json.dumps(pod))
    return result.exit_code, result.stdout, result.stderr


def ledger_configmap(namespace: str, tree_root: str, reservation: Reservation) -> dict[str, Any]:
    stored = shared_ledger.StoredReservation(reservation, "replica-a", time.time())
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": shared_ledger.ledger_object_name(tree_root), "namespace": namespace,
                         "labels": {MANAGED_BY_LABEL: MANAGED_BY, TREE_LABEL: tree_root}},
            "data": shared_ledger.encode([stored])}


@pytest.fixture
def live_tree(api: Api, webhook_server: WebhookProcess, namespace: str) -> tuple[str, str]:
    parent, leaf = f"p-{namespace}", f"l-{namespace}"
    create_quota(api, namespace, parent, {CORE: "600", RATIO: "600"}, labels={IS_PARENT_LABEL: "true"})
    create_quota(api, namespace, leaf, {"nvidia.com/gpu": "4"}, labels={PARENT_LABEL: parent})
    eventually(lambda: admits_quota(webhook_server, namespace, leaf), "the webhook knows the leaf quota")
    api.core.create_namespaced_pod(namespace, whole_card_pod("legacy", leaf, cards=2))
    share = {CORE: "50", RATIO: "50"}
    api.core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "share", "labels": {"quota.scheduling.koordinator.sh/name": leaf}},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"requests": share, "limits": share}}]}})
    return parent, leaf


def test_live_tree_with_usage_families_and_reservations(api: Api, kubeconfig_path: Path,
                                                        live_tree: tuple[str, str], namespace: str) -> None:
    parent, leaf = live_tree
    coming = Reservation(f"{namespace}/coming", "admission-1", (leaf, parent), {CORE: Quantity.parse("100"),
                                                                                RATIO: Quantity.parse("100")},
                         expires_at=time.time() + 600)
    api.core.create_namespaced_config_map(namespace, ledger_configmap(namespace, parent, coming))

    code, out, err = gpuquota("quota", "--kubeconfig", str(kubeconfig_path), "-n", namespace, "-o", "json", "--pods")

    assert (code, err) == (0, "")
    document = json.loads(out)
    assert document["source"] == "live"
    quotas = {q["name"]: q for q in document["quotas"]}
    assert [q["name"] for q in document["quotas"]] == [parent, leaf]
    leaf_core = quotas[leaf]["resources"][0]
    # The leaf limits nvidia.com/gpu: 4 (400); the webhook rewrote the 2-card pod to 200 and recorded
    # what it asked for, so it counts as a vendor pod.
    assert {k: leaf_core[k] for k in ("name", "limit", "used", "usedByFamily", "reserved", "free", "bindsFirst")} == {
        "name": CORE, "limit": "400", "used": "250", "usedByFamily": {"vendor": "200", "koordinator": "50"},
        "reserved": "100", "free": "50", "bindsFirst": leaf}
    parent_core = quotas[parent]["resources"][0]
    assert (parent_core["used"], parent_core["reserved"], parent_core["free"]) == ("250", "100", "250")
    assert [(p["name"], p["family"], p["rewritten"]) for p in quotas[leaf]["pods"]] == [
        ("legacy", "vendor", True), ("share", "koordinator", False)]

    code, table, _ = gpuquota("quota", "--kubeconfig", str(kubeconfig_path), "-n", namespace)
    assert code == 0
    row = next(line for line in table.splitlines() if line.startswith(f"  {leaf}"))
    assert row.split()[1:6] == ["gpu-core", "-", "400", "(4", "cards)"]

    # explain decides as a strict replica would: the stored reservation takes room, so one more card
    # (100 where 400 - 250 - 100 = 50 is left) is refused, the reservation counted in "used".
    card = whole_card_pod("one-more", leaf, cards=1)
    card["metadata"]["namespace"] = namespace
    code, out, _ = _explain_stdin(kubeconfig_path, card)
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["reason"]) == (1, "QuotaExceeded")
    assert f"used: {CORE}=350," in explanation["message"]
    # The headroom counts the reservation as the decision does.
    assert [(h["quota"], h["used"], h["freeBefore"], h["freeAfter"]) for h in explanation["headroom"]
            if h["resource"] == CORE] == [(leaf, "350", "50", "-50"), (parent, "350", "250", "150")]


def test_live_quota_shows_a_strict_ledgers_gang_reservation(api: Api, kubeconfig_path: Path,
                                                            live_tree: tuple[str, str], namespace: str) -> None:
    parent, leaf = live_tree
    need = {CORE: Quantity.parse("100"), RATIO: Quantity.parse("100")}
    opened = GangReservation(f"{namespace}/trainers", "admission-7", (leaf, parent), need, 1,
                             expires_at=time.time() + 600)
    stored = shared_ledger.stored_gang(opened, "replica-a", time.time())
    configmap = ledger_configmap(namespace, parent, stored.reservation)
    configmap["data"] = shared_ledger.encode([stored])
    api.core.create_namespaced_config_map(namespace, configmap)

    code, out, err = gpuquota("quota", "--kubeconfig", str(kubeconfig_path), "-n", namespace, "-o", "json")

    assert (code, err) == (0, "")
    document = json.loads(out)
    [gang] = document["gangs"]
    assert {k: gang[k] for k in ("gang", "quota", "minMembers", "stored", "need", "reserved", "state")} == {
        "gang": f"{namespace}/trainers", "quota": leaf, "minMembers": 1, "stored": 0,
        "need": {CORE: "100", RATIO: "100"}, "reserved": {CORE: "100", RATIO: "100"}, "state": "reserved"}
    # What the gang's reservation holds is in its quotas' RESERVED too.
    leaf_core = next(q for q in document["quotas"] if q["name"] == leaf)["resources"][0]
    assert (leaf_core["used"], leaf_core["reserved"], leaf_core["free"]) == ("250", "100", "50")


def test_live_explain_gives_the_apiservers_refusal(api: Api, kubeconfig_path: Path, live_tree: tuple[str, str],
                                                   namespace: str, tmp_path: Path) -> None:
    _, leaf = live_tree
    pod = whole_card_pod("big", leaf, cards=2)  # 200 more where 150 is left
    pod["metadata"]["namespace"] = namespace
    (tmp_path / "pod.json").write_text(json.dumps(pod))

    code, out, err = gpuquota("explain", "-f", str(tmp_path / "pod.json"), "--kubeconfig", str(kubeconfig_path),
                              "-o", "json")

    assert (code, err) == (1, "")
    explanation = json.loads(out)["explanations"][0]
    with pytest.raises(ApiException) as refused:
        api.core.create_namespaced_pod(namespace, pod)
    assert refused.value.status == 403
    served_message = json.loads(refused.value.body)["message"]
    assert served_message.endswith(f"denied the request: {explanation['message']}")
    assert explanation["message"].startswith(f"exceeded quota: {namespace}/{leaf}, requested: {CORE}=200")

    fits = whole_card_pod("small", leaf, cards=1)
    fits["metadata"]["namespace"] = namespace
    (tmp_path / "small.json").write_text(json.dumps(fits))
    code, _, _ = gpuquota("explain", "-f", str(tmp_path / "small.json"), "--kubeconfig", str(kubeconfig_path))
    assert code == 0
    created = api.core.create_namespaced_pod(namespace, fits)
    assert created.metadata.name == "small"


def test_live_quota_takes_kubectl_names_selectors_and_no_headers(kubeconfig_path: Path, live_tree: tuple[str, str],
                                                                  namespace: str) -> None:
    parent, leaf = live_tree
    live = ("quota", "--kubeconfig", str(kubeconfig_path), "-n", namespace)

    assert gpuquota(*live, "-o", "name", "-l", PARENT_LABEL) == (
        0, f"elasticquota.scheduling.sigs.k8s.io/{leaf}\n", "")
    code, out, _ = gpuquota(*live, "--no-headers", "-l", f"{IS_PARENT_LABEL}=true")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines() if not line.startswith(" ")] == [parent]
    # The leaf's row, with its parent above it: the table keeps a selection's ancestors.
    code, out, _ = gpuquota(*live, "--no-headers", "-l", f"{PARENT_LABEL}={parent}")
    assert [line.split()[0] for line in out.splitlines() if not line.startswith("    ")] == [parent, leaf]
