"""The WSGI application a worker serves: the admission routes in front of Flask, which keeps
health, readiness, metrics and the JSON answers for unknown paths and methods.

The admission decisions are :class:`~webhook.admission.decisions.AdmissionHandlers`'; here they
are wired to their paths, to the quota decider, the node view and the event reporter the server
built, and to the probes that report on the same decider.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import MethodNotAllowed, NotFound

from gpuquota_core.conversion import ConversionConfig
from gpuquota_core.enforcement import NOT_READY, QUOTA_SERVICE_DOWN
from gpuquota_core.placement import NodeView
from webhook.admission.body import MAX_BODY_BYTES
from webhook.admission.config_source import ConfigSource
from webhook.admission.decisions import AdmissionHandlers
from webhook.admission.observability import LOGGER_NAME
from webhook.admission.quota_port import EventReporter, QuotaDecider
from webhook.admission.review import status_body
from webhook.admission.status import METHOD_NOT_ALLOWED, NOT_FOUND, status_of
from webhook.serving import metrics
from webhook.serving.routes import JSON, AdmissionEndpoint, AdmissionRoutes

# Where create_app keeps its admission routes, for the worker that answers reviews itself.
ROUTES_EXTENSION = "gpuquota.admission_routes"


def admission_endpoints(app: object) -> Mapping[str, AdmissionEndpoint]:
    """The admission endpoints of an app made by :func:`create_app`, by path; empty for any other app."""
    extensions = getattr(app, "extensions", None)
    routes = extensions.get(ROUTES_EXTENSION) if isinstance(extensions, dict) else None
    return routes.endpoints if isinstance(routes, AdmissionRoutes) else {}


def create_app(*, config: ConversionConfig, quota: QuotaDecider, max_body_bytes: int = MAX_BODY_BYTES,
               logger: logging.Logger | None = None, config_path: Path | None = None,
               nodes: Callable[[], NodeView | None] = lambda: None,
               events: EventReporter | None = None) -> Flask:
    """A WSGI app serving the admission endpoints, health, readiness and metrics.

    ``config`` is in force from the start; with ``config_path`` the file is re-read when it
    changes (checked at most once a second) and a version that does not load is logged and ignored.
    ``nodes`` gives the current node view for the rewrite decision (None: not listed yet).
    """
    app = Flask("gpuquota-webhook")
    log = logger or logging.getLogger(LOGGER_NAME)
    handlers = AdmissionHandlers(ConfigSource(config, config_path, logger=log), quota, nodes, events)

    endpoints = {
        path: AdmissionEndpoint(path, handle, max_body_bytes, log)
        for path, handle in (("/mutate-pods", handlers.mutate_pod), ("/validate-pods", handlers.validate_pod),
                             ("/validate-elasticquotas", handlers.validate_elasticquota))
    }
    routes = AdmissionRoutes(endpoints, app.wsgi_app)
    app.wsgi_app = routes  # type: ignore[method-assign]
    app.extensions[ROUTES_EXTENSION] = routes

    @app.get("/healthz")
    def healthz() -> Response:
        # Liveness: the worker answers, and so does the quota service behind it. Independent of
        # the quota state, so a slow first sync makes the pod unready, not restarted; but a dead
        # service fails it, so a server that cannot heal is restarted.
        alive, reason = quota.alive()
        if alive:
            return Response(b'{"status":"ok"}', status=200, mimetype=JSON)
        return Response(orjson.dumps({"status": "unavailable", "reason": reason}),
                        status=status_of(QUOTA_SERVICE_DOWN), mimetype=JSON)

    @app.get("/readyz")
    def readyz() -> Response:
        ready, reason = quota.ready()
        body = orjson.dumps({"status": "ok" if ready else "unavailable", "reason": reason})
        return Response(body, status=200 if ready else status_of(NOT_READY), mimetype=JSON)

    @app.get("/metrics")
    def metrics_view() -> Response:
        text, content_type = metrics.render(quota)
        return Response(text, status=200, content_type=content_type)

    # What the API server answers for a path or method it does not serve: a JSON Status, so that a
    # client (or a misconfigured webhook path) reads the reason, not Flask's HTML page.
    @app.errorhandler(NotFound)
    def not_found(error: NotFound) -> Response:
        message = f"the server could not find the requested resource ({request.method} {_shown_path()})"
        return Response(status_body(NOT_FOUND, message), status=status_of(NOT_FOUND), mimetype=JSON)

    @app.errorhandler(MethodNotAllowed)
    def method_not_allowed(error: MethodNotAllowed) -> Response:
        allowed = ", ".join(sorted(error.valid_methods or ()))
        message = f"{_shown_path()} does not allow {request.method}; it answers {allowed}"
        return Response(status_body(METHOD_NOT_ALLOWED, message), status=status_of(METHOD_NOT_ALLOWED),
                        mimetype=JSON,
                        headers={"Allow": allowed})

    return app


# A path is echoed in the Status up to this many characters (a client may send any length).
SHOWN_PATH_LIMIT = 200


def _shown_path() -> str:
    path = request.path
    return path if len(path) <= SHOWN_PATH_LIMIT else path[:SHOWN_PATH_LIMIT] + "..."


