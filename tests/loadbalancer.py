"""HAProxy in front of several webhook replicas, as a Service spreads the apiserver's calls (not a test module)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from controlplane import LOOPBACK, free_ports


class HAProxy:
    def __init__(self, work_dir: Path, backends: list[int]) -> None:
        self.port = free_ports(1)[0]
        self.config = work_dir / "haproxy.cfg"
        servers = "\n".join(f"  server r{i} {LOOPBACK}:{port} check inter 300ms fall 1 rise 2"
                            for i, port in enumerate(backends))
        # TCP mode: TLS goes through untouched, so the apiserver verifies the webhook's own
        # certificate. Round robin per connection; a refused connect is retried on another server.
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
  balance roundrobin
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
