"""RFC 6902 patches: diff, apply, and the ~0 / ~1 escaping of resource names."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuquota_core.jsonpatch import PatchError, apply, copy_json, diff, escape_pointer_token, unescape_pointer_token


@pytest.mark.parametrize(("token", "escaped"), [
    ("nvidia.com/gpu", "nvidia.com~1gpu"), ("a~b", "a~0b"), ("~1", "~01"), ("/~", "~1~0"), ("~/", "~0~1"),
    ("", ""), ("plain", "plain")])
def test_pointer_tokens_escape_and_unescape(token: str, escaped: str) -> None:
    assert escape_pointer_token(token) == escaped
    assert unescape_pointer_token(escaped) == token


def test_diff_of_a_rewritten_resource_list() -> None:
    before = {"spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1"}}}]}}
    after = {"spec": {"containers": [{"name": "a", "resources": {"limits": {
        "cpu": "1", "koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}}}]}}

    assert diff(before, after) == [
        {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"},
        {"op": "add", "path": "/spec/containers/0/resources/limits/koordinator.sh~1gpu-core", "value": "100"},
        {"op": "add", "path": "/spec/containers/0/resources/limits/koordinator.sh~1gpu-memory-ratio", "value": "100"},
    ]


def test_diff_of_keys_with_tildes_and_slashes() -> None:
    assert diff({"a~/b": 1}, {"a~/b": 2, "~1": 3}) == [
        {"op": "replace", "path": "/a~0~1b", "value": 2}, {"op": "add", "path": "/~01", "value": 3}]


@pytest.mark.parametrize(("before", "after", "operations"), [
    pytest.param({"a": 1}, {"a": 1}, [], id="equal"),
    pytest.param({"a": 1}, {"a": True}, [{"op": "replace", "path": "/a", "value": True}], id="bool-is-not-int"),
    pytest.param({"a": 1}, {"a": 1.0}, [{"op": "replace", "path": "/a", "value": 1.0}], id="float-is-not-int"),
    pytest.param({"a": [1, 2]}, {"a": [1, 3]}, [{"op": "replace", "path": "/a/1", "value": 3}], id="list-element"),
    pytest.param({"a": [1, 2]}, {"a": [1]}, [{"op": "replace", "path": "/a", "value": [1]}], id="list-shorter"),
    pytest.param({"a": {"b": 1}}, {"a": [1]}, [{"op": "replace", "path": "/a", "value": [1]}], id="object-to-list"),
    pytest.param({"a": None}, {"a": {}}, [{"op": "replace", "path": "/a", "value": {}}], id="null-to-object"),
    pytest.param({"a": 1}, [1], [{"op": "replace", "path": "", "value": [1]}], id="whole-document"),
    pytest.param(1, 2, [{"op": "replace", "path": "", "value": 2}], id="scalar-document"),
])
def test_diff_cases(before: Any, after: Any, operations: list[dict[str, Any]]) -> None:
    assert diff(before, after) == operations
    assert apply(before, operations) == after


def test_diff_values_are_copies() -> None:
    after = {"a": {"b": [1]}}

    [operation] = diff({}, after)
    after["a"]["b"].append(2)

    assert operation["value"] == {"b": [1]}


def test_apply_leaves_the_input_alone() -> None:
    document = {"a": {"b": [1, 2]}}
    before = copy.deepcopy(document)

    assert apply(document, [{"op": "remove", "path": "/a/b/0"}]) == {"a": {"b": [2]}}
    assert document == before


@pytest.mark.parametrize(("operations", "result"), [
    pytest.param([{"op": "add", "path": "/l/0", "value": 0}], {"l": [0, 1, 2], "o": {"k": "v"}}, id="insert"),
    pytest.param([{"op": "add", "path": "/l/-", "value": 3}], {"l": [1, 2, 3], "o": {"k": "v"}}, id="append"),
    pytest.param([{"op": "add", "path": "/l/2", "value": 3}], {"l": [1, 2, 3], "o": {"k": "v"}}, id="insert-at-end"),
    pytest.param([{"op": "replace", "path": "/l/1", "value": 9}], {"l": [1, 9], "o": {"k": "v"}}, id="replace-item"),
    pytest.param([{"op": "remove", "path": "/l/0"}], {"l": [2], "o": {"k": "v"}}, id="remove-item"),
    pytest.param([{"op": "add", "path": "/o/k", "value": "w"}], {"l": [1, 2], "o": {"k": "w"}}, id="add-replaces"),
    pytest.param([{"op": "add", "path": "/o/a~1b", "value": 1}], {"l": [1, 2], "o": {"k": "v", "a/b": 1}},
                 id="escaped-key"),
    pytest.param([{"op": "add", "path": "/o/", "value": 1}], {"l": [1, 2], "o": {"k": "v", "": 1}}, id="empty-key"),
    pytest.param([{"op": "replace", "path": "", "value": 5}], 5, id="replace-root"),
])
def test_apply_follows_rfc6902(operations: list[dict[str, Any]], result: Any) -> None:
    assert apply({"l": [1, 2], "o": {"k": "v"}}, operations) == result


@pytest.mark.parametrize(("operation", "message"), [
    pytest.param({"op": "replace", "path": "/o/missing", "value": 1}, "/o/missing: member 'missing' does not exist",
                 id="replace-missing"),
    pytest.param({"op": "remove", "path": "/o/missing"}, "/o/missing: member 'missing' does not exist",
                 id="remove-missing"),
    pytest.param({"op": "add", "path": "/missing/x", "value": 1}, "/missing/x: member 'missing' does not exist",
                 id="parent-missing"),
    pytest.param({"op": "add", "path": "/l/3", "value": 1}, "/l/3: index 3 is out of range", id="index-past-end"),
    pytest.param({"op": "replace", "path": "/l/2", "value": 1}, "/l/2: index 2 is out of range", id="replace-at-end"),
    pytest.param({"op": "remove", "path": "/l/-"}, "/l/-: '-' is not an array index", id="remove-dash"),
    pytest.param({"op": "add", "path": "/l/01", "value": 1}, "/l/01: '01' is not an array index", id="leading-zero"),
    pytest.param({"op": "add", "path": "/o/k/x", "value": 1}, "/o/k/x: cannot descend into str", id="into-scalar"),
    pytest.param({"op": "add", "path": "o", "value": 1}, "path 'o' must be empty or start with /", id="no-slash"),
    pytest.param({"op": "add", "path": 3, "value": 1}, "path must be a string, not int", id="path-not-string"),
    pytest.param({"op": "move", "path": "/o", "from": "/l"}, "unsupported op 'move'", id="move"),
    pytest.param({"op": "add", "path": "/o/x"}, "/o/x: add needs a value", id="no-value"),
    pytest.param({"op": "remove", "path": ""}, "cannot remove the whole document", id="remove-root"),
])
def test_apply_refuses_what_the_api_server_would(operation: dict[str, Any], message: str) -> None:
    with pytest.raises(PatchError) as error:
        apply({"l": [1, 2], "o": {"k": "v"}}, [operation])
    assert str(error.value) == message


def test_deep_documents_copy_and_diff_without_recursion() -> None:
    deep: dict[str, Any] = {}
    cursor = deep
    for _ in range(10_000):
        cursor["x"] = [{}]
        cursor = cursor["x"][0]
    changed = copy_json(deep)
    cursor = changed
    while cursor:
        cursor = cursor["x"][0]
    cursor["leaf"] = 1

    operations = diff(deep, changed)

    assert len(operations) == 1 and operations[0]["op"] == "add"
    assert operations[0]["path"] == "/x/0" * 10_000 + "/leaf"
    # Compared with diff, not ==: Python's own == recurses and would hit the limit here.
    assert diff(apply(deep, operations), changed) == []
    assert diff(deep, copy_json(deep)) == []


def test_copy_json_copies_containers_and_shares_scalars() -> None:
    document = {"a": [1, {"b": "c"}], "d": None}

    copied = copy_json(document)

    assert copied == document
    assert copied["a"] is not document["a"] and copied["a"][1] is not document["a"][1]
    assert copy_json(5) == 5
