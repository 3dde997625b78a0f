"""Commands for running and watching the market: ``serve``, ``worker``, ``init-topics``,
``ledger``, ``rejections``, ``schemas``, ``vectors``, ``demo`` — and ``verify-receipt``, which
anyone can run with the base package alone (no service dependencies)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from .common import (
    EXIT_BROKER,
    EXIT_REFUSED,
    CommandError,
    bootstrap,
    check_broker,
    run_client,
    topics_of,
    unreachable,
)
from .output import add_json_flag, json_mode, print_json, say, show

__all__ = ["add_commands", "cmd_verify_receipt"]

EXIT_IDENTITY = 6


def cmd_serve(args: argparse.Namespace) -> int:
    from ...broker.embedded import EmbeddedBroker  # noqa: PLC0415

    settings = _worker_settings(args)
    with _data_dir_held(settings, exclusive=True):
        key_id, market_key = _start_checks(args, settings)
        broker = None
        if args.broker is None:
            broker = EmbeddedBroker().start()
            settings = _tuned(replace(settings, broker=broker.url).for_tansu(), args)
        try:
            _say_serving(settings, key_id, market_key, embedded=broker is not None)
            return _run(settings, None if broker is None else broker.stop, args=args)
        finally:
            if broker is not None:
                broker.stop()


def _say_serving(settings: Any, key_id: str, market_key: str, *, embedded: bool) -> None:
    """What ``serve`` prints once it serves: where, what to paste in a second terminal."""
    url = settings.broker
    print(
        f"epsilon-market is serving on {url} (prefix {settings.prefix}); "
        "leave this running and use a second terminal:",
        flush=True,
    )
    pages = f"http://{settings.web_host}:{settings.web_port}"
    print(
        f"  export EMARKET_BROKER={url} EMARKET_WORKER={pages} EMARKET_MARKET_KEY={market_key}",
        flush=True,
    )
    print(
        f"  (EMARKET_MARKET_KEY: the key the market signs receipts and answers with, key id "
        f"{key_id}; clients believe nothing it did not sign, and given this key (pinned) they "
        "trust no other; without it they trust the key <prefix>.market names, with a "
        "warning)",
        flush=True,
    )
    print(
        f"  worker pages: {pages}/health, /metrics, /ledger   (Ctrl-C stops everything)", flush=True
    )
    print(
        f"  /ledger needs the operators' token in {settings.data_dir}/operator_token "
        "(`epsilon-market ledger` reads it)",
        flush=True,
    )
    if embedded:
        print(
            "  the embedded broker keeps everything in memory: when this stops, accounts, "
            "streams and holdings are gone (open the accounts again after a restart)",
            flush=True,
        )


def _market_key_of(settings: Any) -> tuple[str, str]:
    """(key id, public key) of the key the worker will sign with (loaded, or made, as it
    will): what clients pin (docs/protocol.md §12.1.1)."""
    from ...worker.secrets import load_or_create_keys  # noqa: PLC0415

    try:
        keys = load_or_create_keys(settings.data_dir)
    except (ValueError, OSError) as exc:  # EMARKET_SIGNING_KEY, EMARKET_NOISE_SECRET, the files
        raise CommandError(f"the market's keys: {exc}") from None
    return str(keys.key_id), str(keys.public_key_b64)


def cmd_worker(args: argparse.Namespace) -> int:
    bootstrap(args)
    settings = _worker_settings(args)
    with _data_dir_held(settings, exclusive=False):
        key_id, market_key = _start_checks(args, settings)
        print(
            f"epsilon-market worker: market key {key_id}: clients pin it with "
            f"EMARKET_MARKET_KEY={market_key} (--market-key)",
            flush=True,
        )
        return _run(settings, args=args)


@contextlib.contextmanager
def _data_dir_held(settings: Any, *, exclusive: bool) -> Iterator[None]:
    """The data directory held while ``serve`` (``exclusive``) or ``worker`` runs: a second
    ``serve`` on it, or a worker beside a ``serve``, is one line and exit 2."""
    from ...worker.data_lock import DataDirInUse, hold_data_dir  # noqa: PLC0415

    held = contextlib.ExitStack()
    try:
        held.enter_context(hold_data_dir(settings.data_dir, exclusive=exclusive))
    except DataDirInUse as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(
            f"--data-dir {settings.data_dir}: cannot use this directory ({exc.strerror or exc})"
        ) from None
    with held:
        yield


def _start_checks(args: argparse.Namespace, settings: Any) -> tuple[str, str]:
    """What ``serve`` and ``worker`` check before anything starts, each failure one line: the
    web port is free, the market's keys load (made on the first start), and, last, the broker
    answers (``serve`` without a broker starts its own). Returns the market key (id, public
    key)."""
    taken = _web_port_taken(settings)
    if taken:
        raise CommandError(taken)
    market_key = _market_key_of(settings)
    if args.broker is not None:
        check_broker(args, args.broker_wait, _auth_of(settings))
    return market_key


def _auth_of(settings: Any) -> dict[str, Any]:
    try:
        auth: dict[str, Any] = settings.aiokafka_auth()
    except (ValueError, OSError) as exc:  # a half-set EMARKET_KAFKA_*, an unreadable CA file
        raise CommandError(f"broker credentials: {exc}") from None
    return auth


def _web_port_taken(settings: Any) -> str | None:
    """Why the worker's web port cannot be served, or None: checked before anything starts, so
    a taken port is one clear line, not a crash half a minute later."""
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the web server binds
        try:
            sock.bind((settings.web_host, settings.web_port))
        except OSError as exc:
            return (
                f"the worker's web port {settings.web_host}:{settings.web_port} is "
                f"not free ({exc.strerror}): another market or program is serving there. "
                "Choose another with --web-port N (or EMARKET_WEB_PORT)."
            )
    return None


def _run(
    settings: Any,
    on_forced_exit: Callable[[], None] | None = None,
    *,
    args: argparse.Namespace,
) -> int:
    from aiokafka.errors import KafkaError  # noqa: PLC0415

    from ...worker.identity import MarketIdentityError  # noqa: PLC0415
    from ...worker.runner import run_worker  # noqa: PLC0415

    try:
        run_worker(settings, on_forced_exit)
    except MarketIdentityError as exc:
        print(f"error: the worker did not start: {exc}", file=sys.stderr)
        return EXIT_IDENTITY
    except TimeoutError as exc:  # the broker went away after answering the first check
        raise unreachable(args, str(exc)) from None
    except KafkaError as exc:
        raise unreachable(args, type(exc).__name__) from None
    return 0


def _worker_settings(args: argparse.Namespace) -> Any:
    from ...worker.config import Settings  # noqa: PLC0415

    try:
        s = Settings.from_env(
            broker=args.broker,
            prefix=args.prefix,
            app_id=args.app_id,
            partitions=args.partitions,
            data_dir=Path(args.data_dir) if args.data_dir else None,
            store=args.store,
            web_host=args.web_host,
            web_port=args.web_port,
            log_level=args.log_level or ("warn" if args.command == "serve" else None),
            require_encryption=False if args.unsafe_unsealed_buyers else None,
            accept_clear_values=True if args.accept_clear_values else None,
        )
    except ValueError as exc:  # an EMARKET_* variable that is not what it must be
        raise CommandError(f"the worker's settings: {exc}") from None
    return _tuned(s.for_tansu() if args.tansu else s, args)


def _tuned(settings: Any, args: argparse.Namespace) -> Any:
    """``settings`` with the group and fetch flags given on the command line, which win over
    the embedded broker's defaults and the environment."""
    tuning = {
        "session_timeout": args.session_timeout,
        "fetch_max_wait_ms": args.fetch_max_wait_ms,
        "heartbeat_interval": args.heartbeat_interval,
    }
    return replace(settings, **{k: v for k, v in tuning.items() if v is not None})


def cmd_init_topics(args: argparse.Namespace) -> int:
    from ...broker.admin import (  # noqa: PLC0415
        PartitionCountError,
        check_input_partitions,
        ensure_topics,
    )

    async def body(c: Any) -> list[str]:
        topics = topics_of(args)
        made = await ensure_topics(c.bootstrap, topics, **c.auth)
        try:  # topics that existed keep their count: never report the one asked for instead
            await check_input_partitions(c.bootstrap, topics, **c.auth)
        except PartitionCountError as exc:
            raise CommandError(
                f"the input topics exist already, with another partition count, "
                f"which cannot change: {exc}",
                EXIT_REFUSED,
            ) from None
        return made

    from ...core.census import SELLER_SHARE_FLOOR  # noqa: PLC0415

    created = run_client(args, body)
    room = _capacity(args.partitions)
    lines = [
        "created: " + (", ".join(created) if created else "nothing (all topics exist)"),
        f"{room['partitions']} input partitions: at most {room['max_workers']} workers "
        "share the market (the count is fixed once the topics exist); each partition "
        f"holds at most {room['streams_per_partition']} streams, "
        f"{room['seller_streams_per_partition']} of one seller",
    ]
    if room["seller_streams_per_partition"] < SELLER_SHARE_FLOOR:
        lines.append(
            f"warning: a seller's share of a partition is {room['seller_streams_per_partition']}"
            ": its streams whose ids hash to one partition are refused (too_many_streams) "
            "before it reaches EMARKET_MAX_STREAMS_PER_SELLER; raise that to at least "
            f"{SELLER_SHARE_FLOOR * args.partitions} for {args.partitions} partitions"
        )
    show(args, {"created": created, "capacity": room}, "\n".join(lines))
    return 0


def _partition_count(text: str) -> int:
    """``--partitions`` of ``init-topics``: a whole number of at least 1 (argparse type)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return n


def _capacity(partitions: int) -> dict[str, int]:
    """The shares per partition under this environment's limits (``EMARKET_MAX_*``)."""
    from ...core.census import capacity  # noqa: PLC0415
    from ...worker.config import Settings  # noqa: PLC0415

    return capacity(Settings.from_env().limits.stream_quota, partitions)


def _operator_token(args: argparse.Namespace) -> str | None:
    """The operators' credential: ``--token-file``, else ``$EMARKET_OPERATOR_TOKEN``, else the
    ``operator_token`` the worker wrote to ``--data-dir`` (default ``$EMARKET_DATA_DIR`` or
    ``data``); None if there is none."""
    if args.token_file is None and os.environ.get("EMARKET_OPERATOR_TOKEN"):
        return os.environ["EMARKET_OPERATOR_TOKEN"].strip()
    data_dir = Path(args.data_dir or os.environ.get("EMARKET_DATA_DIR") or "data")
    path = Path(args.token_file) if args.token_file else data_dir / "operator_token"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        if args.token_file:
            raise CommandError(f"--token-file {args.token_file}: no such file") from None
        return None
    except OSError as exc:
        raise CommandError(f"cannot read the operator token {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CommandError(
            f"{path} is not an operator token (the worker writes one, text, to its data "
            "directory as operator_token)"
        ) from None


def _whose_ledger(url: str, *, defaulted: bool) -> str:
    """One line naming the worker and the market whose ledger is read; refuses a worker of
    another market than ``EMARKET_MARKET_KEY`` names (a default port may answer for anyone's)."""
    import urllib.error  # noqa: PLC0415 - not on the path of --help and keygen
    import urllib.request  # noqa: PLC0415

    from market.receipts import key_id, parse_public_key  # noqa: PLC0415

    base = _base(url)
    try:
        with urllib.request.urlopen(base + "/health", timeout=10) as resp:
            health: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503: not ok, but it says who it is
        health = json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", exc)
        raise CommandError(
            f"cannot reach the worker at {base} ({why}); is it running? `epsilon-market serve` "
            "serves it at http://127.0.0.1:6066 (set EMARKET_WORKER or --worker)",
            EXIT_BROKER,
        ) from None
    market = str(health.get("market_key_id", "?"))
    pinned = os.environ.get("EMARKET_MARKET_KEY")
    if pinned:
        want = key_id(parse_public_key(pinned))
        if want != market:
            raise CommandError(
                f"the worker at {base} serves another market (key id {market}), not the one "
                f"EMARKET_MARKET_KEY names ({want}): point EMARKET_WORKER or --worker at yours",
                EXIT_REFUSED,
            )
    how = " (EMARKET_WORKER not set: the default port)" if defaulted else ""
    return (
        f"ledger of market {market} (app {health.get('app_id', '?')}, broker "
        f"{health.get('broker', '?')}) from the worker at {base}{how}"
    )


def _base(url: str) -> str:
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise CommandError(f"--worker {url!r} must be a URL such as http://127.0.0.1:6066")
    return base


def _fetch_ledger(url: str, token: str) -> dict[str, Any]:
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    base = _base(url)
    request = urllib.request.Request(base + "/ledger")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            data: dict[str, Any] = json.loads(resp.read())["streams"]
            return data
    except urllib.error.HTTPError as exc:
        if exc.code != 401:
            raise CommandError(f"the worker at {base} answered {exc.code}", EXIT_BROKER) from None
        raise CommandError(
            f"the worker at {base} refused the operator token: pass the `operator_token` of "
            "its data directory (--token-file, or --data-dir)",
            EXIT_REFUSED,
        ) from None
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        why = getattr(exc, "reason", exc)
        raise CommandError(
            f"cannot read the ledger of the worker at {base} ({why}); is it running? "
            "`epsilon-market serve` serves it at http://127.0.0.1:6066",
            EXIT_BROKER,
        ) from None


def _window_figure(s: dict[str, Any]) -> str:
    """``spent/cap`` of a window stream's newest window (``-`` on event streams)."""
    pw = s.get("privacy_window")
    if not pw or not pw.get("latest"):
        return "-"
    latest = pw["latest"]
    return f"{latest['spent']:g}/{latest['cap']:g} per {pw['duration_ms'] // 1000}s"


def cmd_ledger(args: argparse.Namespace) -> int:
    from ...wire.money import format_money  # noqa: PLC0415

    streams: dict[str, Any] = {}
    env = [u.strip() for u in os.environ.get("EMARKET_WORKER", "").split(",") if u.strip()]
    token = _operator_token(args)
    urls = args.worker or env or ["http://127.0.0.1:6066"]
    said = [_whose_ledger(url, defaulted=not (args.worker or env)) for url in urls]
    if token is None:
        raise CommandError(
            "the ledger is the operators' page and needs their token: pass --token-file, "
            "set EMARKET_OPERATOR_TOKEN, or --data-dir of the worker (its operator_token)",
            EXIT_REFUSED,
        )
    for url in urls:
        streams.update(_fetch_ledger(url, token))
    if json_mode(args):
        print_json(streams)
        print("\n".join(said), file=sys.stderr)
        return 0
    print("\n".join(said) + "\n")
    print(
        f"{'stream':<20} {'seller':<12} {'spent':>10} {'cap':>8} {'unit':<8} {'revenue':>14}"
        f"  {'values':>8}  window spent/cap"
    )
    buyers: dict[str, dict[str, Any]] = {}
    sellers: dict[tuple[str, str], int] = {}
    for sid, s in sorted(streams.items()):
        money = format_money(s["revenue_minor"], s["currency"])
        print(
            f"{sid:<20} {s['seller_id']:<12} {s['privacy_spent']:>10g} {s['cap']:>8g} "
            f"{s['level_unit']:<8} {money:>14}  {s['values_ingested']:>8}  "
            f"{_window_figure(s)}"
        )
        for b, h in s.get("holders", {}).items():
            buyers.setdefault(b, {})[sid] = {**h, "currency": s["currency"]}
        key = (s["seller_id"], s["currency"])
        sellers[key] = sellers.get(key, 0) + s["revenue_minor"]
    print(f"\n{'seller':<20} {'revenue':>14}  streams")
    for (seller, cur), revenue in sorted(sellers.items()):
        owned = sorted(k for k, v in streams.items() if v["seller_id"] == seller)
        print(f"{seller:<20} {format_money(revenue, cur):>14}  {', '.join(owned)}")
    print(f"\n{'buyer':<20} {'stream':<20} {'level':>8} {'paid':>14} purchases")
    for b, held in sorted(buyers.items()):
        for sid, h in sorted(held.items()):
            paid = format_money(h["paid_minor"], h["currency"])
            print(f"{b:<20} {sid:<20} {h['level']:>8g} {paid:>14} {h['purchases']}")
    return 0


def cmd_rejections(args: argparse.Namespace) -> int:
    """Every refusal on the rejections topic (operators), newest last, one line each."""
    import contextlib  # noqa: PLC0415

    from ...wire.events import Rejection  # noqa: PLC0415
    from ..client import TopicReader  # noqa: PLC0415

    async def body(c: Any) -> None:
        reader = TopicReader(c.bootstrap, c.topics.rejections, **c.auth)
        await reader.start()
        try:
            while batch := await reader.poll(2.0 if not args.follow else 3600.0):
                for _, raw in batch:
                    try:
                        rej = Rejection.model_validate_json(raw)
                    except ValueError:
                        skipped[0] += 1
                        continue
                    if args.stream and rej.stream_id != args.stream:
                        continue
                    shown[0] += 1
                    if json_mode(args):
                        print(rej.model_dump_json(), flush=True)
                        continue
                    who = rej.sender_id or (f"claims {rej.claimed_id}" if rej.claimed_id else "?")
                    kind = rej.source_topic.removeprefix(f"{c.topics.prefix}.")
                    line = f"{rej.reason:<24} {kind:<13} {rej.stream_id or '-':<16} {who:<18}"
                    print(f"{line} {rej.message}", flush=True)
        finally:
            await reader.stop()

    skipped, shown = [0], [0]
    with contextlib.suppress(KeyboardInterrupt):
        run_client(args, body)
    if not shown[0]:  # said, not left to an empty screen
        on = f" on stream {args.stream!r}" if args.stream else ""
        say(args, f"no refusals{on} on {args.prefix}.rejections yet")
    if skipped[0]:
        print(
            f"warning: skipped {skipped[0]} records that are not rejections (written by "
            "someone other than the market?)",
            file=sys.stderr,
        )
    return 0


def _out_dir(text: str) -> Path:
    """The directory ``--out`` names, made if missing; a clear error if it cannot be."""
    out = Path(text)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or exc
        raise CommandError(f"--out {text}: cannot create this directory ({why})") from None
    return out


def cmd_schemas(args: argparse.Namespace) -> int:
    from ...wire.events import SCHEMAS, published_schema  # noqa: PLC0415

    out = _out_dir(args.out)
    written = []
    for name in SCHEMAS:
        path = out / f"{name}.schema.json"
        path.write_text(json.dumps(published_schema(name), indent=2, sort_keys=True) + "\n")
        written.append(str(path))
    show(args, {"written": written}, "\n".join(written))
    return 0


def cmd_vectors(args: argparse.Namespace) -> int:
    """Write the protocol's test vectors (docs/protocol.md §10) as JSON files."""
    from ...wire.vectors import build, render  # noqa: PLC0415

    out = _out_dir(args.out)
    written = []
    for name, doc in build().items():
        path = out / name
        path.write_text(render(doc))
        written.append(str(path))
    show(args, {"written": written}, "\n".join(written))
    return 0


def cmd_verify_receipt(args: argparse.Namespace) -> int:
    """Verify a saved purchase outcome against the market's key: the receipt's signature, and
    the released numbers (and envelope) of the file against what the receipt commits to. With a
    key given (pinned) it needs only the base package (no service extra) and no broker."""
    from market.errors import ReceiptError  # noqa: PLC0415
    from market.receipts import verify_outcome  # noqa: PLC0415

    try:
        data = json.loads(Path(args.event).read_text())
    except OSError as exc:
        raise CommandError(f"cannot read {args.event}: {exc.strerror}") from None
    except (ValueError, RecursionError):
        raise CommandError(f"{args.event} is not JSON (expected a `buy --output` file)") from None
    key, source = _receipt_key(args)
    try:
        rec = verify_outcome(data, key)
    except ReceiptError as exc:  # the verdict, not an error of the command: on stdout
        verdict = f"INVALID: {exc.message} (checked with the market key {source})"
        show(args, {"valid": False, "error": exc.message}, verdict)
        return EXIT_REFUSED
    from ...wire.money import format_money  # noqa: PLC0415 - plain Python: no service extra

    price = format_money(rec.price_minor, rec.currency)
    sealed = " and its sealed envelope" if rec.ciphertext_digest else ""
    show(
        args,
        {"valid": True, "receipt": rec.to_dict()},
        f"valid: purchase {rec.purchase_id} by {rec.buyer_id} on {rec.stream_id} (seller "
        f"{rec.seller_id}, {rec.mechanism}), level {rec.level_before:g} -> {rec.level_after:g}, "
        f"{price}, {len(rec.value_ids)} values\n"
        f"  checked: the receipt is signed by the market key {source}, and the released "
        f"values of {args.event} ({len(rec.value_ids)}){sealed} are the ones it commits to "
        "(with the file's opening)",
    )
    return 0


def _receipt_key(args: argparse.Namespace) -> tuple[Any, str]:
    """The market key a receipt is checked with, and where it came from: the key given
    (``--public-key``, else ``--market-key`` / ``EMARKET_MARKET_KEY``: pinned, no broker needed),
    else the one the market's identity record on ``--broker`` names, trusted on first use with a
    warning, as every other command reads it (docs/protocol.md §12.1.1)."""
    from market.errors import ReceiptError  # noqa: PLC0415
    from market.receipts import key_id, parse_public_key  # noqa: PLC0415

    given = [
        (f, k)
        for f, k in (("--public-key", args.public_key), ("--market-key", args.market_key))
        if k
    ]
    if len({k for _, k in given}) > 1:
        raise CommandError(
            "--public-key and --market-key (or EMARKET_MARKET_KEY) name two different keys: "
            "give the market's key once"
        )
    if given:
        flag, text = given[0]
        try:
            key = parse_public_key(text)
        except ReceiptError as exc:
            raise CommandError(f"{flag}: {exc.message}") from None
        return key, f"{key_id(key)} given ({flag})"
    if not getattr(args, "broker", None):
        raise CommandError(
            "verify-receipt needs the market's key: pass --market-key KEY (or set "
            "EMARKET_MARKET_KEY; --public-key KEY works too; `epsilon-market serve` prints it), "
            "or --broker / EMARKET_BROKER to read it from the market's identity record"
        )

    async def body(c: Any) -> Any:
        return await c.market_key()

    key = run_client(args, body)
    return key, f"{key_id(key)} read from {args.prefix}.market on {args.broker} (not pinned)"


def cmd_demo(args: argparse.Namespace) -> int:
    if args.broker is not None:
        from ...broker.auth import env_auth  # noqa: PLC0415

        try:
            auth = env_auth()
        except (ValueError, OSError) as exc:
            raise CommandError(f"broker credentials: {exc}") from None
        check_broker(args, args.broker_wait, auth)
    from ..demo import run_demo  # noqa: PLC0415

    return run_demo(broker=args.broker, steps=args.steps, n_values=args.values)


_WORKER_FLAGS: tuple[tuple[str, type, str], ...] = (
    (
        "--app-id",
        str,
        "the Faust app id: workers with one id share the work "
        "(default $EMARKET_APP_ID or epsilon-market)",
    ),
    (
        "--partitions",
        int,
        "input partitions of the market's topics (default $EMARKET_PARTITIONS or 4)",
    ),
    (
        "--data-dir",
        str,
        "the market's keys, the operators' token and local checkpoints "
        "(default $EMARKET_DATA_DIR or data); one serve per directory",
    ),
    (
        "--store",
        str,
        "table store, memory:// or rocksdb:// (default $EMARKET_STORE or memory://)",
    ),
    (
        "--web-host",
        str,
        "address of /health, /metrics and /ledger (default $EMARKET_WEB_HOST or 127.0.0.1)",
    ),
    (
        "--web-port",
        int,
        "port of /health, /metrics and /ledger (default $EMARKET_WEB_PORT or 6066)",
    ),
    (
        "--session-timeout",
        float,
        "consumer group session timeout, seconds (default "
        "$EMARKET_SESSION_TIMEOUT or 10; 3 with --tansu)",
    ),
    (
        "--heartbeat-interval",
        float,
        "consumer group heartbeat, seconds (default "
        "$EMARKET_HEARTBEAT_INTERVAL or 1; 0.3 with --tansu)",
    ),
    (
        "--fetch-max-wait-ms",
        int,
        "longest wait of a fetch, ms (default $EMARKET_FETCH_MAX_WAIT_MS or 1500; 20 with --tansu)",
    ),
)
"""The worker's settings a flag of ``serve``/``worker`` overrides (:mod:`streams.worker.config`)."""


def _worker_options(sp: argparse.ArgumentParser) -> None:
    for flag, kind, text in _WORKER_FLAGS:
        sp.add_argument(flag, type=kind, default=None, help=text)
    sp.add_argument(
        "--log-level",
        default=None,
        choices=["crit", "error", "warn", "info", "debug"],
        help="default warn for serve; $EMARKET_LOG_LEVEL or info for worker",
    )
    sp.add_argument(
        "--tansu",
        action="store_true",
        help="apply the embedded-broker workarounds (serve applies them to its own broker)",
    )
    _broker_wait(sp)
    sp.add_argument(
        "--unsafe-unsealed-buyers",
        action="store_true",
        help="UNSAFE: also serve buyers without a sealing key; their releases travel in clear "
        "text, readable by anyone who can read their inbox topic (on the embedded broker, "
        "anyone who can reach it). Default: such purchases are refused (encryption_required)",
    )
    sp.add_argument(
        "--accept-clear-values",
        action="store_true",
        help="migration only: also accept value batches not sealed to the market's key (their "
        "numbers are readable on the values topic). Default: refused (values_not_sealed)",
    )


def _running_commands(sub: Any) -> None:
    """``serve``, ``worker`` and ``demo``: the commands that run until stopped."""
    sp = sub.add_parser("serve", help="run the embedded broker and a worker (blocks)")
    _worker_options(sp)
    sp.set_defaults(fn=cmd_serve)
    sp = sub.add_parser("worker", help="run a worker against --broker")
    _worker_options(sp)
    sp.set_defaults(fn=cmd_worker)
    sp = sub.add_parser("demo", help="live demo: a seller streams, a buyer buys three steps")
    sp.add_argument(
        "--steps", type=int, default=3, help="privacy steps the buyer buys, 1 to 5 (default 3)"
    )
    sp.add_argument(
        "--values", type=int, default=20, help="readings the seller publishes (default 20)"
    )
    _broker_wait(sp)
    sp.set_defaults(fn=cmd_demo)


def _broker_wait(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--broker-wait",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with --broker: how long it may take to answer before this stops (exit 4); "
        "raise it where a supervisor may start this before the broker is up "
        "(default %(default)g)",
    )


def add_commands(sub: Any) -> None:
    _running_commands(sub)
    sp = sub.add_parser("init-topics", help="create the market's topics")
    sp.add_argument(
        "--partitions",
        type=_partition_count,  # a text default is checked too
        default=os.environ.get("EMARKET_PARTITIONS") or "4",
        help="input partitions, fixed for the market's life: at most this many "
        "workers (default $EMARKET_PARTITIONS or 4; docs/operations.md, sizing)",
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_init_topics)
    sp = sub.add_parser("ledger", help="operators: revenue, privacy spent and holdings")
    sp.add_argument(
        "--worker",
        action="append",
        default=None,
        help="worker URL, repeatable (default $EMARKET_WORKER, comma-separated, "
        "or http://127.0.0.1:6066)",
    )
    sp.add_argument(
        "--token-file",
        default=None,
        help="the operators' credential (default $EMARKET_OPERATOR_TOKEN, or "
        "operator_token in --data-dir); without it only aggregates are shown",
    )
    sp.add_argument(
        "--data-dir",
        default=None,
        help="the worker's data directory (default $EMARKET_DATA_DIR or data)",
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_ledger)
    sp = sub.add_parser("rejections", help="operators: every refused event, with its reason")
    sp.add_argument("--stream", default=None, help="only this stream's (default: every stream)")
    sp.add_argument("--follow", action="store_true", help="keep reading new refusals until Ctrl-C")
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_rejections)
    sp = sub.add_parser("schemas", help="export the JSON Schemas of every event")
    sp.add_argument(
        "--out", default="docs/schemas", help="directory to write to (default docs/schemas)"
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_schemas)
    sp = sub.add_parser("vectors", help="write the protocol's test vectors (docs/vectors)")
    sp.add_argument(
        "--out", default="docs/vectors", help="directory to write to (default docs/vectors)"
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_vectors)
    _verify_receipt_parser(sub)


def _verify_receipt_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "verify-receipt",
        help="check a purchase outcome (buy --output): the receipt's signature by the market key "
        "and the released values against it",
    )
    sp.add_argument(
        "event", metavar="FILE", help="a purchase_fulfilled event, as buy --output writes it"
    )
    sp.add_argument(
        "--public-key",
        default=None,
        help="the market's key, base64, for this check (as --market-key); default "
        "--market-key / $EMARKET_MARKET_KEY, else the key of the market's identity record on "
        "--broker, trusted on first use with a warning",
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_verify_receipt)
