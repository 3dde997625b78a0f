"""A buyer's reservation: hold a purchase's terms and privacy room for a while, answered signed.

A ``reserve`` event names what a purchase would name (a level, an accuracy, or the next step)
and how long to hold it (``hold_ms``, at most :data:`~streams.wire.events.MAX_HOLD_MS`). The
market plans the step as for a purchase, asks the ledger's gate whether that purchase would pass
now (every window, every per-buyer check, less the room others' reservations hold), and if so
keeps a :class:`~.holds.Hold` in the stream's record and answers a
:class:`~streams.wire.events.Reservation` in the buyer's inbox, signed like every answer. A
purchase naming it (:mod:`.purchases`) buys that level at that price in that room until
``expires_at_ms``; what bounds reservations is :mod:`.holds`'.

Times are the market's clock, read once per event: a reservation expires at ``min(requested_at,
now) + hold_ms``, so a buyer's clock ahead of the market's buys no longer hold; a request whose
hold has passed by the market's clock is refused (``request_too_old``), and one dated more than
:data:`~streams.wire.events.MAX_HOLD_MS` ahead too (``request_from_the_future``). A copy of a
request already decided is counted and answered nowhere (the answer is in the inbox, keyed by
the reservation id), so anyone writing a buyer's signed request again adds nothing there: the
worker remembers the requests it decided as it remembers quotes (:mod:`.replay.quotes`), and
the stream's record the reservations it holds, which a restart keeps.
"""

from __future__ import annotations

import hashlib

from market.errors import NoHigherStepError
from market.pricing import StepPlan

from ..wire.events import (
    MAX_HOLD_MS,
    UNIT_OF,
    HeldRoom,
    PurchaseRequest,
    Reservation,
    ReserveRequest,
)
from .accuracy import error_info
from .context import Context
from .holds import Hold, add, admit, find, newcomers, within
from .incoming import Incoming
from .outputs import Outcome, Output, Reject, dump
from .planning import plan, target
from .products import Product
from .rejections import rejection
from .room import level_of, room_for
from .stream import Stream
from .stream_store import Streams

__all__ = ["check_place", "reserve", "reserved_step"]


def fingerprint(req: ReserveRequest) -> str:
    """What makes two reservations with one id the same request."""
    acc = None if req.accuracy is None else req.accuracy.model_dump()
    fields = (req.stream_id, req.target_level, acc, req.hold_ms, req.requested_at_ms)
    return hashlib.sha256(repr(fields).encode()).hexdigest()


def reserve(ctx: Context, streams: Streams, inc: Incoming[ReserveRequest]) -> Outcome:
    """Apply one signed ``reserve``: a copy → nothing; else admit, plan, hold, answer (a
    reservation the stream keeps is recognised by its record, a refused one by the worker's
    memory of the requests it decided)."""
    req = inc.event
    stream = streams.load(req.stream_id)
    mine = find(stream.state.reservations, req.buyer_id)
    if mine is not None and mine.reservation_id == req.reservation_id:
        return _again(req, mine)
    try:
        first = ctx.quotes.admit(req.buyer_id, f"reserve/{req.reservation_id}", req.requested_at_ms)
    except Reject as stale:  # no inbox: a stale copy may be anyone's (.replay.quotes)
        return rejection(ctx, "reserve", inc.src, stale)
    if not first:  # a copy of a request this worker refused: its refusal is in the inbox
        return Outcome("reserve", "duplicate", reason="already_answered", stream_id=req.stream_id)
    now = ctx.clock()
    try:
        _fresh(req, now)
    except Reject as stale:  # no inbox either: anyone may write an old request again
        return rejection(ctx, "reserve", inc.src, stale)
    ctx.allowance.quote(req.buyer_id)  # a reservation is a quote that holds: rate-limited alike
    admit(stream.state.reservations, req.buyer_id, req.requested_at_ms, now)
    hold = _hold(ctx, stream, req, now)
    add(stream.state.reservations, hold)
    stream.touch()
    answer = _answer(stream, req, hold)
    return Outcome(
        "reserve",
        "accepted",
        [Output(ctx.topics.inbox(req.buyer_id), req.reservation_id.encode(), dump(answer))],
        stream_id=req.stream_id,
        figures=stream.figures(),  # the reservations held (no revenue: nothing is charged)
    )


def _again(req: ReserveRequest, kept: Hold) -> Outcome:
    """A reservation id the buyer's record on the stream already names: the same request
    written again (counted, answered nowhere: its answer is in the inbox), or another one
    under that id (refused)."""
    if kept.fingerprint != fingerprint(req):
        raise Reject(
            "idempotency_key_reused",
            f"reservation id {req.reservation_id!r} was already used by buyer "
            f"{req.buyer_id!r} for a different request; use a new reservation id",
        )
    return Outcome("reserve", "duplicate", reason="already_answered", stream_id=req.stream_id)


def _fresh(req: ReserveRequest, now: int) -> None:
    """Refuse a request whose hold has passed by the market's clock, or dated too far ahead
    (to the operators and the public refusal record, like a stale quote: not to the inbox)."""
    if req.requested_at_ms + req.hold_ms <= now:
        raise Reject(
            "request_too_old",
            f"reservation {req.reservation_id!r} was requested at {req.requested_at_ms} ms to "
            f"hold {req.hold_ms} ms: that time has passed by the market's clock ({now} ms). "
            "Reserve again with a new reservation id and the current time",
            claimed=req.buyer_id,
        )
    if req.requested_at_ms > now + MAX_HOLD_MS:
        raise Reject(
            "request_from_the_future",
            f"reservation {req.reservation_id!r} claims a time more than {MAX_HOLD_MS} ms "
            f"ahead of the market's clock ({now} ms); check the buyer's clock",
            claimed=req.buyer_id,
        )


def check_place(ctx: Context, stream: Stream[Product], buyer_id: str) -> None:
    """Refuse (``stream_full``) a buyer who holds no level on a stream whose holders, with the
    places kept for other buyers' reservations, are at the most it may have."""
    reg = stream.registration
    holders = stream.state.holders
    limit = ctx.limits.holder_limit(reg.release_width())
    if buyer_id in holders:
        return
    if len(holders) + newcomers(stream.state.reservations, holders, buyer_id) >= limit:
        raise Reject(
            "stream_full",
            f"stream {reg.stream_id!r} has its maximum of {limit} buyers, counting those whose "
            "reservation keeps them a place (every new value is delivered to each of them); "
            "ask the operators (EMARKET_MAX_HOLDERS)",
        )


def _hold(ctx: Context, stream: Stream[Product], req: ReserveRequest, now: int) -> Hold:
    """The reservation the request asks for, if the stream can hold it (else a refusal)."""
    try:
        step = plan(stream, req.buyer_id, target(stream, req.buyer_id, req))
    except NoHigherStepError:
        raise Reject(
            "no_higher_step",
            f"you hold the top step of stream {req.stream_id!r}: there is nothing to reserve",
        ) from None
    if step.after <= step.held:
        raise Reject(
            "already_held",
            f"you hold a level on stream {req.stream_id!r} as accurate as the one asked for or "
            "more: reserve a level above it",
            held_level=step.held,
        )
    check_place(ctx, stream, req.buyer_id)
    room = room_for(stream, req.buyer_id, step.after, step.price_minor)
    within(room)
    start = min(req.requested_at_ms, now)
    return Hold(
        reservation_id=req.reservation_id,
        buyer_id=req.buyer_id,
        requested_at_ms=req.requested_at_ms,
        fingerprint=fingerprint(req),
        expires_at_ms=start + req.hold_ms,
        keep_until_ms=max(req.requested_at_ms, now) + 2 * req.hold_ms,
        level_before=step.held,
        level=step.after,
        price_minor=step.price_minor,
        room=room,
    )


def _answer(stream: Stream[Product], req: ReserveRequest, hold: Hold) -> Reservation:
    reg = stream.registration
    w = None if reg.window is None else reg.window.duration_ms
    held = (
        []
        if w is None
        else [
            HeldRoom(start_ms=k * w, end_ms=(k + 1) * w, room=level_of(n))
            for k, n in sorted(hold.room.items())
        ]
    )
    return Reservation(
        reservation_id=req.reservation_id,
        buyer_id=req.buyer_id,
        stream_id=req.stream_id,
        level_unit=UNIT_OF[reg.mechanism],
        level_before=hold.level_before,
        level_after=hold.level,
        price_minor=hold.price_minor,
        currency=reg.currency,
        expires_at_ms=hold.expires_at_ms,
        held=held,
        error_model=error_info(reg, hold.level),
    )


def reserved_step(stream: Stream[Product], req: PurchaseRequest) -> StepPlan:
    """The step a purchase naming a reservation buys: the reservation's level at its price,
    or a refusal saying why it cannot (unknown, expired — and when —, used, or asking for
    another level)."""
    rid = req.reservation_id
    kept = find(stream.state.reservations, req.buyer_id)
    if kept is None or kept.reservation_id != rid:
        raise Reject(
            "reservation_unknown",
            f"stream {req.stream_id!r} holds no reservation {rid!r} of yours: it was never "
            "made, was replaced by a newer one, or expired long enough ago to be forgotten. "
            "Reserve again (`epsilon-market reserve`), or buy without --reservation",
        )
    if kept.status == "lapsed":
        raise Reject(
            "reservation_expired",
            f"reservation {rid!r} expired at {kept.expires_at_ms} ms by the market's clock, "
            "and its room was released: buy without --reservation, or reserve again from "
            f"{kept.keep_until_ms} ms",
            expired_at_ms=kept.expires_at_ms,
        )
    if kept.status == "used":
        raise Reject(
            "reservation_used",
            f"reservation {rid!r} was used by an earlier purchase of yours on this stream (any "
            "purchase of yours there uses your reservation): reserve again to hold new terms",
        )
    if req.target_level is not None and req.target_level != kept.level:
        raise Reject(
            "reservation_mismatch",
            f"reservation {rid!r} holds level {kept.level:g}, not the target_level "
            f"{req.target_level:g} this purchase names: name no --target, or its level",
            reserved_level=kept.level,
        )
    return StepPlan(kept.level_before, kept.level, kept.level, kept.price_minor)
