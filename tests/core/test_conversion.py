"""The conversion table: defaults, loading it from YAML, and the pinned-model lookup for bytes."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
import yaml

from gpuquota_core.conversion import (
    DEFAULT_CONFIG,
    GPU_MODEL_LABEL,
    ConfigError,
    ConversionRule,
    Strategy,
    load_config,
    memory_bytes_to_ratio,
    pinned_gpu_model,
)

CORE = "koordinator.sh/gpu-core"
RATIO = "koordinator.sh/gpu-memory-ratio"


def test_defaults_need_no_file() -> None:
    assert load_config(None) is DEFAULT_CONFIG
    assert load_config({}) == DEFAULT_CONFIG
    assert DEFAULT_CONFIG.input_names == {"nvidia.com/gpu", "amd.com/gpu", "dcu.com/gpu", "koordinator.sh/gpu"}
    for name, vendor in (("nvidia.com/gpu", "nvidia"), ("amd.com/gpu", "amd"), ("dcu.com/gpu", "hygon")):
        assert DEFAULT_CONFIG.rule_for(name) == ConversionRule(
            name, {CORE: Fraction(100), RATIO: Fraction(100)}, Strategy.REPLACE, whole_units_only=True,
            vendor=vendor)
    assert DEFAULT_CONFIG.rule_for("koordinator.sh/gpu") == ConversionRule(
        "koordinator.sh/gpu", {CORE: Fraction(1), RATIO: Fraction(1)}, Strategy.REPLACE, whole_units_only=False)
    assert DEFAULT_CONFIG.rule_for("cpu") is None
    assert (DEFAULT_CONFIG.gpu_memory_by_model, DEFAULT_CONFIG.model_label, DEFAULT_CONFIG.rename_deprecated) == (
        {}, GPU_MODEL_LABEL, True)


FULL = """
transformations:
- input: nvidia.com/gpu
  outputs: {koordinator.sh/gpu-core: "100", koordinator.sh/gpu-memory-ratio: 100}
- input: example.com/half-gpu
  outputs: {koordinator.sh/gpu-memory-ratio: 50}
  strategy: Retain
  wholeUnitsOnly: true
gpuMemoryByModel:
  A100-SXM4-80GB: 80Gi
  T4: 16Gi
gpuModelLabel: example.com/gpu-model
renameDeprecated: false
"""


def test_a_full_yaml_config() -> None:
    config = load_config(yaml.safe_load(FULL))

    assert config.rules == (
        ConversionRule("nvidia.com/gpu", {CORE: Fraction(100), RATIO: Fraction(100)}, Strategy.REPLACE, True,
                       "nvidia"),
        ConversionRule("example.com/half-gpu", {RATIO: Fraction(50)}, Strategy.RETAIN, True),
    )
    assert config.gpu_memory_by_model == {"A100-SXM4-80GB": 80 * 2**30, "T4": 16 * 2**30}
    assert (config.model_label, config.rename_deprecated) == ("example.com/gpu-model", False)


def test_transformations_replace_the_whole_default_table() -> None:
    config = load_config({"transformations": [{"input": "amd.com/gpu", "outputs": {RATIO: "100"}}]})

    assert config.input_names == {"amd.com/gpu"}
    # Vendor names default to whole units, others to any value.
    assert config.rules[0].whole_units_only is True
    assert load_config({"transformations": [{"input": "x.io/gpu", "outputs": {RATIO: "1"}}]}).rules[0] == (
        ConversionRule("x.io/gpu", {RATIO: Fraction(1)}, Strategy.REPLACE, False))
    assert load_config({"gpuMemoryByModel": {"T4": "16Gi"}}).rules == DEFAULT_CONFIG.rules


def test_a_rule_names_the_vendor_of_its_input_by_default_or_as_written() -> None:
    def vendor_of(rule: dict[str, object]) -> str | None:
        return load_config({"transformations": [{"outputs": {RATIO: "100"}, **rule}]}).rules[0].vendor

    assert vendor_of({"input": "amd.com/gpu"}) == "amd"
    assert vendor_of({"input": "dcu.com/gpu"}) == "hygon"
    assert vendor_of({"input": "nvidia.com/gpu"}) == "nvidia"
    assert vendor_of({"input": "x.io/gpu"}) is None
    assert vendor_of({"input": "x.io/gpu", "vendor": "metax"}) == "metax"
    assert vendor_of({"input": "amd.com/gpu", "vendor": None}) is None


CONFIG_ERRORS = [
    pytest.param([], "the conversion config must be a mapping", id="not-a-mapping"),
    pytest.param({"transformation": []}, "the conversion config: unknown key 'transformation' (expected one of "
                 "transformations, gpuMemoryByModel, gpuModelLabel, renameDeprecated, enforcement, rewrite)",
                 id="misspelt-section"),
    pytest.param({"rewrite": "sometimes"}, "rewrite must be one of auto, always, never, not 'sometimes'",
                 id="rewrite-policy-unknown"),
    pytest.param({"transformations": {}}, "transformations must be a list", id="transformations-not-list"),
    pytest.param({"transformations": [{"input": "a", "outputs": {RATIO: 1}, "vendor": "AMD GPUs"}]},
                 "transformations[0].vendor must be a node.koordinator.sh/gpu-vendor value, or null for none",
                 id="vendor-not-a-label-value"),
    pytest.param({"transformations": ["x"]}, "transformations[0] must be a mapping", id="rule-not-mapping"),
    pytest.param({"transformations": [{"outputs": {}}]}, "transformations[0].input must be a resource name",
                 id="no-input"),
    pytest.param({"transformations": [{"input": "a", "output": {}}]}, "transformations[0]: unknown key 'output' "
                 "(expected one of input, outputs, strategy, wholeUnitsOnly, vendor)", id="misspelt-rule-key"),
    pytest.param({"transformations": [{"input": "a", "outputs": []}]}, "transformations[0].outputs must be a mapping",
                 id="outputs-not-mapping"),
    pytest.param({"transformations": [{"input": "a", "outputs": {RATIO: "lots"}}]},
                 f"transformations[0].outputs[{RATIO}]: quantities must match the regular expression "
                 "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': 'lots'", id="output-not-quantity"),
    pytest.param({"transformations": [{"input": "a", "outputs": {RATIO: "-1"}}]},
                 f"transformations[0].outputs[{RATIO}] must not be negative", id="negative-output"),
    pytest.param({"transformations": [{"input": "a", "outputs": {}, "strategy": "Keep"}]},
                 "transformations[0].strategy must be Replace or Retain", id="bad-strategy"),
    pytest.param({"transformations": [{"input": "a", "outputs": {}, "wholeUnitsOnly": "yes"}]},
                 "transformations[0].wholeUnitsOnly must be true or false", id="whole-units-not-bool"),
    pytest.param({"transformations": [{"input": "a", "outputs": {}}, {"input": "a", "outputs": {}}]},
                 "transformations: input a is listed twice", id="duplicate-input"),
    pytest.param({"transformations": [{"input": "a", "outputs": {"b": "1"}}, {"input": "b", "outputs": {"c": "1"}}]},
                 "transformations: output b of a is itself an input", id="chained-rules"),
    pytest.param({"transformations": [{"input": "a", "outputs": {"a": "2"}}]},
                 "transformations: output a of a is itself an input", id="self-output"),
    pytest.param({"transformations": [{"input": "a", "outputs": {}, "strategy": "Retain"}]},
                 "transformations: a retains its input and adds nothing", id="retain-nothing"),
    pytest.param({"transformations": [{"input": "kubernetes.io/gpu", "outputs": {RATIO: "1"}}]},
                 "transformations: input kubernetes.io/gpu is renamed to koordinator.sh/gpu before conversion; "
                 "use that name", id="deprecated-input"),
    pytest.param({"transformations": [{"input": "a", "outputs": {"kubernetes.io/gpu-core": "1"}}]},
                 "transformations: output kubernetes.io/gpu-core of a is a deprecated name; "
                 "use koordinator.sh/gpu-core",
                 id="deprecated-output"),
    pytest.param({"gpuMemoryByModel": []}, "gpuMemoryByModel must be a mapping", id="models-not-mapping"),
    pytest.param({"gpuMemoryByModel": {"T4": "big"}}, "gpuMemoryByModel[T4]: quantities must match the regular "
                 "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': 'big'", id="model-size-garbage"),
    pytest.param({"gpuMemoryByModel": {"T4": "0"}}, "gpuMemoryByModel[T4]: must be a positive whole number of bytes",
                 id="model-size-zero"),
    pytest.param({"gpuMemoryByModel": {"T4": "1.5"}},
                 "gpuMemoryByModel[T4]: must be a positive whole number of bytes", id="model-size-fraction"),
    pytest.param({"gpuModelLabel": ""}, "gpuModelLabel must be a non-empty string", id="empty-label"),
    pytest.param({"gpuModelLabel": 5}, "gpuModelLabel must be a non-empty string", id="label-not-string"),
    pytest.param({"renameDeprecated": "no"}, "renameDeprecated must be true or false", id="rename-not-bool"),
]


@pytest.mark.parametrize(("document", "message"), CONFIG_ERRORS)
def test_config_errors_name_the_entry(document: Any, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(document)

    assert str(error.value) == message


def test_deprecated_names_are_fine_in_rules_when_renaming_is_off() -> None:
    config = load_config({"renameDeprecated": False,
                          "transformations": [{"input": "kubernetes.io/gpu", "outputs": {RATIO: "1"}}]})

    assert config.input_names == {"kubernetes.io/gpu"}


def selector(model: str) -> dict[str, Any]:
    return {"nodeSelector": {GPU_MODEL_LABEL: model}}


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions} for expressions in terms]}}}}


def model_in(*values: str, operator: str = "In", key: str = GPU_MODEL_LABEL) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


PINNED = [
    pytest.param(selector("T4"), "T4", id="node-selector"),
    pytest.param(affinity([model_in("T4")]), "T4", id="required-affinity"),
    pytest.param(affinity([model_in("T4")], [model_in("T4"), {"key": "zone", "operator": "In", "values": ["a"]}]),
                 "T4", id="every-term-same-model"),
    pytest.param({**selector("T4"), **affinity([model_in("T4")])}, "T4", id="selector-and-affinity-agree"),
    pytest.param({}, None, id="nothing"),
    pytest.param(affinity([model_in("T4", "A100")]), None, id="two-models-in-one-term"),
    pytest.param(affinity([model_in("T4")], [model_in("A100")]), None, id="terms-disagree"),
    pytest.param(affinity([model_in("T4")], [{"key": "zone", "operator": "In", "values": ["a"]}]), None,
                 id="one-term-not-pinned"),
    pytest.param(affinity([model_in("T4", operator="NotIn")]), None, id="not-in"),
    pytest.param({**selector("T4"), **affinity([model_in("A100")])}, None, id="selector-and-affinity-disagree"),
    pytest.param({"nodeSelector": {GPU_MODEL_LABEL: 4}}, None, id="selector-not-string"),
    pytest.param({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": "x"}}}}, None, id="terms-not-list"),
    pytest.param({"affinity": []}, None, id="affinity-wrong-type"),
    pytest.param({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [model_in("T4")]}}]}}}, None, id="preferred-only"),
]


@pytest.mark.parametrize(("spec", "model"), PINNED)
def test_pinned_gpu_model(spec: dict[str, Any], model: str | None) -> None:
    assert pinned_gpu_model(spec) == model


def test_pinned_model_uses_the_configured_label() -> None:
    assert pinned_gpu_model({"nodeSelector": {"example.com/model": "T4"}}, "example.com/model") == "T4"
    assert pinned_gpu_model({"nodeSelector": {"example.com/model": "T4"}}) is None


@pytest.mark.parametrize(("memory", "card", "shared", "ratio"), [
    pytest.param(16 * 2**30, 32 * 2**30, 1, 50, id="half-card"),
    pytest.param(16 * 2**30, 80 * 2**30, 1, 20, id="fifth-of-a-bigger-card"),
    pytest.param(1, 80 * 2**30, 1, 1, id="one-byte-rounds-up"),
    pytest.param(10 * 2**30, 32 * 2**30, 1, 32, id="31.25-rounds-up"),
    pytest.param(64 * 2**30, 32 * 2**30, 1, 200, id="two-cards"),
    pytest.param(10 * 2**30, 32 * 2**30, 3, 33, id="rounded-up-to-a-multiple-of-shared"),
    pytest.param(16 * 2**30, 32 * 2**30, 0, 50, id="shared-zero-is-one"),
])
def test_memory_bytes_to_ratio_never_rounds_down(memory: int, card: int, shared: int, ratio: int) -> None:
    assert memory_bytes_to_ratio(memory, card, shared) == ratio
