"""A buyer's purchase: recall its decision, or fulfil or refuse it, then keep the decision.

A purchase is keyed by ``(buyer_id, stream_id, purchase_id)``. Its decision, fulfilment or
refusal, is kept (:class:`~.state.PurchaseRecord`: levels, price, the values covered, a digest
of the outcome), and a resend is never charged again (a resend with other parameters is
refused, ``idempotency_key_reused``). How records are recalled, kept and forgotten is
:mod:`streams.core.replay`'s.

A copy of a purchase's first request whose outcome was surely sent, to an inbox that still holds
it, is counted and answered nowhere (:meth:`~.replay.records.Records.in_inbox`): the buyer's
client finds the outcome in its inbox, and a copy anyone else writes again must not add to that
inbox. A resend signed anew (another request time, e.g. by a new process of the buyer's client)
is answered once, and so is a copy whose outcome may be missing; a copy of either adds nothing
(:meth:`~.replay.records.Records.resend_due`). The outcome is sent again at most once per
:data:`~.replay.records.ANSWER_INTERVAL_MS`: a
fulfilment's outcome is then *recomputed* from the decision — noise is a pure function of the
request, receipts are deterministic and envelopes are sealed with a sender key and nonce
derived from the secret, the buyer's key, the AAD and the plaintext — and sent only if it is
byte for byte the outcome first sent (its digest); a refusal is refused again with its reason
code. Within the interval, or when the outcome cannot be recomputed any more (the values it
covered left the window, the buyer's sealing key changed), the resend gets a short
``already_answered`` notice naming when it was answered: never silence, never new bytes.

A fulfilment releases the level bought on every value in the stream's window, charges
``P(new) − P(held)``, and carries an Ed25519-signed receipt that binds the released numbers with
a commitment (opened by an opening only the buyer is given, beside the numbers) and their
envelope, when sealed. The seller is told of it in its own inbox (:mod:`.sales`, one notice
per seller and batch), once: a resend answered from the record sold nothing new.

The decision's record is written once, without the outcome's bytes. A batch committed whose
outputs were then lost is replayed by the worker that takes its partition over: it finds the
record (:meth:`~.replay.records.Records.unsent`) and recomputes the outcome, and sends it with
its sale; where the batch itself evicted a value the outcome covered, the record took the bytes
(:meth:`~.replay.records.Records.evicted`) and they are sent as they are.
"""

from __future__ import annotations

import hashlib
import json

from market import MarketError
from market.envelope import ciphertext_digest
from market.errors import ReceiptError
from market.pricing import StepPlan
from market.receipts import Receipt, commitment, derive_opening, sign_receipt

from ..wire.events import (
    UNIT_OF,
    AccountState,
    Envelope,
    PurchaseFulfilled,
    PurchaseRequest,
    ReceiptModel,
    Rejection,
    ReleasedValue,
)
from ..wire.money import format_money
from ..wire.sealing import purchase_aad, seal_releases
from ..wire.trusted import trusted
from .accuracy import error_info
from .context import Context
from .incoming import Incoming
from .outputs import Outcome, Output, Reject, dump
from .planning import plan, target
from .products import Product
from .rejections import Source, rejection
from .replay.records import ANSWER_INTERVAL_MS, MAX_FAR_FUTURE_RECORDS, purchase_key
from .replay.watermarks import advance_purchases, floor_purchases, heap_of
from .reserving import check_place, reserved_step
from .sales import sale
from .state import PurchaseRecord
from .stream import Stream
from .stream_store import Streams

__all__ = ["fingerprint", "purchase"]


def fingerprint(req: PurchaseRequest) -> str:
    """What makes two purchases with one id the same request (the send time does not)."""
    acc = None if req.accuracy is None else req.accuracy.model_dump()
    fields: tuple[object, ...] = (
        req.stream_id,
        req.target_level,
        req.max_price_minor,
        req.currency,
        acc,
        req.most_accurate,
    )
    if req.reservation_id is not None:  # only then: earlier purchases keep their fingerprint
        fields += (req.reservation_id,)
    return hashlib.sha256(repr(fields).encode()).hexdigest()


class _Unkept(Exception):
    """A refusal no record of which can be kept (see :meth:`Records.recordable`)."""

    def __init__(self, refusal: Reject) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def purchase(ctx: Context, streams: Streams, inc: Incoming[PurchaseRequest]) -> Outcome:
    """Apply one signed ``purchase``: recall → fulfil or refuse → keep."""
    req = inc.event
    fp = fingerprint(req)
    stream = streams.find(req.stream_id)
    earlier = _recall(ctx, stream, req)
    if earlier is not None:
        _same_request(req, earlier, fp)
        return _again(ctx, stream, inc, earlier)
    heap = heap_of(ctx.records, stream, req.stream_id)
    sent: bytes | None = None
    try:
        _admit(ctx, req)
        outcome, record, sent = _fulfil(ctx, streams, req, fp, inc.account)
    except _Unkept as unkept:
        return rejection(ctx, "purchase", inc.src, unkept.refusal)
    except (Reject, MarketError) as exc:  # every refusal of an admitted purchase is kept
        heap = heap_of(ctx.records, stream, req.stream_id, refused=True)
        kept = ctx.records.has_room(heap)
        outcome, record = _refused(ctx, req, fp, inc.src, exc, kept=kept, known=stream is not None)
        if not kept:
            return outcome
    ctx.records.keep_purchase(
        purchase_key(req.buyer_id, req.stream_id, req.purchase_id), record, heap, sent
    )
    advance_purchases(ctx.records, stream, req.stream_id, req.requested_at_ms)
    return outcome


def _recall(
    ctx: Context, stream: Stream[Product] | None, req: PurchaseRequest
) -> PurchaseRecord | None:
    """The purchase's kept decision; a refusal if it is too old for any to be kept."""
    if stream is not None:
        floor_purchases(ctx.records, stream)
        ctx.records.settle(stream.id)
    watermark = None if stream is None else stream.state.purchase_watermark_ms
    ctx.admission.admit_age(
        "purchase", req.requested_at_ms, watermark, req.purchase_id, req.stream_id
    )
    return ctx.records.purchase(purchase_key(req.buyer_id, req.stream_id, req.purchase_id))


def _admit(ctx: Context, req: PurchaseRequest) -> None:
    """Refuse a new purchase from the future; a refusal that cannot be kept raises
    :class:`_Unkept`."""
    ts = req.requested_at_ms
    try:
        ctx.admission.admit_time("purchase", ts, req.purchase_id)
    except Reject as ahead:
        if ctx.records.recordable(ts, req.buyer_id, req.stream_id):
            raise
        ahead.sender = req.buyer_id
        ahead.message += (
            f"; this refusal is not recorded (buyer {req.buyer_id!r} has "
            f"{MAX_FAR_FUTURE_RECORDS} refusals of purchases dated this far ahead on record): "
            "these signed bytes would be applied if sent again once the market's clock reaches "
            "their date"
        )
        raise _Unkept(ahead) from None


def _same_request(req: PurchaseRequest, record: PurchaseRecord, fp: str) -> None:
    """Refuse a resent purchase id that meant something else (a kept decision is its stream's
    state: a batch counts wholly or not at all, so the stream counts what it records)."""
    if record.fingerprint != fp:
        raise Reject(
            "idempotency_key_reused",
            f"purchase id {req.purchase_id!r} was already used by buyer {req.buyer_id!r} for a "
            "different request; use a new purchase id",
        )


def _again(
    ctx: Context,
    stream: Stream[Product] | None,
    inc: Incoming[PurchaseRequest],
    record: PurchaseRecord,
) -> Outcome:
    """A resent purchase whose outcome stands: that outcome again (at most once an interval);
    never a second charge."""
    req = inc.event
    key = purchase_key(req.buyer_id, req.stream_id, req.purchase_id)
    inbox = ctx.topics.inbox(req.buyer_id)
    copy = req.requested_at_ms == record.requested_at_ms  # the first request's, re-sent
    if (copy and ctx.records.in_inbox(inbox, key, record)) or (
        not ctx.records.resend_due(key, req.requested_at_ms, inbox)
    ):
        return Outcome(
            "purchase", "duplicate", reason="already_answered", stream_id=record.stream_id
        )
    unsent = ctx.records.unsent(key, record)
    last = ctx.records.answer_due(key)
    ctx.records.resend_answered(key, req.requested_at_ms, final=last is None)
    if last is not None:
        return _notice(ctx, inc, record, last, again=True)
    if record.payload is not None:  # not yet sent for sure (its batch's outputs may be lost)
        ctx.records.resent(key, record)
        outputs = _sent_again(ctx, req, record, record.payload)
        return Outcome("purchase", "duplicate", outputs, stream_id=record.stream_id)
    if record.status == "rejected":
        return _refused_again(ctx, inc, record)
    redone = None if stream is None else _recompute(ctx, stream, inc, record)
    if redone is None:
        return _notice(ctx, inc, record, record.decided_at_ms, again=False)
    if unsent:  # its batch may have been committed without its outputs
        outputs = _sent_again(ctx, req, record, redone.decode())
    else:
        outputs = [Output(ctx.topics.inbox(req.buyer_id), req.purchase_id.encode(), redone)]
    return Outcome("purchase", "duplicate", outputs, stream_id=record.stream_id)


def _sent_again(
    ctx: Context, req: PurchaseRequest, record: PurchaseRecord, payload: str
) -> list[Output]:
    """The messages of a decision whose outcome may not have been sent (the batch that made it
    was lost before its outputs went): its bytes again, with the refusal record or the sale
    notice sent beside them — the same bytes, which readers count once."""
    out = Output(ctx.topics.inbox(req.buyer_id), req.purchase_id.encode(), payload.encode())
    if record.status == "rejected":
        return [out, Output(ctx.topics.rejections, req.stream_id.encode(), out.value)]
    receipt = _receipt_in(payload)
    if receipt is None:  # never: a kept fulfilment carries its receipt
        return [out]
    return [out, *sale(ctx, receipt, record.decided_at_ms)]


def _receipt_in(payload: str) -> Receipt | None:
    """The receipt of a kept ``purchase_fulfilled`` outcome, if it has a valid one."""
    try:
        return Receipt.from_dict(json.loads(payload)["receipt"])
    except (ValueError, LookupError, TypeError, ReceiptError):
        return None


def _recompute(
    ctx: Context, stream: Stream[Product], inc: Incoming[PurchaseRequest], record: PurchaseRecord
) -> bytes | None:
    """The outcome first sent, recomputed from the decision over the values it covered; None
    if they are not all retained any more or the bytes differ (the digest proves them)."""
    covered = [e for e in stream.state.window if e.seq in record.seqs]
    if len(covered) != record.count:
        return None
    step = StepPlan(record.level_before, record.level_after, record.level_after, record.price_minor)
    # a resend may carry another send time: the receipt binds the first request's
    req = inc.event.model_copy(update={"requested_at_ms": record.requested_at_ms})
    try:
        with stream.showing(covered):
            releases, _ = stream.product.release_window(ctx, stream, record.level_after)
            outcome, _ = _fulfilled(ctx, req, stream, step, releases, inc.account.sealing_key)
    except (AssertionError, Reject, MarketError):  # a state it needs is gone
        return None
    payload = dump(outcome)
    return payload if hashlib.sha256(payload).hexdigest() == record.digest else None


def _notice(
    ctx: Context,
    inc: Incoming[PurchaseRequest],
    record: PurchaseRecord,
    answered_at_ms: int,
    *,
    again: bool,
) -> Outcome:
    """A short ``already_answered`` notice for the buyer alone: the resend changed nothing,
    and says when its outcome was sent (``again``: it will be sent again after the interval;
    else it cannot be recomputed, and the inbox holds it)."""
    req = inc.event
    topic, partition, offset, raw = inc.src
    now = ctx.clock()
    retry = max(0, answered_at_ms + ANSWER_INTERVAL_MS - now) if again else None
    tail = (
        f"a resend is answered again at most every {ANSWER_INTERVAL_MS // 1000} s: resend "
        f"after {retry} ms"
        if again
        else "its outcome cannot be recomputed any more: it is in your inbox, keyed by the id"
    )
    event = Rejection(
        reason="already_answered",
        message=f"purchase {req.purchase_id!r} was {record.status} and answered at "
        f"{answered_at_ms} ms; nothing was charged or changed; {tail}",
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        request_id=req.purchase_id,
        sender_id=req.buyer_id,
        stream_id=req.stream_id,
        payload="",
        payload_bytes=len(raw),
        payload_sha256=hashlib.sha256(raw).hexdigest(),
        payload_truncated=bool(raw),
        details={
            "status": record.status,
            "answered_at_ms": answered_at_ms,
            "retry_after_ms": retry,
            **_which_answer(record),
        },
    )
    out = Output(ctx.topics.inbox(req.buyer_id), req.purchase_id.encode(), dump(event))
    return Outcome(
        "purchase", "duplicate", [out], reason="already_answered", stream_id=req.stream_id
    )


def _which_answer(record: PurchaseRecord) -> dict[str, str]:
    """What names the earlier answer a notice stands for (docs/protocol.md §12.4): the digest
    of a fulfilment's bytes, or a refusal's code. The id may have been used since by another
    request, refused ``idempotency_key_reused`` in the same inbox: the buyer's client must not
    take that answer for the one to its purchase."""
    if record.status == "fulfilled" and record.digest:
        return {"answer_sha256": record.digest}
    if record.status == "rejected" and record.reason:
        return {"answer_reason": record.reason}
    return {}


def _refused_again(ctx: Context, inc: Incoming[PurchaseRequest], record: PurchaseRecord) -> Outcome:
    """A resent refused purchase: refused again with the reason code it first got."""
    req = inc.event
    rej = Reject(
        record.reason,
        f"purchase {req.purchase_id!r} was refused when the market first decided it "
        f"({record.reason}, at {record.decided_at_ms} ms); the same signed bytes are refused "
        "again: send a new purchase id",
        sender=req.buyer_id,
        first_decided_at_ms=record.decided_at_ms,
    )
    outcome = rejection(ctx, "purchase", inc.src, rej)
    outcome.status = "duplicate"
    return outcome


def _refused(
    ctx: Context,
    req: PurchaseRequest,
    fp: str,
    src: Source,
    exc: Reject | MarketError,
    *,
    kept: bool,
    known: bool,
) -> tuple[Outcome, PurchaseRecord]:
    """The outcome of a refused purchase, and the record that keeps it (``kept``: false when
    the refusals kept of the stream, or of unknown streams on its partition, are at their cap,
    and the refusal then says so)."""
    rej = exc if isinstance(exc, Reject) else Reject(exc.code, exc.message)
    rej.sender = req.buyer_id
    if not kept and known:
        rej.message += (
            f"; this refusal is not recorded (the market keeps at most {ctx.records.caps.refusals}"
            " refusals of purchases per stream): these signed bytes would be decided again if "
            "sent again"
        )
    elif not kept:
        rej.message += (
            "; this refusal is not recorded (the market keeps at most "
            f"{ctx.records.caps.unknown} refusals of purchases on unknown streams per "
            "partition): these signed bytes would be applied if sent again once the stream exists"
        )
    outcome = rejection(ctx, "purchase", src, rej)
    record = PurchaseRecord(
        fingerprint=fp,
        status="rejected",
        stream_id=req.stream_id,
        requested_at_ms=req.requested_at_ms,
        reason=rej.reason[:48],
        decided_at_ms=ctx.clock(),
    )
    return outcome, record


def _check_terms(
    ctx: Context, req: PurchaseRequest, stream: Stream[Product], account: AccountState
) -> None:
    """Refuse what the stream's terms do not allow the buyer's account or currency."""
    reg = stream.registration
    if ctx.require_encryption and not account.sealing_key:
        raise Reject(
            "encryption_required",
            "this market only delivers sealed releases and your account has no sealing key: "
            "rotate your keys with one (`epsilon-market account rotate --key-file`)",
        )
    if req.currency != reg.currency:
        raise Reject(
            "currency_mismatch",
            f"stream {reg.stream_id!r} is priced in {reg.currency}, not {req.currency}",
        )


def _check_step(
    ctx: Context, req: PurchaseRequest, stream: Stream[Product], step: StepPlan
) -> None:
    """Refuse a step that buys nothing, costs more than offered, or would overfill the stream."""
    reg = stream.registration
    if step.after <= step.held:  # nothing to buy (each such request kept a whole window)
        raise Reject(
            "already_held",
            f"you hold a level on stream {reg.stream_id!r} as accurate as the one asked for or "
            "more: its releases are in your inbox (resending the purchase that bought it sends "
            "them again); buy a level above it, or quote what is for sale",
            held_level=step.held,
        )
    if step.price_minor > req.max_price_minor:
        raise Reject(
            "price_too_high",
            f"this step costs {format_money(step.price_minor, reg.currency)}, more than the "
            "purchase's max_price_minor",
            quoted_price_minor=step.price_minor,
        )
    check_place(ctx, stream, req.buyer_id)


def _fulfil(
    ctx: Context, streams: Streams, req: PurchaseRequest, fp: str, account: AccountState
) -> tuple[Outcome, PurchaseRecord, bytes]:
    """Release the level bought on the stream's window, charge, sign; or raise a refusal.
    Returns the outcome, the decision's record and the outcome's bytes (the buyer's answer)."""
    stream = streams.load(req.stream_id)
    reg = stream.registration
    _check_terms(ctx, req, stream, account)
    if req.reservation_id is not None:
        step = reserved_step(stream, req)
    else:
        step = plan(stream, req.buyer_id, target(stream, req.buyer_id, req))
    _check_step(ctx, req, stream, step)

    def release() -> tuple[list[ReleasedValue], int, Receipt, bytes]:
        # the outcome (sealed, signed) is built inside the gate, before anything is charged:
        # if building it failed, the buyer would otherwise pay for a level with no outcome
        releases, new_noise = stream.product.release_window(ctx, stream, step.after)
        fulfilled, receipt = _fulfilled(ctx, req, stream, step, releases, account.sealing_key)
        return releases, new_noise, receipt, dump(fulfilled)

    ledger = stream.ledger
    releases, new_noise, receipt, payload = ledger.sell(
        req.buyer_id, ledger.level(step.after), step.price_minor, release
    )
    record = _decision(ctx, req, stream, step, fp, payload)
    outcome = Outcome(
        "purchase",
        "fulfilled",
        [
            Output(ctx.topics.inbox(req.buyer_id), req.purchase_id.encode(), payload),
            *sale(ctx, receipt, record.decided_at_ms),
        ],
        stream_id=reg.stream_id,
        mechanism=reg.mechanism,
        releases=len(releases),
        new_noise=new_noise,
        price_minor=step.price_minor,
        figures=stream.figures(),
    )
    return outcome, record, payload


def _decision(
    ctx: Context,
    req: PurchaseRequest,
    stream: Stream[Product],
    step: StepPlan,
    fp: str,
    payload: bytes,
) -> PurchaseRecord:
    """What a fulfilment's record keeps: the decision, the values covered (the window
    released, by arrival number) and the outcome's digest, not its bytes (a replay recomputes
    them; :meth:`~.replay.records.Records.evicted` adds them where it could not)."""
    window = stream.state.window
    return PurchaseRecord(
        fingerprint=fp,
        status="fulfilled",
        stream_id=stream.id,
        requested_at_ms=req.requested_at_ms,
        price_minor=step.price_minor,
        level_before=step.held,
        level_after=step.after,
        first_seq=window[0].seq if window else stream.state.next_seq,
        count=len(window),
        decided_at_ms=ctx.clock(),
        digest=hashlib.sha256(payload).hexdigest(),
    )


def _fulfilled(
    ctx: Context,
    req: PurchaseRequest,
    stream: Stream[Product],
    step: StepPlan,
    releases: list[ReleasedValue],
    sealing_key: str | None,
) -> tuple[PurchaseFulfilled, Receipt]:
    """The outcome event: releases (sealed for the buyer's key, if any) and a signed receipt;
    and the receipt's fields (what the seller's sale notice is made of)."""
    reg = stream.registration
    opening = derive_opening(
        ctx.keys.opening_key,
        buyer_id=req.buyer_id,
        stream_id=reg.stream_id,
        purchase_id=req.purchase_id,
        requested_at_ms=req.requested_at_ms,
        level_after=step.after,
    )
    sealed: Envelope | None = None
    if sealing_key:
        sealed = seal_releases(
            ctx.sealer, sealing_key, releases, purchase_aad(req.purchase_id), opening
        )
    receipt = Receipt(
        purchase_id=req.purchase_id,
        buyer_id=req.buyer_id,
        stream_id=reg.stream_id,
        seller_id=reg.seller_id,
        mechanism=reg.mechanism,
        value_ids=tuple(r.value_id for r in releases),
        level_before=step.held,
        level_after=step.after,
        price_minor=step.price_minor,
        currency=reg.currency,
        commitment=commitment(opening, [stream.product.committed(r) for r in releases]),
        receipt_version=stream.product.receipt_version,
        requested_at_ms=req.requested_at_ms,
        market_key_id=ctx.keys.key_id,
        ciphertext_digest="" if sealed is None else ciphertext_digest(dict(sealed)),
    )
    signature = sign_receipt(receipt, ctx.keys.signing_key)
    event = trusted(
        PurchaseFulfilled,
        purchase_id=req.purchase_id,
        buyer_id=req.buyer_id,
        stream_id=reg.stream_id,
        level_unit=UNIT_OF[reg.mechanism],
        level_before=step.held,
        level_after=step.after,
        price_minor=step.price_minor,
        currency=reg.currency,
        releases=[] if sealed else releases,
        sealed=sealed,
        opening=None if sealed else opening.hex(),  # in clear only beside numbers in clear
        receipt=trusted(ReceiptModel, **receipt.to_dict(), signature=signature),
        error_model=error_info(reg, step.after),
    )
    return event, receipt
