"""A scripted Kubernetes list/watch endpoint for the list/watch loop's offline tests (not a test module).

``sync_kind`` calls a lister with the list and watch arguments of the Kubernetes client and reads
the raw response; this answers from a script instead, records each call, and stops the loop when
the script runs out.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import orjson


class Response:
    """A raw (``_preload_content=False``) response: ``data`` for a list, ``stream`` for a watch."""

    def __init__(self, body: bytes) -> None:
        self.data = body

    def stream(self, _size: int) -> Iterator[bytes]:
        # Split mid-line on purpose: events may arrive in any chunking.
        yield self.data[:7]
        yield self.data[7:]

    def release_conn(self) -> None:
        pass


class ScriptedApi:
    """Answers lists and watches from a script; each entry is bytes, or an exception to raise.

    ``calls`` records each call: ``list``, ``list+<continue token>`` or ``watch@<resourceVersion>``.
    """

    def __init__(self, script: list[Any], stop: threading.Event) -> None:
        self.script = script
        self.stop = stop
        self.calls: list[str] = []

    def __call__(self, **kwargs: Any) -> Response:
        if kwargs.get("watch"):
            self.calls.append(f"watch@{kwargs['resource_version']}")
        else:
            self.calls.append(f"list+{kwargs['_continue']}" if kwargs.get("_continue") else "list")
        if not self.script:
            self.stop.set()
            raise ConnectionError("script finished")
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return Response(step)


def listing(version: str, *items: dict[str, Any], more: str = "") -> bytes:
    """A list response at ``version``; ``more`` is the continue token of a further page."""
    metadata = {"resourceVersion": version, **({"continue": more} if more else {})}
    return orjson.dumps({"metadata": metadata, "items": list(items)})


def events(*pairs: tuple[str, dict[str, Any]]) -> bytes:
    """A watch stream: one JSON event a line, ``(type, object)`` each."""
    return b"\n".join(orjson.dumps({"type": kind, "object": obj}) for kind, obj in pairs) + b"\n"
