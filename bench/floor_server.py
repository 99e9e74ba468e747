"""The floor under the product: a WSGI app that does no admission work, under the product's gunicorn.

``make bench`` runs it next to ``gpuquota serve`` and the Go reference, so every run shows how much
of the distance to Go is the server stack (gunicorn, its worker, Python's TLS) and how much is the
product's own code. Its settings are the product's, taken from ``webhook.serving.gunicorn_conf.gunicorn_options``
with the defaults of ``webhook.serving.settings.Settings`` (worker class, workers, threads, keep-alive,
parser, TLS context), so the two cannot drift apart. The app reads the whole body, as the product
does, and answers with a fixed AdmissionReview the size of the product's answer to the benchmark's
review (1,324 bytes: a patch and two warnings).

Usage: python bench/floor_server.py CERT_DIR PORT
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuquota_core.conversion import DEFAULT_CONFIG  # noqa: E402
from webhook.serving.gunicorn_conf import MetricsDirectory, gunicorn_options  # noqa: E402
from webhook.serving.server import WebhookApplication  # noqa: E402
from webhook.serving.settings import Settings  # noqa: E402
from webhook.serving.supervision import QuotaServiceSupervisor  # noqa: E402

PRODUCT_ANSWER_BYTES = 1324
_PREFIX = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"bench-uid",' \
          b'"allowed":true,"warnings":["'
_SUFFIX = b'"]}}'
ANSWER = _PREFIX + b"x" * (PRODUCT_ANSWER_BYTES - len(_PREFIX) - len(_SUFFIX)) + _SUFFIX


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(ANSWER)))])
    return [ANSWER]


class FloorApplication(WebhookApplication):
    """The product's gunicorn application (same options, same ``load_config``) serving the no-op app."""

    def load(self) -> Callable[..., Iterable[bytes]]:
        return app


def main() -> None:
    cert_dir, port = Path(sys.argv[1]), int(sys.argv[2])
    settings = Settings(cert_dir=cert_dir, port=port, log_level="warning")
    metrics = MetricsDirectory(Path(tempfile.mkdtemp(prefix="gpuquota-floor-metrics-")), owned=True)
    # No quota service here: the supervisor has nothing to start or watch.
    FloorApplication(settings, DEFAULT_CONFIG, gunicorn_options(settings, metrics, lambda _settings: None),
                     QuotaServiceSupervisor()).run()


if __name__ == "__main__":
    main()
