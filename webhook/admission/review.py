"""The AdmissionReview ``admission.k8s.io/v1`` codec: the only module that knows its JSON shape.

Handlers receive a typed :class:`AdmissionRequest` and return an :class:`AdmissionResponse` built
with :func:`allowed`, :func:`patched` or :func:`denied`. The protocol rules live here so no
handler can forget them: ``response.uid`` always echoes the request, a patch is always RFC 6902
computed from the original and the changed object (never hand-written operations, so ``~1``
escaping and idempotence are in one place), base64-encoded with ``patchType: JSONPatch``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpuquota_core.enforcement import FORBIDDEN
from gpuquota_core.jsonpatch import Operation
from webhook.admission.status import status_of

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})


class BadRequest(ValueError):
    """A body that is not an AdmissionReview v1 request; answered with HTTP 400 and the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GroupVersionKind:
    group: str
    version: str
    kind: str


@dataclass(frozen=True, slots=True)
class GroupVersionResource:
    group: str
    version: str
    resource: str


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    sub_resource: str
    operation: str
    namespace: str
    name: str
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    dry_run: bool

    def is_core(self, kind: str) -> bool:
        """True for the core/v1 object itself (``Pod``), not one of its subresources."""
        return self.kind.group == "" and self.kind.kind == kind and self.sub_resource == ""

    def is_kind(self, group: str, kind: str) -> bool:
        return self.kind.group == group and self.kind.kind == kind and self.sub_resource == ""


@dataclass(frozen=True, slots=True)
class AdmissionResponse:
    uid: str
    allowed: bool
    code: int = 200
    message: str = ""
    reason: str = ""
    patch: list[Operation] | None = None
    warnings: tuple[str, ...] = ()
    # What the log line and the metrics call this decision ("allowed", "patched", "denied").
    decision: str = field(default="allowed", compare=False)

    def to_dict(self) -> dict[str, Any]:
        response: dict[str, Any] = {"uid": self.uid, "allowed": self.allowed}
        if not self.allowed:
            response["status"] = {"status": "Failure", "code": self.code, "reason": self.reason,
                                  "message": self.message}
        if self.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(self.patch)).decode("ascii")
        if self.warnings:
            response["warnings"] = list(self.warnings)
        return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def encode_review(response: AdmissionResponse) -> bytes:
    return orjson.dumps(response.to_dict())


# ---------------------------------------------------------------------------------------------
# Decoding. Every check names the field, because the reason is all an operator will see in the
# API server's log when a webhook call fails.


def _str(container: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = container.get(key)
    if value is None:
        if required:
            raise BadRequest(f"{where}.{key} is required")
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{where}.{key} must be a string, got {_type_name(value)}")
    if required and not value:
        raise BadRequest(f"{where}.{key} must not be empty")
    return value


def _object(container: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = container.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest(f"{where}.{key} must be an object, got {_type_name(value)}")
    return value


def _type_name(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(value), type(value).__name__)


def decode_review(body: bytes) -> AdmissionRequest:
    """Parse a request body into an :class:`AdmissionRequest`; :class:`BadRequest` says why not."""
    if not body:
        raise BadRequest("empty request body: expected an AdmissionReview")
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"request body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise BadRequest(f"expected an AdmissionReview object, got a JSON {_type_name(document)}")
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if kind != KIND:
        raise BadRequest(f"expected kind {KIND}, got {kind!r}")
    if api_version != API_VERSION:
        raise BadRequest(f"expected apiVersion {API_VERSION}, got {api_version!r}")
    request = document.get("request")
    if not isinstance(request, dict):
        raise BadRequest("AdmissionReview has no request object")
    where = "request"
    uid = _str(request, "uid", where, required=True)
    operation = _str(request, "operation", where, required=True)
    if operation not in OPERATIONS:
        raise BadRequest(f"request.operation must be one of {', '.join(sorted(OPERATIONS))}, got {operation!r}")
    raw_kind = _object(request, "kind", where)
    if raw_kind is None:
        raise BadRequest("request.kind is required")
    gvk = GroupVersionKind(_str(raw_kind, "group", "request.kind"), _str(raw_kind, "version", "request.kind"),
                           _str(raw_kind, "kind", "request.kind", required=True))
    raw_resource = _object(request, "resource", where) or {}
    gvr = GroupVersionResource(_str(raw_resource, "group", "request.resource"),
                               _str(raw_resource, "version", "request.resource"),
                               _str(raw_resource, "resource", "request.resource"))
    dry_run = request.get("dryRun")
    if dry_run is not None and not isinstance(dry_run, bool):
        raise BadRequest(f"request.dryRun must be a boolean, got {_type_name(dry_run)}")
    return AdmissionRequest(
        uid=uid,
        kind=gvk,
        resource=gvr,
        sub_resource=_str(request, "subResource", where),
        operation=operation,
        namespace=_str(request, "namespace", where),
        name=_str(request, "name", where),
        object=_object(request, "object", where),
        old_object=_object(request, "oldObject", where),
        dry_run=bool(dry_run),
    )


# ---------------------------------------------------------------------------------------------
# Response helpers.


def allowed(request: AdmissionRequest, *, warnings: Iterable[str] = ()) -> AdmissionResponse:
    return AdmissionResponse(request.uid, True, warnings=tuple(warnings), decision="allowed")


def patched(request: AdmissionRequest, operations: list[Operation], *,
            warnings: Iterable[str] = ()) -> AdmissionResponse:
    """Allow with a JSONPatch (a plain allow when there is nothing to change)."""
    if not operations:
        return allowed(request, warnings=warnings)
    return AdmissionResponse(request.uid, True, patch=operations, warnings=tuple(warnings), decision="patched")


def denied(request: AdmissionRequest, message: str, *, reason: str = FORBIDDEN,
           warnings: Iterable[str] = ()) -> AdmissionResponse:
    """Refuse; the API server shows the user the status_of ``reason`` as the HTTP status."""
    return AdmissionResponse(request.uid, False, code=status_of(reason), message=message, reason=reason,
                             warnings=tuple(warnings), decision="denied")


def status_body(reason: str, message: str) -> bytes:
    """A ``metav1.Status`` for HTTP-level failures (an unreadable or oversized body, a server error):
    what the API server logs. Its code is the HTTP status the answer goes out with."""
    return orjson.dumps({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": status_of(reason),
                         "reason": reason, "message": message})
