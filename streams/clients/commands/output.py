"""How every command prints: lines a person reads by default, JSON for machines with ``--json``.

One convention for every command:

* by default stdout holds what a person reads: one line, or a table, with units (the level's
  unit, prices with their currency, accuracy in the value's units);
* with ``--json`` (before or after the command's name) stdout holds only JSON, the machine's
  form (the market's events as the schemas in ``docs/schemas`` define them), and the lines a
  person reads go to stderr;
* an error is one line on stderr (:class:`~.common.CommandError`), whatever the mode.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_json_flag", "json_mode", "print_json", "say", "show", "warn"]

JSON_HELP = "machine-readable JSON on stdout (the lines a person reads go to stderr)"


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """``--json`` after a command's name (``epsilon-market --json CMD`` works as well)."""
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=JSON_HELP)


def json_mode(args: argparse.Namespace) -> bool:
    """Whether the command prints JSON (``--json`` given before or after its name)."""
    return bool(getattr(args, "json", False))


def print_json(obj: Any) -> None:
    """``obj`` (a pydantic model, or plain data) as indented JSON on stdout."""
    if hasattr(obj, "model_dump_json"):
        print(obj.model_dump_json(indent=2))
    else:
        print(json.dumps(obj, indent=2, sort_keys=True))


def warn(message: str) -> None:
    """A line for the person on stderr: a warning, or the human form under ``--json``."""
    print(message, file=sys.stderr)


def say(args: argparse.Namespace, text: str) -> None:
    """Lines a person reads: on stdout, or on stderr under ``--json`` (stdout holds JSON)."""
    if json_mode(args):
        warn(text)
    else:
        print(text, flush=True)


def show(args: argparse.Namespace, machine: Any, text: str) -> None:
    """A command's result: ``text`` for a person, or ``machine`` as JSON under ``--json`` (the
    text then goes to stderr)."""
    if json_mode(args):
        print_json(machine)
    say(args, text)
