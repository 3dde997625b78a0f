"""What every command shares: reaching the broker, reading key files, failing with a message.

Every error a command can meet is a :class:`CommandError` with the message a person needs (what
was wrong, what to do) and an exit code; :func:`streams.clients.cli.main` prints it in one line,
never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from .flags import in_flags, input_problem
from .output import json_mode, print_json, warn

__all__ = [
    "EXIT_BROKER",
    "EXIT_INTERRUPTED",
    "EXIT_REFUSED",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "CommandError",
    "bootstrap",
    "broker_source",
    "check_broker",
    "floats",
    "load_party",
    "print_json",
    "read_inbox",
    "refused",
    "run_client",
    "topics_of",
    "unreachable",
    "warn",
]

EXIT_REFUSED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_BROKER = 1, 2, 3, 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped
T = TypeVar("T")


class CommandError(Exception):
    """A failure to report in one line: ``message`` says what to do; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def floats(text: str) -> list[float]:
    """``"1,2.5"`` → ``[1.0, 2.5]`` (argparse type)."""
    try:
        out = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        out = []
    if not out or not all(math.isfinite(x) for x in out):
        raise argparse.ArgumentTypeError(f"expected finite comma-separated numbers, got {text!r}")
    return out


def bootstrap(args: argparse.Namespace) -> str:
    """``host:port`` list from ``--broker`` (``kafka://host:port``, several joined by ``;``)."""
    broker = getattr(args, "broker", None)
    if not broker:
        raise CommandError(
            f"'{args.command}' needs a broker: pass --broker kafka://HOST:PORT or set "
            "EMARKET_BROKER (`epsilon-market serve` prints the URL of its embedded broker)"
        )
    hosts = [u.strip().split("://", 1)[-1] for u in broker.split(";") if u.strip()]
    for hp in hosts or [""]:
        host, _, port = hp.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CommandError(
                f"--broker {broker!r}: expected kafka://HOST:PORT (several joined by ';'), "
                "e.g. kafka://127.0.0.1:9092"
            )
    return ",".join(hosts)


def topics_of(args: argparse.Namespace) -> Any:
    from ...wire.topics import Topics  # noqa: PLC0415

    return Topics(args.prefix, getattr(args, "partitions", 4) or 4)


def load_party(args: argparse.Namespace) -> Any:
    """The party whose key file ``--key-file`` names (never created by accident)."""
    from ..keys import KeyFileError, Party  # noqa: PLC0415

    path = getattr(args, "key_file", None)
    if not path:
        raise CommandError(
            f"'{args.command}' acts for an account: pass --key-file FILE (or set "
            "EMARKET_KEY_FILE); create one with `epsilon-market keygen --account ID --out FILE`"
        )
    try:
        return Party.load(path, on_warning=warn)  # a key file others can read: said, not refused
    except KeyFileError as exc:
        raise CommandError(str(exc)) from None


def broker_source(args: argparse.Namespace) -> str:
    """Where ``--broker``'s value came from, as the person typed it: the flag, or the
    environment variable a shell kept from an earlier session (set by :func:`..cli.main`)."""
    return str(getattr(args, "broker_from", None) or "--broker")


def unreachable(args: argparse.Namespace, why: str) -> CommandError:
    """The one error for a broker that does not answer: which broker, where its address came
    from, and what to do (exit 4), for client commands and ``serve``/``worker``/``demo`` alike."""
    source = broker_source(args)
    if args.command == "serve" and source != "--broker":
        todo = (
            f"`unset {source}` to run serve's embedded broker, or start that broker; "
            "--broker kafka://HOST:PORT names another"
        )
    elif args.command == "serve":
        todo = "start that broker, or leave out --broker to run serve's embedded broker"
    elif source != "--broker":
        todo = (
            f"is it running? {source} is set in this shell: `unset {source}` if that broker "
            "is gone, or pass --broker kafka://HOST:PORT (`epsilon-market serve` prints the "
            "URL of its embedded broker)"
        )
    else:
        todo = "is it running? `epsilon-market serve` prints the URL of its embedded broker"
    return CommandError(
        f"cannot reach the broker at {args.broker} (from {source}): {why}; {todo}", EXIT_BROKER
    )


@contextlib.contextmanager
def _quiet_kafka_logs() -> Iterator[None]:
    """aiokafka logs every failed connection attempt; a command reports the failure once, as an
    error line with what to do (the level is restored after, for a worker's own logs)."""
    log = logging.getLogger("aiokafka")
    before = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(before)


def check_broker(args: argparse.Namespace, wait: float, auth: dict[str, Any]) -> None:
    """Return once the broker of ``--broker`` answers, or raise :func:`unreachable` after
    ``wait`` seconds: what ``serve``, ``worker`` and ``demo`` do before anything starts, so a
    dead broker is one line, not a worker retrying and then a traceback."""
    import asyncio  # noqa: PLC0415

    from aiokafka.errors import KafkaError  # noqa: PLC0415

    from ...broker.admin import wait_for_broker  # noqa: PLC0415

    boot = bootstrap(args)
    with _quiet_kafka_logs():
        try:
            asyncio.run(wait_for_broker(boot, timeout=wait, **auth))
        except TimeoutError:
            raise unreachable(args, f"no answer within {wait:g} s") from None
        except (KafkaError, OSError) as exc:
            raise unreachable(args, _why(exc)) from None


def _why(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or type(exc).__name__)


def run_client(
    args: argparse.Namespace, body: Callable[[Any], Awaitable[T]], party: Any = None
) -> T:
    """Run ``body(client)`` with a connected client; broker failures become CommandErrors."""
    import asyncio  # noqa: PLC0415 - not on the path of --help and keygen

    from aiokafka.errors import KafkaError  # noqa: PLC0415
    from pydantic import ValidationError  # noqa: PLC0415

    from ...broker.auth import env_auth  # noqa: PLC0415
    from ..client import MarketClient, MarketKeyError, MarketRootError  # noqa: PLC0415

    boot = bootstrap(args)
    try:
        auth = env_auth()
    except (ValueError, OSError) as exc:  # a half-set EMARKET_KAFKA_*, an unreadable CA file
        raise CommandError(f"broker credentials: {exc}") from None

    async def go() -> T:
        async with MarketClient(
            boot,
            topics_of(args),
            party=party,
            auth=auth,
            market_public_key=getattr(args, "market_key", None),
            on_warning=warn,
        ) as client:
            return await body(client)

    try:
        with _quiet_kafka_logs():
            return asyncio.run(go())
    except KafkaError as exc:
        raise unreachable(args, type(exc).__name__) from None
    except TimeoutError as exc:
        raise CommandError(f"timed out: {exc}", EXIT_TIMEOUT) from None
    except ValidationError as exc:  # an event built from what was typed, before it is signed
        raise CommandError(f"invalid input: {input_problem(args, exc)}") from None
    except MarketRootError as exc:  # no key to pass would make this market trustworthy
        raise CommandError(f"the market's trust root ({exc.reason}): {exc}", EXIT_REFUSED) from None
    except MarketKeyError as exc:
        raise CommandError(
            f"{exc}; pass --market-key KEY (EMARKET_MARKET_KEY; `epsilon-market serve` prints it)"
        ) from None
    except OSError as exc:
        raise unreachable(args, _why(exc)) from None


def read_inbox(args: argparse.Namespace, body: Callable[[Any], Awaitable[T]], party: Any) -> bool:
    """Run ``body(client)`` reading ``party``'s own inbox until it ends or Ctrl-C stops it (what
    was read so far is the caller's to print); an account without an inbox was never opened.
    Returns whether Ctrl-C stopped it: the inbox may then not have been read at all."""
    try:
        run_client(args, body, party)
    except KeyboardInterrupt:
        return True
    except LookupError:
        raise CommandError(
            f"no inbox for account {party.account_id!r}: open the account first "
            f"(`epsilon-market account open --key-file {args.key_file}`)",
            EXIT_REFUSED,
        ) from None
    return False


def refused(
    args: argparse.Namespace, doing: str, rejection: Any, hint: str = "", *, printed: bool = False
) -> CommandError:
    """The error a refusal of the market becomes (exit 1): ``"<doing> refused (<reason>):
    <message>"`` in the command's flags; under ``--json`` the rejection itself is printed first,
    as the market signed it (unless the command ``printed`` it already)."""
    if json_mode(args) and not printed:
        print_json(rejection)
    message = in_flags(args, f"{rejection.message}{hint}")
    return CommandError(f"{doing} refused ({rejection.reason}): {message}", EXIT_REFUSED)
