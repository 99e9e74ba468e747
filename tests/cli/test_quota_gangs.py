"""``gpuquota quota`` shows gangs: each gang with a member stored or a live reservation, its minimum,
its stored members, its need, the rest of the minimum and what a reservation holds for it.

Files hold no reservations, so offline RESERVED is unknown (``-``, null) and a partly stored gang
is ``partial``; live, strict accounting's ledger entries (``~gang/<namespace>/<name>``, read back
through ``shared_ledger.encode``/``decode`` as the ConfigMap holds them) say what is held now.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from cli.main import cli
from gpuquota_core import shared_ledger
from gpuquota_core.ledger import GangReservation, Reservation
from gpuquota_core.quantity import Quantity
from gpuquota_core.quota_objects import quota_from_object
from gpuquota_core.quota_tree import QuotaTree
from gpuquota_core.quota_view import build_view, pod_groups_of

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
GANG_NAME, GANG_MIN = "gang.scheduling.koordinator.sh/name", "gang.scheduling.koordinator.sh/min-available"
QUOTA = {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
         "metadata": {"name": "train", "namespace": "team-train"},
         "spec": {"max": {CORE: "1000", RATIO: "1000"}}}


def member(name: str, gang: str, minimum: int, **labels: str) -> dict[str, Any]:
    annotations = {GANG_NAME: gang, GANG_MIN: str(minimum)} if gang else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-train", "uid": f"uid-{name}",
                         "labels": {"quota.scheduling.koordinator.sh/name": "train", **labels},
                         "annotations": annotations},
            "spec": {"containers": [{"name": "w", "resources": {"limits": {CORE: "100", RATIO: "100"}}}]},
            "status": {"phase": "Running"}}


def quota_command(tmp_path: Path, objects: list[dict[str, Any]], *args: str) -> str:
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(objects))
    result = CliRunner().invoke(cli, ["quota", "-f", str(tmp_path / "cluster.yaml"), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_files_show_stored_members_and_the_rest_of_the_minimum_with_reserved_unknown(tmp_path: Path) -> None:
    partial = [member(f"a-{index}", "gang-a", 8) for index in range(5)]
    complete = [member(f"b-{index}", "gang-b", 2) for index in range(2)]
    out = quota_command(tmp_path, [QUOTA, *partial, *complete])
    assert out.split("\n\n", 1)[1].splitlines() == [
        "GANG                QUOTA   MIN   STORED   NEED                                REST"
        "                                RESERVED   STATE",
        "team-train/gang-a   train   8     5        gpu-core=800,gpu-memory-ratio=800   "
        "gpu-core=300,gpu-memory-ratio=300   -          partial",
        "team-train/gang-b   train   2     2        gpu-core=200,gpu-memory-ratio=200   0"
        "                                   -          complete"]
    document = json.loads(quota_command(tmp_path, [QUOTA, *partial, *complete], "-o", "json"))
    assert document["gangs"][0] == {
        "gang": "team-train/gang-a", "source": "annotations", "quota": "train", "minMembers": 8, "stored": 5,
        "asked": {CORE: "500", RATIO: "500"}, "need": {CORE: "800", RATIO: "800"},
        "rest": {CORE: "300", RATIO: "300"}, "reserved": None, "state": "partial", "expiresAt": None}
    assert [gang["state"] for gang in document["gangs"]] == ["partial", "complete"]
    # --no-headers: the rows only; and no gang at all: no gang table.
    assert quota_command(tmp_path, [QUOTA, *complete], "--no-headers").splitlines()[-1].startswith(
        "team-train/gang-b   train   2     2")
    assert "GANG" not in quota_command(tmp_path, [QUOTA, member("plain", "", 0)])


def test_a_pod_groups_members_read_its_minimum_and_min_resources(tmp_path: Path) -> None:
    group = {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "pg", "namespace": "team-train"},
             "spec": {"minMember": 3, "minResources": {"nvidia.com/gpu": "4"}}}
    members = [member(f"pg-{index}", "", 0, **{"pod-group.scheduling.sigs.k8s.io": "pg"}) for index in range(2)]
    document = json.loads(quota_command(tmp_path, [QUOTA, group, *members], "-o", "json"))
    [gang] = document["gangs"]
    assert (gang["gang"], gang["source"], gang["minMembers"], gang["stored"], gang["need"], gang["rest"]) == (
        "team-train/pg", "PodGroup", 3, 2, {CORE: "400", RATIO: "400"}, {CORE: "200", RATIO: "200"})
    # Without its PodGroup the label names no gang koord-scheduler knows.
    assert json.loads(quota_command(tmp_path, [QUOTA, *members], "-o", "json"))["gangs"] == []


def test_a_live_strict_ledger_says_what_the_gangs_reservation_holds() -> None:
    tree = QuotaTree.build([quota_from_object(QUOTA)])
    stored = [member(f"a-{index}", "gang-a", 8) for index in range(2)]
    need = {CORE: Quantity.parse("800"), RATIO: Quantity.parse("800")}
    opened = GangReservation("team-train/gang-a", "review-0", ("train",), need, 8, expires_at=2000.0)
    # One member admitted and not yet seen by the watch draws from the reservation.
    drawn = Reservation("team-train/a-2", "review-2", ("train",), {CORE: Quantity.parse("100"),
                                                                     RATIO: Quantity.parse("100")},
                        2000.0, gang="team-train/gang-a")
    entries = shared_ledger.decode(shared_ledger.encode([
        shared_ledger.stored_gang(opened, "replica-0", 1000.0),
        shared_ledger.StoredReservation(drawn, "replica-0", 1000.0)]))
    view = build_view(tree, stored, reservations=entries, ledger_trees={"train"}, now=1500.0,
                      pod_groups=pod_groups_of([]))
    [gang] = view.gangs
    assert (gang.stored, gang.state, gang.expires_at) == (2, "reserved", 2000.0)
    # The need less the two stored and the one reserved member: five cards held for the other five.
    assert gang.reserved == {CORE: Quantity.parse("500"), RATIO: Quantity.parse("500")}
    assert gang.rest == {CORE: Quantity.parse("600"), RATIO: Quantity.parse("600")}
    # RESERVED of the quota counts the member's reservation and what the gang's still holds.
    [core] = [row for row in view.quotas[0].resources if row.resource == CORE]
    assert (core.used, core.reserved) == (Quantity.parse("200"), Quantity.parse("600"))
    # Expired, it holds nothing, and the gang is partial again.
    later = build_view(tree, stored, reservations=entries, ledger_trees={"train"}, now=2500.0)
    assert [(g.state, g.reserved) for g in later.gangs] == [("partial", {})]
    # A tree whose ledger object was not read: unknown.
    unread = build_view(tree, stored, reservations=entries, ledger_trees=set(), now=1500.0)
    assert [g.reserved for g in unread.gangs] == [None]
