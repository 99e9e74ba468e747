"""A throwaway etcd + kube-apiserver on 127.0.0.1 for end-to-end tests (not a test module).

The binaries come from ``hack/build-control-plane.sh``; the flags follow the envtest model in
shared/reference/control-plane.md §5, admin access through a client certificate in system:masters.
With ``with_controllers`` a kube-scheduler and a kube-controller-manager run against it as well, so
Deployments expand into pods and pods are bound to Nodes; there is still no kubelet, so Nodes are
objects whose status the tests write and pods never start.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from kubeaccess import pki

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-control-plane.sh"
LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 40
ETCD_START_TIMEOUT = 60.0
APISERVER_START_TIMEOUT = 180.0
CONTROLLER_START_TIMEOUT = 120.0
STOP_GRACE_SECONDS = 15.0
POLL_INTERVAL = 0.2
ELASTICQUOTA_GROUP = "scheduling.sigs.k8s.io"
ELASTICQUOTA_VERSION = "v1alpha1"
ELASTICQUOTA_PLURAL = "elasticquotas"
# A cold build of kube-apiserver takes ~7 minutes on 2 cores; leave room for module downloads.
BUILD_TIMEOUT = 3600.0


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message carries the evidence."""


class BuildUnavailableError(ControlPlaneError):
    """No cached binaries and no Go toolchain to build them: the only case a local run may skip."""


class StartupError(ControlPlaneError):
    """etcd or kube-apiserver exited or never became ready; the message ends with their log tails."""


# The controllers the e2e tests rely on: Deployment -> ReplicaSet -> Pod, cascading deletion, and
# namespace deletion. Left out on purpose: the node lifecycle controller (no kubelet ever renews a
# lease, so it would taint every Node unreachable and evict its pods), the ServiceAccount and token
# controllers (the ServiceAccount admission plugin is off, so no pod needs a token), and everything
# that needs a cloud, a kubelet or CSR signing keys.
CONTROLLERS = ("deployment-controller", "replicaset-controller", "garbage-collector-controller", "namespace-controller")


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path

    def all(self) -> tuple[Path, ...]:
        return (self.etcd, self.kube_apiserver, self.kube_scheduler, self.kube_controller_manager)


def run_build_script(build_script: Path) -> Path:
    """Run a (cached) build script of hack/ and return the directory it printed last.

    BuildUnavailableError when it fails and no Go toolchain exists: the only case a local run may skip.
    """
    try:
        result = subprocess.run(
            [str(build_script)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ControlPlaneError(f"{build_script} did not finish within {BUILD_TIMEOUT:.0f}s") from exc
    except OSError as exc:
        raise ControlPlaneError(f"cannot run {build_script}: {exc}") from exc
    if result.returncode != 0:
        message = f"{build_script} failed (exit {result.returncode}):\n{result.stderr.strip()}"
        if shutil.which("go") is None:
            raise BuildUnavailableError(message)
        raise ControlPlaneError(message)
    lines = result.stdout.strip().splitlines()
    if not lines:
        raise ControlPlaneError(f"{build_script} printed no directory")
    return Path(lines[-1])


def locate_binaries(build_script: Path = BUILD_SCRIPT) -> Binaries:
    """Run the (cached) build and return where it put the binaries."""
    directory = run_build_script(build_script)
    binaries = Binaries(
        etcd=directory / "etcd",
        kube_apiserver=directory / "kube-apiserver",
        kube_scheduler=directory / "kube-scheduler",
        kube_controller_manager=directory / "kube-controller-manager",
    )
    for binary in binaries.all():
        if not os.access(binary, os.X_OK):
            raise ControlPlaneError(f"{build_script} reported {directory}, but {binary} is not executable")
    return binaries


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        self.log_file.flush()
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        # The process leads its own group (start_new_session), so its pgid is its pid; signalling the
        # group also reaches anything it forked.
        pgid = self.popen.pid
        if self.alive():
            _signal_group(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        # Stragglers in the group would outlive a leader that already exited on SIGTERM.
        _signal_group(pgid, signal.SIGKILL)
        self.popen.wait()
        self.log_file.close()


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


# Its one worker thread lives as long as the test process.
_LONG_LIVED_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="control-plane-spawner")


def _die_with_parent() -> None:
    # If pytest itself is killed (no finalizers run), the kernel still takes the servers down.
    # PR_SET_PDEATHSIG fires when the spawning *thread* exits, so start servers from a long-lived thread.
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def free_ports(count: int) -> list[int]:
    """Ports the kernel considers free right now on 127.0.0.1 (held together so they differ)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler and kube-controller-manager with ``with_controllers``)
    in a temporary directory; use as a context manager or start()/stop()."""

    binaries: Binaries
    extra_apiserver_args: Sequence[str] = ()
    base_dir: Path | None = None
    start_attempts: int = 3
    with_controllers: bool = False
    controllers: Sequence[str] = CONTROLLERS

    work_dir: Path = field(init=False)
    pki_dir: Path = field(init=False)
    etcd_url: str = field(init=False, default="")
    server: str = field(init=False, default="")
    kubeconfig_path: Path = field(init=False)
    ca_cert_path: Path = field(init=False)
    admin_cert_path: Path = field(init=False)
    admin_key_path: Path = field(init=False)
    etcd_log: Path = field(init=False)
    apiserver_log: Path = field(init=False)
    scheduler_log: Path = field(init=False)
    controller_manager_log: Path = field(init=False)
    _processes: list[_Process] = field(init=False, default_factory=list)
    _owns_work_dir: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.base_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="gpuquota-cp-"))
            self._owns_work_dir = True
        else:
            self.work_dir = self.base_dir
            self.work_dir.mkdir(parents=True, exist_ok=True)
        self.pki_dir = self.work_dir / "pki"
        self.kubeconfig_path = self.work_dir / "admin.kubeconfig"
        self.ca_cert_path = self.pki_dir / "apiserver-ca.crt"
        self.admin_cert_path = self.pki_dir / "admin.crt"
        self.admin_key_path = self.pki_dir / "admin.key"
        self.etcd_log = self.work_dir / "etcd.log"
        self.apiserver_log = self.work_dir / "kube-apiserver.log"
        self.scheduler_log = self.work_dir / "kube-scheduler.log"
        self.controller_manager_log = self.work_dir / "kube-controller-manager.log"

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        return [process.popen.pid for process in self._processes]

    def start(self) -> None:
        self._write_pki()
        atexit.register(self.stop)
        for attempt in range(1, self.start_attempts + 1):
            try:
                self._start_once()
                return
            except StartupError as exc:
                self._stop_processes()
                # Another process may grab a port between free_ports() and the server's bind.
                if attempt < self.start_attempts and "address already in use" in str(exc):
                    continue
                self.stop()
                raise

    def stop(self) -> None:
        """Stop every server, last started first (etcd last); safe to call more than once."""
        self._stop_processes()
        atexit.unregister(self.stop)

    def cleanup(self) -> None:
        """Stop, then remove the working directory when this object created it."""
        self.stop()
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _stop_processes(self) -> None:
        while self._processes:
            self._processes.pop().stop()

    def _start_once(self) -> None:
        etcd_port, peer_port, api_port, scheduler_port, manager_port = free_ports(5)
        self.etcd_url = f"http://{LOOPBACK}:{etcd_port}"
        self.server = f"https://{LOOPBACK}:{api_port}"
        etcd = self._spawn("etcd", self._etcd_args(etcd_port, peer_port), self.etcd_log)
        self._wait_until(etcd, ETCD_START_TIMEOUT, self._etcd_healthy)
        apiserver = self._spawn("kube-apiserver", self._apiserver_args(api_port), self.apiserver_log)
        self._wait_until(apiserver, APISERVER_START_TIMEOUT, self._apiserver_ready)
        self._write_kubeconfig()
        if not self.with_controllers:
            return
        # Both start together and are then awaited in turn: their start-ups overlap.
        scheduler = self._spawn("kube-scheduler", self._scheduler_args(scheduler_port), self.scheduler_log)
        manager = self._spawn("kube-controller-manager", self._controller_manager_args(manager_port),
                              self.controller_manager_log)
        for process, port in ((scheduler, scheduler_port), (manager, manager_port)):
            self._wait_until(process, CONTROLLER_START_TIMEOUT, functools.partial(self._component_healthy, port))

    # -- faults (tests/e2e/test_faults.py) ---------------------------------------------------

    def _process(self, name: str) -> _Process:
        for process in self._processes:
            if process.name == name:
                return process
        raise ControlPlaneError(f"{name} is not running in this control plane")

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port over the same etcd, until ready.

        What a rolling restart of a control-plane node looks like to a client: connections drop,
        then the same address serves the same data again.
        """
        old = self._process("kube-apiserver")
        old.stop()
        port = int(self.server.rsplit(":", 1)[1])
        new = self._spawn("kube-apiserver", self._apiserver_args(port), self.apiserver_log)
        # Keep the start order (etcd first): stop() stops the last started first.
        self._processes.remove(new)
        self._processes[self._processes.index(old)] = new
        self._wait_until(new, APISERVER_START_TIMEOUT, self._apiserver_ready)

    def pause_etcd(self) -> None:
        """SIGSTOP etcd: every read and write of the apiserver hangs until resume_etcd()."""
        _signal_group(self._process("etcd").popen.pid, signal.SIGSTOP)

    def resume_etcd(self) -> None:
        _signal_group(self._process("etcd").popen.pid, signal.SIGCONT)

    def _etcd_args(self, client_port: int, peer_port: int) -> list[str]:
        client_url = f"http://{LOOPBACK}:{client_port}"
        peer_url = f"http://{LOOPBACK}:{peer_port}"
        data_dir = self.work_dir / "etcd-data"
        # A retry after a port clash must not find the half-initialised member of the last attempt.
        shutil.rmtree(data_dir, ignore_errors=True)
        return [
            str(self.binaries.etcd),
            "--name=default",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            # Test data is disposable; fsync would only make every write wait for the disk.
            "--unsafe-no-fsync=true",
        ]

    def _apiserver_args(self, port: int) -> list[str]:
        pki_dir = self.pki_dir
        return [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--advertise-address={LOOPBACK}",
            "--endpoint-reconciler-type=none",
            f"--cert-dir={pki_dir}",
            f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
            f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
            f"--client-ca-file={pki_dir / 'client-ca.crt'}",
            "--authorization-mode=RBAC",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            f"--service-account-issuer=https://{LOOPBACK}:{port}/",
            f"--service-account-key-file={pki_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
            # No ServiceAccount controller creates default ServiceAccounts, and no node lifecycle
            # controller would ever lift the not-ready taint (see CONTROLLERS).
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            *self.extra_apiserver_args,
        ]

    def _component_serving_args(self, port: int) -> list[str]:
        # Both serve /healthz (and /metrics) only; loopback, our CA's certificate, admin kubeconfig.
        # /healthz is in their default --authorization-always-allow-paths, so the probe needs no
        # credentials, and without --authentication-kubeconfig they need no delegated authn either.
        return [f"--kubeconfig={self.kubeconfig_path}", "--leader-elect=false", f"--secure-port={port}",
                *self.component_tls_args()]

    def _scheduler_args(self, port: int) -> list[str]:
        return [str(self.binaries.kube_scheduler), *self._component_serving_args(port)]

    def _controller_manager_args(self, port: int) -> list[str]:
        return [
            str(self.binaries.kube_controller_manager),
            *self._component_serving_args(port),
            f"--controllers={','.join(self.controllers)}",
        ]

    def _write_pki(self) -> None:
        serving_ca = pki.create_ca("gpuquota-e2e apiserver CA")
        serving = pki.issue_serving_cert(serving_ca, ["localhost"], [LOOPBACK])
        components = pki.issue_serving_cert(serving_ca, ["localhost"], [LOOPBACK])
        client_ca = pki.create_ca("gpuquota-e2e client CA")
        admin = pki.issue_client_cert(client_ca, "admin", ["system:masters"])
        signer = pki.create_rsa_key_pair()
        pki.write_public_file(self.ca_cert_path, serving_ca.cert_pem)
        pki.write_public_file(self.pki_dir / "apiserver.crt", serving.cert_pem)
        pki.write_private_file(self.pki_dir / "apiserver.key", serving.key_pem)
        pki.write_public_file(self.pki_dir / "components.crt", components.cert_pem)
        pki.write_private_file(self.pki_dir / "components.key", components.key_pem)
        pki.write_public_file(self.pki_dir / "client-ca.crt", client_ca.cert_pem)
        pki.write_public_file(self.admin_cert_path, admin.cert_pem)
        pki.write_private_file(self.admin_key_path, admin.key_pem)
        pki.write_public_file(self.pki_dir / "sa.pub", signer.public_pem)
        pki.write_private_file(self.pki_dir / "sa.key", signer.private_pem)

    def _write_kubeconfig(self) -> None:
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": pki.ca_bundle(self.ca_cert_path.read_bytes()),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate-data": pki.ca_bundle(self.admin_cert_path.read_bytes()),
                        "client-key-data": pki.ca_bundle(self.admin_key_path.read_bytes()),
                    },
                }
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
            "current-context": "e2e",
        }
        pki.write_private_file(self.kubeconfig_path, yaml.safe_dump(kubeconfig, sort_keys=False).encode())

    def start_component(self, name: str, args: list[str], probe: Callable[[], str | None], *,
                        env: Mapping[str, str] | None = None, timeout: float = CONTROLLER_START_TIMEOUT) -> None:
        """Start one more server beside the control plane (koord-scheduler, koord-manager) and wait
        until ``probe`` says it is ready; it stops with the rest, before etcd and the apiserver."""
        process = self._spawn(name, args, self.work_dir / f"{name}.log", env=env)
        self._wait_until(process, timeout, probe)

    def component_tls_args(self) -> list[str]:
        """Serving flags of a kube-scheduler-like component: loopback, the test CA's certificate."""
        return [f"--bind-address={LOOPBACK}", f"--tls-cert-file={self.pki_dir / 'components.crt'}",
                f"--tls-private-key-file={self.pki_dir / 'components.key'}"]

    def component_healthy(self, port: int) -> Callable[[], str | None]:
        """A probe of ``https://127.0.0.1:<port>/healthz`` for start_component."""
        return functools.partial(self._component_healthy, port)

    def _spawn(self, name: str, args: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> _Process:
        log_file = log_path.open("ab")
        log_file.write(f"### {' '.join(args)}\n".encode())
        log_file.flush()
        spawn = functools.partial(
            subprocess.Popen,
            args,
            cwd=self.work_dir,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
            # Only calls prctl, which is safe between fork and exec.
            preexec_fn=_die_with_parent,
        )
        # PR_SET_PDEATHSIG follows the spawning thread: a server started from a short-lived thread
        # (a fault test restarting the apiserver mid-burst) would be killed when that thread ends.
        popen = spawn() if threading.current_thread() is threading.main_thread() else \
            _LONG_LIVED_SPAWNER.submit(spawn).result()
        process = _Process(name=name, popen=popen, log_path=log_path, log_file=log_file)
        self._processes.append(process)
        return process

    def _wait_until(self, process: _Process, timeout: float, probe: Callable[[], str | None]) -> None:
        """Poll ``probe`` (None = ready, else the reason it is not) until ready, exit or deadline."""
        deadline = time.monotonic() + timeout
        reason = "not probed yet"
        while True:
            if not process.alive():
                raise self._startup_error(f"{process.name} exited with code {process.popen.returncode}")
            outcome = probe()
            if outcome is None:
                return
            reason = outcome
            if time.monotonic() >= deadline:
                raise self._startup_error(f"{process.name} not ready after {timeout:.0f}s: {reason}")
            # Waiting on the process doubles as the poll interval and notices an exit at once.
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(timeout=POLL_INTERVAL)

    def _etcd_healthy(self) -> str | None:
        try:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as response:
                body: dict[str, Any] = json.loads(response.read())
        except (OSError, ValueError) as exc:
            return f"/health: {exc}"
        return None if body.get("health") == "true" else f"/health: {body}"

    def _apiserver_ready(self) -> str | None:
        context = ssl.create_default_context(cafile=str(self.ca_cert_path))
        context.load_cert_chain(str(self.admin_cert_path), str(self.admin_key_path))
        try:
            with urllib.request.urlopen(f"{self.server}/readyz", timeout=5, context=context) as response:
                body = response.read().decode(errors="replace").strip()
        except urllib.error.HTTPError as exc:
            failing = [line for line in exc.read().decode(errors="replace").splitlines() if "failed" in line]
            return f"/readyz {exc.code}: {'; '.join(failing) or exc.reason}"
        except OSError as exc:
            return f"/readyz: {exc}"
        return None if body == "ok" else f"/readyz said {body!r}"

    def _component_healthy(self, port: int) -> str | None:
        context = ssl.create_default_context(cafile=str(self.ca_cert_path))
        try:
            with urllib.request.urlopen(f"https://{LOOPBACK}:{port}/healthz", timeout=5, context=context) as response:
                body = response.read().decode(errors="replace").strip()
        except urllib.error.HTTPError as exc:
            return f"/healthz {exc.code}: {exc.read().decode(errors='replace').strip()[:300] or exc.reason}"
        except OSError as exc:
            return f"/healthz: {exc}"
        return None if body == "ok" else f"/healthz said {body!r}"

    def _startup_error(self, headline: str) -> StartupError:
        sections = [headline]
        for process in self._processes:
            sections.append(f"--- last {LOG_TAIL_LINES} lines of {process.log_path} ---\n{process.tail()}")
        return StartupError("\n".join(sections))


@dataclass(frozen=True)
class Api:
    """Typed API groups over one authenticated client."""

    client: k8s.ApiClient
    core: k8s.CoreV1Api
    custom: k8s.CustomObjectsApi
    apiextensions: k8s.ApiextensionsV1Api
    admissionregistration: k8s.AdmissionregistrationV1Api

    def close(self) -> None:
        self.client.close()


def make_api(kubeconfig_path: Path) -> Api:
    # new_client_from_config leaves the kubernetes package's global default configuration alone.
    api_client = k8s_config.new_client_from_config(config_file=str(kubeconfig_path))
    return Api(
        client=api_client,
        core=k8s.CoreV1Api(api_client),
        custom=k8s.CustomObjectsApi(api_client),
        apiextensions=k8s.ApiextensionsV1Api(api_client),
        admissionregistration=k8s.AdmissionregistrationV1Api(api_client),
    )


def _quantities(values: Mapping[str, str | int]) -> dict[str, str]:
    # Quantities travel as strings; bool is an int subclass and never a quantity.
    out: dict[str, str] = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise TypeError(f"{name}: quantity must be str or int, got {type(value).__name__}")
        out[name] = str(value)
    return out


# The ``gpu_node`` fixture: (name, allocatable, capacity=None, labels=None, taints=()) -> V1Node.
GpuNodeFactory = Callable[..., k8s.V1Node]


def processes_using(path: Path) -> list[int]:
    """PIDs whose command line mentions ``path``: every server a ControlPlane starts names its work dir."""
    needle = str(path).encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return found


def create_gpu_node(
    core: k8s.CoreV1Api,
    name: str,
    allocatable: Mapping[str, str | int],
    capacity: Mapping[str, str | int] | None = None,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> k8s.V1Node:
    """Create a Ready Node that advertises the given resources, as a kubelet would have reported them.

    ``capacity`` defaults to ``allocatable``. The status goes in with the create and again through
    the /status subresource, because the main resource ignores status changes after creation and
    the create path is not guaranteed to keep it on every version. kube-scheduler places pods only
    on a Node whose allocatable includes ``pods`` (and the cpu/memory they ask for).
    """
    status = {
        "capacity": _quantities(capacity if capacity is not None else allocatable),
        "allocatable": _quantities(allocatable),
        # What a healthy kubelet reports; nothing renews it, which is why the node lifecycle
        # controller does not run (CONTROLLERS).
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "written by the e2e tests"}],
    }
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": [dict(taint) for taint in taints]},
        "status": status,
    }
    core.create_node(body)
    return core.patch_node_status(name, {"status": status})


# Enough for every test; no "pods" in it, so kube-scheduler never binds a pod there.
CANONICAL_NODE_ALLOCATABLE = {"cpu": "1000", "memory": "4Ti", "koordinator.sh/gpu-core": "100000",
                              "koordinator.sh/gpu-memory-ratio": "100000", "koordinator.sh/gpu-memory": "80Ti"}


def create_canonical_gpu_node(core: k8s.CoreV1Api, name: str) -> None:
    """A Node advertising the canonical names, untainted and unlabelled, that takes no pods.

    With ``rewrite: auto`` (the default) a live webhook rewrites a pod only when a node it can
    reach advertises koordinator.sh/gpu-core and gpu-memory-ratio: a control plane whose webhook is
    expected to rewrite needs one. The webhook reads only GPU names, labels and taints of a node,
    so it counts this one; the scheduler, which needs ``pods`` in allocatable, never uses it.
    An existing one of that name is kept.
    """
    try:
        create_gpu_node(core, name, CANONICAL_NODE_ALLOCATABLE)
    except ApiException as exc:
        if exc.status != 409:
            raise


def install_elasticquota_crd(api: Api) -> k8s.V1CustomResourceDefinition:
    """Koordinator's ElasticQuota CRD, from the module hack/build-koordinator.sh built, created (one
    already there is kept) and Established: what a cluster running Koordinator has, and what our
    install leaves alone (manifests/elasticquota-crd, for clusters without Koordinator, is tested by
    tests/e2e/test_manifests.py)."""
    # Imported here: tests/koordinator.py builds on this module.
    from koordinator import locate_koordinator

    path = locate_koordinator().crd_path(ELASTICQUOTA_PLURAL, ELASTICQUOTA_GROUP)
    manifest: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        api.apiextensions.create_custom_resource_definition(manifest)
    except ApiException as exc:
        if exc.status != 409:
            raise
    return wait_for_crd_established(api.apiextensions, manifest["metadata"]["name"])


def wait_for_crd_established(
    apiextensions: k8s.ApiextensionsV1Api, name: str, timeout: float = 60.0
) -> k8s.V1CustomResourceDefinition:
    deadline = time.monotonic() + timeout
    while True:
        crd = apiextensions.read_custom_resource_definition(name)
        conditions = {c.type: c for c in (crd.status.conditions or [])} if crd.status else {}
        established = conditions.get("Established")
        if established is not None and established.status == "True":
            return crd
        if time.monotonic() >= deadline:
            details = {kind: f"{c.status} ({c.reason}: {c.message})" for kind, c in conditions.items()}
            raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s: {details}")
        # Polling the apiserver's own condition; there is no event to wait on without a watch.
        time.sleep(POLL_INTERVAL)
