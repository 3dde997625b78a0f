"""``epsilon-market`` / ``python -m streams``: the command line for sellers, buyers and operators.

Run ``epsilon-market --help`` for the commands. Client commands take ``--broker`` (or
``EMARKET_BROKER``); ``serve`` and ``demo`` start the embedded broker when no broker is given.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _floats(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        out = []
    if not out or not all(math.isfinite(x) for x in out):
        raise argparse.ArgumentTypeError(f"expected finite comma-separated numbers, got {text!r}")
    return out


def _bootstrap(broker: str) -> str:
    return ",".join(u.split("://", 1)[-1] for u in broker.split(";"))


def _topics(args: argparse.Namespace) -> Any:
    from ..wire.topics import Topics  # noqa: PLC0415

    return Topics(args.prefix, getattr(args, "partitions", 4) or 4)


def _print(obj: Any) -> None:
    if hasattr(obj, "model_dump_json"):
        print(obj.model_dump_json(indent=2))
    else:
        print(json.dumps(obj, indent=2, sort_keys=True))


# ----------------------------------------------------------------------------- commands
def cmd_serve(args: argparse.Namespace) -> int:
    from ..broker.embedded import EmbeddedBroker  # noqa: PLC0415
    from ..worker.config import Settings  # noqa: PLC0415

    settings = _worker_settings(args)
    broker = None
    if args.broker is None:
        broker = EmbeddedBroker().start()
        settings = Settings(**{**settings.__dict__, "broker": broker.url}).for_tansu()
        print(f"embedded broker (Tansu, in-memory) on {broker.bootstrap}")
        print(f"  other commands: epsilon-market --broker {broker.url} --prefix {args.prefix} ...")
    print(
        f"worker '{settings.app_id}': metrics http://{settings.web_host}:{settings.web_port}/metrics"
    )
    try:
        return _run(settings)
    finally:
        if broker is not None:
            broker.stop()


def cmd_worker(args: argparse.Namespace) -> int:
    return _run(_worker_settings(args))


def _run(settings: Any) -> int:
    from ..worker.identity import MarketIdentityError  # noqa: PLC0415
    from ..worker.runner import run_worker  # noqa: PLC0415

    try:
        run_worker(settings)
    except MarketIdentityError as exc:
        print(f"error: the worker did not start: {exc}", file=sys.stderr)
        return 6
    return 0


def _worker_settings(args: argparse.Namespace) -> Any:
    from ..worker.config import Settings  # noqa: PLC0415

    s = Settings.from_env(
        broker=args.broker,
        prefix=args.prefix,
        app_id=args.app_id,
        partitions=args.partitions,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        store=args.store,
        web_host=args.web_host,
        web_port=args.web_port,
        log_level=args.log_level,
    )
    if args.tansu:
        s = s.for_tansu()
    from dataclasses import replace  # noqa: PLC0415

    return replace(
        s,
        **{
            k: v
            for k, v in {
                "session_timeout": args.session_timeout,
                "heartbeat_interval": args.heartbeat_interval,
                "fetch_max_wait_ms": args.fetch_max_wait_ms,
            }.items()
            if v is not None
        },
    )


def cmd_init_topics(args: argparse.Namespace) -> int:
    from ..broker.admin import ensure_topics  # noqa: PLC0415

    created = asyncio.run(ensure_topics(_bootstrap(args.broker), _topics(args)))
    print("created: " + (", ".join(created) if created else "nothing (all topics exist)"))
    return 0


def _pricing(args: argparse.Namespace) -> dict[str, Any]:
    if args.price_table:
        prices = {}
        for item in args.price_table.split(","):
            lvl, _, price = item.partition("=")
            prices[lvl.strip()] = int(price)
        return {"kind": "table", "prices": prices}
    if args.price_per_precision is not None:
        return {"kind": "linear_precision", "rate_per_precision": args.price_per_precision}
    return {"kind": "linear_level", "rate_per_level": args.price_per_level}


def cmd_register(args: argparse.Namespace) -> int:
    from pydantic import ValidationError  # noqa: PLC0415

    from ..wire.events import Rejection, StreamRegistration  # noqa: PLC0415
    from .client import MarketClient  # noqa: PLC0415

    try:
        reg = StreamRegistration(
            stream_id=args.stream,
            seller_id=args.seller,
            mechanism=args.mechanism,
            sensitivity=args.sensitivity,
            dimension=args.dimension,
            steps=args.steps,
            cap=args.cap if args.cap is not None else max(args.steps),
            retain_last=args.retain,
            sealed=args.sealed,
            pricing=_pricing(args),
            currency=args.currency,
            description=args.description,
        )
    except ValidationError as exc:
        print(f"invalid registration: {exc}", file=sys.stderr)
        return 2

    async def run() -> Any:
        async with MarketClient(_bootstrap(args.broker), _topics(args)) as c:
            return await c.register(reg, timeout=args.timeout)

    result = asyncio.run(run())
    _print(result)
    return 1 if isinstance(result, Rejection) else 0


def cmd_publish(args: argparse.Namespace) -> int:
    from .client import MarketClient  # noqa: PLC0415

    rows: list[Row] = []
    if args.values is not None:
        rows.append((args.value_id, args.values, args.published_at))
    else:
        src = sys.stdin if args.file in (None, "-") else open(args.file)  # noqa: SIM115
        with src:
            for n, raw_line in enumerate(src, 1):
                line = raw_line.strip()
                if not line:
                    continue
                try:
                    rows.append(_parse_row(line))
                except ValueError as exc:
                    print(f"line {n}: {exc}", file=sys.stderr)
                    return 2

    async def run() -> None:
        async with MarketClient(_bootstrap(args.broker), _topics(args)) as c:
            t0 = time.monotonic()
            for i, (vid, vals, stamp) in enumerate(rows, 1):
                out = await c.publish(args.stream, vals, value_id=vid, published_at_ms=stamp)
                if len(rows) == 1:
                    print(f"{out} published_at_ms={c.published_at(args.stream, out)}")
                elif i % 100 == 0 or i == len(rows):
                    rate = i / max(1e-9, time.monotonic() - t0)
                    print(f"\rpublished {i}/{len(rows)} values ({rate:.0f}/s)", end="", flush=True)
            if len(rows) > 1:
                print()

    asyncio.run(run())
    return 0


_ROW_HELP = (
    'expected a JSON list of numbers or {"value_id": "...", "values": [numbers], '
    '"published_at_ms": ms}'
)
Row = tuple[str | None, list[float], int | None]


def _parse_row(line: str) -> Row:
    """One line of a values file, checked before anything is sent."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON ({exc}); {_ROW_HELP}") from None
    vid = stamp = None
    if isinstance(obj, dict):
        vid, stamp = obj.get("value_id"), obj.get("published_at_ms")
        if vid is not None and not isinstance(vid, str):
            raise ValueError(f"value_id must be a string; {_ROW_HELP}")
        if stamp is not None and (not isinstance(stamp, int) or isinstance(stamp, bool)):
            raise ValueError(f"published_at_ms must be an integer (Unix ms); {_ROW_HELP}")
        obj = obj.get("values")
    if not isinstance(obj, list) or not obj:
        raise ValueError(_ROW_HELP)
    if not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in obj
    ):
        raise ValueError(f"values must all be finite numbers; {_ROW_HELP}")
    return vid, [float(x) for x in obj], stamp


def cmd_quote(args: argparse.Namespace) -> int:
    from ..wire.events import Rejection  # noqa: PLC0415
    from .client import MarketClient  # noqa: PLC0415

    async def run() -> Any:
        async with MarketClient(_bootstrap(args.broker), _topics(args)) as c:
            return await c.quote(args.buyer, args.stream, target_level=args.target)

    result = asyncio.run(run())
    _print(result)
    return 1 if isinstance(result, Rejection) else 0


def _buyer_key(path: str | None) -> Any:
    """The buyer's X25519 key from ``path`` (base64 raw bytes), created (mode 0600) if missing."""
    if not path:
        return None
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: PLC0415
    from cryptography.hazmat.primitives.serialization import (  # noqa: PLC0415
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    p = Path(path)
    if not p.exists():
        key = X25519PrivateKey.generate()
        raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(base64.b64encode(raw).decode() + "\n")
        print(f"created buyer key {p} (keep it private)", file=sys.stderr)
        return key
    try:
        return X25519PrivateKey.from_private_bytes(base64.b64decode(p.read_text().strip()))
    except ValueError:
        raise SystemExit(f"{p} is not a buyer key (base64 of 32 bytes)") from None


def cmd_buy(args: argparse.Namespace) -> int:
    from ..wire.events import Rejection  # noqa: PLC0415
    from .client import MarketClient  # noqa: PLC0415

    async def run() -> Any:
        async with MarketClient(_bootstrap(args.broker), _topics(args)) as c:
            return await c.buy(
                args.buyer,
                args.stream,
                target_level=args.target,
                max_price_minor=args.max_price,
                currency=args.currency,
                purchase_id=args.purchase_id,
                timeout=args.timeout,
                key=_buyer_key(args.key_file),
            )

    result = asyncio.run(run())
    if args.output:
        Path(args.output).write_text(result.model_dump_json(indent=2))
    _print(result)
    return 1 if isinstance(result, Rejection) else 0


def cmd_tail(args: argparse.Namespace) -> int:
    from .client import MarketClient  # noqa: PLC0415

    async def run() -> None:
        async with MarketClient(_bootstrap(args.broker), _topics(args)) as c:
            key = _buyer_key(args.key_file)
            async for ev in c.tail(args.buyer, idle_timeout=None if args.follow else 2.0, key=key):
                print(ev.model_dump_json(), flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from .client import MarketClient  # noqa: PLC0415

    async def run() -> Any:
        async with MarketClient(_bootstrap(args.broker), _topics(args)) as c:
            return await c.catalog()

    entries = asyncio.run(run())
    _print({k: json.loads(v.model_dump_json()) for k, v in entries.items()})
    return 0


def cmd_schemas(args: argparse.Namespace) -> int:
    from ..wire.events import SCHEMAS  # noqa: PLC0415

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, adapter in SCHEMAS.items():
        path = out / f"{name}.schema.json"
        schema = adapter.json_schema()
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://epsilon-market.example/schemas/{name}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        print(path)
    return 0


def cmd_verify_receipt(args: argparse.Namespace) -> int:
    """Verify a saved purchase outcome; needs only the base package (no service extra)."""
    from market.errors import ReceiptError  # noqa: PLC0415
    from market.receipts import parse_public_key, verify_outcome  # noqa: PLC0415

    try:
        key = parse_public_key(args.public_key)
    except ReceiptError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    try:
        data = json.loads(Path(args.event).read_text())
    except OSError as exc:
        print(f"error: cannot read {args.event}: {exc.strerror}", file=sys.stderr)
        return 2
    except (ValueError, RecursionError):
        print(f"error: {args.event} is not JSON (expected `buy --output` file)", file=sys.stderr)
        return 2
    try:
        rec = verify_outcome(data, key)
    except ReceiptError as exc:
        print(f"INVALID: {exc.message}")
        return 1
    print(
        f"valid: purchase {rec.purchase_id} by {rec.buyer_id} on {rec.stream_id} (seller "
        f"{rec.seller_id}, {rec.mechanism}), level {rec.level_before:g} -> {rec.level_after:g}, "
        f"{rec.price_minor} {rec.currency} minor units, {len(rec.value_ids)} values"
    )
    return 0


def cmd_ledger(args: argparse.Namespace) -> int:
    streams: dict[str, Any] = {}
    for url in args.worker:
        with urllib.request.urlopen(url.rstrip("/") + "/ledger", timeout=10) as resp:
            streams.update(json.loads(resp.read())["streams"])
    if args.json:
        _print(streams)
        return 0
    buyers: dict[str, dict[str, Any]] = {}
    print(f"{'stream':<20} {'seller':<12} {'spent':>8} {'cap':>8} {'revenue':>12}  values")
    for sid, s in sorted(streams.items()):
        print(
            f"{sid:<20} {s['seller_id']:<12} {s['privacy_spent']:>8g} {s['cap']:>8g} "
            f"{s['revenue_minor']:>9} {s['currency']}  {s['values_ingested']}"
        )
        for b, h in s["holders"].items():
            buyers.setdefault(b, {})[sid] = h
    sellers: dict[tuple[str, str], int] = {}
    for s in streams.values():
        key = (s["seller_id"], s["currency"])
        sellers[key] = sellers.get(key, 0) + s["revenue_minor"]
    print(f"\n{'seller':<20} {'revenue':>12}  streams")
    for (seller, cur), revenue in sorted(sellers.items()):
        owned = sorted(k for k, v in streams.items() if v["seller_id"] == seller)
        print(f"{seller:<20} {revenue:>9} {cur}  {', '.join(owned)}")
    print(f"\n{'buyer':<20} {'stream':<20} {'level':>8} {'paid':>10} purchases")
    for b, held in sorted(buyers.items()):
        for sid, h in sorted(held.items()):
            print(f"{b:<20} {sid:<20} {h['level']:>8g} {h['paid_minor']:>10} {h['purchases']}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo  # noqa: PLC0415

    return run_demo(broker=args.broker, steps=args.steps, n_values=args.values)


# ---------------------------------------------------------------------------------- parser
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
    p.add_argument("--prefix", default=os.environ.get("EMARKET_PREFIX", "emarket"))
    sub = p.add_subparsers(dest="command", required=True)
    _worker_commands(sub)
    _seller_commands(sub)
    _buyer_commands(sub)
    _tool_commands(sub)
    return p


def _worker_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--app-id", default=None)
    sp.add_argument("--partitions", type=int, default=None)
    sp.add_argument("--data-dir", default=None)
    sp.add_argument("--store", default=None, help="memory:// or rocksdb:// (if installed)")
    sp.add_argument("--web-host", default=None)
    sp.add_argument("--web-port", type=int, default=None)
    sp.add_argument("--session-timeout", type=float, default=None)
    sp.add_argument("--heartbeat-interval", type=float, default=None)
    sp.add_argument("--fetch-max-wait-ms", type=int, default=None)
    sp.add_argument(
        "--log-level", default=None, choices=["crit", "error", "warn", "info", "debug"]
    )
    sp.add_argument("--tansu", action="store_true", help="apply the embedded-broker workarounds")


def _worker_commands(sub: Any) -> None:
    sp = sub.add_parser("serve", help="run a worker (and the embedded broker if no --broker)")
    _worker_options(sp)
    sp.set_defaults(fn=cmd_serve)
    sp = sub.add_parser("worker", help="run a worker against --broker")
    _worker_options(sp)
    sp.set_defaults(fn=cmd_worker)
    sp = sub.add_parser("demo", help="live demo: a seller streams, a buyer buys three steps")
    sp.add_argument("--steps", type=int, default=3)
    sp.add_argument("--values", type=int, default=20)
    sp.set_defaults(fn=cmd_demo)
    sp = sub.add_parser("init-topics", help="create the market's topics")
    sp.add_argument("--partitions", type=int, default=4)
    sp.set_defaults(fn=cmd_init_topics)


def _seller_commands(sub: Any) -> None:
    sp = sub.add_parser("register", help="seller: register a stream")
    sp.add_argument("--stream", required=True)
    sp.add_argument("--seller", required=True)
    sp.add_argument("--mechanism", choices=["laplace", "gaussian", "poisson"], default="laplace")
    sp.add_argument("--sensitivity", type=float, default=1.0)
    sp.add_argument("--dimension", type=int, default=1)
    sp.add_argument(
        "--steps", "--ladder", type=_floats, required=True,
        help="levels sold as steps, e.g. 0.25,0.5,1,2",
    )  # fmt: skip
    sp.add_argument("--cap", type=float, default=None, help="default: the top step")
    sp.add_argument("--retain", type=int, default=16)
    sp.add_argument("--sealed", action="store_true")
    sp.add_argument("--price-per-level", type=float, default=100.0)
    sp.add_argument("--price-per-precision", type=float, default=None)
    sp.add_argument("--price-table", default=None, help="e.g. 1=100,2=150 (minor units)")
    sp.add_argument("--currency", default="EUR")
    sp.add_argument("--description", default="")
    sp.add_argument("--timeout", type=float, default=30.0)
    sp.set_defaults(fn=cmd_register)
    sp = sub.add_parser("publish", help="seller: publish values (one, or JSON lines)")
    sp.add_argument("--stream", required=True)
    sp.add_argument("--value-id", default=None)
    sp.add_argument(
        "--published-at", type=int, default=None,
        help="publication time (Unix ms); give the original one when resending a value id",
    )  # fmt: skip
    sp.add_argument("--values", type=_floats, default=None, help="e.g. 20.5,21.0")
    sp.add_argument("--file", default=None, help="JSON lines file (or - for stdin)")
    sp.set_defaults(fn=cmd_publish)


def _buyer_commands(sub: Any) -> None:
    for name, fn, helptext in (
        ("quote", cmd_quote, "buyer: price of the next step (or --target) without buying"),
        ("buy", cmd_buy, "buyer: buy the next step (or --target) and wait for the release"),
    ):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("--buyer", required=True)
        sp.add_argument("--stream", required=True)
        sp.add_argument("--target", type=float, default=None)
        if name == "buy":
            sp.add_argument("--max-price", type=int, required=True, help="minor units")
            sp.add_argument("--currency", default="EUR")
            sp.add_argument("--purchase-id", default=None, help="idempotency key (default: new)")
            sp.add_argument("--timeout", type=float, default=60.0)
            sp.add_argument("--output", default=None, help="also write the outcome to this file")
            sp.add_argument(
                "--key-file",
                default=None,
                help="buyer's X25519 key (created if missing): releases are sealed for it",
            )
        sp.set_defaults(fn=fn)
    sp = sub.add_parser("tail", help="buyer: print the events on a buyer's topic")
    sp.add_argument("--buyer", required=True)
    sp.add_argument("--follow", action="store_true")
    sp.add_argument("--key-file", default=None, help="open sealed releases with this key")
    sp.set_defaults(fn=cmd_tail)


def _tool_commands(sub: Any) -> None:
    sp = sub.add_parser("catalog", help="list registered streams and prices")
    sp.set_defaults(fn=cmd_catalog)
    sp = sub.add_parser("schemas", help="export the JSON Schemas of every event")
    sp.add_argument("--out", default="docs/schemas")
    sp.set_defaults(fn=cmd_schemas)
    sp = sub.add_parser("verify-receipt", help="verify a purchase outcome against the market key")
    sp.add_argument("event", help="file with a purchase_fulfilled event (buy --output)")
    sp.add_argument("--public-key", required=True, help="market key, base64 (see catalog)")
    sp.set_defaults(fn=cmd_verify_receipt)
    sp = sub.add_parser("ledger", help="operators: revenue, privacy spent and holdings")
    sp.add_argument("--worker", action="append", required=True, help="worker URL (repeatable)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_ledger)


_NEEDS_BROKER = {"init-topics", "register", "publish", "quote", "buy", "tail", "catalog", "worker"}


_SERVICE_MODULES = {"aiokafka", "faust", "mode", "pydantic", "prometheus_client"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in _NEEDS_BROKER and not args.broker:
        parser.error(f"'{args.command}' needs --broker (or EMARKET_BROKER)")
    try:
        return int(args.fn(args))
    except KeyboardInterrupt:
        return 130
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in _SERVICE_MODULES:
            raise
        print(
            f"'{args.command}' needs the service extra ({exc.name} is not installed): "
            "pip install 'epsilon-market[service]'",
            file=sys.stderr,
        )
        return 5
    except Exception as exc:
        return _report(args, exc)


def _report(args: argparse.Namespace, exc: Exception) -> int:
    """Print a known error as one line and return its exit code; re-raise anything else."""
    from aiokafka.errors import KafkaError  # noqa: PLC0415
    from pydantic import ValidationError  # noqa: PLC0415

    from market.errors import MarketError  # noqa: PLC0415

    if isinstance(exc, TimeoutError):
        print(f"timed out: {exc}", file=sys.stderr)
        return 3
    if isinstance(exc, KafkaError | OSError):
        print(f"cannot reach the broker {args.broker}: {exc!r}", file=sys.stderr)
        return 4
    if isinstance(exc, ValidationError):
        print(f"invalid input: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, MarketError):
        print(f"error ({exc.code}): {exc.message}", file=sys.stderr)
        return 1
    raise exc


if __name__ == "__main__":
    raise SystemExit(main())
