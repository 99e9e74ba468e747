"""Paths and methods the webhook does not serve, through a real ``gpuquota serve`` (gunicorn, TLS):
each is answered with a JSON ``metav1.Status``, as the API server answers them, never an HTML page."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from webhookproc import WebhookProcess


def request(server: WebhookProcess, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    host, port = server.url.removeprefix("https://").rsplit(":", 1)
    connection = http.client.HTTPSConnection(host, int(port), timeout=10, context=server.ssl_context())
    try:
        connection.request(method, path, body=b"{}" if method in ("POST", "PUT", "PATCH") else None,
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def status(body: bytes) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(body)
    return decoded


@pytest.mark.parametrize(("method", "path"), [("GET", "/"), ("GET", "/no-such-path"), ("POST", "/mutate"),
                                              ("DELETE", "/apis/v1/pods"), ("GET", "/mutate-pods/extra")])
def test_an_unknown_path_is_a_json_not_found_status(offline_webhook: WebhookProcess, method: str, path: str) -> None:
    code, headers, body = request(offline_webhook, method, path)

    assert code == 404
    assert headers["content-type"] == "application/json"
    assert status(body) == {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 404,
                            "reason": "NotFound",
                            "message": f"the server could not find the requested resource ({method} {path})"}


@pytest.mark.parametrize(("method", "path"), [("POST", "/healthz"), ("PUT", "/readyz"), ("DELETE", "/metrics")])
def test_an_unserved_method_is_a_json_method_not_allowed_status(offline_webhook: WebhookProcess, method: str,
                                                                 path: str) -> None:
    code, headers, body = request(offline_webhook, method, path)

    assert code == 405
    assert headers["content-type"] == "application/json"
    assert sorted(headers["allow"].split(", ")) == ["GET", "HEAD", "OPTIONS"]
    assert status(body) == {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 405,
                            "reason": "MethodNotAllowed",
                            "message": f"{path} does not allow {method}; it answers GET, HEAD, OPTIONS"}
