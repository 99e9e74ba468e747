"""A worker's QuotaDecider: asks the quota service over its Unix socket, with bounded timeouts.

If the service is down or slow the pod is refused (validation fails closed) instead of hanging.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

from .quota_port import PodAdmission, Verdict
from .quota_wire import recv_frame, send_frame

DEFAULT_TIMEOUT_SECONDS = 2.0


class QuotaClient:
    def __init__(self, path: Path, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.path = path
        self.timeout = timeout
        self._local = threading.local()  # one connection per worker thread

    def _call(self, message: dict[str, Any]) -> Any:
        for attempt in (1, 2):  # one retry on a stale kept connection
            sock: socket.socket | None = getattr(self._local, "sock", None)
            try:
                if sock is None:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.settimeout(self.timeout)
                    sock.connect(str(self.path))
                    self._local.sock = sock
                send_frame(sock, message)
                reply = recv_frame(sock)
                if reply is None:
                    raise ConnectionError("quota service closed the connection")
                return reply
            except (OSError, ValueError):
                if sock is not None:
                    sock.close()
                self._local.sock = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def ready(self) -> tuple[bool, str]:
        try:
            reply = self._call({"op": "ready"})
        except (OSError, ValueError) as error:
            return False, f"quota service unreachable: {error}"
        return bool(reply["ready"]), str(reply["reason"])

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        try:
            # orjson writes the dataclass itself; asdict would deep-copy its label and request maps first.
            reply = self._call({"op": "admit_pod", "admission": admission})
        except (OSError, ValueError) as error:
            return Verdict(False, f"quota service unavailable, pod not admitted: {error}", 503, "QuotaServiceDown")
        return self._verdict(reply)

    def review_elasticquota(self, operation: str, quota: dict[str, Any], old_quota: dict[str, Any] | None,
                            dry_run: bool) -> Verdict:
        try:
            reply = self._call({"op": "review_elasticquota", "quota": quota})
        except (OSError, ValueError) as error:
            return Verdict(False, f"quota service unavailable, quota not admitted: {error}", 503,
                           "QuotaServiceDown")
        return self._verdict(reply)

    @staticmethod
    def _verdict(reply: dict[str, Any]) -> Verdict:
        reply["warnings"] = tuple(reply.get("warnings", ()))
        return Verdict(**reply)
