"""``catalog``, ``quote``, ``buy`` and ``tail``: what a buyer does, signed with its key file.

Prices are typed and shown in major units (``--max-price 0.50`` for 50 euro cents). Releases
sealed for the buyer are opened with its key file; ``tail`` shows what is in the buyer's inbox.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

from . import output
from .common import EXIT_REFUSED, CommandError, load_party, read_inbox, refused, run_client, warn
from .output import add_json_flag, json_mode, print_json, say, show

__all__ = ["accuracy_target", "add_commands", "add_target_flags"]


def cmd_catalog(args: argparse.Namespace) -> int:
    async def body(c: Any) -> Any:
        return await c.catalog_records()

    records, invalid = run_client(args, body)
    entries = {e.registration.stream_id: e for e in records}
    if json_mode(args):
        import json  # noqa: PLC0415

        print_json({k: json.loads(v.model_dump_json()) for k, v in entries.items()})
    else:
        _catalog_table(entries)
    if invalid:
        warn(
            f"warning: skipped {invalid} records that are not catalog entries (written by "
            "someone other than the market?)"
        )
    return 0


def _catalog_table(entries: dict[str, Any]) -> None:
    """One line per stream a person reads: who sells it, how, and each level's price."""
    if not entries:
        print("no streams in the catalog yet")
        return
    print(f"{'stream':<20} {'seller':<14} {'mechanism':<17} {'dim':>6}  levels (price)")
    for sid, e in sorted(entries.items()):
        reg = e.registration
        print(
            f"{sid:<20} {reg.seller_id:<14} {reg.mechanism:<17} {reg.dimension:>6}  "
            f"{output.prices(e)}{output.share(reg)}"
        )
    first = next(iter(entries.values()))
    print(
        f"every entry signed by the market key {first.market_public_key} "
        f"(key id {first.market_key_id}); --json for every field"
    )


def cmd_quote(args: argparse.Namespace) -> int:
    from ...wire.events import Rejection  # noqa: PLC0415

    party = load_party(args)
    accuracy = accuracy_target(args)

    async def body(c: Any) -> Any:
        return await c.quote(
            args.stream, target_level=args.target, accuracy=accuracy, timeout=args.timeout
        )

    result = run_client(args, body, party)
    if isinstance(result, Rejection):
        raise refused(args, "quote", result)
    show(args, result, output.offers_table(result) + "\n" + output.quote_line(result))
    return 0


def accuracy_target(args: argparse.Namespace) -> dict[str, float] | None:
    """``--rmse`` or ``--half-width`` (with ``--confidence``) as an accuracy target."""
    rmse, hw = getattr(args, "rmse", None), getattr(args, "half_width", None)
    if rmse is not None and hw is not None:
        raise CommandError("give --rmse or --half-width, not both")
    if (rmse is not None or hw is not None) and args.target is not None:
        raise CommandError("give --target or an accuracy (--rmse / --half-width), not both")
    for flag, v in (("--rmse", rmse), ("--half-width", hw)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise CommandError(f"{flag} must be a positive number in the value's units")
    if not 0 < args.confidence <= 0.9999:
        raise CommandError(f"--confidence is in (0, 0.9999], e.g. 0.95; not {args.confidence}")
    if rmse is not None:
        return {"rmse": rmse}
    if hw is not None:
        return {"half_width": hw, "confidence": args.confidence}
    return None


def cmd_buy(args: argparse.Namespace) -> int:
    from ...wire.events import Rejection  # noqa: PLC0415
    from ...wire.money import parse_money  # noqa: PLC0415

    party = load_party(args)
    try:
        max_minor = parse_money(args.max_price, args.currency)
    except ValueError as exc:
        raise CommandError(f"--max-price: {exc}") from None

    accuracy = accuracy_target(args)
    if args.most_accurate and (accuracy is not None or args.target is not None):
        raise CommandError(
            "--most-accurate buys the best level --max-price pays for: give it "
            "alone, without --target, --rmse or --half-width"
        )
    if args.reservation and (accuracy is not None or args.most_accurate):
        raise CommandError(
            "--reservation buys the level the reservation holds: give it without --rmse, "
            "--half-width or --most-accurate (--target only if it is that level)"
        )
    out = _open_output(args.output) if args.output else None  # before paying, not after

    async def body(c: Any) -> Any:
        return await c.buy(
            args.stream,
            target_level=args.target,
            accuracy=accuracy,
            most_accurate=args.most_accurate,
            max_price_minor=max_minor,
            currency=args.currency,
            purchase_id=args.purchase_id,
            reservation_id=args.reservation,
            timeout=args.timeout,
        )

    try:
        result = run_client(args, body, party)
    except BaseException:
        if out is not None:  # nothing to keep: no empty outcome file left behind
            out.close()
            Path(args.output).unlink(missing_ok=True)
        raise
    if out is not None:  # the outcome goes to the file (the JSON --json would print)
        with out:
            out.write(result.model_dump_json(indent=2))
    elif json_mode(args):
        print_json(result)
    if isinstance(result, Rejection):
        raise refused(args, "purchase", result, printed=True)
    _say_bought(args, result)
    _say_named(args, result.releases)
    return 0


def _say_bought(args: argparse.Namespace, result: Any) -> None:
    """What a person reads after a purchase: the level, the price, the values, the receipt."""
    paid = output.money(result.price_minor, result.currency)
    say(
        args,
        "\n".join(
            [
                f"bought level {result.level_after:g} ({result.level_unit}) "
                f"of {result.stream_id} for "
                f"{paid}: {len(result.releases)} values"
                + (f" (outcome and receipt in {args.output})" if args.output else ""),
                *output.releases(result.releases, result.error_model),
                f"  purchase {result.purchase_id}; receipt signed by the market key "
                f"{result.receipt.market_key_id}"
                + ("" if args.output else " (--output FILE keeps it)"),
            ]
        ),
    )


def _say_named(args: argparse.Namespace, releases: list[Any]) -> None:
    """With ``--key-names FILE``: each histogram release's counts by the names it shows."""
    if not args.key_names:
        return
    from ..histograms import describe_named  # noqa: PLC0415

    try:
        names = [n.strip() for n in Path(args.key_names).read_text("utf-8").splitlines()]
    except OSError as exc:
        raise CommandError(f"--key-names {args.key_names}: {exc.strerror}") from None
    for r in releases:
        if r.keys is not None:
            say(args, describe_named(r, [n for n in names if n]))


def _open_output(path: str) -> Any:
    """``--output`` created for writing (mode 0600: it holds opened releases) before the
    purchase is made, so that a bad path fails before anything is paid. Never an existing
    file: it may hold an earlier outcome and its receipt, which a failed purchase would
    otherwise destroy."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CommandError(
            f"--output {path}: the file exists (it may hold an earlier outcome and receipt); "
            "give a new file name; nothing was bought"
        ) from None
    except OSError as exc:
        raise CommandError(
            f"--output {path}: cannot write this file ({exc.strerror}); nothing was bought"
        ) from None
    return os.fdopen(fd, "w")


def cmd_tail(args: argparse.Namespace) -> int:
    from ...wire.events import (  # noqa: PLC0415
        AccountState,
        DeliveriesWithheld,
        PurchaseFulfilled,
        ValueReleased,
    )

    party = _with_old_keys(args, load_party(args))
    confirmed, unopened, pending = [False], [], []

    def told(u: Any) -> None:
        unopened.append(u)
        pending.append(u)

    async def body(c: Any) -> None:
        async for ev in c.tail(idle_timeout=None if args.follow else 2.0, on_unopened=told):
            if json_mode(args):
                print(ev.model_dump_json(), flush=True)
            else:
                print("\n".join(output.event(ev)), flush=True)
            for u in pending:
                _say_unopened(args, u)
            pending.clear()
            if isinstance(ev, AccountState) and ev.signing_key == party.public_key:
                confirmed[0] = True
            if isinstance(ev, PurchaseFulfilled | ValueReleased):
                _say_named(args, ev.releases)
            if isinstance(ev, DeliveriesWithheld) and json_mode(args):
                warn(f"{len(ev.value_ids)} value(s) withheld: {ev.message}")

    interrupted = read_inbox(args, body, party)
    if unopened:
        versions = sorted({u.key_version for u in unopened if u.key_version and not u.held})
        fix = (
            f": pass the key file of version {', '.join(map(str, versions))} with --old-key-file"
            if versions
            else ""
        )
        warn(f"warning: {len(unopened)} sealed record(s) above could not be opened{fix}")
    if not confirmed[0] and not interrupted:  # nothing the market signed says this key holds it
        raise CommandError(
            f"the market never confirmed account {party.account_id!r} for this key file's key: "
            f"open it (`epsilon-market account open --key-file {args.key_file}`)",
            EXIT_REFUSED,
        )
    return 0


def _with_old_keys(args: argparse.Namespace, party: Any) -> Any:
    """``party`` also holding the sealing keys of every ``--old-key-file`` (key files of the
    account before a rotation that did not yet record its retired keys in the new file)."""
    from ..keys import KeyFileError, Party  # noqa: PLC0415

    try:
        older = [Party.load(p, on_warning=warn) for p in args.old_key_file or []]
        return party.holding(older)
    except KeyFileError as exc:
        raise CommandError(f"--old-key-file: {exc}") from None


def _say_unopened(args: argparse.Namespace, u: Any) -> None:
    """Where a sealed record stays closed: why, and which key file opens it."""
    ev = u.event
    which = f"purchase {ev.purchase_id}" if ev.type == "purchase_fulfilled" else ev.stream_id
    fix = (
        f": pass the key file of version {u.key_version} with --old-key-file FILE"
        if u.key_version is not None and not u.held and u.sealing_key is not None
        else ""
    )
    if json_mode(args):
        warn(f"{ev.type} ({which}) not opened: {u.reason}{fix}")
    else:
        print(f"  not opened: {u.reason}{fix}", flush=True)


def add_commands(sub: Any) -> None:
    sp = sub.add_parser("catalog", help="list registered streams, their levels and prices")
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_catalog)
    for name, fn, helptext in (
        ("quote", cmd_quote, "buyer: price of the next step (or --target) without buying"),
        ("buy", cmd_buy, "buyer: buy the next step (or --target) and wait for the release"),
    ):
        sp = sub.add_parser(name, help=helptext)
        add_target_flags(sp)
        if name == "buy":
            sp.add_argument(
                "--max-price", required=True, help="most you will pay, e.g. 0.50 (in --currency)"
            )
            sp.add_argument(
                "--most-accurate",
                action="store_true",
                help="the most accurate level --max-price buys",
            )
            sp.add_argument("--currency", default="EUR", help="the currency of --max-price")
            sp.add_argument("--purchase-id", default=None, help="idempotency key (default: new)")
            sp.add_argument(
                "--reservation",
                default=None,
                metavar="ID",
                help="buy on the terms of this reservation of yours (`epsilon-market reserve`)",
            )
            sp.add_argument(
                "--output", default=None, metavar="FILE", help="also write the outcome to this file"
            )
            sp.add_argument(
                "--key-names",
                default=None,
                metavar="FILE",
                help="histogram streams of strings: name the keys of the releases "
                "from these strings (one per line)",
            )
        add_json_flag(sp)
        sp.set_defaults(fn=fn)
    _add_tail(sub)


def add_target_flags(sp: Any) -> None:
    """What a buyer's request names (the stream, a level or an accuracy) and how it signs."""
    sp.add_argument("--key-file", default=None, help="the buyer's keys (epsilon-market keygen)")
    sp.add_argument("--stream", required=True, help="the stream (`epsilon-market catalog`)")
    sp.add_argument("--target", type=float, default=None, help="a level for sale (a step)")
    sp.add_argument(
        "--rmse",
        type=float,
        default=None,
        help="instead of a level: the cheapest level with at most this RMS error "
        "per coordinate (value units)",
    )
    sp.add_argument(
        "--half-width",
        type=float,
        default=None,
        help="instead of a level: the cheapest level whose --confidence interval "
        "is at most ± this (value units)",
    )
    sp.add_argument("--confidence", type=float, default=0.95, help="for --half-width")
    sp.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for the market's answer"
    )


def _add_tail(sub: Any) -> None:
    sp = sub.add_parser("tail", help="buyer/seller: print the events in your inbox")
    sp.add_argument(
        "--key-file",
        default=None,
        help="your keys: opens sealed releases (also with the retired sealing keys it records)",
    )
    sp.add_argument(
        "--old-key-file",
        action="append",
        default=[],
        metavar="FILE",
        help="a key file of the account from before a rotation, to open what was sealed to it "
        "(repeatable; default none)",
    )
    sp.add_argument("--follow", action="store_true", help="keep reading new events until Ctrl-C")
    sp.add_argument(
        "--key-names",
        default=None,
        metavar="FILE",
        help="histogram streams of strings: name released keys from these strings",
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_tail)
