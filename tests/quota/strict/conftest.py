"""The fixtures of strict accounting's tests: a wall clock the test moves, and the fake API."""

from __future__ import annotations

import pytest
from fakeledger import FakeCore


@pytest.fixture
def clock() -> list[float]:
    return [1_000_000.0]


@pytest.fixture
def core(clock: list[float]) -> FakeCore:
    return FakeCore(clock)
