"""What the quota service process is started with, as typed values.

The server's settings hold one :class:`QuotaServiceOptions` (``Settings.quota``), filled by
``gpuquota serve`` from the options named after its fields. The gunicorn master resolves the ledger
namespace in it and hands it to ``python -m webhook.quota.service`` as one JSON argument, read back
into the same dataclass: a new option is a field here and a flag of ``serve``, with no settings
field, argv flag, parser line or parameter in between. The fields' meanings and defaults live only
here, beside the service that applies them (serving knows quota, never the reverse).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpuquota_core.ledger import DEFAULT_TTL_SECONDS


class Accounting(StrEnum):
    """Where quota reservations are kept (docs/accounting.md "Several replicas")."""

    # In this server instance's own memory: a burst spread over N replicas can admit up to N times the room.
    LOCAL = "local"
    # In a ledger ConfigMap per quota tree, written before each admission and shared by all replicas.
    STRICT = "strict"

    @classmethod
    def spelled(cls) -> str:
        """The modes as a refusal lists them: "local or strict"."""
        return " or ".join(mode.value for mode in cls)


# How long the list/watch of a kind may keep failing before the view counts as stale and /readyz
# fails. Longer than a control-plane rolling restart, shorter than the time in which a cluster's
# quota usage drifts far from what was last seen.
DEFAULT_STALE_AFTER_SECONDS = 120.0
# Unconfirmed reservations one caller may hold at once. The API server's own admissions are
# confirmed by the watch within a second, so it holds roughly (creates per second x watch lag),
# far below this; a caller posting forged reviews is stopped here, and what it holds expires.
DEFAULT_MAX_RESERVATIONS_PER_CALLER = 500
# The port of the listener a writer-lease holder answers the other replicas' admissions on.
DEFAULT_PEER_PORT = 8444


@dataclass(frozen=True, slots=True)
class QuotaServiceOptions:
    """Everything one quota service process is started with (``webhook.quota.service.run_service``)."""

    # A file or directory of manifests standing in for the cluster (offline mode); None = live.
    state_path: Path | None = None
    # Live mode: the kubeconfig (and context) to watch the cluster with; None = in-cluster config.
    kubeconfig_path: Path | None = None
    context: str | None = None
    accounting: Accounting = Accounting.LOCAL
    # Namespace of strict accounting's ledger ConfigMaps, already resolved (the flag or the pod's own).
    ledger_namespace: str = ""
    # Seconds a failing list/watch may last before /readyz reports the quota view stale.
    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS
    # How long an admitted pod holds room before the watch must have shown it (see gpuquota_core.ledger).
    reservation_ttl_seconds: float = DEFAULT_TTL_SECONDS
    # Unconfirmed reservations one caller (TLS peer) may hold.
    max_reservations_per_caller: int = DEFAULT_MAX_RESERVATIONS_PER_CALLER
    # Strict accounting: the Lease (in the ledger namespace) whose holder writes every ledger, the
    # other replicas forwarding their admissions to it (webhook.quota.strict.forwarding); "" = every
    # replica decides and writes its own admissions, in the degraded mode (fresh reads, no escrow).
    writer_lease: str = ""
    # Where the other replicas reach this one's listener: the host (""= $POD_IP, else this host's
    # address) and the port (0 = any free one; the Lease carries the one bound).
    peer_address: str = ""
    peer_port: int = DEFAULT_PEER_PORT
    # The serving certificate and key's directory, which the listener serves and whose key signs the
    # forwarded requests: not a flag of its own, the server fills it from --cert-dir.
    tls_dir: Path | None = None

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(option.name for option in dataclasses.fields(cls))

    def to_json(self) -> str:
        return json.dumps({name: _encoded(getattr(self, name)) for name in self.field_names()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> QuotaServiceOptions:
        """The options :meth:`to_json` wrote; a ValueError naming the field for anything else."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"quota service options are not JSON: {error}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"quota service options must be a JSON object, not {type(raw).__name__}")
        unknown = sorted(set(raw) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"unknown quota service options: {', '.join(unknown)}")
        hints = typing.get_type_hints(cls)
        return cls(**{name: _decoded(name, hints[name], value) for name, value in raw.items()})


def _encoded(value: object) -> object:
    return str(value) if isinstance(value, Path) else value


def _decoded(name: str, hint: Any, value: object) -> Any:
    """``value`` read back as the field's type (``hint``): X or ``X | None`` for the types above."""
    choices = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in choices:
        return None
    kind = next(choice for choice in choices if choice is not type(None))
    if kind is Accounting and isinstance(value, str) and value in {mode.value for mode in Accounting}:
        return Accounting(value)
    if kind is Path and isinstance(value, str):
        return Path(value)
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is str and isinstance(value, str):
        return value
    raise ValueError(f"quota service option {name} must be {getattr(kind, '__name__', kind)}, not {value!r}")
