"""bench/go-reference, the Go stdlib admission server the benchmarks weigh our webhook against: built
from its directory and started on a free loopback port with a certificate of its own.

Its mutating path does the same whole-card rewrite as /mutate-pods; its validating paths decode the
review and allow it. Behind the project's mutating and validating configurations it is the cheapest a
create that passes both webhooks can be: the apiserver's own side of two calls, the two-webhook limit.

The scripts that import it put tests/ on sys.path first (tests/controlplane.py, tests/webhookproc.py).
"""

from __future__ import annotations

import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from controlplane import LOOPBACK, free_ports
from webhookproc import generate_certs

SOURCE = Path(__file__).resolve().parent / "go-reference"
START_DEADLINE = 30.0


def build_go_reference(directory: Path) -> Path:
    """The binary, built into ``directory`` (Go's build cache makes a rebuild of unchanged source quick)."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "go-reference"
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=SOURCE, check=True)
    return binary


@dataclass
class GoReference:
    process: subprocess.Popen[bytes]
    url: str
    ca_bundle: str  # base64, as a webhook configuration's caBundle

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_go_reference(directory: Path) -> GoReference:
    """The Go reference built and serving under ``directory`` (its binary and certificates), answering when
    returned; stopped again if it does not come up."""
    binary = build_go_reference(directory)
    cert_dir = directory / "certs"
    ca_bundle = generate_certs(cert_dir)
    port = free_ports(1)[0]
    process = subprocess.Popen([str(binary), "-addr", f"{LOOPBACK}:{port}", "-cert", str(cert_dir / "tls.crt"),
                                "-key", str(cert_dir / "tls.key")], stderr=subprocess.DEVNULL)
    reference = GoReference(process, f"https://{LOOPBACK}:{port}", ca_bundle)
    context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
    deadline = time.monotonic() + START_DEADLINE
    while True:
        try:
            urllib.request.urlopen(reference.url + "/mutate-pods", timeout=2, context=context)
        except urllib.error.HTTPError:
            return reference  # it answers (400 for an empty body): up
        except OSError:
            if process.poll() is not None or time.monotonic() >= deadline:
                reference.stop()
                raise RuntimeError(f"the Go reference did not start (exit code {process.poll()})") from None
            time.sleep(0.1)  # polling a condition with a deadline
