"""``reserve``: hold a purchase's terms for a while, then ``buy --reservation ID`` on them.

The market answers with a reservation it signs: the level, the price, the privacy room held in
each window and when it expires (by the market's clock). Until then a purchase naming it buys
exactly that, whatever other buyers do (docs/protocol.md §6.9).
"""

from __future__ import annotations

import argparse
from typing import Any

from ...wire.holding import MAX_HOLD_MS
from ...wire.times import utc_text
from . import output
from .buyer import accuracy_target, add_target_flags
from .common import CommandError, load_party, refused, run_client
from .output import add_json_flag, show

__all__ = ["add_commands"]


def _hold_ms(seconds: float) -> int:
    """``--hold`` in milliseconds, or a clear refusal of what the market would refuse."""
    ms = round(seconds * 1000)
    if not 1_000 <= ms <= MAX_HOLD_MS:
        raise CommandError(
            f"--hold is how many seconds to hold the terms, from 1 to {MAX_HOLD_MS // 1000} "
            f"(the market holds a reservation at most that long), not {seconds:g}"
        )
    return ms


def cmd_reserve(args: argparse.Namespace) -> int:
    from ...wire.events import Rejection  # noqa: PLC0415

    hold = _hold_ms(args.hold)
    party = load_party(args)
    accuracy = accuracy_target(args)

    async def body(c: Any) -> Any:
        return await c.reserve(
            args.stream,
            hold_ms=hold,
            target_level=args.target,
            accuracy=accuracy,
            reservation_id=args.reservation_id,
            timeout=args.timeout,
        )

    result = run_client(args, body, party)
    if isinstance(result, Rejection):
        raise refused(args, "reservation", result)
    show(args, result, reserved_lines(result))
    return 0


def reserved_lines(r: Any) -> str:
    """What a person reads of a reservation: the terms, the room, until when, how to use it."""
    until = utc_text(r.expires_at_ms)
    price = output.money(r.price_minor, r.currency)
    lines = [
        f"reserved {r.reservation_id} on {r.stream_id}: level {r.level_before:g} -> "
        f"{output.level(r.level_after, r.level_unit)} for {price}, held until {until} "
        f"by the market's clock"
    ]
    lines += [
        f"  privacy room held in the window {utc_text(h.start_ms)} to {utc_text(h.end_ms)}: "
        f"{h.room:g} {r.level_unit}"
        for h in r.held
    ]
    major = price.split()[0]
    lines.append(
        f"buy it: epsilon-market buy --stream {r.stream_id} --reservation {r.reservation_id} "
        f"--max-price {major} --currency {r.currency}"
    )
    return "\n".join(lines)


def add_commands(sub: Any) -> None:
    sp = sub.add_parser(
        "reserve",
        help="buyer: hold the price and privacy room of the next step (or --target) for "
        "--hold seconds, then buy it with buy --reservation",
    )
    add_target_flags(sp)
    sp.add_argument(
        "--hold",
        type=float,
        required=True,
        metavar="SECONDS",
        help=f"how long to hold the terms (1 to {MAX_HOLD_MS // 1000} seconds)",
    )
    sp.add_argument(
        "--reservation-id", default=None, help="names the reservation (default: a new one)"
    )
    add_json_flag(sp)
    sp.set_defaults(fn=cmd_reserve)
