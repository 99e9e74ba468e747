"""The conversion table: how each accepted GPU spelling becomes the canonical Koordinator form.

Like Kueue's resource transformations, a rule names an input resource, the output quantities per
one unit of input, and whether the input is replaced or retained. Unlike Kueue, the result is
written into the pod itself, so the scheduler and every ElasticQuota see one set of names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from typing import Any

from .enforcement import DEFAULT_ENFORCEMENT, EnforcementConfig, EnforcementError, load_enforcement
from .placement import RewritePolicy
from .podspec import as_mapping
from .quantity import QuantityError, parse_quantity
from .resources import (
    AMD_GPU,
    DEPRECATED_RENAMES,
    GPU_CORE,
    GPU_MEMORY_RATIO,
    HYGON_DCU,
    KOORD_GPU,
    NVIDIA_GPU,
    PERCENT_PER_CARD,
)

GPU_MODEL_LABEL = "node.koordinator.sh/gpu-model"
CONFIG_KEYS: tuple[str, ...] = ("transformations", "gpuMemoryByModel", "gpuModelLabel", "renameDeprecated",
                                 "enforcement", "rewrite")
RULE_KEYS: tuple[str, ...] = ("input", "outputs", "strategy", "wholeUnitsOnly", "vendor")
# The value of node.koordinator.sh/gpu-vendor on the nodes whose cards a vendor name counts.
# Koordinator defines "nvidia" (apis/extension/device_share.go) and reads a node without the label
# as NVIDIA; for AMD and Hygon it defines none (koordlet copies whatever the vendor's device
# report says), so these two are this project's defaults, set per rule with ``vendor``.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
DEFAULT_VENDORS: Mapping[str, str] = {NVIDIA_GPU: "nvidia", AMD_GPU: "amd", HYGON_DCU: "hygon"}


class ConfigError(ValueError):
    """A conversion configuration that cannot be used; the message names the offending entry."""


class Strategy(Enum):
    REPLACE = "Replace"
    RETAIN = "Retain"


@dataclass(frozen=True, slots=True)
class ConversionRule:
    input: str
    outputs: Mapping[str, Fraction]  # output quantity per one unit of input
    strategy: Strategy = Strategy.REPLACE
    # Vendor counts are whole cards: a fractional count is left for the API server to refuse rather
    # than silently turned into a share.
    whole_units_only: bool = False
    # The node.koordinator.sh/gpu-vendor value of the nodes whose cards the input counts (None: the
    # input names no vendor). The outputs name none, so the rewrite keeps the pod on that vendor's
    # nodes (gpuquota_core.placement).
    vendor: str | None = None


def _cards(name: str) -> ConversionRule:
    per_card = Fraction(PERCENT_PER_CARD)
    return ConversionRule(name, {GPU_CORE: per_card, GPU_MEMORY_RATIO: per_card}, whole_units_only=True,
                          vendor=DEFAULT_VENDORS[name])


DEFAULT_RULES: tuple[ConversionRule, ...] = (
    _cards(NVIDIA_GPU),
    _cards(AMD_GPU),
    _cards(HYGON_DCU),
    ConversionRule(KOORD_GPU, {GPU_CORE: Fraction(1), GPU_MEMORY_RATIO: Fraction(1)}),
)


@dataclass(frozen=True, slots=True)
class ConversionConfig:
    rules: tuple[ConversionRule, ...] = DEFAULT_RULES
    # Bytes of memory per card, by GPU model: the only way bytes can become a ratio (as Koordinator's
    # scheduler does after allocation, pkg/scheduler/plugins/deviceshare/devicehandler_gpu.go).
    gpu_memory_by_model: Mapping[str, int] = field(default_factory=dict)
    model_label: str = GPU_MODEL_LABEL
    rename_deprecated: bool = True
    # Per-check enforce / warn / dry-run of /validate-pods (gpuquota_core.enforcement); it lives in
    # the same file so one reload swaps the table and the modes together.
    enforcement: EnforcementConfig = DEFAULT_ENFORCEMENT
    # Whether a pod is rewritten at all (gpuquota_core.placement): only where a node it can reach
    # advertises the canonical names (auto), regardless (always), or never (count only).
    rewrite: RewritePolicy = RewritePolicy.AUTO

    def rule_for(self, name: str) -> ConversionRule | None:
        for rule in self.rules:
            if rule.input == name:
                return rule
        return None

    @property
    def input_names(self) -> frozenset[str]:
        return frozenset(rule.input for rule in self.rules)


DEFAULT_CONFIG = ConversionConfig()


def load_config(document: Mapping[str, Any] | None) -> ConversionConfig:
    """Build a config from its YAML form; absent sections keep the defaults.

    ``transformations: [{input, outputs: {name: qty}, strategy: Replace|Retain}]`` replaces the
    default table; ``gpuMemoryByModel: {model: 80Gi}`` enables bytes → ratio for pinned models;
    ``enforcement: {default: enforce, checks: {QuotaExceeded: warn}}`` sets the enforcement modes;
    ``rewrite: auto|always|never`` whether pods are rewritten (gpuquota_core.placement). A rule's
    ``vendor`` (default: by its input, DEFAULT_VENDORS) is the gpu-vendor label of the nodes its
    input's cards are on.
    """
    if document is None:
        return DEFAULT_CONFIG
    if not isinstance(document, Mapping):
        raise ConfigError("the conversion config must be a mapping")
    # A misspelt section ("transformation:") would otherwise fall back to the defaults in silence.
    _no_unknown_keys(document, CONFIG_KEYS, "the conversion config")
    rename = document.get("renameDeprecated", True)
    if not isinstance(rename, bool):
        raise ConfigError("renameDeprecated must be true or false")
    rules = DEFAULT_RULES
    if "transformations" in document:
        rules = tuple(_load_rule(i, raw) for i, raw in enumerate(_list(document["transformations"],
                                                                         "transformations")))
        _check_rules(rules, rename)
    models: dict[str, int] = {}
    for model, raw in as_mapping(document.get("gpuMemoryByModel"), "gpuMemoryByModel", _not_a_mapping).items():
        try:
            size = parse_quantity(raw)
        except QuantityError as error:
            raise ConfigError(f"gpuMemoryByModel[{model}]: {error}") from None
        if size.amount <= 0 or not size.is_integer():
            raise ConfigError(f"gpuMemoryByModel[{model}]: must be a positive whole number of bytes")
        models[str(model)] = size.ceil()
    model_label = document.get("gpuModelLabel", GPU_MODEL_LABEL)
    if not isinstance(model_label, str) or not model_label:
        raise ConfigError("gpuModelLabel must be a non-empty string")
    try:
        enforcement = load_enforcement(document.get("enforcement"))
    except EnforcementError as error:
        raise ConfigError(str(error)) from None
    policies = [policy.value for policy in RewritePolicy]
    raw_policy = document.get("rewrite", RewritePolicy.AUTO.value)
    if raw_policy not in policies:
        raise ConfigError(f"rewrite must be one of {', '.join(policies)}, not {raw_policy!r}")
    return ConversionConfig(rules, models, model_label, rename, enforcement, RewritePolicy(raw_policy))


def _not_a_mapping(where: str) -> ConfigError:
    return ConfigError(f"{where} must be a mapping")


def _no_unknown_keys(document: Mapping[Any, Any], known: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(key) for key in document if key not in known)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (expected one of {', '.join(known)})")


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(f"{where} must be a list")
    return value


def _load_rule(index: int, raw: object) -> ConversionRule:
    where = f"transformations[{index}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping")
    entry = raw
    _no_unknown_keys(entry, RULE_KEYS, where)
    name = entry.get("input")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.input must be a resource name")
    outputs: dict[str, Fraction] = {}
    for output, quantity in as_mapping(entry.get("outputs"), f"{where}.outputs", _not_a_mapping).items():
        try:
            per_unit = parse_quantity(quantity)
        except QuantityError as error:
            raise ConfigError(f"{where}.outputs[{output}]: {error}") from None
        if per_unit.amount < 0:
            raise ConfigError(f"{where}.outputs[{output}] must not be negative")
        outputs[str(output)] = per_unit.amount
    try:
        strategy = Strategy(entry.get("strategy", Strategy.REPLACE.value))
    except ValueError:
        raise ConfigError(f"{where}.strategy must be Replace or Retain") from None
    whole = entry.get("wholeUnitsOnly", name in (NVIDIA_GPU, AMD_GPU, HYGON_DCU))
    if not isinstance(whole, bool):
        raise ConfigError(f"{where}.wholeUnitsOnly must be true or false")
    vendor = entry.get("vendor", DEFAULT_VENDORS.get(name))
    # It is written into pods' node affinity, which the API server checks as a label value.
    if vendor is not None and (not isinstance(vendor, str) or not _LABEL_VALUE.fullmatch(vendor)):
        raise ConfigError(f"{where}.vendor must be a node.koordinator.sh/gpu-vendor value, or null for none")
    return ConversionRule(name, outputs, strategy, whole, vendor)


def _check_rules(rules: tuple[ConversionRule, ...], rename_deprecated: bool = True) -> None:
    inputs = [rule.input for rule in rules]
    duplicates = sorted({name for name in inputs if inputs.count(name) > 1})
    if duplicates:
        raise ConfigError(f"transformations: input {duplicates[0]} is listed twice")
    for rule in rules:
        # A chain (a → b, b → c) or a retained input would make the rewrite depend on how often it
        # runs; reinvocation must be a no-op, so the table has to reach its canonical form in one pass.
        chained = sorted(set(rule.outputs) & set(inputs))
        if chained:
            raise ConfigError(f"transformations: output {chained[0]} of {rule.input} is itself an input")
        if rule.strategy is Strategy.RETAIN and not rule.outputs:
            raise ConfigError(f"transformations: {rule.input} retains its input and adds nothing")
        if rename_deprecated:
            # Deprecated names are renamed before the table runs: an input spelt that way never
            # matches, and an output spelt that way would be renamed by the next pass.
            if rule.input in DEPRECATED_RENAMES:
                raise ConfigError(f"transformations: input {rule.input} is renamed to "
                                  f"{DEPRECATED_RENAMES[rule.input]} before conversion; use that name")
            deprecated = sorted(set(rule.outputs) & set(DEPRECATED_RENAMES))
            if deprecated:
                raise ConfigError(f"transformations: output {deprecated[0]} of {rule.input} is a deprecated name; "
                                  f"use {DEPRECATED_RENAMES[deprecated[0]]}")


def pinned_gpu_model(spec: Mapping[str, Any], label: str = GPU_MODEL_LABEL) -> str | None:
    """The one GPU model a pod can only land on, from its nodeSelector or required node affinity."""
    models: set[str] = set()
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and isinstance(selector.get(label), str):
        models.add(selector[label])
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
                if isinstance(node_affinity, Mapping) else None)
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if isinstance(terms, list) and terms:
        # Terms are ORed: the model is pinned only if every term pins the same single model.
        per_term = [_term_model(term, label) for term in terms]
        if all(model is not None for model in per_term):
            models.update(model for model in per_term if model is not None)
    return models.pop() if len(models) == 1 else None


def _term_model(term: object, label: str) -> str | None:
    if not isinstance(term, Mapping) or not isinstance(term.get("matchExpressions"), list):
        return None
    for expression in term["matchExpressions"]:
        if (isinstance(expression, Mapping) and expression.get("key") == label
                and expression.get("operator") == "In" and isinstance(expression.get("values"), list)
                and len(expression["values"]) == 1 and isinstance(expression["values"][0], str)):
            return str(expression["values"][0])
    return None


def memory_bytes_to_ratio(memory_bytes: int, card_bytes: int, shared: int = 1) -> int:
    """Percent of a card that holds ``memory_bytes``, rounded *up* so the pod never gets less.

    With ``gpu.shared`` the total must split evenly over the devices, so it is rounded up to a
    multiple of ``shared`` too.
    """
    ratio = math.ceil(Fraction(memory_bytes * PERCENT_PER_CARD, card_bytes))
    devices = max(shared, 1)
    return math.ceil(Fraction(ratio, devices)) * devices

