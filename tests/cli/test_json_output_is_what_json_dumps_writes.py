"""``document(..., plain=True)`` writes exactly what ``json.dumps(indent=2)`` writes.

The orjson path exists only for speed (a large audit's report is big); whatever it cannot
write identically (non-ASCII, DEL, integers beyond 64 bits, unusual types) goes to json.dumps.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import StrEnum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.output import _orjson_indented, document

EXAMPLES = int(os.environ.get("GPUQUOTA_PROPERTY_EXAMPLES", "300"))
PROFILE = settings(max_examples=EXAMPLES, deadline=None,
                   derandomize=os.environ.get("GPUQUOTA_PROPERTY_RANDOM") != "1")

texts = st.one_of(st.text(), st.text(alphabet=st.characters(max_codepoint=0x7F)))
plain = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), texts),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)),
    max_leaves=30,
)


@PROFILE
@given(plain)
def test_plain_documents_are_written_as_json_dumps_writes_them(data: object) -> None:
    assert document(data, "json", plain=True) == json.dumps(data, indent=2)


def test_an_audit_like_report_needs_no_fallback_to_json_dumps() -> None:
    report = {"findings": [{"check": "pod-legacy-gpu-request", "details": {"rewrites": ["a -> b"]}, "n": 3}],
              "summary": {"bySeverity": {"error": 0}, "empty": {}, "none": [], "flag": True, "x": None}}
    assert _orjson_indented(report) == json.dumps(report, indent=2)


@pytest.mark.parametrize("data", [
    {"name": "caf\u00e9"},  # json.dumps escapes non-ASCII
    {"name": "\x7f"},  # and DEL
    {"big": 2**64},  # orjson refuses integers beyond 64 bits
    {1: "int key"},  # and non-str keys
])
def test_what_orjson_would_write_differently_is_left_to_json_dumps(data: object) -> None:
    assert _orjson_indented(data) is None
    assert document(data, "json", plain=True) == json.dumps(data, indent=2)


class Colour(StrEnum):
    RED = "red"


@dataclass
class Point:
    x: int


def test_unusual_types_get_json_dumps_result_or_error() -> None:
    assert document({"c": Colour.RED}, "json", plain=True) == json.dumps({"c": Colour.RED}, indent=2)
    with pytest.raises(TypeError):
        document({"p": Point(1)}, "json", plain=True)


def test_floats_take_json_dumps_without_the_promise() -> None:
    assert document({"f": 1e-05}, "json") == '{\n  "f": 1e-05\n}'
