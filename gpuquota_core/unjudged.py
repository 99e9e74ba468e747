"""Objects the audit and ``convert`` cannot judge, and why: each gets a finding or a note naming the
path at fault, never silence.

Two sorts: a Pod or workload that cannot be read as far as its pod spec (a manifest the API server
would refuse: the audit cannot vouch for it), and an AdmissionReview, which carries a pod but is a
request to the webhook, not an object of the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .audit import TEMPLATE_PATHS, Finding, Severity
from .podspec import mapping_or_empty

CHECK = "object-not-judged"
ADMISSION_REVIEW = ("an AdmissionReview is a request to the webhook, not an object of the cluster; "
                    "`gpuquota explain -f FILE` answers it as the webhook would")
_TYPE_NAMES = {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}


@dataclass(frozen=True)
class Unjudged:
    """``path`` (dotted, from the object's top) and why the object cannot be judged there."""

    path: str
    reason: str
    severity: Severity

    def describe(self) -> str:
        return f"{self.path}: {self.reason}"


def why_unjudged(obj: Mapping[str, Any]) -> Unjudged | None:
    """Why ``obj`` holds a pod that cannot be judged; None for an object that can, or that holds none."""
    kind = obj.get("kind")
    if kind == "AdmissionReview":
        return Unjudged("request.object", ADMISSION_REVIEW, Severity.WARNING)
    if kind == "Pod":
        path: tuple[str, ...] = ("spec",)
    elif isinstance(kind, str) and kind in TEMPLATE_PATHS:
        path = (*TEMPLATE_PATHS[kind], "spec")
    else:
        return None
    current: Any = obj
    for depth, step in enumerate(path, 1):
        current = current.get(step)
        if current is None:
            return Unjudged(".".join(path[:depth]), "is missing", Severity.ERROR)
        if not isinstance(current, Mapping):
            what = _TYPE_NAMES.get(type(current), type(current).__name__)
            return Unjudged(".".join(path[:depth]), f"is a {what}, not a mapping", Severity.ERROR)
    return None


def unjudged_findings(objects: Iterable[Mapping[str, Any]],
                      origin: Callable[[Mapping[str, Any]], str | None] | None = None) -> list[Finding]:
    """A finding for each object :func:`why_unjudged` explains; ``origin`` names the file it came from."""
    findings: list[Finding] = []
    for obj in objects:
        unjudged = why_unjudged(obj)
        if unjudged is None:
            continue
        metadata = mapping_or_empty(obj.get("metadata"))
        file = origin(obj) if origin is not None else None
        where = f"{file}: " if file else ""
        message = (f"{where}{unjudged.describe()}" if unjudged.severity is Severity.WARNING
                   else f"{where}{unjudged.describe()}; the audit cannot judge this object")
        findings.append(Finding(CHECK, unjudged.severity, str(obj.get("kind")), str(metadata.get("namespace") or ""),
                                str(metadata.get("name") or ""), message,
                                {**({"file": file} if file else {}), "path": unjudged.path}))
    return findings
