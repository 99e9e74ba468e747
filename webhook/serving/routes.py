"""The admission paths over HTTP: a review in, one answer out, written by whichever way the worker serves it.

An :class:`AdmissionEndpoint` reads the body (capped, :mod:`webhook.admission.body`), decodes it
(:mod:`webhook.admission.review`), hands the typed request to one method of
:class:`~webhook.admission.decisions.AdmissionHandlers`, encodes what comes back and records it
(:mod:`webhook.admission.observability`). What goes on the wire is an :class:`Answer`: its status
line, its headers and its body are composed here once, and both writers send exactly them:
:class:`AdmissionRoutes` through WSGI, and the gunicorn worker itself as raw bytes for the reviews
it answers without WSGI (webhook.serving.gunicorn_worker), which adds only gunicorn's own
Server, Date and Connection headers, as gunicorn does for a WSGI answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from gpuquota_core.enforcement import BAD_REQUEST
from webhook.admission.body import BodyTooLarge, read_body
from webhook.admission.decisions import Outcome
from webhook.admission.observability import record_decision, record_failure, record_rejected
from webhook.admission.review import AdmissionRequest, BadRequest, decode_review, encode_review, status_body
from webhook.admission.status import INTERNAL_ERROR, METHOD_NOT_ALLOWED, REQUEST_ENTITY_TOO_LARGE, status_of

JSON = "application/json"
# Status code -> "200 OK", the form of a status line after the HTTP version and of WSGI's status.
_STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in HTTPStatus}

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer on an admission path: the status and the headers that belong to its body."""

    status: int
    body: bytes
    # The methods a 405 names; empty for every other answer.
    allow: str = ""

    @property
    def status_line(self) -> str:
        return _STATUS_LINES[self.status]

    @property
    def headers(self) -> list[tuple[str, str]]:
        allow = [("Allow", self.allow)] if self.allow else []
        return [("Content-Type", JSON), *allow, ("Content-Length", str(len(self.body)))]


@dataclass(frozen=True, slots=True)
class AdmissionEndpoint:
    """One admission route: WSGI environ in, its :class:`Answer` out, counted and logged."""

    path: str
    handle: Callable[[AdmissionRequest, str], Outcome]
    max_body_bytes: int
    log: logging.Logger

    def serve(self, environ: Mapping[str, Any]) -> Answer:
        endpoint, log = self.path, self.log
        started = time.perf_counter()
        try:
            body = read_body(environ, self.max_body_bytes)
            req = decode_review(body)
        except BodyTooLarge as error:
            return _refuse(log, endpoint, REQUEST_ENTITY_TOO_LARGE, str(error), started)
        except BadRequest as error:
            return _refuse(log, endpoint, BAD_REQUEST, error.reason, started)
        try:
            # The TLS peer's address: who really sent the review (its userInfo is whatever the
            # sender wrote); the per-caller reservation bound counts by it.
            outcome = self.handle(req, environ.get("REMOTE_ADDR") or "")
        except Exception:
            # Reaches the API server as a webhook failure (its failurePolicy decides); the
            # traceback goes to our log, not to the user.
            record_failure(log, endpoint, req, time.perf_counter() - started)
            return Answer(status_of(INTERNAL_ERROR),
                          status_body(INTERNAL_ERROR, "internal error in the gpuquota webhook"))
        payload = encode_review(outcome.response)
        record_decision(log, endpoint, req, outcome, time.perf_counter() - started)
        return Answer(200, payload)


def _refuse(log: logging.Logger, endpoint: str, reason: str, message: str, started: float) -> Answer:
    code = status_of(reason)
    record_rejected(log, endpoint, code, message, time.perf_counter() - started)
    return Answer(code, status_body(reason, message))


class AdmissionRoutes:
    """WSGI middleware serving the admission paths itself; every other path goes on to Flask.

    Flask's request context, URL matching and Response objects cost a large share of a call
    (docs/benchmarks.md, "Mechanisms kept"), and admission POSTs are nearly all of this server's traffic. Health,
    readiness and metrics stay Flask routes.
    """

    def __init__(self, endpoints: Mapping[str, AdmissionEndpoint], app: WsgiApp) -> None:
        self.endpoints = dict(endpoints)
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        endpoint = self.endpoints.get(environ.get("PATH_INFO", ""))
        if endpoint is None:
            return self.app(environ, start_response)
        if environ.get("REQUEST_METHOD") == "POST":
            answer = endpoint.serve(environ)
        else:
            answer = Answer(status_of(METHOD_NOT_ALLOWED),
                            status_body(METHOD_NOT_ALLOWED, f"{endpoint.path} accepts only POST"),
                            allow="POST")
        start_response(answer.status_line, answer.headers)
        return [answer.body]
