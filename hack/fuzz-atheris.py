"""Coverage-guided fuzzing (atheris/libFuzzer) of everything the webhook reads from outside.

One target, three layers: the AdmissionReview decoder, the pod walker + canonical rewrite +
validation, and the quantity parser. The contract is the webhook's: a result, or BadRequest /
PodShapeError / QuantityError, which become 400 or a clear deny. Anything else would be a 500.

Run: make fuzz-atheris [RUNS=200000]   (installs atheris into .venv on first use)
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import atheris

with atheris.instrument_imports():
    from gpuquota_core.canonical import canonicalize_pod
    from gpuquota_core.podspec import PodShapeError, pod_requests, read_containers
    from gpuquota_core.quantity import Quantity, QuantityError
    from gpuquota_core.validation import validate_pod_gpu
    from webhook.admission.review import BadRequest, decode_review

EXPECTED = (BadRequest, PodShapeError, QuantityError)


def one_input(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    if provider.ConsumeBool():
        with contextlib.suppress(QuantityError):
            Quantity.parse(provider.ConsumeUnicodeNoSurrogates(64))
        return
    try:
        request = decode_review(provider.ConsumeBytes(provider.remaining_bytes()))
        if request.object is None:
            return
        result = canonicalize_pod(request.object)
        spec = result.obj.get("spec")
        if isinstance(spec, dict):
            containers = read_containers(spec)
            validate_pod_gpu(containers, pod_requests(spec, containers))
    except EXPECTED:
        pass


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
