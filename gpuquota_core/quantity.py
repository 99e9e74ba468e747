"""Exact Kubernetes resource quantities.

A quantity is held as a :class:`fractions.Fraction`, never a float, so ``0.1 + 0.2`` GPU shares add
up exactly and a conversion can never round a request *down*. Parsing follows apimachinery's
grammar (``<signed number><suffix>`` with binary-SI, decimal-SI or ``e``-exponent suffixes), and
formatting reproduces its canonical form so that values round-trip through the API unchanged.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from functools import lru_cache, total_ordering


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity, or one too large to be meaningful."""


class QuantityFormat(Enum):
    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


_BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES: dict[str, int] = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12,
                                     "P": 15, "E": 18}
_DECIMAL_BY_EXPONENT: dict[int, str] = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_EXPONENT: dict[int, str] = {exp: suffix for suffix, exp in _BINARY_SUFFIXES.items()}

_QUANTITY_RE = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
# What nearly every real pod and quota says: an unsigned whole number with at most a plain SI or
# binary suffix ("1", "500m", "64Gi", "100"). These need no decimal point, exponent or rounding.
_PLAIN_RE = re.compile(r"(?P<digits>[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?")

# Bounds that keep hostile input (``1e999999999``, a 10,000-digit mantissa) from costing unbounded
# CPU or memory. Real quantities are far inside them: apimachinery itself caps at about 2^63 * 10^18.
MAX_TEXT_LENGTH = 64
MAX_DECIMAL_EXPONENT = 64
# 1n is the finest precision the API keeps; anything finer is rounded up, as apimachinery does.
NANO = Fraction(1, 10**9)


@total_ordering
@dataclass(frozen=True, slots=True)
class Quantity:
    """An exact quantity plus the suffix family it is written in (for canonical formatting)."""

    amount: Fraction
    format: QuantityFormat = QuantityFormat.DECIMAL_SI
    # The text it was parsed from, for messages that quote the user ("1.5", not "1500m"); never
    # part of its value, and not kept through arithmetic.
    written: str | None = field(default=None, compare=False, hash=False)

    def as_written(self) -> str:
        """The text the user wrote, else the canonical text."""
        return self.written if self.written is not None else str(self)

    @classmethod
    def parse(cls, text: str | int | float) -> Quantity:
        return parse_quantity(text)

    @classmethod
    def of(cls, amount: int | Fraction, fmt: QuantityFormat = QuantityFormat.DECIMAL_SI) -> Quantity:
        return cls(Fraction(amount), fmt)

    def ceil(self) -> int:
        """Whole units rounded up: ``Quantity.Value()`` in apimachinery (``0.5`` GPU asks for 1)."""
        return math.ceil(self.amount)

    def is_zero(self) -> bool:
        return self.amount == 0

    def is_integer(self) -> bool:
        return self.amount.denominator == 1

    # Whole amounts (nearly every quantity a pod or quota holds) add, subtract and compare as ints:
    # the same exact result, without Fraction's general rational arithmetic, which dominated the
    # profile of the quota cache (every pod is summed into its quota and each ancestor).
    def __add__(self, other: Quantity) -> Quantity:
        a, b = self.amount, other.amount
        if a.denominator == 1 and b.denominator == 1:
            return Quantity(Fraction(a.numerator + b.numerator), self.format)
        return Quantity(a + b, self.format)

    def __sub__(self, other: Quantity) -> Quantity:
        a, b = self.amount, other.amount
        if a.denominator == 1 and b.denominator == 1:
            return Quantity(Fraction(a.numerator - b.numerator), self.format)
        return Quantity(a - b, self.format)

    def __neg__(self) -> Quantity:
        return Quantity(-self.amount, self.format)

    def scaled(self, factor: int | Fraction) -> Quantity:
        return Quantity(self.amount * factor, self.format)

    def __eq__(self, other: object) -> bool:
        # Equal amounts are equal quantities whatever their suffix: "1Ki" == "1024".
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.amount == other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    def __lt__(self, other: Quantity) -> bool:
        a, b = self.amount, other.amount
        if a.denominator == 1 and b.denominator == 1:
            return a.numerator < b.numerator
        return a < b

    # Written out rather than derived by total_ordering, whose derived methods cost a second
    # comparison (__eq__ through Fraction) each: quota checks compare with > on every admission.
    def __gt__(self, other: Quantity) -> bool:
        a, b = self.amount, other.amount
        if a.denominator == 1 and b.denominator == 1:
            return a.numerator > b.numerator
        return a > b

    def __str__(self) -> str:
        return format_quantity(self.amount, self.format)

    def __repr__(self) -> str:
        return f"Quantity({self!s})"


ZERO = Quantity(Fraction(0))


def parse_quantity(text: str | int | float) -> Quantity:
    """Parse a quantity as the API server does; raise :class:`QuantityError` with the reason.

    JSON and YAML numbers are accepted as the API server accepts them (``Quantity`` unmarshals a
    bare number from its text): an int exactly, a float through its shortest ``repr``, which is the
    text the user wrote (``0.5``, ``1e+20``), so no binary-float error creeps into the amount.
    """
    if isinstance(text, bool):
        raise QuantityError(f"quantity must be a string or integer, not {text!r}")
    if isinstance(text, int):
        if abs(text) >= 10**MAX_DECIMAL_EXPONENT:
            # Never format the int itself: a hostile 5,000-digit number exceeds Python's str() limit.
            raise QuantityError(f"quantity {text.bit_length()}-bit integer is out of range")
        return Quantity(Fraction(text), written=str(text))
    if isinstance(text, float):
        text = repr(text)
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string or integer, not {type(text).__name__}")
    return _parse_text(text)


# A cluster spells its quantities with a small vocabulary ("1", "500m", "1Gi"), and the quota cache
# parses each of them again for every pod and every watch event; Quantity is immutable, so one
# parse per distinct text is enough. Errors are not cached (lru_cache does not keep exceptions);
# the bound keeps a stream of distinct hostile texts from growing memory.
@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Quantity:
    parsed = _parse_plain(text)
    if parsed is None:
        parsed = _parse_general(text)
    return Quantity(parsed.amount, parsed.format, text)


def _parse_plain(text: str) -> Quantity | None:
    """The fast path: integer arithmetic only, and exactly what :func:`_parse_general` returns.

    A whole number times 2^k or 10^k is exact; times 10^-3, -6 or -9 (m, u, n) it is a multiple of
    1n, so the round-up to nano never applies. Anything else (signs, decimals, exponents, values
    near the range bound) returns None and takes the general path, with its error messages.
    """
    if len(text) > 32:  # far inside the range bound, so the result is never out of range
        return None
    match = _PLAIN_RE.fullmatch(text)
    if match is None:
        return None
    digits, suffix = int(match["digits"]), match["suffix"] or ""
    if suffix in _BINARY_SUFFIXES:
        return Quantity(Fraction(digits << _BINARY_SUFFIXES[suffix]), QuantityFormat.BINARY_SI)
    exponent = _DECIMAL_SUFFIXES[suffix]
    amount = Fraction(digits * 10**exponent) if exponent >= 0 else Fraction(digits, 10**-exponent)
    return Quantity(amount, QuantityFormat.DECIMAL_SI)


def _parse_general(text: str) -> Quantity:
    """The whole grammar: signs, decimal fractions, ``e`` exponents, rounding up to 1n."""
    if len(text) > MAX_TEXT_LENGTH:
        raise QuantityError(f"quantity {text[:16]!r}... is longer than {MAX_TEXT_LENGTH} characters")
    # fullmatch, not match with "$": "$" also matches before a trailing newline, and "1\n" is not a quantity.
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise QuantityError(f"quantities must match the regular expression "
                            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}")
    number = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY_SUFFIXES:
        amount, fmt = number * (2 ** _BINARY_SUFFIXES[suffix]), QuantityFormat.BINARY_SI
    elif suffix in _DECIMAL_SUFFIXES:
        amount, fmt = number * Fraction(10) ** _DECIMAL_SUFFIXES[suffix], QuantityFormat.DECIMAL_SI
    else:
        exponent = int(suffix[1:])
        if abs(exponent) > MAX_DECIMAL_EXPONENT:
            raise QuantityError(f"quantity {text!r} is out of range (exponent beyond ±{MAX_DECIMAL_EXPONENT})")
        amount, fmt = number * Fraction(10) ** exponent, QuantityFormat.DECIMAL_EXPONENT
    if abs(amount) >= 10**MAX_DECIMAL_EXPONENT:
        raise QuantityError(f"quantity {text!r} is out of range")
    return Quantity(_round_up_to_nano(amount), fmt)


def _round_up_to_nano(amount: Fraction) -> Fraction:
    if (amount / NANO).denominator == 1:
        return amount
    # Away from zero, like apimachinery's RoundUp: a request never shrinks by parsing.
    nanos = math.ceil(abs(amount) / NANO)
    return Fraction(nanos if amount >= 0 else -nanos) * NANO


# Cached for the same reason as parsing: the webhook and the cache print the same few amounts
# ("100", "1Gi") over and over, and the arguments (a Fraction, an enum member) are immutable.
@lru_cache(maxsize=4096)
def format_quantity(amount: Fraction, fmt: QuantityFormat = QuantityFormat.DECIMAL_SI) -> str:
    """The canonical string apimachinery would print for this amount and format."""
    amount = _round_up_to_nano(amount)
    if amount == 0:
        return "0"
    sign = "-" if amount < 0 else ""
    magnitude = abs(amount)
    if fmt is QuantityFormat.BINARY_SI and magnitude.denominator == 1:
        # Binary suffixes only for whole numbers of at least 1Ki; below that apimachinery prints decimal.
        for exponent in sorted(_BINARY_BY_EXPONENT, reverse=True):
            unit = 2**exponent
            if magnitude >= unit and magnitude % unit == 0:
                return f"{sign}{magnitude // unit}{_BINARY_BY_EXPONENT[exponent]}"
        if magnitude < 1024:
            return f"{sign}{magnitude}"
    mantissa, exponent = _decimal_mantissa(magnitude)
    if fmt is QuantityFormat.DECIMAL_EXPONENT:
        return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")
    if exponent > 18:
        mantissa, exponent = mantissa * 10 ** (exponent - 18), 18
    return f"{sign}{mantissa}{_DECIMAL_BY_EXPONENT[exponent]}"


def _decimal_mantissa(magnitude: Fraction) -> tuple[int, int]:
    """Largest exponent (a multiple of 3, at least -9) that leaves an integer mantissa."""
    nanos = int(magnitude / NANO)
    exponent = -9
    while nanos % 1000 == 0 and nanos != 0:
        nanos //= 1000
        exponent += 3
    return nanos, exponent
