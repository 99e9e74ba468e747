"""Forged AdmissionReviews from a caller that is not the API server cannot fill a quota.

Anyone who reaches the port can post reviews with fresh UIDs; every admitted one would reserve room
until it expires. The per-caller bound (``--max-reservations-per-caller``) caps what one TLS peer
holds unconfirmed. The flood comes from 127.0.0.2, the "API server" from 127.0.0.1.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from reviews import pod, review
from webhookproc import WebhookProcess, post_review, served_from_state

RATIO = "koordinator.sh/gpu-memory-ratio"
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
BOUND = 5
STATE = """apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team-a, namespace: team}
spec: {max: {koordinator.sh/gpu-memory-ratio: "1000"}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    with served_from_state(tmp_path_factory.mktemp("flood"), STATE, "--max-reservations-per-caller",
                           str(BOUND)) as process:
        yield process


def ask(server: WebhookProcess, source: str, name: str) -> dict[str, Any]:
    document = review(pod(name, "team", labels={QUOTA_LABEL: "team-a"}, resources={RATIO: "100"}),
                      uid=str(uuid.uuid4()))
    return post_review(server, "/validate-pods", document, source=source)


def test_fake_uid_flood_is_capped_and_the_quota_stays_usable(server: WebhookProcess) -> None:
    flood = [ask(server, "127.0.0.2", f"fake-{i}") for i in range(40)]
    assert [a["allowed"] for a in flood].count(True) == BOUND
    refused = [a for a in flood if not a["allowed"]]
    assert len(refused) == 40 - BOUND
    status = refused[0]["status"]
    assert isinstance(status, dict) and status["code"] == 429 and status["reason"] == "TooManyReservations"
    assert f"caller 127.0.0.2 already holds {BOUND} quota reservations" in str(status["message"])
    # 1000 of room, 500 held by the flood: real pods still get the other 500, then the quota speaks.
    real = [ask(server, "127.0.0.1", f"real-{i}") for i in range(BOUND)]
    assert all(a["allowed"] for a in real)
    over = ask(server, "127.0.0.1", "one-too-many")
    assert not over["allowed"] and str(over["status"]["message"]).startswith(
        "exceeded quota: team/team-a, ")
