"""The cyclic garbage collector, paused for the length of one offline command."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """Run the block with the collector off, then restore it.

    ``audit`` and ``migrate plan`` build a few objects per snapshot object (records, findings,
    report dicts) and no reference cycles; with the collector on, its full collections walk all of
    them again and again and find nothing: at 100,000 pods, half a second of writing the report
    alone. Any cycle made meanwhile (the kubernetes client's, in a live audit) is collected when
    the block ends, which for the command line is just before the process exits.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
