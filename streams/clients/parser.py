"""The parsers of the command line: each option's help says its default, the options every
command takes are accepted on either side of the command's name, and every command can be found.

Built on argparse's public interface only: :class:`CommandParser` keeps what is added to it (its
options, its commands) instead of reading argparse's private lists, so the walks over every
command (:func:`streams.clients.cli.build_parser`, the tests) need nothing private.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

from .commands.output import JSON_HELP

__all__ = ["GLOBAL_OPTIONS", "CommandParser", "Version", "add_global_options", "help_line"]

GLOBAL_OPTIONS = ("--broker", "--prefix", "--market-key", "--json")
"""Options every command takes, before or after its name (``--version`` only before it:
``account rotate --version`` is the account's)."""


def help_line(action: argparse.Action) -> str | None:
    """``action``'s help with its default, as ``--help`` prints it: the default is appended when
    there is one to show and the text does not already say it."""
    text = action.help
    if not text or text == argparse.SUPPRESS:
        return text
    shown = action.default not in (None, False, "", argparse.SUPPRESS, [])
    if shown and action.option_strings and "default" not in text:
        text += " (default %(default)s)"
    return text


class CommandParser(argparse.ArgumentParser):
    """A parser of the command line that shows each option's default in its help and keeps
    what was added to it: ``options`` (every option and positional, in order) and
    ``subcommands`` (the sets of commands below it, each a name → parser mapping)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options: list[argparse.Action] = []  # before super(): it adds --help
        self.subcommands: list[dict[str, argparse.ArgumentParser]] = []
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.dest == "key_file" and action.default is None:  # may come from the environment
            action.default = os.environ.get("EMARKET_KEY_FILE")
            action.help = (action.help or "your key file") + " (default $EMARKET_KEY_FILE)"
        action.help = help_line(action)
        self.options.append(action)
        return action

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", CommandParser)
        sub = super().add_subparsers(**kwargs)
        self.subcommands.append(sub.choices)
        return sub

    def commands(self, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
        """Every command below this parser, as (its words, e.g. ``("account", "open")``, its
        parser), and (with ``path``) this one if it is a command itself (has no commands)."""
        if path and not self.subcommands:
            yield path, self
        for choices in self.subcommands:
            for name, child in choices.items():
                if isinstance(child, CommandParser):
                    yield from child.commands((*path, name))

    def parsers(self) -> Iterator[CommandParser]:
        """This parser and every one below it (``account`` and its commands included)."""
        yield self
        for choices in self.subcommands:
            for child in choices.values():
                if isinstance(child, CommandParser):
                    yield from child.parsers()


def add_global_options(p: CommandParser, *, after: bool) -> None:
    """The options of :data:`GLOBAL_OPTIONS` on ``p``: with their defaults on the top-level
    parser, and (``after``) on each command's parser with ``SUPPRESS`` as the default, so that
    given after the command's name they set the value and, not given, leave the top level's."""
    have = {s for a in p.options for s in a.option_strings}

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if after else value

    if "--broker" not in have:
        p.add_argument(
            "--broker",
            default=default(None),
            help="Kafka broker URL (kafka://host:port; several joined by ';'); default "
            "$EMARKET_BROKER, or the embedded broker for serve/demo",
        )
    if "--prefix" not in have:
        p.add_argument(
            "--prefix",
            default=default(os.environ.get("EMARKET_PREFIX", "emarket")),
            help="the market's topic prefix (default $EMARKET_PREFIX or emarket)",
        )
    if "--market-key" not in have:
        p.add_argument(
            "--market-key",
            default=default(os.environ.get("EMARKET_MARKET_KEY") or None),
            help="the market's Ed25519 key (base64) its answers must be signed with, "
            "pinned: a market whose identity record names another is refused; default "
            "$EMARKET_MARKET_KEY, else the one the identity record names, trusted on "
            "first use with a warning",
        )
    if "--json" not in have:
        p.add_argument("--json", action="store_true", default=default(False), help=JSON_HELP)


class Version(argparse.Action):
    """``--version``: the installed package's version, read only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

        try:
            text = version("epsilon-market")
        except PackageNotFoundError:  # run from a checkout without `pip install`
            text = "unknown (not installed: pip install -e .)"
        print(f"{parser.prog} {text}")
        parser.exit()
