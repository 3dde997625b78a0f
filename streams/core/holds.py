"""Reservations a stream holds: who holds which terms and how much privacy room, until when.

A buyer reserves a purchase's terms (:mod:`.reserving`): its level, its price and the room its
release needs in each privacy window, held for that buyer alone for a short time. While a
reservation is held, every other release on the stream — other buyers' purchases, quotes, the
subscription deliveries of new values — sees each window's headroom less the room that others'
reservations hold (:func:`held_by_others`, the ledger's check); the reserving buyer's purchase
sees its own room as free. So a purchase naming a held reservation gets its terms whatever
other buyers do meanwhile: every release checks ``spent + room held by others + added ≤ cap``
per window, and a reservation is granted only under the same rule, so ``spent + every held
room ≤ cap`` always holds, and the room a buyer holds is there when it buys (values published
since need room of their own). A buyer who holds no level keeps a place among the stream's
bounded holders while its reservation holds (:func:`newcomers`).

This module is the one place that says what is held, and it never reads a clock: the market's
clock is read once per event, and :func:`settle` turns what it says into state (a reservation
whose time is up *lapses*: its room is released). So a stream's record says, by itself, which
room is held, and a restart or a replay of the record holds exactly that.

Anti-blocking, without a deposit (a deposit would need money to flow before a purchase, which
this market has no account of, and a refund of it): a reservation holds at most
:data:`~streams.wire.events.MAX_HOLD_MS`; a buyer holds at most one per stream, and after one
lapses unused may reserve on that stream again only once as much time has passed again
(:attr:`Hold.keep_until_ms`); a stream holds at most :data:`MAX_PER_STREAM` at once; the room
held is what the buyer's own purchase needs, granted only if that purchase would pass the
ledger's gate now (every window and per-buyer check); and each reservation counts against the
buyer's quotes a minute.

A reservation's record is kept, used or lapsed, until its buyer may reserve there again: a copy
of its signed request written again meanwhile is recognised (counted, answered nowhere), and
after that it is too old to be admitted (its ``requested_at_ms`` + ``hold_ms`` is past).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from market.privacy_units import level_of

from ..wire.times import utc_text
from .outputs import Reject

__all__ = [
    "HOLD_BYTES",
    "MAX_HELD_WINDOWS",
    "MAX_KEPT",
    "MAX_PER_STREAM",
    "Hold",
    "add",
    "admit",
    "consume",
    "find",
    "held_by_others",
    "held_count",
    "held_note",
    "newcomers",
    "settle",
    "within",
]

MAX_PER_STREAM = 4
"""Reservations a stream holds at once (of different buyers): more would let a few accounts
keep its windows for themselves."""
MAX_KEPT = 4 * MAX_PER_STREAM
"""Reservation records a stream keeps at once, held, used or lapsed (each until its buyer may
reserve there again): beyond that a new reservation waits for the first to be dropped."""
MAX_HELD_WINDOWS = 16
"""Privacy windows one reservation may hold room in (it bounds a stream's record)."""
HOLD_BYTES = 400 + 48 * MAX_HELD_WINDOWS
"""Upper bound on the JSON of one reservation in a stream's record (64-character ids)."""


class Hold(BaseModel):
    """One buyer's reservation on a stream, as its record keeps it.

    ``status`` is ``held`` until the buyer buys on the stream (``used``: any purchase of the
    buyer's there, which changes the level its terms were priced from) or its time is up
    (``lapsed``); only a held reservation holds room.
    """

    model_config = ConfigDict(extra="forbid")
    reservation_id: str
    buyer_id: str
    #: the request's time and fingerprint: what a copy of it must match
    requested_at_ms: int
    fingerprint: str
    #: the market's clock from which it no longer holds
    expires_at_ms: int
    #: until when the record is kept (the buyer may reserve on the stream again from then)
    keep_until_ms: int
    level_before: float
    level: float
    price_minor: int
    #: window index → room held there, in the ledger's nano-units
    room: dict[int, int] = {}
    status: Literal["held", "used", "lapsed"] = "held"


def find(holds: Iterable[Hold], buyer_id: str) -> Hold | None:
    """The buyer's reservation record on the stream, if one is kept (at most one is)."""
    return next((h for h in holds if h.buyer_id == buyer_id), None)


def held_count(holds: Iterable[Hold]) -> int:
    """How many reservations hold room now."""
    return sum(1 for h in holds if h.status == "held")


def newcomers(holds: Iterable[Hold], holders: Container[str], buyer_id: str) -> int:
    """Buyers other than ``buyer_id`` whose held reservation keeps them a holder's place (they
    hold no level yet): a stream's holders are bounded, and their purchase must find one."""
    return sum(
        1
        for h in holds
        if h.status == "held" and h.buyer_id != buyer_id and h.buyer_id not in holders
    )


def held_by_others(holds: Iterable[Hold], buyer_id: str | None) -> dict[int, int]:
    """Window index → room held by reservations of buyers other than ``buyer_id`` (``None``:
    every reservation's, for a release to no one buyer: a subscription delivery)."""
    out: dict[int, int] = {}
    for h in holds:
        if h.status == "held" and h.buyer_id != buyer_id:
            for k, room in h.room.items():
                out[k] = out.get(k, 0) + room
    return out


def held_note(holds: Iterable[Hold], window: int, buyer_id: str | None) -> str:
    """What reservations of buyers other than ``buyer_id`` hold of window ``window``'s
    headroom and until when, as a clause a refusal or a withheld notice appends ("" if
    none): a window refused with headroom left says why."""
    mine = [
        h
        for h in holds
        if h.status == "held" and h.buyer_id != buyer_id and h.room.get(window, 0) > 0
    ]
    if not mine:
        return ""
    held = level_of(sum(h.room[window] for h in mine))
    first = min(h.expires_at_ms for h in mine)
    return (
        f", and {held:g} of its headroom is held by buyers' reservations (the first lapses at "
        f"{utc_text(first)} unless used)"
    )


def settle(holds: list[Hold], now_ms: int) -> bool:
    """Apply the market's clock: a held reservation whose time is up lapses (its room is
    released), and a record past its keeping time is dropped. True if anything changed."""
    changed = False
    for h in holds:
        if h.status == "held" and h.expires_at_ms <= now_ms:
            h.status, h.room = "lapsed", {}
            changed = True
    kept = [h for h in holds if h.keep_until_ms > now_ms]
    if len(kept) != len(holds):
        holds[:] = kept
        changed = True
    return changed


def consume(holds: list[Hold], buyer_id: str) -> Hold | None:
    """The buyer bought on the stream: its held reservation, if any, is used (its room becomes
    the purchase's spend, recorded by the ledger in the same step). Returns it."""
    h = find(holds, buyer_id)
    if h is None or h.status != "held":
        return None
    h.status, h.room = "used", {}
    return h


def admit(
    holds: Sequence[Hold],
    buyer_id: str,
    requested_at_ms: int,
    now_ms: int,
) -> None:
    """Refuse a new reservation the bounds do not allow (``reservation_limit``): the buyer
    holds one on the stream, or must wait after one that lapsed, or the stream holds
    :data:`MAX_PER_STREAM` already. The message says until when."""
    mine = find(holds, buyer_id)
    if mine is not None and mine.status == "held":
        raise Reject(
            "reservation_limit",
            f"you hold reservation {mine.reservation_id!r} on this stream until "
            f"{mine.expires_at_ms} ms (the market's clock, now {now_ms} ms): buy with it "
            "(`epsilon-market buy --reservation ID`) or let it expire; one reservation per "
            "buyer and stream",
            retry_at_ms=mine.expires_at_ms,
        )
    if mine is not None and mine.status == "lapsed":
        raise Reject(
            "reservation_limit",
            f"your reservation {mine.reservation_id!r} on this stream lapsed unused at "
            f"{mine.expires_at_ms} ms; you may reserve on this stream again from "
            f"{mine.keep_until_ms} ms (as long again), or buy now without a reservation",
            retry_at_ms=mine.keep_until_ms,
        )
    if mine is not None and requested_at_ms <= mine.requested_at_ms:
        raise Reject(
            "request_too_old",
            f"this reservation was requested at {requested_at_ms} ms, no later than your "
            f"reservation {mine.reservation_id!r} on this stream ({mine.requested_at_ms} ms): "
            "reserve again with a new reservation id and the current time",
        )
    _room_for_one(holds, now_ms)


def _room_for_one(holds: Sequence[Hold], now_ms: int) -> None:
    """Refuse a reservation the stream has no room to hold or keep (``reservation_limit``)."""
    if len(holds) >= MAX_KEPT:
        first = min(h.keep_until_ms for h in holds)
        raise Reject(
            "reservation_limit",
            f"this stream keeps its maximum of {MAX_KEPT} reservations (held, used or "
            f"lapsed); the first is dropped at {first} ms (now {now_ms} ms): reserve again "
            "then, or buy now without a reservation",
            retry_at_ms=first,
        )
    held = [h for h in holds if h.status == "held"]
    if len(held) >= MAX_PER_STREAM:
        first = min(h.expires_at_ms for h in held)
        raise Reject(
            "reservation_limit",
            f"this stream holds its maximum of {MAX_PER_STREAM} reservations (of other "
            f"buyers); the first expires at {first} ms: reserve again then, or buy now "
            "without a reservation",
            retry_at_ms=first,
        )


def within(room: Mapping[int, int]) -> None:
    """Refuse a reservation whose purchase would add to more than :data:`MAX_HELD_WINDOWS`
    windows (``reservation_limit``): its record would not be bounded."""
    if len(room) > MAX_HELD_WINDOWS:
        raise Reject(
            "reservation_limit",
            f"the purchase reserved would spend privacy in {len(room)} windows of this "
            f"stream; a reservation holds room in at most {MAX_HELD_WINDOWS}: buy without a "
            "reservation",
        )


def add(holds: list[Hold], hold: Hold) -> None:
    """Keep ``hold`` (admitted by :func:`admit`), in place of its buyer's used record."""
    holds[:] = [h for h in holds if h.buyer_id != hold.buyer_id]
    holds.append(hold)
