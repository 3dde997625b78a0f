"""A buyer's purchase → plan, release, charge, receipt; and quotes, which only plan.

A purchase is keyed by ``(buyer_id, stream_id, purchase_id)``: its outcome, fulfilment or
refusal, is stored with the exact bytes sent, and a resend re-emits those bytes without
charging again (a resend with other parameters is refused, ``idempotency_key_reused``). A
fulfilment releases the level bought on every value in the stream's window, charges
``P(new) − P(held)``, and carries an Ed25519-signed receipt that binds the released numbers
(and their envelope, when sealed).
"""

from __future__ import annotations

import hashlib

from market import ChainState, MarketError
from market.accuracy import AccuracyNotForSaleError, cheapest_level
from market.envelope import ciphertext_digest
from market.errors import NoHigherStepError
from market.histogram_chain import HistogramChain, HistogramValue
from market.pricing import StepPlan, plan_step, sellable_levels
from market.receipts import (
    KEYED_RECEIPT_VERSION,
    RECEIPT_VERSION,
    Receipt,
    ReleaseTriple,
    release_digest,
    sign_receipt,
)

from ..wire.events import (
    UNIT_OF,
    AccountState,
    Envelope,
    Offer,
    PurchaseFulfilled,
    PurchaseRequest,
    QuoteAnswer,
    QuoteRequest,
    ReceiptModel,
    ReleasedValue,
)
from ..wire.money import format_money
from ..wire.sealing import purchase_aad, seal_releases
from .accuracy import error_info, offer_accuracy, threshold
from .auth import acting_for, authenticate
from .context import Context
from .histograms import as_released
from .horizon import CLOCK_RECORD_MS, MAX_CLOCK_SKEW_MS, MAX_FAR_FUTURE_RECORDS
from .outputs import Outcome, Output, Reject, dump
from .placement import check_partition
from .rejections import Source, rejection
from .state import Holder, PurchaseRecord, StreamState, record_key
from .totals import is_totals, release_totals, worst_total_factor
from .values import settle_evictions, store_state, value_identity
from .windows import charge_purchase, check_purchase, fitting_levels, latest_status

__all__ = ["fingerprint", "fulfil", "purchase", "quote"]


def fingerprint(req: PurchaseRequest) -> str:
    """What makes two purchases with one id the same request (the send time does not)."""
    acc = None if req.accuracy is None else req.accuracy.model_dump()
    fields = (req.stream_id, req.target_level, req.max_price_minor, req.currency, acc,
              req.most_accurate)  # fmt: skip
    return hashlib.sha256(repr(fields).encode()).hexdigest()


def quote(ctx: Context, req: QuoteRequest, src: Source, *, final: bool = True) -> Outcome:
    """Answer what a purchase would cost, without buying."""
    authenticate(ctx, req, req.buyer_id, final=final)
    with acting_for(req.buyer_id, req.stream_id):
        check_partition(ctx, src, req.stream_id)
        return _quote(ctx, req)


def _quote(ctx: Context, req: QuoteRequest) -> Outcome:
    st = ctx.stream(req.stream_id)
    target = _target(ctx, st, req.buyer_id, req)
    try:
        plan = _plan(ctx, st, req.buyer_id, target)
    except NoHigherStepError:  # the top step is held: the quote still lists what is for sale
        holder = st.holders.get(req.buyer_id)
        held = holder.level if holder else 0.0
        plan = StepPlan(held, held, held, 0)
    answer = QuoteAnswer(
        quote_id=req.quote_id,
        buyer_id=req.buyer_id,
        stream_id=req.stream_id,
        level_unit=UNIT_OF[st.registration.mechanism],
        level_before=plan.held,
        level_after=plan.after,
        price_minor=plan.price_minor,
        currency=st.registration.currency,
        error_model=error_info(st.registration, plan.after),
        offers=_offers(ctx, st, plan.held),
        privacy_window=latest_status(st),
    )
    topic = ctx.topics.inbox(req.buyer_id)
    return Outcome(
        "quote",
        "answered",
        [Output(topic, req.quote_id.encode(), dump(answer))],
        stream_id=req.stream_id,
        price_minor=plan.price_minor,
    )


def purchase(ctx: Context, req: PurchaseRequest, src: Source, *, final: bool = True) -> Outcome:
    """Apply one signed ``purchase``: replay a stored outcome, or fulfil or refuse and store it."""
    account = authenticate(ctx, req, req.buyer_id, final=final)
    with acting_for(req.buyer_id, req.stream_id):
        check_partition(ctx, src, req.stream_id)  # before any state is read or written
        return _purchase(ctx, req, src, account)


def purchase_key(req: PurchaseRequest) -> str:
    """Where a purchase's outcome is recorded: under its buyer, stream and id. The record lives
    in the stream's changelog partition, so the key names the stream: keyed by buyer and id
    alone, one id used on two streams was two records under one key, and the partition a
    worker restored last decided which it kept (red team, third round)."""
    return record_key(req.buyer_id, req.stream_id, req.purchase_id)


def _recorded(ctx: Context, req: PurchaseRequest) -> PurchaseRecord | None:
    """The purchase's stored outcome: under its key, or under the ``buyer/purchase_id`` key of
    records written before purchase keys named the stream (if it is this stream's)."""
    record = ctx.stores.purchases.get(purchase_key(req))
    if record is None:
        legacy = ctx.stores.purchases.get(record_key(req.buyer_id, req.purchase_id))
        if legacy is not None and legacy.stream_id == req.stream_id:
            record = legacy
    return record


def _check_legacy(ctx: Context, req: PurchaseRequest) -> None:
    """Refuse an id a record written before purchase keys named the stream holds for another
    stream: that key held one record of several streams (one id on two streams, their
    partitions restored by one worker), and this stream's may be the one lost, so never fulfil
    under it, as before the change (red team, fourth round). The refusal is recorded like any
    other (fifth round: unrecorded, a worker without the legacy record fulfilled the copy)."""
    legacy = ctx.stores.purchases.get(record_key(req.buyer_id, req.purchase_id))
    if legacy is not None and legacy.stream_id != req.stream_id:
        raise Reject(
            "idempotency_key_reused",
            f"purchase id {req.purchase_id!r} was already used by buyer {req.buyer_id!r} on "
            f"stream {legacy.stream_id!r}; use a new purchase id",
        )


def _purchase(ctx: Context, req: PurchaseRequest, src: Source, account: AccountState) -> Outcome:
    rec_key = purchase_key(req)
    fp = fingerprint(req)
    topic = ctx.topics.inbox(req.buyer_id)
    st = ctx.stores.streams.get(req.stream_id)
    ts = req.requested_at_ms
    if st is not None:
        _floor_watermark(ctx, st)
    watermark = None if st is None else st.purchase_watermark_ms
    # too old: no record can be needed to recognise it (nor may one exist)
    ctx.horizon.admit_age("purchase", ts, watermark, req.purchase_id, req.stream_id)
    record = _recorded(ctx, req)
    if record is not None:
        return _replay(ctx, req, record, fp, topic)
    try:
        _check_legacy(ctx, req)
        try:
            ctx.horizon.admit_time("purchase", ts, req.purchase_id)
        except Reject as ahead:  # recorded below, unless no record of it can be kept
            if not ctx.horizon.recordable(ts, req.buyer_id, req.stream_id):
                ahead.sender = req.buyer_id
                ahead.message += (
                    f"; this refusal is not recorded (buyer {req.buyer_id!r} has "
                    f"{MAX_FAR_FUTURE_RECORDS} refusals of purchases dated this far ahead on "
                    "record): these signed bytes would be applied if sent again once the "
                    "market's clock reaches their date"
                )
                return rejection(ctx, "purchase", src, ahead)
            raise
        outcome = fulfil(ctx, req, fp, account)
    except (Reject, MarketError) as exc:  # every refusal of an admitted purchase is recorded
        rej = exc if isinstance(exc, Reject) else Reject(exc.code, exc.message)
        rej.sender = req.buyer_id
        outcome = rejection(ctx, "purchase", src, rej)
        ctx.stores.purchases[rec_key] = PurchaseRecord(
            fingerprint=fp,
            status="rejected",
            stream_id=req.stream_id,
            payload=outcome.outputs[0].value.decode(),
            requested_at_ms=ts,
        )
    _advance_watermark(ctx, req, rec_key)
    return outcome


def _replay(
    ctx: Context, req: PurchaseRequest, record: PurchaseRecord, fp: str, topic: str
) -> Outcome:
    """A resent purchase: the stored bytes again, or a refusal if the id meant something else."""
    if record.fingerprint != fp:
        raise Reject(
            "idempotency_key_reused",
            f"purchase id {req.purchase_id!r} was already used by buyer {req.buyer_id!r} for a "
            "different request; use a new purchase id",
        )
    if record.status == "fulfilled":
        _restore_charge(ctx, req, record)
    payload = record.payload.encode()
    outputs = [Output(topic, req.purchase_id.encode(), payload)]
    if record.status == "rejected":
        outputs.append(Output(ctx.topics.rejections, req.stream_id.encode(), payload))
    return Outcome("purchase", "duplicate", outputs, stream_id=record.stream_id)


def _restore_charge(ctx: Context, req: PurchaseRequest, record: PurchaseRecord) -> None:
    """Apply a fulfilled purchase's charge again if its stream's record does not show it.

    A batch's records (this outcome among them) are acknowledged before its streams' records
    (:mod:`streams.worker.batch`): a worker that dies between the two leaves the outcome durable
    and the charge, holding and privacy spent lost. The batch is replayed, this purchase meets
    its record, and the stored outcome says what was bought and paid: applied here, once (the
    holder then holds the level, and a later replay changes nothing).
    """
    st = ctx.stores.streams.get(req.stream_id)
    done = PurchaseFulfilled.model_validate_json(record.payload)
    holder = None if st is None else st.holders.get(req.buyer_id)
    if st is None or (holder is not None and holder.level >= done.level_after):
        return
    plan = StepPlan(done.level_before, done.level_after, done.level_after, done.price_minor)
    _charge(st, req, plan)
    charge_purchase(st, plan.after)
    if st.window:
        st.spent = max(st.spent, plan.after)
    ctx.stores.streams[req.stream_id] = st


def _advance_watermark(ctx: Context, req: PurchaseRequest, rec_key: str) -> None:
    """Remember the outcome until the horizon passes its request time, move the stream's
    purchase watermark to its request time but never past the market's clock (a purchase dated
    an hour ahead, refused at no cost, moved it an hour ahead: honest resends near the horizon
    lost their records, and with a short horizon every purchase was too old; red team, third
    round), and forget outcomes beyond the horizon."""
    st = ctx.stores.streams.get(req.stream_id)
    ts = req.requested_at_ms
    if st is None:  # no stream watermark: refusals of unknown streams expire by the clock,
        # a skew after it refuses their copies (another worker's clock may be behind)
        unknown = ctx.horizon.unknown(req.stream_id)
        ctx.horizon.remember("purchase", unknown, ts, rec_key)
        ctx.horizon.forget("purchase", unknown, ctx.clock() - CLOCK_RECORD_MS,
                           ctx.stores.purchases)  # fmt: skip
        return
    ctx.horizon.remember("purchase", req.stream_id, ts, rec_key)
    # never ahead of the clock, whatever the request claims; and in whole steps, so that
    # purchases refused at no cost rewrite the stream's record at most once a step (one per
    # millisecond of request time rewrote it on every event: red team, fifth round)
    step = ctx.horizon.step_ms
    moved = min(ts, ctx.clock()) // step * step
    if moved > st.purchase_watermark_ms:
        st.purchase_watermark_ms = moved
        ctx.stores.streams[req.stream_id] = st
    ctx.horizon.forget("purchase", req.stream_id, st.purchase_watermark_ms, ctx.stores.purchases)


def _floor_watermark(ctx: Context, st: StreamState) -> None:
    """Raise the stream's purchase watermark to the market's clock minus the allowed skew.

    The clock refuses a purchase older than the horizon and the skew; stored in the stream, that
    verdict is every worker's: a copy reaching a worker whose clock is behind is refused by the
    watermark, where its own clock would have let it in (red team, third round). Records the
    watermark then lets go are those the clock refuses anyway.
    """
    floor = ctx.clock() - MAX_CLOCK_SKEW_MS
    if st.purchase_watermark_ms < floor:
        # a step beyond the floor (still an hour less a step behind the clock): one signed
        # purchase replayed a thousand times wrote the stream record a thousand times
        # (red team, fourth round)
        st.purchase_watermark_ms = floor = floor + ctx.horizon.step_ms
        ctx.stores.streams[st.registration.stream_id] = st
        ctx.horizon.forget("purchase", st.registration.stream_id, floor, ctx.stores.purchases)


def _target(
    ctx: Context, st: StreamState, buyer_id: str, req: PurchaseRequest | QuoteRequest
) -> float | None:
    """The level a request names: explicitly, as an accuracy, or as "the most accurate level
    my price buys"; ``None`` for the next step."""
    if req.accuracy is None and not getattr(req, "most_accurate", False):
        return req.target_level
    reg = st.registration
    terms = ctx.terms(reg)
    levels = sellable_levels(reg.steps, reg.cap)
    acc = req.accuracy
    if acc is not None:
        # on running totals the target is for the least accurate total: tree_height nodes,
        # whose Gaussian errors add up to sqrt(tree_height) times one node's
        per = worst_total_factor(reg)
        rmse = None if acc.rmse is None else acc.rmse / per
        hw = None if acc.half_width is None else acc.half_width / per
        try:
            return cheapest_level(terms.mechanism, levels, rmse=rmse, half_width=hw,
                                  confidence=acc.confidence)  # fmt: skip
        except AccuracyNotForSaleError as exc:
            msg = f"{exc}; buy that level with target_level {exc.best:g}"
            if per != 1.0:
                msg = (f"no level for sale makes every running total that accurate: the best, "
                       f"{exc.best:g}, gives {exc.error * per:.4g} on the least accurate total "
                       f"({reg.tree_height} tree nodes); buy it with target_level {exc.best:g}")
            raise Reject("accuracy_not_for_sale", msg, best_level=exc.best,
                         best_error=exc.error * per) from None  # fmt: skip
        except ValueError as exc:  # a target the model cannot meet at all (wire-validated)
            raise Reject("invalid_event", f"accuracy target: {exc}") from None
    holder = st.holders.get(buyer_id)
    held = holder.level if holder else 0.0
    budget = req.max_price_minor if isinstance(req, PurchaseRequest) else 0
    above = [lv for lv in levels if lv > held]
    fits = fitting_levels(st, above)
    price = terms.schedule.step_price
    affordable = [lv for lv, ok in zip(above, fits, strict=True)
                  if ok and price(terms.mechanism, held, lv) <= budget]  # fmt: skip
    if affordable:
        return max(affordable)
    # nothing affordable: the next level up is refused as too dear (saying what it costs);
    # nothing above at all: the next step is refused as "no higher step"
    return above[0] if above else None


def _offers(ctx: Context, st: StreamState, held: float) -> list[Offer]:
    """Every level for sale with its accuracy and what it costs the buyer from ``held``."""
    reg = st.registration
    terms = ctx.terms(reg)
    out = []
    levels = sellable_levels(reg.steps, reg.cap)
    window = reg.window is not None
    # a level at or below the one held is answered with the held level's release
    for lv, fits in zip(levels, fitting_levels(st, [max(lv, held) for lv in levels]), strict=True):
        rmse, hw95 = offer_accuracy(reg.mechanism, reg.release_sensitivity(), reg.dimension, lv)
        factor = worst_total_factor(reg)  # running totals: the least accurate total's
        rmse, hw95 = rmse * factor, hw95 * factor
        price = terms.schedule.step_price(terms.mechanism, held, lv) if lv > held else 0
        out.append(Offer(level=lv, rmse=rmse, half_width_95=hw95, price_minor=price,
                         held=lv <= held, fits_window=fits if window else None,
                         threshold=threshold(reg, lv)))  # fmt: skip
    return out


def _plan(ctx: Context, st: StreamState, buyer_id: str, target: float | None) -> StepPlan:
    reg = st.registration
    terms = ctx.terms(reg)
    holder = st.holders.get(buyer_id)
    held = holder.level if holder else 0.0
    return plan_step(
        terms.schedule, terms.mechanism, list(reg.steps), reg.cap, held, target,
        stream=reg.stream_id,
    )  # fmt: skip


def _check_terms(
    ctx: Context, req: PurchaseRequest, st: StreamState, account: AccountState
) -> None:
    reg = st.registration
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


def fulfil(ctx: Context, req: PurchaseRequest, fp: str, account: AccountState) -> Outcome:
    """Release the level bought on the stream's window, charge, sign; or raise a refusal."""
    st = ctx.stream(req.stream_id)
    reg = st.registration
    _check_terms(ctx, req, st, account)
    plan = _plan(ctx, st, req.buyer_id, _target(ctx, st, req.buyer_id, req))
    if plan.after <= plan.held:
        # nothing to buy: each such request stored the whole window's outcome (up to a
        # message, ~1 MiB) for the horizon and sent it again, at no cost (red team, fifth round)
        raise Reject(
            "already_held",
            f"you hold level {plan.held:g} on stream {reg.stream_id!r}, as accurate as level "
            f"{plan.target:g} or more: its releases are in your inbox (resending the purchase "
            "that bought it sends them again); buy a level above it, or quote what is for sale",
            held_level=plan.held,
        )
    if plan.price_minor > req.max_price_minor:
        raise Reject(
            "price_too_high",
            f"moving from level {plan.held:g} to {plan.target:g} costs "
            f"{format_money(plan.price_minor, reg.currency)}; you offered at most "
            f"{format_money(req.max_price_minor, reg.currency)}",
            quoted_price_minor=plan.price_minor,
        )
    limit = ctx.limits.holder_limit(reg.release_width())
    if req.buyer_id not in st.holders and len(st.holders) >= limit:
        raise Reject(
            "stream_full",
            f"stream {reg.stream_id!r} has its maximum of {limit} buyers (every new value is "
            "delivered to each of them); ask the operators (EMARKET_MAX_HOLDERS)",
        )
    check_purchase(st, plan.after, sellable_levels(reg.steps, reg.cap))
    releases, new_noise = _release_window(ctx, st, plan.after)
    # the outcome (sealed, signed) is built before anything is charged: if building it failed,
    # the buyer would otherwise hold and pay for a level with no stored outcome
    payload = dump(_fulfilled(ctx, req, st, plan, releases, account.sealing_key))
    _charge(st, req, plan)
    charge_purchase(st, plan.after)
    ctx.stores.streams[reg.stream_id] = st
    ctx.stores.purchases[purchase_key(req)] = PurchaseRecord(
        fingerprint=fp,
        status="fulfilled",
        stream_id=reg.stream_id,
        price_minor=plan.price_minor,
        payload=payload.decode(),
        requested_at_ms=req.requested_at_ms,
    )
    return Outcome(
        "purchase",
        "fulfilled",
        [Output(ctx.topics.inbox(req.buyer_id), req.purchase_id.encode(), payload)],
        stream_id=reg.stream_id,
        mechanism=reg.mechanism,
        releases=len(releases),
        new_noise=new_noise,
        price_minor=plan.price_minor,
        figures=ctx.figures(st),
    )


def _release_window(
    ctx: Context, st: StreamState, level: float
) -> tuple[list[ReleasedValue], int]:
    """Every value in the window released at ``level``: one step of each value's chain."""
    sid = st.registration.stream_id
    chain = ctx.terms(st.registration).chain
    step = chain.step_of(level)
    if is_totals(st.registration):
        releases, new_noise = release_totals(ctx, st, level)
        if st.window:
            st.spent = max(st.spent, level)
        return releases, new_noise
    settle_evictions(ctx, st)
    hist = ctx.terms(st.registration).histogram
    if hist is not None:
        return _release_histograms(ctx, st, hist, level)
    keys = [record_key(sid, e.value_id) for e in st.window]
    states: list[ChainState] = []
    for k in keys:
        state = ctx.stores.releases[k]
        assert isinstance(state, ChainState)  # window entries are never evicted
        states.append(state)
    new_noise = sum(chain.new_steps(s, step) for s in states)
    identities = [value_identity(sid, e.value_id, e.digest) for e in st.window]
    vectors = chain.release(states, step, identities, ctx.noise)
    if new_noise:
        for k, state in zip(keys, states, strict=True):
            store_state(ctx, k, state)
    if st.window:
        st.spent = max(st.spent, level)
    releases = [
        ReleasedValue.model_construct(value_id=e.value_id, seq=e.seq, level=level,
                                      values=v.tolist())
        for e, v in zip(st.window, vectors, strict=True)
    ]  # fmt: skip
    return releases, new_noise


def _release_histograms(
    ctx: Context, st: StreamState, chain: HistogramChain, level: float
) -> tuple[list[ReleasedValue], int]:
    """Every histogram in the window released at ``level``, each recomputed from its counts."""
    sid = st.registration.stream_id
    step = chain.step_of(level)
    releases = []
    for e in st.window:
        value = ctx.stores.releases[record_key(sid, e.value_id)]
        assert isinstance(value, HistogramValue)  # window entries are never evicted
        ident = value_identity(sid, e.value_id, e.digest)
        releases.append(as_released(e.value_id, e.seq, level,
                                    chain.release(value, step, ident, ctx.rngs)))  # fmt: skip
    if st.window:
        st.spent = max(st.spent, level)
    return releases, sum(e.level < level for e in st.window)  # levels not released before


def _charge(st: StreamState, req: PurchaseRequest, plan: StepPlan) -> Holder:
    """The buyer now holds ``plan.after`` and has paid for it."""
    holder = st.holders.get(req.buyer_id) or Holder(level=plan.after)
    holder.level = plan.after
    holder.paid_minor += plan.price_minor
    holder.purchases += 1
    st.holders[req.buyer_id] = holder
    st.revenue_minor += plan.price_minor
    return holder


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
    st: StreamState,
    plan: StepPlan,
    releases: list[ReleasedValue],
    sealing_key: str | None,
) -> PurchaseFulfilled:
    """The outcome event: releases (sealed for the buyer's key, if any) and a signed receipt."""
    reg = st.registration
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
        level_before=plan.held,
        level_after=plan.after,
        price_minor=plan.price_minor,
        currency=reg.currency,
        release_digest=release_digest(_digested(releases)),
        receipt_version=KEYED_RECEIPT_VERSION if reg.histogram else RECEIPT_VERSION,
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
        level_before=plan.held,
        level_after=plan.after,
        price_minor=plan.price_minor,
        currency=reg.currency,
        releases=[] if sealed else releases,
        sealed=sealed,
        receipt=ReceiptModel.model_construct(**receipt.to_dict(), signature=signature),
        error_model=error_info(st.registration, plan.after),
    )
