"""Quota decisions as users meet them: pods created through the real apiserver and the webhook."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from clusterhelpers import (
    DENIED_BY,
    PARENT_LABEL,
    QUOTA_LABEL,
    RATIO,
    create_quota,
    refusal,
    wait_until_enforced,
    whole_card_pod,
)
from controlplane import Api
from kubernetes.client.exceptions import ApiException
from webhookproc import WebhookProcess

IS_PARENT_LABEL = "quota.scheduling.koordinator.sh/is-parent"


@dataclass(frozen=True)
class Tree:
    namespace: str
    parent: str
    team: str


@pytest.fixture
def tree(webhook_server: WebhookProcess, api: Api, namespace: str) -> Tree:
    """parent (max 4 cards) -> team (max 3 cards), written in gpu-memory-ratio like Koordinator's docs.

    Quota names are one namespace-independent tree in Koordinator, so they carry the namespace.
    """
    names = Tree(namespace, f"parent-{namespace}", f"team-{namespace}")
    create_quota(api, namespace, names.parent, {RATIO: "400"}, labels={IS_PARENT_LABEL: "true"})
    create_quota(api, namespace, names.team, {RATIO: "300"}, labels={PARENT_LABEL: names.parent})
    wait_until_enforced(api, namespace, names.team, 4)
    return names


def test_ratio_quota_limits_whole_card_pods(api: Api, tree: Tree) -> None:
    api.core.create_namespaced_pod(tree.namespace, whole_card_pod("first", tree.team, 2))

    status_message = refusal(api, tree.namespace, whole_card_pod("second", tree.team, 2))

    assert status_message == (403, DENIED_BY + (
        f"exceeded quota: {tree.namespace}/{tree.team}, requested: {RATIO}=200, used: {RATIO}=200, "
        f"limited: {RATIO}=300"))
    api.core.create_namespaced_pod(tree.namespace, whole_card_pod("third", tree.team, 1))


def test_dry_run_does_not_spend_quota(api: Api, tree: Tree) -> None:
    for _ in range(3):
        assert refusal(api, tree.namespace, whole_card_pod("preview", tree.team, 3), dry_run="All") is None

    api.core.create_namespaced_pod(tree.namespace, whole_card_pod("real", tree.team, 3))

    assert refusal(api, tree.namespace, whole_card_pod("one-more", tree.team, 1)) is not None


def test_label_naming_a_missing_quota_is_refused(api: Api, tree: Tree) -> None:
    status, message = refusal(api, tree.namespace, whole_card_pod("lost", "no-such-quota", 1)) or (0, "")

    assert status == 403
    assert message.startswith(DENIED_BY)
    assert "no-such-quota" in message


def test_pods_cannot_be_bound_to_a_parent_quota(api: Api, tree: Tree) -> None:
    status, message = refusal(api, tree.namespace, whole_card_pod("on-parent", tree.parent, 1)) or (0, "")

    assert status == 403
    assert "parent" in message.removeprefix(DENIED_BY)


def sibling_team(api: Api, tree: Tree) -> str:
    """A second leaf (max 3 cards) under the same parent (max 4 cards)."""
    sibling = f"other-{tree.namespace}"
    create_quota(api, tree.namespace, sibling, {RATIO: "300"}, labels={PARENT_LABEL: tree.parent})
    wait_until_enforced(api, tree.namespace, sibling, 4)
    return sibling


def test_ancestor_quota_refuses_what_the_leaf_would_allow(api: Api, tree: Tree) -> None:
    sibling = sibling_team(api, tree)
    api.core.create_namespaced_pod(tree.namespace, whole_card_pod("team-pod", tree.team, 3))

    # 2 cards fit the sibling (max 3) but not the parent (3 of 4 used).
    status_message = refusal(api, tree.namespace, whole_card_pod("sibling-pod", sibling, 2))

    assert status_message == (403, DENIED_BY + (
        f"exceeded quota: {tree.namespace}/{tree.parent}, requested: {RATIO}=200, used: {RATIO}=300, "
        f"limited: {RATIO}=400 (ancestor of quota {sibling})"))


def test_label_change_into_a_full_quota_is_refused(api: Api, tree: Tree) -> None:
    sibling = sibling_team(api, tree)
    api.core.create_namespaced_pod(tree.namespace, whole_card_pod("fills-team", tree.team, 3))
    api.core.create_namespaced_pod(tree.namespace, whole_card_pod("mover", sibling, 1))

    # Moving within one parent adds nothing to the parent, but the target leaf is full.
    with pytest.raises(ApiException) as refused:
        api.core.patch_namespaced_pod("mover", tree.namespace, {"metadata": {"labels": {QUOTA_LABEL: tree.team}}})

    assert refused.value.status == 403
    assert json.loads(refused.value.body)["message"] == DENIED_BY + (
        f"exceeded quota: {tree.namespace}/{tree.team}, requested: {RATIO}=100, used: {RATIO}=300, "
        f"limited: {RATIO}=300")
    stored = api.core.read_namespaced_pod("mover", tree.namespace)
    assert stored.metadata.labels[QUOTA_LABEL] == sibling


def test_legacy_whole_card_quota_limits_canonical_pods(webhook_server: WebhookProcess, api: Api,
                                                       namespace: str) -> None:
    legacy = f"legacy-{namespace}"
    create_quota(api, namespace, legacy, {"nvidia.com/gpu": "1"})
    wait_until_enforced(api, namespace, legacy, 2)

    api.core.create_namespaced_pod(namespace, whole_card_pod("fits", legacy, 1))
    status_message = refusal(api, namespace, whole_card_pod("over", legacy, 1))

    assert status_message is not None
    status, message = status_message
    assert status == 403
    assert message.startswith(DENIED_BY + f"exceeded quota: {namespace}/{legacy}, requested: ")
    assert f"limited: {RATIO}=100" in message or "limited: koordinator.sh/gpu-core=100" in message


def test_a_taken_quota_name_is_refused_as_koordinator_refuses_it(
        api: Api, tree: Tree) -> None:
    # Quota names are cluster-wide (pkg/webhook/elasticquota/quota_topology.go): a second one of a name, in another
    # namespace, would make which limit applies depend on the order the webhook sees them.
    other = f"other-{tree.namespace}"
    api.core.create_namespace({"metadata": {"name": other}})
    try:
        with pytest.raises(ApiException) as refused:
            create_quota(api, other, tree.team, {RATIO: "300"})
        assert refused.value.status == 422
        message = json.loads(refused.value.body)["message"]
        assert (f"ElasticQuota name {tree.team} is already used by {tree.namespace}/{tree.team}: quota names are "
                "cluster-wide in Koordinator; choose another name") in message
    finally:
        api.core.delete_namespace(other)
