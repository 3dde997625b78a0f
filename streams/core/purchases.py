"""A buyer's purchase: recall its outcome, or fulfil or refuse it, then keep the outcome.

A purchase is keyed by ``(buyer_id, stream_id, purchase_id)``. Its outcome, fulfilment or
refusal, is kept with the exact bytes sent, and a resend gets those bytes again without being
charged again (a resend with other parameters is refused, ``idempotency_key_reused``). How
outcomes are recalled, kept and forgotten is :mod:`streams.core.replay`'s.

A fulfilment releases the level bought on every value in the stream's window, charges
``P(new) − P(held)``, and carries an Ed25519-signed receipt that binds the released numbers (and
their envelope, when sealed).
"""

from __future__ import annotations

import hashlib

from market import MarketError
from market.envelope import ciphertext_digest
from market.pricing import StepPlan
from market.receipts import Receipt, ReleaseTriple, release_digest, sign_receipt

from ..wire.events import (
    UNIT_OF,
    AccountState,
    Envelope,
    PurchaseFulfilled,
    PurchaseRequest,
    ReceiptModel,
    ReleasedValue,
)
from ..wire.money import format_money
from ..wire.sealing import purchase_aad, seal_releases
from .accuracy import error_info
from .context import Context
from .incoming import Incoming
from .outputs import Outcome, Output, Reject, dump
from .planning import plan, target
from .products import Product
from .rejections import Source, rejection
from .replay import legacy
from .replay.records import MAX_FAR_FUTURE_RECORDS, purchase_key
from .replay.repair import outcome_stands
from .replay.watermarks import advance_purchases, floor_purchases, heap_of
from .state import PurchaseRecord
from .stream import Stream
from .stream_store import Streams

__all__ = ["fingerprint", "purchase"]


def fingerprint(req: PurchaseRequest) -> str:
    """What makes two purchases with one id the same request (the send time does not)."""
    acc = None if req.accuracy is None else req.accuracy.model_dump()
    fields = (req.stream_id, req.target_level, req.max_price_minor, req.currency, acc,
              req.most_accurate)  # fmt: skip
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
    if earlier is not None and _stands(stream, req, earlier, fp):
        return _again(ctx, req, earlier)
    try:
        _admit(ctx, req)
        outcome, record = _fulfil(ctx, streams, req, fp, inc.account)
    except _Unkept as unkept:
        return rejection(ctx, "purchase", inc.src, unkept.refusal)
    except (Reject, MarketError) as exc:  # every refusal of an admitted purchase is kept
        outcome, record = _refused(ctx, req, fp, inc.src, exc)
    ctx.records.keep_purchase(purchase_key(req.buyer_id, req.stream_id, req.purchase_id),
                              record, heap_of(ctx.records, stream, req.stream_id))  # fmt: skip
    advance_purchases(ctx.records, stream, req.stream_id, req.requested_at_ms)
    return outcome


def _recall(ctx: Context, stream: Stream[Product] | None,
            req: PurchaseRequest) -> PurchaseRecord | None:  # fmt: skip
    """The purchase's kept outcome; a refusal if it is too old for any to be kept."""
    if stream is not None:
        floor_purchases(ctx.records, stream)
    watermark = None if stream is None else stream.state.purchase_watermark_ms
    ctx.admission.admit_age("purchase", req.requested_at_ms, watermark, req.purchase_id,
                            req.stream_id)  # fmt: skip
    kept = ctx.records.purchase(purchase_key(req.buyer_id, req.stream_id, req.purchase_id))
    return kept if kept is not None else legacy.recall(ctx.records, req)


def _admit(ctx: Context, req: PurchaseRequest) -> None:
    """Refuse a new purchase whose id an old key holds, or which is from the future; a refusal
    that cannot be kept raises :class:`_Unkept`."""
    legacy.check_id(ctx.records, req)
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


def _stands(stream: Stream[Product] | None, req: PurchaseRequest, record: PurchaseRecord,
            fp: str) -> bool:  # fmt: skip
    """Whether a resent purchase gets its kept outcome (:func:`outcome_stands`; ``False``: the
    outcome of a lost batch, never sent, decided afresh); a refusal if the id meant something
    else."""
    if record.fingerprint != fp:
        raise Reject(
            "idempotency_key_reused",
            f"purchase id {req.purchase_id!r} was already used by buyer {req.buyer_id!r} for a "
            "different request; use a new purchase id",
        )
    if record.status != "fulfilled" or stream is None:
        return True
    done = PurchaseFulfilled.model_validate_json(record.payload)
    return outcome_stands(stream, req.buyer_id, done)


def _again(ctx: Context, req: PurchaseRequest, record: PurchaseRecord) -> Outcome:
    """A resent purchase: the kept bytes again."""
    payload = record.payload.encode()
    outputs = [Output(ctx.topics.inbox(req.buyer_id), req.purchase_id.encode(), payload)]
    if record.status == "rejected":
        outputs.append(Output(ctx.topics.rejections, req.stream_id.encode(), payload))
    return Outcome("purchase", "duplicate", outputs, stream_id=record.stream_id)


def _refused(ctx: Context, req: PurchaseRequest, fp: str, src: Source,
             exc: Reject | MarketError) -> tuple[Outcome, PurchaseRecord]:  # fmt: skip
    """The outcome of a refused purchase, and the record that keeps it."""
    rej = exc if isinstance(exc, Reject) else Reject(exc.code, exc.message)
    rej.sender = req.buyer_id
    outcome = rejection(ctx, "purchase", src, rej)
    record = PurchaseRecord(fingerprint=fp, status="rejected", stream_id=req.stream_id,
                            payload=outcome.outputs[0].value.decode(),
                            requested_at_ms=req.requested_at_ms)  # fmt: skip
    return outcome, record


def _check_terms(ctx: Context, req: PurchaseRequest, stream: Stream[Product],
                 account: AccountState) -> None:  # fmt: skip
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


def _check_step(ctx: Context, req: PurchaseRequest, stream: Stream[Product],
                step: StepPlan) -> None:  # fmt: skip
    """Refuse a step that buys nothing, costs more than offered, or would overfill the stream."""
    reg = stream.registration
    if step.after <= step.held:  # nothing to buy (each such request kept a whole window)
        raise Reject(
            "already_held",
            f"you hold level {step.held:g} on stream {reg.stream_id!r}, as accurate as level "
            f"{step.target:g} or more: its releases are in your inbox (resending the purchase "
            "that bought it sends them again); buy a level above it, or quote what is for sale",
            held_level=step.held,
        )
    if step.price_minor > req.max_price_minor:
        raise Reject(
            "price_too_high",
            f"moving from level {step.held:g} to {step.target:g} costs "
            f"{format_money(step.price_minor, reg.currency)}; you offered at most "
            f"{format_money(req.max_price_minor, reg.currency)}",
            quoted_price_minor=step.price_minor,
        )
    limit = ctx.limits.holder_limit(reg.release_width())
    if req.buyer_id not in stream.state.holders and len(stream.state.holders) >= limit:
        raise Reject(
            "stream_full",
            f"stream {reg.stream_id!r} has its maximum of {limit} buyers (every new value is "
            "delivered to each of them); ask the operators (EMARKET_MAX_HOLDERS)",
        )


def _fulfil(ctx: Context, streams: Streams, req: PurchaseRequest, fp: str,
            account: AccountState) -> tuple[Outcome, PurchaseRecord]:  # fmt: skip
    """Release the level bought on the stream's window, charge, sign; or raise a refusal."""
    stream = streams.load(req.stream_id)
    reg = stream.registration
    _check_terms(ctx, req, stream, account)
    step = plan(stream, req.buyer_id, target(stream, req.buyer_id, req))
    _check_step(ctx, req, stream, step)
    ledger = stream.ledger
    ledger.check_purchase(ledger.level(step.after))
    releases, new_noise = stream.product.release_window(ctx, stream, step.after)
    # the outcome (sealed, signed) is built before anything is charged: if building it failed,
    # the buyer would otherwise hold and pay for a level with no kept outcome
    payload = dump(_fulfilled(ctx, req, stream, step, releases, account.sealing_key))
    stream.charge(req.buyer_id, step.after, step.price_minor)
    ledger.record_purchase(ledger.level(step.after))
    record = PurchaseRecord(fingerprint=fp, status="fulfilled", stream_id=reg.stream_id,
                            price_minor=step.price_minor, payload=payload.decode(),
                            requested_at_ms=req.requested_at_ms)  # fmt: skip
    outcome = Outcome(
        "purchase", "fulfilled",
        [Output(ctx.topics.inbox(req.buyer_id), req.purchase_id.encode(), payload)],
        stream_id=reg.stream_id, mechanism=reg.mechanism, releases=len(releases),
        new_noise=new_noise, price_minor=step.price_minor, figures=stream.figures(),
    )  # fmt: skip
    return outcome, record


def _digested(releases: list[ReleasedValue]) -> list[ReleaseTriple]:
    """What the receipt's digest covers: each release's numbers, and a histogram's keys."""
    return [
        (r.value_id, r.level, r.values) if r.keys is None
        else (r.value_id, r.level, r.values, r.keys)
        for r in releases
    ]  # fmt: skip


def _fulfilled(
    ctx: Context,
    req: PurchaseRequest,
    stream: Stream[Product],
    step: StepPlan,
    releases: list[ReleasedValue],
    sealing_key: str | None,
) -> PurchaseFulfilled:
    """The outcome event: releases (sealed for the buyer's key, if any) and a signed receipt."""
    reg = stream.registration
    sealed: Envelope | None = None
    if sealing_key:
        sealed = seal_releases(ctx.sealer, sealing_key, releases, purchase_aad(req.purchase_id))
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
        release_digest=release_digest(_digested(releases)),
        receipt_version=stream.product.receipt_version,
        requested_at_ms=req.requested_at_ms,
        market_key_id=ctx.keys.key_id,
        ciphertext_digest="" if sealed is None else ciphertext_digest(sealed.model_dump()),
    )
    signature = sign_receipt(receipt, ctx.keys.signing_key)
    return PurchaseFulfilled.model_construct(
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
        receipt=ReceiptModel.model_construct(**receipt.to_dict(), signature=signature),
        error_model=error_info(reg, step.after),
    )
