"""What is remembered per pod shape stays bounded however many shapes a cluster has: the eviction
rule every per-shape cache shares (gpuquota_core.memo)."""

from __future__ import annotations

from gpuquota_core.memo import BoundedMemo


def test_an_answer_is_given_back_for_the_key_it_was_stored_under() -> None:
    memo: BoundedMemo[str] = BoundedMemo(size=3)
    assert memo.get("a") is None
    assert memo.remember("a", "first") == "first"
    assert memo.get("a") == "first"


def test_a_full_memo_is_emptied_before_it_takes_the_next_entry() -> None:
    memo: BoundedMemo[int] = BoundedMemo(size=3)
    for number in range(3):
        memo.remember(number, number)
    assert [memo.get(number) for number in range(3)] == [0, 1, 2]
    memo.remember(3, 3)
    assert [memo.get(number) for number in range(4)] == [None, None, None, 3]
