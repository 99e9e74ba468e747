"""Flags that several commands share, spelled and checked as kubectl spells them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from gpuquota_core.selector import Selector, SelectorError, parse_selector

from .output import COLOUR_CHOICES

F = TypeVar("F", bound=Callable[..., Any])


def _selector(ctx: click.Context, param: click.Parameter, value: str | None) -> Selector | None:
    if value is None:
        return None
    try:
        return parse_selector(value)
    except SelectorError as error:
        raise click.BadParameter(str(error), ctx, param) from None


def selector_option(what: str) -> Callable[[F], F]:
    return click.option("-l", "--selector", "selector", default=None, callback=_selector, metavar="SELECTOR",
                        help=f"Label selector ({what}): 'a=b', 'a!=b', 'a in (x,y)', 'a notin (x)', 'a', '!a', "
                             "joined by commas.")


def no_headers_option(help_text: str) -> Callable[[F], F]:
    return click.option("--no-headers", is_flag=True, help=help_text)


def colour_option(what: str) -> Callable[[F], F]:
    return click.option("--color", "colour", default="auto", type=click.Choice(COLOUR_CHOICES), show_default=True,
                        help=f"{what}: on a terminal (auto, unless NO_COLOR is set), always or never.")
