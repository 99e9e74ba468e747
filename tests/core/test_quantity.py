"""Kubernetes quantities: exact parsing, apimachinery's canonical strings, and what is refused."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpuquota_core.quantity import (
    MAX_TEXT_LENGTH,
    ZERO,
    Quantity,
    QuantityError,
    QuantityFormat,
    format_quantity,
    parse_quantity,
)

CANONICAL = [
    # (input, canonical string, exact amount)
    pytest.param("1", "1", Fraction(1), id="plain"),
    pytest.param("1000", "1k", Fraction(1000), id="thousand-becomes-k"),
    pytest.param("1000000k", "1G", Fraction(10**9), id="k-to-G"),
    pytest.param("1500m", "1500m", Fraction(3, 2), id="milli-kept"),
    pytest.param("1.5", "1500m", Fraction(3, 2), id="fraction-to-milli"),
    pytest.param("0.1", "100m", Fraction(1, 10), id="tenth"),
    pytest.param(".5", "500m", Fraction(1, 2), id="leading-dot"),
    pytest.param("1.", "1", Fraction(1), id="trailing-dot"),
    pytest.param("+1", "1", Fraction(1), id="plus-sign"),
    pytest.param("-1.5", "-1500m", Fraction(-3, 2), id="negative"),
    pytest.param("1.5m", "1500u", Fraction(3, 2000), id="micro"),
    pytest.param("1n", "1n", Fraction(1, 10**9), id="nano"),
    pytest.param("0.0000000001", "1n", Fraction(1, 10**9), id="below-nano-rounds-up"),
    pytest.param("1E", "1E", Fraction(10**18), id="exa"),
    pytest.param("10000000000000000000", "10E", Fraction(10**19), id="beyond-exa-stays-E"),
    pytest.param("0", "0", Fraction(0), id="zero"),
    pytest.param("0Ki", "0", Fraction(0), id="zero-binary"),
    pytest.param("1Ki", "1Ki", Fraction(1024), id="kibi"),
    pytest.param("1024Ki", "1Mi", Fraction(2**20), id="kibi-to-mebi"),
    pytest.param("1000Ki", "1000Ki", Fraction(1024000), id="kibi-not-power"),
    pytest.param("1.5Gi", "1536Mi", Fraction(3 * 2**29), id="fractional-gibi"),
    pytest.param("0.5Ki", "512", Fraction(512), id="binary-below-1Ki-prints-decimal"),
    pytest.param("0.1Ki", "102400m", Fraction(512, 5), id="binary-fraction-prints-decimal"),
    pytest.param("-1Ki", "-1Ki", Fraction(-1024), id="negative-binary"),
    pytest.param("1e3", "1e3", Fraction(1000), id="exponent"),
    pytest.param("1E3", "1e3", Fraction(1000), id="capital-exponent"),
    pytest.param("12e6", "12e6", Fraction(12 * 10**6), id="exponent-mantissa"),
    pytest.param("1.5e3", "1500", Fraction(1500), id="exponent-multiple-of-3"),
    pytest.param("5e-1", "500e-3", Fraction(1, 2), id="negative-exponent"),
    pytest.param("1e-10", "1e-9", Fraction(1, 10**9), id="tiny-exponent-rounds-up"),
    pytest.param("2e0", "2", Fraction(2), id="zero-exponent"),
    pytest.param("1e21", "1e21", Fraction(10**21), id="big-exponent"),
]


@pytest.mark.parametrize(("text", "canonical", "amount"), CANONICAL)
def test_parse_is_exact_and_formats_like_apimachinery(text: str, canonical: str, amount: Fraction) -> None:
    quantity = parse_quantity(text)

    assert quantity.amount == amount
    assert str(quantity) == canonical
    # The canonical string is a fixed point: parsing it again gives the same amount and string.
    again = parse_quantity(canonical)
    assert (again.amount, str(again)) == (amount, canonical)


@pytest.mark.parametrize(("text", "fmt"), [
    ("1", QuantityFormat.DECIMAL_SI), ("1m", QuantityFormat.DECIMAL_SI), ("1Gi", QuantityFormat.BINARY_SI),
    ("1e3", QuantityFormat.DECIMAL_EXPONENT)])
def test_the_suffix_family_is_remembered(text: str, fmt: QuantityFormat) -> None:
    assert parse_quantity(text).format is fmt


def test_ints_and_floats_from_yaml_or_json_parse_like_their_text() -> None:
    assert parse_quantity(2) == Quantity.of(2)
    assert parse_quantity(-3).amount == -3
    # A float goes through its shortest repr, the text the user typed: 0.1 is exactly 1/10.
    assert parse_quantity(0.1).amount == Fraction(1, 10)
    assert parse_quantity(1e20).amount == 10**20
    assert str(parse_quantity(0.5)) == "500m"


GARBAGE = [
    pytest.param("", id="empty"),
    pytest.param("abc", id="letters"),
    pytest.param("1 ", id="trailing-space"),
    pytest.param(" 1", id="leading-space"),
    pytest.param("1\n", id="trailing-newline"),
    pytest.param("1K", id="capital-K"),
    pytest.param("1ki", id="lowercase-ki"),
    pytest.param("1e", id="exponent-without-digits"),
    pytest.param("1.2.3", id="two-dots"),
    pytest.param(".", id="only-dot"),
    pytest.param("+", id="only-sign"),
    pytest.param("--1", id="double-sign"),
    pytest.param("1Mi1", id="suffix-then-digits"),
    pytest.param("0x10", id="hex"),
    pytest.param("１", id="fullwidth-digit"),
    pytest.param("nan", id="nan"),
    pytest.param("Infinity", id="infinity"),
]


@pytest.mark.parametrize("text", GARBAGE)
def test_garbage_is_refused_with_the_grammar(text: str) -> None:
    with pytest.raises(QuantityError, match=r"^quantities must match the regular expression") as error:
        parse_quantity(text)
    assert str(error.value).endswith(f": {text!r}")


@pytest.mark.parametrize(("value", "message"), [
    pytest.param(float("nan"), "quantities must match the regular expression", id="float-nan"),
    pytest.param(float("inf"), "quantities must match the regular expression", id="float-inf"),
    pytest.param(True, "quantity must be a string or integer, not True", id="bool"),
    pytest.param(None, "quantity must be a string or integer, not NoneType", id="none"),
    pytest.param([1], "quantity must be a string or integer, not list", id="list"),
    pytest.param({"a": 1}, "quantity must be a string or integer, not dict", id="dict"),
])
def test_wrong_types_are_refused(value: object, message: str) -> None:
    with pytest.raises(QuantityError, match=f"^{message}"):
        parse_quantity(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("1e308", "quantity '1e308' is out of range (exponent beyond ±64)", id="1e308"),
    pytest.param("1e-308", "quantity '1e-308' is out of range (exponent beyond ±64)", id="1e-308"),
    pytest.param("1e999999999999", "quantity '1e999999999999' is out of range (exponent beyond ±64)",
                 id="absurd-exponent"),
    pytest.param("1e64", "quantity '1e64' is out of range", id="exactly-10-to-64"),
    pytest.param("99999999999999999999999999999999999999999999999E", "quantity "
                 "'99999999999999999999999999999999999999999999999E' is out of range", id="huge-with-suffix"),
])
def test_huge_numbers_are_refused_not_computed(text: str, message: str) -> None:
    with pytest.raises(QuantityError) as error:
        parse_quantity(text)
    assert str(error.value) == message


def test_long_text_and_huge_ints_are_refused_cheaply() -> None:
    with pytest.raises(QuantityError) as error:
        parse_quantity("1" * (MAX_TEXT_LENGTH + 1))
    assert str(error.value) == "quantity '1111111111111111'... is longer than 64 characters"
    with pytest.raises(QuantityError) as error:
        parse_quantity(10**5000)  # more digits than str(int) may print
    assert str(error.value) == "quantity 16610-bit integer is out of range"
    assert parse_quantity(10**63).amount == 10**63


def test_float_1e308_is_refused_too() -> None:
    with pytest.raises(QuantityError, match=r"^quantity '1e\+308' is out of range"):
        parse_quantity(1e308)


def test_arithmetic_is_exact() -> None:
    tenth = parse_quantity("100m")
    total = ZERO
    for _ in range(10):
        total = total + tenth
    assert total == Quantity.of(1)
    assert parse_quantity("0.1") + parse_quantity("0.2") == parse_quantity("300m")
    assert parse_quantity("1Ki") - parse_quantity("24") == Quantity.of(1000)
    assert -parse_quantity("2") == Quantity.of(-2)
    assert parse_quantity("1.5").scaled(100) == Quantity.of(150)
    assert parse_quantity("1Ki") + parse_quantity("1Ki") == parse_quantity("2Ki")
    # The left operand's format is kept for printing.
    assert str(parse_quantity("1Gi") + parse_quantity("1Gi")) == "2Gi"


def test_equality_and_ordering_ignore_the_suffix() -> None:
    assert parse_quantity("1Ki") == parse_quantity("1024")
    assert hash(parse_quantity("1Ki")) == hash(parse_quantity("1024"))
    assert len({parse_quantity("1k"), parse_quantity("1000"), parse_quantity("1e3")}) == 1
    assert parse_quantity("999m") < parse_quantity("1") < parse_quantity("1001m")
    assert parse_quantity("1Mi") > parse_quantity("1M")
    assert max(parse_quantity("2"), parse_quantity("1500m")) == Quantity.of(2)
    assert (parse_quantity("1") == "1") is False


@pytest.mark.parametrize(("text", "ceil"), [
    ("0.5", 1), ("100m", 1), ("1", 1), ("1.0001", 2), ("1n", 1), ("-0.5", 0), ("2e0", 2)])
def test_rounding_goes_up_like_value(text: str, ceil: int) -> None:
    assert parse_quantity(text).ceil() == ceil


def test_predicates_and_repr() -> None:
    assert parse_quantity("0m").is_zero()
    assert parse_quantity("2000m").is_integer()
    assert not parse_quantity("1500m").is_integer()
    assert repr(parse_quantity("2Gi")) == "Quantity(2Gi)"
    assert Quantity.parse("3") == Quantity.of(3)


def test_format_rounds_sub_nano_amounts_up_and_away_from_zero() -> None:
    assert format_quantity(Fraction(1, 10**12)) == "1n"
    assert format_quantity(Fraction(-1, 10**12)) == "-1n"
    assert format_quantity(Fraction(2**40), QuantityFormat.BINARY_SI) == "1Ti"
    assert format_quantity(Fraction(1000), QuantityFormat.DECIMAL_EXPONENT) == "1e3"
