"""Run ``gpuquota serve`` as a real process over TLS for tests (not a test module).

The server is started exactly as an operator would start it: the console script, certificates
made by ``gpuquota certs generate``, gunicorn with its production settings. Tests then talk to it
through real HTTPS with CA verification.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from controlplane import LOOPBACK, free_ports

REPO_ROOT = Path(__file__).resolve().parents[1]
GPUQUOTA = Path(sys.executable).parent / "gpuquota"
START_TIMEOUT = 60.0
STOP_GRACE_SECONDS = 20.0
POLL_INTERVAL = 0.1


class WebhookStartError(RuntimeError):
    pass


def generate_certs(out_dir: Path, dns: Sequence[str] = ("localhost",), ips: Sequence[str] = (LOOPBACK,), *,
                   force: bool = False) -> str:
    """Certificates via the real CLI; returns the base64 caBundle it prints (``force``: replace existing ones)."""
    args = [str(GPUQUOTA), "certs", "generate", "--out", str(out_dir), *(["--force"] if force else [])]
    for name in dns:
        args += ["--dns", name]
    for ip in ips:
        args += ["--ip", ip]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise WebhookStartError(f"gpuquota certs generate failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip()


@dataclass
class WebhookProcess:
    """One ``gpuquota serve`` process tree (gunicorn master, workers, and whatever they start)."""

    work_dir: Path
    serve_args: Sequence[str] = ()
    port: int = 0
    # (cert, key) this harness presents, for a server started with --client-ca.
    client_cert: tuple[Path, Path] | None = None
    # Set in the server's environment on top of this process's (e.g. TMPDIR, to see what it leaves there).
    env: dict[str, str] = field(default_factory=dict)
    # Where the server runs: another checkout runs that checkout's code (with it first on PYTHONPATH
    # in ``env``; the quota service, started as ``python -m``, finds its modules in this directory).
    cwd: Path = REPO_ROOT
    cert_dir: Path = field(init=False)
    ca_bundle: str = field(init=False, default="")
    log_path: Path = field(init=False)
    _popen: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _log: IO[bytes] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.cert_dir = self.work_dir / "certs"
        self.log_path = self.work_dir / "webhook.log"
        if not self.port:
            self.port = free_ports(1)[0]

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.cert_dir / "ca.crt"

    def ssl_context(self) -> ssl.SSLContext:
        context = self.context_for(self.ca_file)
        if self.client_cert is not None:
            context.load_cert_chain(str(self.client_cert[0]), str(self.client_cert[1]))
        return context

    @staticmethod
    def context_for(ca_file: Path) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(ca_file))

    def start(self, ready_path: str = "/readyz") -> WebhookProcess:
        if not self.ca_bundle:
            self.ca_bundle = generate_certs(self.cert_dir)
        args = [str(GPUQUOTA), "serve", "--cert-dir", str(self.cert_dir), "--host", LOOPBACK,
                "--port", str(self.port), *self.serve_args]
        self._log = self.log_path.open("ab")
        self._popen = subprocess.Popen(args, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=self._log,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       env={**os.environ, **self.env})
        try:
            self.wait_until_serving(ready_path)
        except BaseException:
            # The caller never gets the object to stop: a server that did not come up must not outlive the test.
            self.stop()
            raise
        return self

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def pid(self) -> int:
        assert self._popen is not None
        return self._popen.pid

    def wait_until_serving(self, path: str = "/healthz", timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        reason = "not probed yet"
        while time.monotonic() < deadline:
            if not self.alive():
                raise WebhookStartError(f"gpuquota serve exited with {self._exit_code()}:\n{self.tail()}")
            status, body = self.get(path)
            if status == 200:
                return
            reason = f"{path} answered {status}: {body[:200]!r}"
            with contextlib.suppress(subprocess.TimeoutExpired):
                assert self._popen is not None
                self._popen.wait(timeout=POLL_INTERVAL)
        raise WebhookStartError(f"gpuquota serve not ready after {timeout:.0f}s: {reason}\n{self.tail()}")

    def get(self, path: str) -> tuple[int, bytes]:
        """(status, body) of a GET over verified TLS; status 0 when the connection fails."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=5, context=self.ssl_context()) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except OSError as error:
            return 0, str(error).encode()

    def wait(self, timeout: float) -> int | None:
        """The master's exit code once it has exited, waiting ``timeout`` seconds at most; None if still running."""
        assert self._popen is not None
        try:
            return self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> int | None:
        """SIGTERM the process group, then SIGKILL stragglers; returns the master's exit code."""
        if self._popen is None:
            return None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=STOP_GRACE_SECONDS)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)
        code = self._popen.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def kill(self) -> None:
        """SIGKILL the whole process tree at once: a replica dying, not shutting down."""
        if self._popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)
        self._popen.wait()

    def _exit_code(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            return f"(cannot read {self.log_path}: {error})"
        return "\n".join(text.splitlines()[-lines:])

    def log_text(self) -> str:
        if self._log is not None:
            self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def post_review(server: WebhookProcess, path: str, document: Any, *, source: str | None = None) -> dict[str, Any]:
    """POST an AdmissionReview over a fresh verified TLS connection (from ``source``); its response."""
    connection = http.client.HTTPSConnection(LOOPBACK, server.port, context=server.ssl_context(), timeout=10,
                                             source_address=(source, 0) if source else None)
    try:
        connection.request("POST", path, body=json.dumps(document).encode(),
                           headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        assert reply.status == 200, reply.read()
        response: dict[str, Any] = json.loads(reply.read())["response"]
        return response
    finally:
        connection.close()


def quota_service_pid(master: int) -> int:
    """The quota service process of the ``gpuquota serve`` whose gunicorn master is ``master``."""
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(master)], capture_output=True, text=True,
                         check=True).stdout
    pids = [int(line.split(None, 1)[0]) for line in out.splitlines() if "webhook.quota.service" in line]
    assert len(pids) == 1, out
    return pids[0]


def quota_service_directory(master: int) -> Path:
    """The private directory of that quota service's socket and node view."""
    arguments = Path(f"/proc/{quota_service_pid(master)}/cmdline").read_text().split("\0")
    return Path(next(argument for argument in arguments if argument.endswith("quota.sock"))).parent


@contextlib.contextmanager
def served_from_state(work: Path, state: str, *serve_args: str) -> Iterator[WebhookProcess]:
    """``gpuquota serve --state`` on the manifests in ``state``, stopped on leaving."""
    (work / "state.yaml").write_text(state, encoding="utf-8")
    process = WebhookProcess(work, serve_args=["--state", str(work / "state.yaml"), *serve_args])
    process.start()
    try:
        yield process
    finally:
        process.stop()
