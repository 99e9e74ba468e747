"""Label selectors (``-l``): kubectl's grammar, the apiserver's matching, and refusals that name the fault."""

from __future__ import annotations

import pytest

from gpuquota_core.selector import Operator, Requirement, SelectorError, parse_selector

LABELS = {"app": "trainer", "tier": "gpu", "team": "nlp", "example.com/owner": "ana", "empty": ""}


@pytest.mark.parametrize(("selector", "selected"), [
    ("", True),
    ("app=trainer", True),
    ("app==trainer", True),
    ("app=server", False),
    ("app!=server", True),
    ("app!=trainer", False),
    ("missing!=x", True),  # != selects objects without the label, as the apiserver does
    ("app", True),
    ("missing", False),
    ("!missing", True),
    ("!app", False),
    ("team in (nlp,vision)", True),
    ("team in (vision)", False),
    ("missing in (nlp)", False),
    ("team notin (vision, audio)", True),
    ("team notin (nlp)", False),
    ("missing notin (nlp)", True),
    ("example.com/owner=ana", True),
    ("empty=", True),
    ("empty in (a,)", True),
    ("app=trainer,tier=gpu", True),
    ("app=trainer,tier=cpu", False),
    (" app = trainer , team in ( nlp ) , !missing ", True),
])
def test_matching(selector: str, selected: bool) -> None:
    assert parse_selector(selector).matches(LABELS) is selected


def test_an_object_without_labels() -> None:
    assert parse_selector("!app").matches(None)
    assert parse_selector("app!=x").matches_object({"metadata": {}})
    assert not parse_selector("app").matches_object({"kind": "Pod"})
    assert parse_selector("app=x").matches_object({"metadata": {"labels": {"app": "x"}}})


def test_parsed_requirements_and_their_text() -> None:
    selector = parse_selector("a=1,b!=2,c in (x, y),d notin (z),e,!f")
    assert selector.requirements == (
        Requirement("a", Operator.EQUALS, ("1",)), Requirement("b", Operator.NOT_EQUALS, ("2",)),
        Requirement("c", Operator.IN, ("x", "y")), Requirement("d", Operator.NOT_IN, ("z",)),
        Requirement("e", Operator.EXISTS), Requirement("f", Operator.DOES_NOT_EXIST))
    assert str(selector) == "a=1,b!=2,c in (x,y),d notin (z),e,!f"
    assert parse_selector(str(selector)) == selector


@pytest.mark.parametrize(("selector", "fault"), [
    ("app=", None),  # valid: the empty value
    ("=x", "expected a label key, found '='"),
    ("app=a=b", "expected ',' between requirements, found '='"),
    ("app x", "after app expected '=', '==', '!=', 'in', 'notin' or ',', found 'x'"),
    ("app in x", "app in needs a list of values in parentheses"),
    ("app in (a", "ends where ')' closing the values of app was expected"),
    ("app in ()", "app in () needs at least one value"),
    ("app in (a b)", "expected ',' or ')' in the values of app, found 'b'"),
    ("app=x,", "ends with ','"),
    ("!", "ends where a label key after '!' was expected"),
    ("!a=b", "expected ',' between requirements, found '='"),
    ("-app=x", "invalid label key '-app'"),
    ("Example.com/app=x", "invalid label key 'Example.com/app'"),
    (f"app={'v' * 64}", "invalid label value"),
    ("app=-x", "invalid label value '-x'"),
    ("app in (ok,-bad)", "invalid label value '-bad'"),
])
def test_refusals_name_the_fault(selector: str, fault: str | None) -> None:
    if fault is None:
        parse_selector(selector)
        return
    with pytest.raises(SelectorError) as error:
        parse_selector(selector)
    assert fault in str(error.value)
    assert repr(selector) in str(error.value)
