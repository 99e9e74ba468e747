"""A real ``gpuquota serve`` (gunicorn, TLS) on the offline example cluster, for the whole module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from webhookproc import REPO_ROOT, WebhookProcess

EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"


@pytest.fixture(scope="session")
def offline_webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    server = WebhookProcess(tmp_path_factory.mktemp("webhook"), serve_args=["--state", str(EXAMPLE_STATE)])
    server.start()
    try:
        yield server
    finally:
        server.stop()

