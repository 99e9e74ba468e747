"""How far a replica's pod list and watch have got: what strict accounting waits on before deciding."""

from __future__ import annotations

from typing import Any

import pytest

from gpuquota_core import shared_ledger
from webhook.quota.pod_versions import REMEMBER_SECONDS, PodVersions, resource_version


def pod(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "team", "name": name, "resourceVersion": version}}


@pytest.mark.parametrize(("text", "expected"),
                         [("42", 42), ("", 0), ("007", 0), ("abc", 0), (None, 0), ("-3", 0), ("4²", 0)])
def test_only_a_positive_integer_resource_version_is_compared(text: object, expected: int) -> None:
    assert resource_version(text) == expected


def test_a_pod_is_bounded_by_the_version_it_was_first_shown_at_and_a_listed_one_by_the_list() -> None:
    clock = [0.0]
    versions = PodVersions(clock=lambda: clock[0])
    versions.listed("100")
    assert versions.seen_through == 100 and versions.shown_at_most("team/old") == 100
    versions.delivered("ADDED", pod("a", "120"))
    versions.delivered("MODIFIED", pod("a", "130"))  # bound, then scheduled: first shown at 120
    versions.delivered("MODIFIED", pod("old", "135"))  # a listed pod changing is still bounded by the list
    versions.delivered("BOOKMARK", {"metadata": {"resourceVersion": "140"}})
    assert versions.shown_at_most("team/a") == 120 and versions.seen_through == 140
    assert versions.shown_at_most("team/old") == 100


def test_a_pod_deleted_and_created_again_is_bounded_by_the_new_one() -> None:
    versions = PodVersions(clock=lambda: 0.0)
    versions.delivered("ADDED", pod("a", "120"))
    versions.delivered("DELETED", pod("a", "150"))
    versions.delivered("ADDED", pod("a", "160"))
    assert versions.shown_at_most("team/a") == 160


def test_a_forgotten_pod_is_still_bounded_from_above() -> None:
    clock = [0.0]
    versions = PodVersions(clock=lambda: clock[0])
    versions.delivered("ADDED", pod("a", "120"))
    clock[0] += REMEMBER_SECONDS + 1
    versions.delivered("ADDED", pod("b", "200"))  # forgets a
    assert versions.shown_at_most("team/a") == 120 and versions.shown_at_most("team/b") == 200


def test_the_ledger_keeps_how_far_its_readers_must_have_watched() -> None:
    data = shared_ledger.encode([], pods_counted_through=4711)
    assert shared_ledger.pods_counted_through(data) == 4711
    assert shared_ledger.pods_counted_through(shared_ledger.encode([])) == 0
    with pytest.raises(shared_ledger.LedgerFormatError):
        shared_ledger.pods_counted_through({shared_ledger.PODS_COUNTED_THROUGH_KEY: "soon"})
    with pytest.raises(shared_ledger.LedgerFormatError):
        shared_ledger.pods_counted_through({shared_ledger.PODS_COUNTED_THROUGH_KEY: "4²"})
