"""Kubernetes label selectors (``-l``), parsed and matched as the apiserver reads them.

The grammar of ``kubectl get -l``: requirements joined by commas, all of which must hold.

    key            the label exists           !key             it does not
    key=value      equal (also key==value)    key!=value       not equal, or the label is absent
    key in (a,b)   one of the values          key notin (a,b)  none of them, or the label is absent

Keys and values are checked as the apiserver checks them (a qualified name with an optional DNS
prefix; a value of at most 63 characters), so a selector refused here would be refused there too.
I/O-free: the CLI filters what it shows with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .podspec import mapping_or_empty


class SelectorError(ValueError):
    """A selector that cannot be parsed; the message quotes the part that is wrong."""


class Operator(Enum):
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"


_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
_KEY = re.compile(rf"(?:(?P<prefix>{_DNS_SUBDOMAIN})/)?{_NAME}")
_VALUE = re.compile(rf"(?:{_NAME})?")
MAX_PREFIX_LENGTH = 253

# One token at a time: an operator, a parenthesis, a comma, or a run of anything else.
_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|[^\s=!(),]+)")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, Any]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator is Operator.EXISTS:
            return present
        if self.operator is Operator.DOES_NOT_EXIST:
            return not present
        if self.operator in (Operator.EQUALS, Operator.IN):
            return present and value in self.values
        # != and notin: true of an object without the label, as the apiserver has it.
        return not present or value not in self.values

    def __str__(self) -> str:
        if self.operator is Operator.EXISTS:
            return self.key
        if self.operator is Operator.DOES_NOT_EXIST:
            return f"!{self.key}"
        if self.operator in (Operator.EQUALS, Operator.NOT_EQUALS):
            return f"{self.key}{self.operator.value}{self.values[0]}"
        return f"{self.key} {self.operator.value} ({','.join(self.values)})"


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, Any] | None) -> bool:
        """Whether an object with these labels (None: it has none) is selected."""
        labels = mapping_or_empty(labels)
        return all(requirement.matches(labels) for requirement in self.requirements)

    def matches_object(self, obj: Mapping[str, Any]) -> bool:
        metadata = obj.get("metadata")
        return self.matches(metadata.get("labels") if isinstance(metadata, Mapping) else None)

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)


def _check_key(key: str, selector: str) -> str:
    match = _KEY.fullmatch(key)
    prefix = match.group("prefix") if match else None
    if match is None or (prefix is not None and len(prefix) > MAX_PREFIX_LENGTH):
        raise SelectorError(f"invalid label key {key!r} in selector {selector!r}: a name of up to 63 letters, "
                            "digits, '-', '_' or '.' (starting and ending with a letter or digit), optionally "
                            "after a DNS subdomain prefix and '/'")
    return key


def _check_value(value: str, selector: str) -> str:
    if _VALUE.fullmatch(value) is None:
        raise SelectorError(f"invalid label value {value!r} in selector {selector!r}: up to 63 letters, digits, "
                            "'-', '_' or '.', starting and ending with a letter or digit")
    return value


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:  # only whitespace is left, which rstrip removed
            break
        tokens.append(match.group(1))
        position = match.end()
    return tokens


def parse_selector(text: str) -> Selector:
    """``text`` as a selector; an empty one selects everything. Raises :class:`SelectorError`."""
    tokens = _tokens(text)
    requirements: list[Requirement] = []
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take(what: str) -> str:
        nonlocal position
        token = peek()
        if token is None:
            raise SelectorError(f"selector {text!r} ends where {what} was expected")
        position += 1
        return token

    while position < len(tokens):
        token = take("a label key")
        if token == "!":
            requirements.append(Requirement(_check_key(take("a label key after '!'"), text), Operator.DOES_NOT_EXIST))
        elif token in ("=", "==", "!=", "(", ")", ","):
            raise SelectorError(f"selector {text!r}: expected a label key, found {token!r}")
        else:
            key = _check_key(token, text)
            following = peek()
            if following is None or following == ",":
                requirements.append(Requirement(key, Operator.EXISTS))
            elif following in ("=", "==", "!="):
                take("an operator")
                value = peek()
                if value is None or value == ",":
                    value = ""  # key= selects an empty value, as the apiserver reads it
                else:
                    value = take("a value")
                    if value in ("=", "==", "!=", "!", "(", ")"):
                        raise SelectorError(f"selector {text!r}: expected a value after {key}{following}, "
                                            f"found {value!r}")
                operator = Operator.NOT_EQUALS if following == "!=" else Operator.EQUALS
                requirements.append(Requirement(key, operator, (_check_value(value, text),)))
            elif following in ("in", "notin"):
                take("an operator")
                requirements.append(Requirement(key, Operator.IN if following == "in" else Operator.NOT_IN,
                                                _value_set(take, text, key, following)))
            else:
                raise SelectorError(f"selector {text!r}: after {key} expected '=', '==', '!=', 'in', 'notin' "
                                    f"or ',', found {following!r}")
        if position < len(tokens):
            separator = take("','")
            if separator != ",":
                raise SelectorError(f"selector {text!r}: expected ',' between requirements, found {separator!r}")
            if position == len(tokens):
                raise SelectorError(f"selector {text!r} ends with ','")
    return Selector(tuple(requirements))


def _value_set(take: Any, text: str, key: str, operator: str) -> tuple[str, ...]:
    """The ``(a,b)`` after ``in``/``notin``; an empty entry (``(a,)``) is the empty value, as the
    apiserver reads it."""
    if take(f"'(' after {key} {operator}") != "(":
        raise SelectorError(f"selector {text!r}: {key} {operator} needs a list of values in parentheses")
    inner: list[str] = []
    while (token := take(f"')' closing the values of {key}")) != ")":
        inner.append(token)
    if not inner:
        raise SelectorError(f"selector {text!r}: {key} {operator} () needs at least one value")
    values: list[str] = []
    current: str | None = None
    for token in [*inner, ","]:
        if token == ",":
            values.append(_check_value(current or "", text))
            current = None
        elif current is not None or token in ("=", "==", "!=", "!", "("):
            raise SelectorError(f"selector {text!r}: expected ',' or ')' in the values of {key}, found {token!r}")
        else:
            current = token
    return tuple(values)
