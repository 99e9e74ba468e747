"""The product's own Python per admission, in-process: both reviews of a pod through AdmissionEndpoint.serve.

Builds the app as a worker does (``create_app``, the server's logging configuration, the decision
log written to /dev/null) with a quota decider that answers "allowed" at once, so what is timed is
what the product itself does for a pod create: read and decode the mutating review, rewrite the
pod, encode the patch, log and count the decision; then the same for the validating review, up to
the quota decision. Not timed: gunicorn (its threads and parser), TLS, and the round trip to the
quota service (bench/quota_roundtrip.py measures that one).

    .venv/bin/python bench/admission_path.py [PODS] [--profile]    # default 20000

Prints the CPU time per pod of five rounds of PODS/5 and their best; with ``--profile``, the shares
of the path's parts under cProfile. Run from a checkout to measure that checkout's code (it is put
first on sys.path); compare two checkouts in the same session, alternating.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# The checkout this is run from, before any installed copy.
sys.path.insert(0, str(Path.cwd()))
# prometheus_client picks its value storage when first imported: the workers' multiprocess files.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="gpuquota-bench-metrics-"))

import orjson

from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.pod_admission import ALLOW, PodAdmission, Verdict
from webhook.serving.app import create_app
from webhook.serving.routes import AdmissionEndpoint, AdmissionRoutes
from webhook.serving.server import configure_logging

PATHS = ("/mutate-pods", "/validate-pods")
# The parts reported with --profile: (function name, a fragment of its file's path).
PARTS = (("decode_review", "review.py"), ("mutate_pod", "decisions.py"), ("validate_pod", "decisions.py"),
         ("encode_review", "review.py"), ("record_decision", "observability.py"),
         ("_log_decision", "observability.py"), ("observe", "observability.py"), ("read_body", "body.py"))


class AllowAll:
    """The quota decider's interface, answering at once: the round trip is not what is measured."""

    def alive(self) -> tuple[bool, str]:
        return True, "bench"

    def ready(self) -> tuple[bool, str]:
        return True, "bench"

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        return ALLOW

    def review_elasticquota(self, quota: dict[str, Any]) -> Verdict:
        return ALLOW


def gpu_pod() -> dict[str, Any]:
    """bench/production_shape.py's pod: one ``nvidia.com/gpu`` card, charged to a quota by its label."""
    gpu = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p-1", "namespace": "bench", "uid": str(uuid.uuid4()),
                         "labels": {"quota.scheduling.koordinator.sh/name": "bench"}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/train:1",
                                     "resources": {"requests": gpu, "limits": gpu}}]}}


def review(pod: dict[str, Any]) -> bytes:
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": "bench", "name": "p-1", "object": pod, "userInfo": {"username": "bench"}}})


def endpoints() -> dict[str, AdmissionEndpoint]:
    # The decision log goes where serve sends it, stderr, here /dev/null; tracebacks stay visible.
    real_stderr = sys.stderr
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(os.open(os.devnull, os.O_WRONLY), "w")))
    try:
        configure_logging("info")
    finally:
        sys.stderr = real_stderr
    app = create_app(config=DEFAULT_CONFIG, quota=AllowAll())
    routes = next(value for value in app.extensions.values() if isinstance(value, AdmissionRoutes))
    return {path: routes.endpoints[path] for path in PATHS}


def main(argv: list[str]) -> None:
    pods = int(next((arg for arg in argv if not arg.startswith("-")), "20000"))
    served = endpoints()
    body = review(gpu_pod())

    def one_pod() -> None:
        for path in PATHS:
            answer = served[path].serve({"wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)),
                                         "REMOTE_ADDR": "127.0.0.1"})
            if answer.status != 200:
                raise SystemExit(f"{path} answered {answer.status}: {answer.body!r}")

    for _ in range(2000):  # warm the memo caches, as a serving worker's are
        one_pod()
    per_round = max(pods // 5, 1)
    rounds = []
    for _ in range(5):
        started = time.process_time()
        for _ in range(per_round):
            one_pod()
        rounds.append((time.process_time() - started) / per_round * 1e6)
    print(f"{Path.cwd().name}: µs of CPU per pod (mutating + validating review): "
          f"{' '.join(f'{r:.1f}' for r in rounds)}; best {min(rounds):.1f}")
    if "--profile" in argv:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(per_round):
            one_pod()
        profile.disable()
        stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        total = sum(row[3] for (_file, _line, name), row in stats.items() if name == "one_pod")
        for part, where in PARTS:
            spent = sum(row[3] for (file, _line, name), row in stats.items() if name == part and where in file)
            print(f"  {part:16s} {100 * spent / total:5.1f} % (under cProfile)")


if __name__ == "__main__":
    main(sys.argv[1:])
