"""Every hint the CLI gives that names a flag or quotes a command line, in one place.

A hint names flags of the commands that give it; tests/cli/test_hints.py runs every command line a
hint quotes through click's parser and checks every flag it names against those commands, so a
flag renamed or missing fails there instead of in front of a user. (Messages of the core that
quote a ``gpuquota`` command line are checked by the same test, from the source.)
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuquota_core.migration import PRE_MIGRATION_SPEC_ANNOTATION
from gpuquota_core.quota_admission import IN_PROGRESS, MIGRATION_IN_PROGRESS_ANNOTATION


@dataclass(frozen=True)
class Hint:
    """``text``, given by each of ``commands`` (paths below ``gpuquota``, e.g. ``migrate apply``),
    with ``{placeholders}`` for values known only when it is given."""

    commands: tuple[str, ...]
    text: str

    def __call__(self, **values: object) -> str:
        return self.text.format(**values)


_MANIFESTS_INSTEAD = "give --kubeconfig, or -f for manifest files"

# No kubeconfig found and not in a pod: what the command could be given instead. Only the commands
# that read a cluster have a manifest alternative; the others write to one.
NO_CLUSTER: dict[str, Hint] = {
    "audit": Hint(("audit",), _MANIFESTS_INSTEAD),
    "quota": Hint(("quota",), _MANIFESTS_INSTEAD),
    "migrate plan": Hint(("migrate plan",), _MANIFESTS_INSTEAD),
    "explain": Hint(("explain",), "give --kubeconfig, or --state for manifest files that stand in for the cluster"),
    "migrate apply": Hint(("migrate apply",), "give --kubeconfig: apply writes to a cluster"),
    "migrate rollback": Hint(("migrate rollback",), "give --kubeconfig: rollback writes to a cluster"),
    "policyreport apply": Hint(("policyreport apply",), "give --kubeconfig: the reports are applied to a cluster"),
    "preflight": Hint(("preflight",), "give --kubeconfig: preflight checks an install in a cluster"),
}

FILES_OR_CLUSTER = Hint(("audit", "quota"), "-f reads manifests; --kubeconfig/--context are for a live cluster: "
                                            "give one or the other")
STATE_OR_CLUSTER = Hint(("explain",), "--state reads manifests; --kubeconfig/--context are for a live cluster: "
                                      "give one or the other")

_NO_NODES = ("no Node objects in {where}: rewrote as `rewrite: always` would; give the cluster's nodes too "
             "({example}) to decide as the webhook does")
# Without Node objects there is nothing to decide `rewrite: auto` with; where the nodes would go.
NO_NODES: dict[str, Hint] = {
    "convert": Hint(("convert",), _NO_NODES.format(where="the input", example="e.g. -f nodes.yaml")),
    "explain": Hint(("explain",), _NO_NODES.format(where="--state", example="e.g. --state nodes.yaml")),
}

CERT_NEEDS_A_NAME = Hint(("certs generate",), "give --service/--namespace, --dns or --ip: a certificate needs a "
                                              "name to be valid for")
CA_KEPT = Hint(("certs generate",), "webhook configurations trust that CA through their caBundle, so it is kept: "
                                   "give --force to replace it, or another --out")
CLIENT_CERT_KEPT = Hint(("certs client",), "give --force to replace them, or another --out")

BOTH_MODES = Hint(("migrate plan", "migrate apply"),
                  "--all-at-once is for ElasticQuotaEnableUpdateResourceKey off; with the gate on "
                  "(--update-resource-key-gate) the step-by-step plan needs no maintenance window: drop one of "
                  "the two flags")
BACKUP_REQUIRED = Hint(("migrate apply",), "--backup FILE is required (a new file that receives every quota before "
                                           "it changes), unless --dry-run=client")
BACKUP_EXISTS = Hint(("migrate apply",), "{backup} exists; choose a new backup file (an old backup is never "
                                         "overwritten)")
APPLY_STOPPED = Hint(("migrate apply",), "originals are in {backup}; undo with `gpuquota migrate rollback -f "
                                         "{backup}`, or re-run apply with a new backup file")
APPLY_ALL_AT_ONCE_STOPPED = Hint(
    ("migrate apply",),
    f"the maintenance window is still open: quotas marked {MIGRATION_IN_PROGRESS_ANNOTATION}={IN_PROGRESS} are "
    "detached from their parent. Resume with `gpuquota migrate apply --all-at-once --backup NEW_FILE` (it re-plans "
    "from the current state and reattaches every detached quota under the parent recorded in its "
    f"{PRE_MIGRATION_SPEC_ANNOTATION} annotation), or undo with `gpuquota migrate rollback -f {{backup}}`")
# Said after any refusal: a quota changed since the migration, one that cannot be read, or one of
# another namespace in the same tree.
ROLLBACK_REFUSED = Hint(("migrate rollback",), "nothing written: fix or restore each refused quota by hand (or leave "
                                               "another namespace's out with -n), then run rollback again")
ROLLBACK_STOPPED = Hint(("migrate rollback",), "re-run `gpuquota migrate rollback` to continue from the current state")


def every_hint() -> list[Hint]:
    """Every hint of this module (for the test that checks them all)."""
    found: list[Hint] = []
    for value in globals().values():
        if isinstance(value, Hint):
            found.append(value)
        elif isinstance(value, dict):
            found += [hint for hint in value.values() if isinstance(hint, Hint)]
    return found
