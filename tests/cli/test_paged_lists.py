"""``kubeaccess.kube.list_pages``, the one paged-list loop of the CLI and the quota service's sync:
it follows the continue token to the last page, asks each page with the caller's options, and
leaves the lister's errors to the caller. A pure function of its lister, so a scripted one stands
in for the API server here; the live lists are covered by the e2e tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from kubernetes.client.exceptions import ApiException

from kubeaccess.kube import list_pages


@dataclass
class Response:
    data: bytes


class ScriptedLister:
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> Response:
        self.calls.append(kwargs)
        return Response(orjson.dumps(self.pages[len(self.calls) - 1]))


def test_every_page_is_read_in_order_following_the_continue_token() -> None:
    lister = ScriptedLister([
        {"items": [{"n": 1}, {"n": 2}], "metadata": {"continue": "t1"}},
        {"items": [{"n": 3}], "metadata": {"continue": "t2"}},
        {"items": [], "metadata": {"resourceVersion": "42"}},
    ])
    pages = list(list_pages(lister, 2, _request_timeout=60))
    assert [item["n"] for page in pages for item in page["items"]] == [1, 2, 3]
    assert pages[-1]["metadata"]["resourceVersion"] == "42"
    assert lister.calls == [
        {"limit": 2, "_preload_content": False, "_request_timeout": 60},
        {"limit": 2, "_continue": "t1", "_preload_content": False, "_request_timeout": 60},
        {"limit": 2, "_continue": "t2", "_preload_content": False, "_request_timeout": 60},
    ]


def test_an_empty_continue_token_ends_the_list() -> None:
    lister = ScriptedLister([{"items": [{"n": 1}], "metadata": {"continue": ""}}])
    assert len(list(list_pages(lister, 500))) == 1
    assert len(lister.calls) == 1


def test_the_listers_error_reaches_the_caller() -> None:
    def expired(**_: Any) -> Response:
        raise ApiException(status=410, reason="Expired")

    with pytest.raises(ApiException) as error:
        list(list_pages(expired, 500))
    assert error.value.status == 410
