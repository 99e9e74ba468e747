"""HAProxy in front of several webhook replicas, as a Service spreads the apiserver's calls (not a test module)."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from controlplane import LOOPBACK, free_ports
from webhookproc import REPO_ROOT, WebhookProcess, generate_certs

FORWARDING_DEADLINE = 60.0


class HAProxy:
    def __init__(self, work_dir: Path, backends: list[int], balance: str = "roundrobin") -> None:
        self.port = free_ports(1)[0]
        self.config = work_dir / "haproxy.cfg"
        servers = "\n".join(f"  server r{i} {LOOPBACK}:{port} check inter 300ms fall 1 rise 2"
                            for i, port in enumerate(backends))
        # TCP mode: TLS goes through untouched, so the apiserver verifies the webhook's own
        # certificate. Round robin per connection (``balance``: HAProxy's algorithm; "first" sends
        # everything to the first server that is up); a refused connect is retried on another server.
        self.config.write_text(f"""global
  maxconn 2000
defaults
  mode tcp
  timeout connect 1s
  timeout client 130s
  timeout server 130s
  retries 3
  option redispatch
frontend webhook
  bind {LOOPBACK}:{self.port}
  default_backend replicas
backend replicas
  balance {balance}
{servers}
""", encoding="utf-8")
        haproxy = shutil.which("haproxy")
        assert haproxy, "haproxy is not installed: run hack/install-test-tools.sh (make test does)"
        check = subprocess.run([haproxy, "-c", "-f", str(self.config)], capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        self.process = subprocess.Popen([haproxy, "-db", "-f", str(self.config)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

    def forwards_to(self, server: WebhookProcess) -> bool:
        """Whether a /healthz through the balancer reaches a replica (one serving ``server``'s certificate)."""
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2, context=server.ssl_context()) as response:
                return bool(response.status == 200)
        except OSError:
            return False


def start_replicas_behind_haproxy(base: Path, serve_args: Sequence[str], count: int = 3, *,
                                  env: Mapping[str, str] | None = None, cwd: Path | None = None,
                                  balance: str = "roundrobin") -> tuple[list[WebhookProcess], HAProxy]:
    """``count`` ``gpuquota serve`` replicas sharing one certificate (the apiserver trusts one caBundle),
    each in ``base/r<index>``, and HAProxy in front of them once it forwards; everything started is
    stopped again if any part fails to come up. ``env`` and ``cwd`` go to every replica, as
    WebhookProcess takes them (another checkout's code: that checkout as ``cwd``, first on PYTHONPATH)."""
    cert_dir = base / "certs"
    ca_bundle = generate_certs(cert_dir)
    servers: list[WebhookProcess] = []
    try:
        for index in range(count):
            server = WebhookProcess(base / f"r{index}", serve_args=serve_args, env=dict(env or {}),
                                    cwd=cwd or REPO_ROOT)
            server.cert_dir, server.ca_bundle = cert_dir, ca_bundle
            servers.append(server)
            server.start()
        balancer = HAProxy(base, [server.port for server in servers], balance)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    deadline = time.monotonic() + FORWARDING_DEADLINE
    while not balancer.forwards_to(servers[0]):
        if time.monotonic() >= deadline:
            balancer.stop()
            for server in servers:
                server.stop()
            raise TimeoutError(f"HAProxy on port {balancer.port} did not forward to the replicas "
                               f"within {FORWARDING_DEADLINE:.0f}s")
        time.sleep(0.1)  # polling a condition with a deadline
    return servers, balancer
