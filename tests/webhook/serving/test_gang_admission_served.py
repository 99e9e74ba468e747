"""Gang members through a real ``gpuquota serve`` over TLS (offline example cluster): the refusal a
user sees for a gang that does not fit, and the gang metrics a scrape shows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from reviews import pod, review
from webhookproc import REPO_ROOT, WebhookProcess, post_review

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"


def member(name: str, gang: str, minimum: int) -> dict[str, Any]:
    document = pod(name, "team-vision", resources={CORE: "100", RATIO: "100"})
    document["metadata"]["annotations"] = {"gang.scheduling.koordinator.sh/name": gang,
                                           "gang.scheduling.koordinator.sh/min-available": str(minimum)}
    return document


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    # A long TTL: offline, no watch ever confirms a reservation, and these must still be held when scraped.
    state = str(REPO_ROOT / "examples" / "cluster")
    process = WebhookProcess(tmp_path_factory.mktemp("gangs"),
                             serve_args=["--state", state, "--reservation-ttl", "3600"])
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_a_gang_is_admitted_against_its_whole_minimum_and_the_scrape_counts_it(server: WebhookProcess) -> None:
    # examples/cluster: team-vision holds 250 of 800 (550 free). gang-a's minimum of four cards fits:
    # its first member opens the reservation, the second draws from it.
    assert post_review(server, "/validate-pods", review(member("gang-a-0", "gang-a", 4)))["allowed"] is True
    assert post_review(server, "/validate-pods", review(member("gang-a-1", "gang-a", 4)))["allowed"] is True
    # 150 are left beside gang-a's 400: gang-b's minimum of four does not fit, and nothing of it is admitted.
    refused = post_review(server, "/validate-pods", review(member("gang-b-0", "gang-b", 4)))
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    assert refused["status"]["reason"] == "QuotaExceeded"
    assert refused["status"]["message"] == (
        f"gang team-vision/gang-b needs {CORE}=400,{RATIO}=400 (4 × {CORE}=100,{RATIO}=100) at "
        f"team-vision/team-vision; {CORE}=150,{RATIO}=150 free: pod team-vision/gang-b-0 is a member of gang "
        f"team-vision/gang-b (minimum 4 members) and no member is admitted until the whole minimum fits")
    # A plain pod sees only what the gang leaves: one card and a half.
    plain = pod("plain-0", "team-vision", resources={CORE: "200", RATIO: "200"})
    assert post_review(server, "/validate-pods", review(plain))["allowed"] is False
    status, body = server.get("/metrics")
    assert status == 200
    samples = [sample for family in text_string_to_metric_families(body.decode()) for sample in family.samples]
    counted = {sample.labels["result"]: sample.value for sample in samples
               if sample.name == "gpuquota_gang_admissions_total"}
    assert counted == {"opened": 1.0, "drew": 1.0, "refused": 1.0}
    assert [sample.value for sample in samples if sample.name == "gpuquota_gang_reservations"] == [1.0]
