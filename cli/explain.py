"""``gpuquota explain``: what the webhook would answer for a pod, or a workload's pod template,
before it is created.

Nothing here decides: the pod goes through the webhook's own handlers (``AdmissionHandlers``:
``mutate_pod``, then ``validate_pod`` on the patched pod, as the API server calls them) against the
webhook's own quota state (``QuotaState``) loaded from the same snapshot ``gpuquota serve --state``
or a live cluster gives it. The headroom table is :func:`gpuquota_core.quota_view.chain_headroom`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpuquota_core import shared_ledger
from gpuquota_core.audit import TEMPLATE_PATHS, template_of, template_pod_name
from gpuquota_core.conversion import ConversionConfig
from gpuquota_core.enforcement import INVALID, InTurn, Mode, Relaxed
from gpuquota_core.gang import POD_GROUP_KIND
from gpuquota_core.gang_view import (
    FIT_ALL,
    FIT_NONE,
    GangFit,
    gang_fit,
    how_many_fit,
    pod_gang,
    scratch_ledger,
    workload_in_turn,
)
from gpuquota_core.jsonpatch import apply
from gpuquota_core.placement import NodeView, RewritePolicy
from gpuquota_core.pod_records import gpu_memory_unknown, remembered_pod_requests
from gpuquota_core.podspec import CONTAINER_KINDS, PodShapeError, as_mapping, mapping_or_empty
from gpuquota_core.quota_decision import PodQuotaRequest
from gpuquota_core.quota_objects import POD_QUOTA_LABEL
from gpuquota_core.quota_view import LevelHeadroom, chain_headroom, describe_rule, with_cards, workload_replicas
from gpuquota_core.resources import ResourceList, add_lists
from gpuquota_core.unjudged import why_unjudged

from . import hints, snapshot
from .errors import CommandError
from .inputs import readable_objects
from .output import document, table

if TYPE_CHECKING:
    from gpuquota_core.ledger import ReservationLedger
    from gpuquota_core.pod_admission import PodAdmission, Verdict
    from gpuquota_core.shared_ledger import StoredReservation
    from webhook.admission.decisions import AdmissionHandlers
    from webhook.admission.review import AdmissionRequest
    from webhook.quota.state import QuotaState

REFUSED_EXIT = 1
# A workload of several pods of which some fit now, not all (docs/cli.md, exit status). Not 3, which
# says that part of the input was left out on the branch this one merges into.
SOME_FIT_EXIT = 4
EXISTING_NOTE = ("The pod already exists in the cluster: judged as if created in its place (its own usage is "
                 "not in USED)")
REWROTE_PREFIX = "gpuquota rewrote "
NOTE_PREFIX = "gpuquota: "


@dataclass
class Subject:
    """A pod to explain: a Pod as given, or the pod a workload's template would create."""

    source: str  # "Pod team-nlp/x" or "Deployment team-nlp/inference"
    pod: dict[str, Any]
    replicas: int | None = None


@dataclass
class Explanation:
    subject: Subject
    admitted: bool
    code: int
    reason: str
    message: str
    rewrites: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    would_deny: list[dict[str, str]] = field(default_factory=list)
    quota: str | None = None
    rule: str = ""
    rule_text: str = ""
    chain: list[str] = field(default_factory=list)
    levels: list[LevelHeadroom] = field(default_factory=list)
    fit: int | None = None  # of a workload's replicas, how many fit the quota one after another now
    # What enforcement does with the workload's pods one after another: how many it admits, and how
    # many of those only because a check is in warn or dry-run (None for a single pod).
    in_turn: InTurn | None = None
    gang: GangFit | None = None  # the gang the pod is a member of: whether its whole minimum fits now
    mutation_note: str = ""
    patch: list[dict[str, Any]] = field(default_factory=list)
    # The pod is already in the state (same namespace and name): judged as if created in its place,
    # so its own usage is not counted twice (once in USED, again in POD ADDS).
    existing: bool = False
    # The validation rules that refused the request (422 Invalid): the quota decision is never reached.
    invalid_rules: list[str] = field(default_factory=list)
    # /mutate-pods refused the pod, so /validate-pods was never asked.
    refused_by_mutation: bool = False

    def mutation_summary(self) -> str:
        return _mutation_summary(self)

    def as_dict(self) -> dict[str, Any]:
        return {"subject": self.subject.source, "admitted": self.admitted, "code": self.code,
                "reason": self.reason, "message": self.message, "existing": self.existing,
                "invalidRules": self.invalid_rules,
                "mutation": {"rewrites": self.rewrites, "notes": self.notes, "patch": self.patch,
                             "summary": self.mutation_summary()},
                "warnings": self.warnings, "wouldDeny": self.would_deny,
                "quota": self.quota, "rule": self.rule, "chain": self.chain,
                "headroom": [level.as_dict() for level in self.levels],
                "gang": None if self.gang is None else self.gang.as_dict(),
                **({"replicas": self.subject.replicas, "replicasThatFit": self.fit, "fit": self.fit_word(),
                    "replicasAdmitted": self.replicas_admitted(),
                    "replicasWouldBeRefused": None if self.in_turn is None else self.in_turn.would_be_refused,
                    "wouldDenyBeyondFit": None if self.in_turn is None or self.in_turn.beyond_fit is None
                    else _would_deny(self.in_turn.beyond_fit)}
                   if self.subject.replicas is not None else {})}

    def fit_word(self) -> str:
        """``all``, ``some`` or ``none`` of a workload's pods fit now (a single pod: admitted or not)."""
        if self.subject.replicas is None or self.fit is None:
            return FIT_ALL if self.admitted else FIT_NONE
        return how_many_fit(self.subject.replicas, self.fit)

    def replicas_admitted(self) -> int | None:
        """Of a workload's pods, how many the webhook admits, under warn or dry-run too (None: not
        counted, the pod is refused before its quota is reached, or a single pod)."""
        return None if self.in_turn is None else self.in_turn.admitted

    def admitted_word(self) -> str:
        """``all``, ``some`` or ``none`` of a workload's pods admitted (a single pod: admitted or not)."""
        admitted = self.replicas_admitted()
        if self.subject.replicas is None or admitted is None:
            return FIT_ALL if self.admitted else FIT_NONE
        return how_many_fit(self.subject.replicas, admitted)

    @property
    def exit_status(self) -> int:
        # What the webhook does: a pod a check in warn or dry-run lets through is admitted.
        word = self.admitted_word()
        return 0 if word == FIT_ALL else REFUSED_EXIT if word == FIT_NONE else SOME_FIT_EXIT


def _would_deny(relaxed: Relaxed) -> dict[str, str]:
    return {"check": relaxed.check, "mode": relaxed.mode.value, "message": relaxed.message}


class _SnapshotDecider:
    """The webhook's quota decider over one snapshot (a ``QuotaDecider``). Every review it sees is
    a dry run, so nothing is reserved; with strict accounting's stored reservations it judges as a
    strict replica does, against the ledger as stored."""

    def __init__(self, state: QuotaState, reservations: Mapping[str, StoredReservation]) -> None:
        self.state = state
        self.reservations = reservations

    def alive(self) -> tuple[bool, str]:
        return True, "explain decides in this process"

    def ready(self) -> tuple[bool, str]:
        return self.state.ready()

    def holding_room(self) -> ReservationLedger:
        """The reservations the decision counts: the stored ones still holding room, else the
        state's own (empty: explain reserves nothing)."""
        if self.reservations:
            return shared_ledger.holding_room(self.reservations, self.state.usage, time.time(),
                                              self.state.ledger.ttl_seconds)
        return self.state.ledger

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        if self.reservations:
            from webhook.quota.strict.batch_plan import judge_batch

            return judge_batch(self.state, [admission], self.reservations, time.time())[0][0]
        return self.state.admit_pod(admission)

    def review_elasticquota(self, quota: dict[str, Any]) -> Verdict:
        raise NotImplementedError("explain reviews pods only")


@click.command()
@click.option("-f", "--filename", "paths", multiple=True, required=True,
              help="Pod, workload (Deployment, Job, CronJob, ...) or AdmissionReview: file, directory or -.")
@click.option("--state", "state_paths", multiple=True,
              help="Manifests that stand in for the cluster (as for 'serve --state').")
@click.option("--kubeconfig", default=None, help="Kubeconfig of the live cluster (default: $KUBECONFIG, "
              "~/.kube/config, in-cluster).")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("-n", "--namespace", default=None, help="Namespace of objects that name none (default: the "
              "context's, or 'default' with --state).")
@click.option("-o", "--output", "fmt", default="text", type=click.Choice(["text", "json", "yaml"]))
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="The webhook's YAML config file (its conversion table and enforcement modes, as 'serve "
              "--config' reads it; built-in defaults, every check enforced, without it).")
def explain(paths: tuple[str, ...], state_paths: tuple[str, ...], kubeconfig: str | None, context: str | None,
            namespace: str | None, fmt: str, config_path: Path | None) -> None:
    """Show what the webhook would do with a pod before it is created.

    What /mutate-pods would rewrite (or leave as written, and why), whether /validate-pods would
    refuse it and with which message, the quota chain it resolves to and by which rule, and the
    room at each level before and after; for a gang member, whether its gang's whole minimum fits.
    Exit 0 when every pod would be admitted, 1 when one is refused, 4 when only some of a
    workload's pods are admitted now (under warn or dry-run enforcement, --config, the pods they
    let through over the quota are admitted too, as the webhook admits them).
    """
    config = snapshot.conversion_config(config_path)
    if state_paths and (kubeconfig or context):
        raise CommandError(hints.STATE_OR_CLUSTER())
    origins: dict[int, str] = {}
    given = readable_objects(paths, nothing_to="explain", origins=origins)
    state_snapshot = (snapshot.from_files(state_paths, "explain against") if state_paths
                      else snapshot.from_cluster(kubeconfig, context))
    if namespace is None:
        if state_snapshot.live:
            from kubeaccess.kube import context_namespace

            namespace = context_namespace(kubeconfig, context)
        else:
            namespace = "default"
    # A workload that cannot be read down to its pod spec is named, never skipped, and never stops the others.
    unreadable = [(f"{origins.get(id(obj), '<input>')}: {obj.get('kind')} {_namespaced_name(obj, namespace)}",
                   unjudged.describe()) for obj in given if obj.get("kind") in TEMPLATE_PATHS
                  and (unjudged := why_unjudged(obj)) is not None]
    subjects = [s for obj in given for s in subjects_of(obj, namespace)]
    if not subjects:
        if unreadable:
            raise CommandError("; ".join(f"{where}: {why}" for where, why in unreadable) + "; nothing to explain")
        raise CommandError(f"{', '.join(paths)}: no Pod, workload with a pod template, or AdmissionReview")
    for where, why in unreadable:
        click.echo(f"{where}: not explained: {why}", err=True)
    if not state_snapshot.live:  # what the --state files hold that is no part of a cluster (an AdmissionReview)
        for note in state_snapshot.notes:
            click.echo(f"note: --state {note}", err=True)
    explanations = explain_all(subjects, state_snapshot, config,
                               pod_groups=[obj for obj in given if obj.get("kind") == POD_GROUP_KIND])
    if fmt == "text":
        click.echo("\n\n".join(render(e) for e in explanations))
    else:
        click.echo(document({"explanations": [e.as_dict() for e in explanations]}, fmt, plain=True))
    statuses = {e.exit_status for e in explanations}
    if unreadable or REFUSED_EXIT in statuses:
        raise SystemExit(REFUSED_EXIT)
    if SOME_FIT_EXIT in statuses:
        raise SystemExit(SOME_FIT_EXIT)


def _namespaced_name(obj: Mapping[str, Any], namespace: str) -> str:
    metadata = mapping_or_empty(obj.get("metadata"))
    return f"{metadata.get('namespace') or namespace}/{metadata.get('name') or metadata.get('generateName') or ''}"


def subjects_of(obj: Mapping[str, Any], namespace: str) -> list[Subject]:
    kind = str(obj.get("kind"))
    metadata = mapping_or_empty(obj.get("metadata"))
    own_namespace = str(metadata.get("namespace") or namespace)
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    if kind == "AdmissionReview":
        request = obj.get("request")
        pod = request.get("object") if isinstance(request, Mapping) else None
        if not isinstance(pod, dict):
            raise CommandError("AdmissionReview has no request.object")
        review_namespace = str(request.get("namespace") or "") if isinstance(request, Mapping) else ""
        return subjects_of(pod, review_namespace or namespace)
    if kind == "Pod":
        pod = _quantities_as_text(_plain(obj, name))
        if not isinstance(pod.get("metadata", {}), dict):
            raise CommandError(f"Pod {name or '(unnamed)'}: metadata is not an object")
        pod.setdefault("metadata", {})["namespace"] = own_namespace
        return [Subject(f"Pod {own_namespace}/{name}", pod)]
    template = template_of(obj)
    if template is None:
        return []
    # The pod a controller would create from it: the template's labels and annotations (the quota
    # label among them), a generated name, the workload's namespace.
    template_metadata = mapping_or_empty(template.get("metadata"))
    pod_metadata: dict[str, Any] = {"generateName": template_pod_name(name), "namespace": own_namespace}
    for key in ("labels", "annotations"):
        if isinstance(template_metadata.get(key), Mapping):
            pod_metadata[key] = _plain(template_metadata[key], name)
    pod = _quantities_as_text({"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata,
                               "spec": _plain(template.get("spec") or {}, name)})
    return [Subject(f"{kind} {own_namespace}/{name} (pod template)", pod, workload_replicas(obj))]


def _quantities_as_text(pod: dict[str, Any]) -> dict[str, Any]:
    """Whole-number quantities written unquoted, as the text the API server stores for them.

    A manifest's ``nvidia.com/gpu: 99999999999999999999`` is a YAML integer; the API server keeps a
    quantity as its text, and every review it sends carries that text. Sent as a JSON number it
    would be read back as the nearest float (1e20), and the verdict would quote a number the user
    never wrote.
    """
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return pod
    maps: list[object] = [spec.get("overhead")]
    for kind in CONTAINER_KINDS:
        entries = spec.get(kind)
        for entry in entries if isinstance(entries, list) else ():
            resources = entry.get("resources") if isinstance(entry, dict) else None
            if isinstance(resources, dict):
                maps += [resources.get("requests"), resources.get("limits")]
    for values in maps:
        if isinstance(values, dict):
            for name, value in values.items():
                if type(value) is int:
                    values[name] = str(value)
    return pod


def _plain(value: Any, name: str) -> Any:
    """A JSON copy, as the API server would hold it: YAML timestamps become their text."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (ValueError, RecursionError):
        raise CommandError(f"{name or '(unnamed)'}: not a JSON object the API server would store") from None


def _review(pod: Mapping[str, Any]) -> bytes:
    """The AdmissionReview the API server would send for the pod's CREATE, as a dry run: the quota
    decision then reserves nothing, even in the webhook's own state."""
    metadata = mapping_or_empty(pod.get("metadata"))
    request = {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "resource": {"group": "", "version": "v1", "resource": "pods"},
               "namespace": str(metadata.get("namespace") or ""), "name": str(metadata.get("name") or ""),
               "operation": "CREATE", "userInfo": {"username": "gpuquota-explain"}, "object": pod, "dryRun": True}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def explain_all(subjects: list[Subject], state_snapshot: snapshot.Snapshot,
                config: ConversionConfig, pod_groups: list[dict[str, Any]] | None = None) -> list[Explanation]:
    """``pod_groups``: PodGroups given with the subjects (created with them), beside the cluster's."""
    from gpuquota_core.quota_integrity import QuotaTreeError
    from webhook.admission.decisions import AdmissionHandlers
    from webhook.admission.review import decode_review
    from webhook.quota.state import QuotaState

    state_snapshot.tree(config)  # an unreadable quota: one Error line, before the state reads it
    state = QuotaState()
    if state_snapshot.live:
        # As the live webhook lists them: two quotas of one name already stored are not an error
        # there (the state keeps one; the audit reports both).
        for kind in ("ElasticQuota", "Pod"):
            state.replace_kind(kind, state_snapshot.of_kind(kind))
        state.replace_kind(POD_GROUP_KIND, [*state_snapshot.of_kind(POD_GROUP_KIND), *(pod_groups or [])])
    else:
        try:
            state.load([*state_snapshot.objects, *(pod_groups or [])])  # as `serve --state` loads them
        except QuotaTreeError as error:
            raise CommandError(str(error)) from None
    decider = _SnapshotDecider(state, state_snapshot.reservations)
    nodes = NodeView.from_objects(state_snapshot.objects)
    if nodes is None and config.rewrite is RewritePolicy.AUTO:
        # As `gpuquota convert` does: with no Node to look at, say so and show the rewrite.
        click.echo(hints.NO_NODES["explain"](), err=True)
        config = replace(config, rewrite=RewritePolicy.ALWAYS)
    handlers = AdmissionHandlers(config, decider, lambda: nodes)
    return [_explain(subject, handlers, decider, decode_review) for subject in subjects]


def _explain(subject: Subject, handlers: AdmissionHandlers, decider: _SnapshotDecider,
             decode_review: Callable[[bytes], AdmissionRequest]) -> Explanation:
    """``subject`` as the webhook answers its CREATE; a pod the state already holds is taken out of
    the usage while it is judged (and put back), as if it were created in its own place."""
    usage = decider.state.usage
    metadata = mapping_or_empty(subject.pod.get("metadata"))
    key = f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}"
    stored = usage.discard(key) if metadata.get("name") and usage.get(key) is not None else None
    try:
        result = _judged(subject, handlers, decider, decode_review)
    finally:
        if stored is not None:
            usage.upsert(stored)
    result.existing = stored is not None
    return result


def _judged(subject: Subject, handlers: AdmissionHandlers, decider: _SnapshotDecider,
            decode_review: Callable[[bytes], AdmissionRequest]) -> Explanation:
    mutated = handlers.mutate_pod(decode_review(_review(subject.pod)))
    response = mutated.response
    rewrites = [w.removeprefix(REWROTE_PREFIX) for w in response.warnings if w.startswith(REWROTE_PREFIX)]
    # Everything else the mutating webhook says: why a request was left as written
    # ("gpuquota left ..."), notes ("gpuquota: ..."), the mixed-node warning.
    notes = [w.removeprefix(NOTE_PREFIX).removeprefix("gpuquota ") for w in response.warnings
             if not w.startswith(REWROTE_PREFIX)]
    if not response.allowed:
        refused = Explanation(subject, False, response.code, response.reason, response.message, rewrites, notes,
                              mutation_note=mutated.note)
        if response.reason == INVALID:
            # /mutate-pods refused the GPU request itself, in /validate-pods' words (its note lists the rules).
            refused.invalid_rules, refused.refused_by_mutation = mutated.note.split(","), True
        return refused
    pod = apply(subject.pod, response.patch) if response.patch else subject.pod
    validated = handlers.validate_pod(decode_review(_review(pod)))
    state, reserved = decider.state, decider.holding_room()
    verdict = validated.response
    result = Explanation(subject, verdict.allowed, verdict.code, verdict.reason, verdict.message, rewrites, notes,
                         warnings=list(verdict.warnings),
                         would_deny=[_would_deny(r) for r in validated.relaxed],
                         mutation_note=mutated.note, patch=[dict(op) for op in response.patch or ()])
    if not verdict.allowed and verdict.reason == INVALID:
        # /validate-pods refused the GPU request itself (its note lists the rules): the quota
        # decision is never reached, so nothing is charged anywhere.
        result.invalid_rules = validated.note.split(",")
        return result
    metadata = mapping_or_empty(pod.get("metadata"))
    labels = mapping_or_empty(metadata.get("labels"))
    resolution = state.tree.resolve(str(metadata.get("namespace") or ""), str(labels.get(POD_QUOTA_LABEL) or ""))
    result.quota, result.rule, result.rule_text = resolution.quota, resolution.rule, describe_rule(resolution)
    result.chain = [q.name for q in state.tree.chain(resolution.quota)] if resolution.quota in state.tree.quotas \
        else []
    try:
        requests = remembered_pod_requests(as_mapping(pod.get("spec"), "spec"), handlers.config)
    except PodShapeError:
        return result  # validation refused it as unreadable: there is no request to place

    def used_of(quota: str) -> ResourceList:
        return add_lists(state.usage.used(quota), reserved.used(quota))

    result.levels = chain_headroom(state.tree, resolution, requests, used_of)
    namespace = str(metadata.get("namespace") or "")
    gang = pod_gang(namespace, metadata, state.pod_groups)
    if gang is not None and resolution.quota in state.tree.quotas:
        result.gang = gang_fit(state.tree, resolution.quota, gang, requests, reserved, used_of)
    if subject.replicas is not None:
        request = PodQuotaRequest(namespace, str(metadata.get("name") or metadata.get("generateName") or ""),
                                  str(labels.get(POD_QUOTA_LABEL) or ""), requests, gpu_memory_unknown(requests))
        if not verdict.allowed:
            result.fit, result.in_turn = 0, InTurn(subject.replicas, 0, 0, 0)
        else:
            result.in_turn = workload_in_turn(
                state.tree, state.usage, scratch_ledger(reserved, state.usage), request, gang, subject.replicas,
                time.time(), handlers.config.enforcement, validated.relaxed)
            result.fit = result.in_turn.fit
    return result


def _mutation_summary(e: Explanation) -> str:
    """What /mutate-pods did, in one line: rewrote, left as written (and why), or nothing to do."""
    if e.rewrites:
        return "rewrote"
    if e.refused_by_mutation:
        # Refused before any other mutating webhook can change the request into one that passes.
        return f"refused here, before another mutating webhook can change it (rule: {', '.join(e.invalid_rules)})"
    if e.invalid_rules:
        # The rewrite leaves an invalid value alone for validation to refuse with the user's own number.
        return f"no rewrite (the request is invalid; /validate-pods refuses it, rule: {', '.join(e.invalid_rules)})"
    return f"no rewrite ({e.mutation_note})"


# How a pod that a check in warn or dry-run lets through passes (docs/deploy.md, the enforcement modes).
PASSES = {Mode.WARN: "pass with a warning", Mode.DRY_RUN: "pass silently, recorded as would-deny"}


def _verdict(e: Explanation) -> str:
    if not e.admitted:
        return f"REFUSED ({e.code} {e.reason})"
    turn = e.in_turn
    if turn is None or turn.fit >= turn.replicas:
        return "ADMITTED"
    if turn.beyond_fit is None:
        return f"ADMITTED, but only {turn.fit} of {turn.replicas} pods fit now"
    over = turn.replicas - turn.fit
    how = f"{PASSES[turn.beyond_fit.mode]} ({turn.beyond_fit.check}, {turn.beyond_fit.mode.value} mode)"
    if turn.fit == 0:
        return (f"ADMITTED, all {turn.replicas} pods, but none fit now: all {over} would be refused under enforce "
                f"and {how}")
    return (f"ADMITTED, all {turn.replicas} pods, but only {turn.fit} fit now: the other {over} would be refused "
            f"under enforce and {how}")


def _beyond_fit(turn: InTurn) -> list[str]:
    """The refusal the pods beyond those that fit meet, let through by warn or dry-run; the first
    pod's own would-deny says it when none fits."""
    relaxed = turn.beyond_fit
    if relaxed is None or turn.fit == 0:
        return []
    pods = f"pod {turn.replicas}" if turn.fit + 1 == turn.replicas else f"pods {turn.fit + 1} to {turn.replicas}"
    return [f"  {pods} would be refused ({relaxed.check}, {relaxed.mode.value} mode): {relaxed.message}"]


def render(e: Explanation) -> str:
    lines = [f"{e.subject.source}: {_verdict(e)}"]
    if e.message:
        lines.append(f"  {e.message}")
    for would in e.would_deny:
        lines.append(f"  would be refused ({would['check']}, {would['mode']} mode): {would['message']}")
    if e.in_turn is not None:
        lines += _beyond_fit(e.in_turn)
    lines.append("")
    lines.append("Mutation (/mutate-pods):")
    if not e.rewrites:
        lines.append(f"  {_mutation_summary(e)}")
    lines += [f"  rewrote {r}" for r in e.rewrites]
    lines += [f"  {n}" for n in e.notes]
    lines.append("")
    if e.existing:
        lines.append(EXISTING_NOTE)
    if not e.rule:
        pass  # refused before the quota decision: the pod could not be read
    elif e.quota is None:
        lines.append(f"Quota: none ({e.rule_text})")
    else:
        lines.append(f"Quota: {e.quota}, by rule {e.rule}: {e.rule_text}")
        if e.chain:
            lines.append(f"  chain: {' -> '.join(e.chain)}")
    if e.levels:
        rows = [[level.quota.name, level.resource.removeprefix("koordinator.sh/"),
                 with_cards(level.resource, level.limit), with_cards(level.resource, level.used),
                 with_cards(level.resource, level.charge), with_cards(level.resource, level.before),
                 with_cards(level.resource, level.after), "" if level.fits else "over"]
                for level in e.levels]
        rendered = table(["LEVEL", "RESOURCE", "LIMIT", "USED", "POD ADDS", "FREE BEFORE", "FREE AFTER", ""], rows)
        lines += ["  " + line for line in rendered.splitlines()]
    if e.subject.replicas is not None and e.fit is not None:
        word = e.fit_word()
        line = f"  replicas: {e.subject.replicas}; pods alike that fit now: {e.fit}" + (
            "" if word == FIT_ALL else f" ({word})")
        if e.in_turn is not None and e.in_turn.would_be_refused:
            line += (f"; admitted: {e.in_turn.admitted}, {e.in_turn.would_be_refused} of them only by warn or "
                     "dry-run enforcement")
        lines.append(line)
    if e.gang is not None:
        lines.append(f"Gang: {e.gang.summary()}")
        if not e.gang.complete:
            rows = [[level.quota.name, level.resource.removeprefix("koordinator.sh/"),
                     with_cards(level.resource, level.limit), with_cards(level.resource, level.used),
                     with_cards(level.resource, level.needs), with_cards(level.resource, level.before),
                     with_cards(level.resource, level.after), "" if level.fits else "over"]
                    for level in e.gang.levels]
            rendered = table(["LEVEL", "RESOURCE", "LIMIT", "USED", "GANG ADDS", "FREE BEFORE", "FREE AFTER", ""],
                             rows)
            lines += ["  " + line for line in rendered.splitlines()]
    other = [w for w in e.warnings if not w.startswith(REWROTE_PREFIX)]
    if other:
        lines.append("")
        lines.append("Warnings:")
        lines += [f"  {w}" for w in other]
    return "\n".join(lines)
