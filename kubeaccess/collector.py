"""The cyclic garbage collector, paused for the length of a block that builds no reference cycles.

Reading a large snapshot, auditing it and planning its migration each allocate millions of
objects that stay alive to the end and hold no cycles; with the collector on, its full collections
walk all of them again and again and free nothing (see docs/benchmarks.md, "Mechanisms kept").
This is process tuning, so it lives with the CLI's I/O and stays out of the I/O-free core; the CLI
pauses around whole commands (audit, migrate) and ``load_objects`` around parsing. One helper for
all of them, so a nested pause restores the collector exactly once, where the outermost block ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """Run the block with the collector off, then restore it as it was.

    Any cycle made meanwhile (the kubernetes client's, in a live audit) is collected after the block.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
