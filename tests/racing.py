"""Many threads making calls at the same moment: the shape of every 'exactly the room' test."""

from __future__ import annotations

import threading
from collections.abc import Callable


def race(clients: int, calls: int, attempt: Callable[[int, int], bool]) -> list[bool]:
    """Start ``clients`` threads together; each makes ``calls`` attempts (client, call) in turn.

    Returns every attempt's outcome (in no particular order).
    """
    results: list[bool] = []
    guard = threading.Lock()
    start = threading.Barrier(clients)

    def client(index: int) -> None:
        start.wait()
        for call in range(calls):
            outcome = attempt(index, call)
            with guard:
                results.append(outcome)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
