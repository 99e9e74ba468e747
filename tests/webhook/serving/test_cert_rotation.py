"""A rotated certificate is served without a restart, and connections already open keep working."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families
from reviews import body, pod, review
from webhookproc import LOOPBACK, REPO_ROOT, WebhookProcess, generate_certs

ROTATION_DEADLINE = 30.0
EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"


def _healthz_with(ca_file: Path, port: int) -> int:
    connection = http.client.HTTPSConnection(LOOPBACK, port, timeout=5,
                                             context=WebhookProcess.context_for(ca_file))
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status
    except OSError:
        return 0
    finally:
        connection.close()


def _expiry(certfile: Path) -> float:
    return x509.load_pem_x509_certificate(certfile.read_bytes()).not_valid_after_utc.timestamp()


def _exported_expiry(server: WebhookProcess) -> float:
    status, text = server.get("/metrics")
    assert status == 200, text
    [value] = [sample.value for family in text_string_to_metric_families(text.decode()) for sample in family.samples
               if sample.name == "gpuquota_serving_certificate_expiry_timestamp_seconds"]
    return value


def test_rotated_certificate_is_served_and_open_connections_survive(tmp_path: Path) -> None:
    server = WebhookProcess(tmp_path / "server", serve_args=["--workers", "2", "--state", str(EXAMPLE_STATE)]).start()
    try:
        old_ca = tmp_path / "old-ca.crt"
        old_ca.write_bytes(server.ca_file.read_bytes())
        open_connection = http.client.HTTPSConnection(LOOPBACK, server.port, timeout=10,
                                                      context=WebhookProcess.context_for(old_ca))
        payload = body(review(pod(resources={"nvidia.com/gpu": "1"})))
        open_connection.request("POST", "/mutate-pods", body=payload, headers={"Content-Type": "application/json"})
        assert open_connection.getresponse().read()

        old_expiry = _expiry(server.cert_dir / "tls.crt")
        assert _exported_expiry(server) == old_expiry
        generate_certs(server.cert_dir, force=True)  # a new CA and serving cert, written over the old files

        deadline = time.monotonic() + ROTATION_DEADLINE
        while _healthz_with(server.ca_file, server.port) != 200:
            assert time.monotonic() < deadline, f"new certificate not served:\n{server.tail()}"
            assert server.alive()
        # New connections now get the new certificate, which the old CA does not sign ...
        assert _healthz_with(old_ca, server.port) == 0
        # ... and the expiry metric is the new certificate's (issued seconds later, so it differs).
        new_expiry = _expiry(server.cert_dir / "tls.crt")
        assert new_expiry != old_expiry
        assert _exported_expiry(server) == new_expiry
        # ... while the connection negotiated before the rotation carries on.
        open_connection.request("POST", "/mutate-pods", body=payload, headers={"Content-Type": "application/json"})
        answer = open_connection.getresponse()
        assert answer.status == 200
        assert json.loads(answer.read())["response"]["allowed"] is True
        open_connection.close()
        assert "Booting worker" in server.log_text()
        assert server.log_text().count("Booting worker") == 2  # no worker was restarted for it
    finally:
        server.stop()
