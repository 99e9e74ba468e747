"""Everything a webhook server instance is configured with, in one immutable value.

The CLI builds it from flags, the gunicorn application hands it to every hook and to the app
factory, and the quota decider factory receives it too: one object travels through the master and
(by fork) into every worker, so nothing has to be smuggled through environment variables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# The cap on a review's body is admission's, sized there with its derivation.
from webhook.admission.body import MAX_BODY_BYTES
from webhook.quota.options import QuotaServiceOptions

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8443
DEFAULT_CERT_DIR = Path("certs")
# File names inside the cert dir; the same names a kubernetes.io/tls Secret mounts (plus the CA).
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    cert_dir: Path = DEFAULT_CERT_DIR
    # YAML conversion table (gpuquota_core.conversion.load_config); None = the built-in defaults.
    config_path: Path | None = None
    # Twice the cores of the benchmark machine (docs/benchmarks.md): each worker has its own
    # SO_REUSEPORT socket and keeps every connection the kernel hashes to it, so with as many
    # workers as cores the API server's few connections could all land on one worker and leave a
    # core idle. Four make that rare and leave two busy workers even when it
    # happens, for a small memory cost each.
    workers: int = 4
    threads: int = 4
    # Above the API server's 90 s idle-connection timeout, so it is always the client that closes
    # an idle connection; if the server closed first, a request racing the close would fail.
    keepalive: int = 120
    graceful_timeout: int = 30
    timeout: int = 30
    log_level: str = "info"
    max_body_bytes: int = MAX_BODY_BYTES
    # Where prometheus_client's multiprocess files live; None = a fresh temporary directory.
    metrics_dir: Path | None = None
    # PEM CA(s) that client certificates must chain to (mutual TLS); None = any client may connect.
    client_ca_path: Path | None = None
    # What the quota service process is started with: the cluster source (manifests, else the
    # kubeconfig or in-cluster config), the accounting and the ledger's limits, each documented and
    # defaulted there once. Serving also reads the cluster source and the accounting, to refuse a
    # configuration before anything is served, and starts the service with ledger_namespace
    # resolved (the flag, else the pod's own: webhook.serving.server.quota_service_options).
    quota: QuotaServiceOptions = field(default_factory=QuotaServiceOptions)

    @property
    def certfile(self) -> Path:
        return self.cert_dir / CERT_FILE

    @property
    def keyfile(self) -> Path:
        return self.cert_dir / KEY_FILE

    @property
    def ca_file(self) -> Path:
        return self.cert_dir / CA_FILE

    @property
    def bind(self) -> str:
        # IPv6 literals need brackets in a gunicorn bind string.
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"
