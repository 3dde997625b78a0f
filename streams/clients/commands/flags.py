"""Speaking of what a person typed: the flags of a command, never the wire's field names.

A person types ``--target 2``; the event the command signs carries ``target_level``, and the
market's refusals and the event's validation speak of that field. Two things here turn them into
the words of the command line, each in one place, used by every command:

* :func:`in_flags` rewrites the field names of a text (a refusal's message) as the flags of the
  command that sent the event (``commands.common.refused`` builds the error a refusal becomes);
* :func:`input_problem` turns a validation error of an event the command was about to sign into
  sentences naming the flags (or, for what no flag sets, the field) and what is wanted.

A field is named by its flag only where the command has that flag: ``tail`` has no ``--target``,
so the message it shows keeps ``target_level``.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from ...wire.ids import ID_PATTERN

__all__ = ["FIELD_FLAGS", "in_flags", "input_problem"]

FIELD_FLAGS = {
    "stream_id": "--stream",
    "target_level": "--target",
    "max_price_minor": "--max-price",
    "purchase_id": "--purchase-id",
    "reservation_id": "--reservation",
    "accuracy.rmse": "--rmse",
    "accuracy.half_width": "--half-width",
    "accuracy.confidence": "--confidence",
    "currency": "--currency",
    "mechanism": "--mechanism",
    "sensitivity": "--sensitivity",
    "dimension": "--dimension",
    "steps": "--steps",
    "cap": "--cap",
    "retain_last": "--retain",
    "description": "--description",
    "window.cap": "--window-cap",
    "window.duration_ms": "--privacy-window",
    "buyer_share": "--buyer-share",
    "tree_height": "--running-totals",
    "rappor_ones": "--rappor",
    "histogram.domain_size": "--histogram",
    "histogram.false_keys": "--false-keys",
    "value_id": "--value-id",
    "published_at_ms": "--published-at",
    "version": "--version",
}
"""Wire field (dotted path inside the event) → the flag that sets it."""

_FIELD = re.compile(r"(?<![-'\"])\b[a-z]+(?:_[a-z]+)+\b(?![-'\"])")
"""A field name in a message: snake_case with at least one underscore (``steps`` or ``cap``
alone are also English words, and stay as they are), not quoted (``'value_id'`` is an id)."""


def _flag(args: argparse.Namespace, field: str) -> str | None:
    """The flag of this command that sets ``field``, if it has one."""
    flag = FIELD_FLAGS.get(field) or FIELD_FLAGS.get(field.rsplit(".", 1)[-1])
    if flag is None or not hasattr(args, flag.lstrip("-").replace("-", "_")):
        return None
    return flag


_WORD = re.compile(r"(?<![-'\"])\b[a-z]+(?:_[a-z]+)*\b(?![-'\"])")
"""Any field name, ``steps`` included: in the model's own rules every such word is a field
(not inside a flag: ``cap`` of ``--window-cap``)."""

_PHRASES = {"window cap": "window.cap"}
"""Fields the rules name in words (``window cap``, not ``cap``)."""


def in_flags(args: argparse.Namespace, text: str, *, words: bool = False) -> str:
    """``text`` with every field name the command has a flag for written as that flag (with
    ``words``, one-word names such as ``steps`` too)."""
    for phrase, field in _PHRASES.items():
        if (flag := _flag(args, field)) is not None:
            text = text.replace(phrase, flag)
    pattern = _WORD if words else _FIELD
    return pattern.sub(lambda m: _flag(args, m.group(0)) or m.group(0), text)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


_WANTS = {
    "greater_than": "must be more than {gt}",
    "greater_than_equal": "must be {ge} or more",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "string_too_long": "must be at most {max_length} characters long",
    "string_too_short": "must be at least {min_length} characters long",
    "too_long": "may hold at most {max_length} items",
    "too_short": "must hold at least {min_length} items",
    "string_pattern_mismatch": "must match the pattern {pattern}",
    "finite_number": "must be a finite number",
    "missing": "is required",
}


_PATTERNS = {
    ID_PATTERN: "must be 1 to 64 letters, digits, '_' or '-'",
    r"^[A-Z]{3}$": "must be a currency's three capital letters (ISO 4217, e.g. EUR)",
}
"""Patterns of the wire, said in words."""


def _where(args: argparse.Namespace, loc: tuple[Any, ...]) -> str:
    """``("steps", 0)`` → ``--steps (its 1st value)``; a field without a flag by its name."""
    names = [str(p) for p in loc if not isinstance(p, int)]
    field = ".".join(names)
    where = _flag(args, field) or field
    if field == "histogram.domain_size" and where == "--histogram":
        where = "N of --histogram integers:N"
    if loc and isinstance(loc[-1], int):  # one number of a list typed as a flag
        where += f" (its {_ordinal(loc[-1] + 1)} value)"
    return where


def _shown(x: Any) -> str:
    """A number as typed (``0``, not ``0.0``); text quoted."""
    if isinstance(x, float):
        return f"{x:g}"
    return repr(x) if isinstance(x, str) else str(x)


def _sentence(args: argparse.Namespace, error: Any) -> str:
    """One validation error in words."""
    msg = str(error.get("msg", ""))
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "value_error" or not loc:  # the model's own rule, said in words
        return in_flags(args, msg.removeprefix("Value error, "), words=True)
    ctx = error.get("ctx", {})
    wants = _PATTERNS.get(str(ctx.get("pattern"))) or _WANTS.get(str(error.get("type")))
    got = error.get("input")
    told = (
        f", not {_shown(got)}"
        if isinstance(got, int | float | str) and not isinstance(got, bool) and len(repr(got)) < 40
        else ""
    )
    if wants is not None:
        try:
            said = wants.format(**{k: _shown(v) for k, v in ctx.items()})
            return f"{_where(args, loc)} {said}{told}"
        except (KeyError, IndexError):
            pass
    return f"{_where(args, loc)}: {msg[:1].lower()}{msg[1:]}"


def input_problem(args: argparse.Namespace, exc: Any) -> str:
    """A pydantic ``ValidationError`` of an event the command built from what was typed, as
    sentences naming the flags (``--steps (its 1st value) must be more than 0, not 0``): the
    first three problems, and how many more there are."""
    said: list[str] = []
    for error in exc.errors():
        text = _sentence(args, error)
        if text not in said:
            said.append(text)
    more = f" (and {len(said) - 3} more problems)" if len(said) > 3 else ""
    return "; ".join(said[:3]) + more
