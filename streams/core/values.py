"""A seller's signed batch of values: each value kept and released by its stream's product.

Each value of a batch is accepted or refused on its own, and the seller learns which in one
``values_accepted`` event; each refused value is also shown to the operators as a rejection. A
value the market has seen is recognised (:meth:`~streams.core.products.base.Product.known`): sent
again with the same numbers it gets the very same releases (``duplicate``), with other numbers it
is refused (``conflicting_value``). Every release is a pure function of the market's noise
secret, the stream's chain, the value's identity and the step, so a resend the market has
forgotten gets the same releases again, never fresh noise.

A batch its seller numbered (docs/protocol.md §6.4.1, :mod:`.replay.numbers`) is recognised by
its number before any of its values is looked at, and answered with the bytes of its first
answer: a number is taken only by a batch whose every value is in the stream, whose answer is
then every line ``accepted``, a pure function of the batch's bytes.
"""

from __future__ import annotations

from typing import Any

from ..wire.events import MAX_BATCH, ValueBatch, ValueItem, ValueOutcome, ValuesAccepted
from ..wire.trusted import trusted
from .auth import acting_for
from .context import Context
from .delivery import release_bytes
from .incoming import Incoming
from .outputs import Outcome, Output, Reject, dump
from .products import Product
from .products.base import Exact
from .rejections import Source, rejection
from .replay import numbers
from .state import EvictedValue, ValueState
from .stream import Stream
from .stream_store import Streams

__all__ = ["batch_capacity", "ingest", "ingest_value"]


def ingest(ctx: Context, streams: Streams, inc: Incoming[ValueBatch]) -> Outcome:
    """Apply one signed ``values`` batch: each value is accepted or refused on its own."""
    batch = inc.event
    stream = streams.load(batch.stream_id)
    reg = stream.registration
    if reg.seller_id != batch.seller_id:
        raise Reject(
            "not_your_stream",
            f"stream {batch.stream_id!r} belongs to seller {reg.seller_id!r}; "
            f"{batch.seller_id!r} cannot publish into it",
        )
    if batch.batch_seq:  # numbered (0 asks where the numbering stands)
        if numbers.applied(stream, batch.batch_seq):
            return _answered_again(ctx, stream, batch)
        numbers.check(stream, batch.batch_seq)
    _check_batch_cost(ctx, stream, len(batch.items))
    outcome = Outcome("value", "accepted", stream_id=batch.stream_id, mechanism=reg.mechanism)
    withheld = ctx.deliveries.withheld_total
    quota_withheld = ctx.deliveries.quota_withheld_total
    product = stream.product
    checked = [_checked(stream, item) for item in batch.items]  # each value's numbers, once
    new = [(item, e) for item, e in zip(batch.items, checked, strict=True) if isinstance(e, Exact)]
    product.prepare(ctx, stream, new)  # the batch's noise, in one kernel call
    try:
        lines = [
            _one(ctx, stream, item, exact, inc.src, outcome)
            for item, exact in zip(batch.items, checked, strict=True)
        ]
    finally:
        product.prepared_done()
    outcome.withheld = ctx.deliveries.withheld_total - withheld
    outcome.quota_withheld = ctx.deliveries.quota_withheld_total - quota_withheld
    if batch.batch_seq and all(line.status != "rejected" for line in lines):
        numbers.take(stream, batch.batch_seq)
        outcome.outputs.append(_answer(ctx, batch, _all_in(batch)))
    elif batch.batch_seq == 0:
        outcome.outputs.append(_answer(ctx, batch, lines, numbers.standing(stream)))
    else:
        outcome.outputs.append(_answer(ctx, batch, lines))
    outcome.outputs.extend(ctx.deliveries.drain_unless_batching())
    outcome.figures = stream.figures()
    statuses = {line.status for line in lines}
    if statuses == {"rejected"}:
        outcome.status, outcome.reason = "rejected", lines[0].reason
    elif "accepted" not in statuses:
        outcome.status = "duplicate"
    return outcome


def _all_in(batch: ValueBatch) -> list[ValueOutcome]:
    """The lines of a numbered batch applied whole: each value is in the stream with the
    numbers sent (new, or known already), so each line is ``accepted`` and the answer is a
    pure function of the batch's bytes."""
    return [trusted(ValueOutcome, value_id=i.value_id, status="accepted") for i in batch.items]


def _answer(
    ctx: Context,
    batch: ValueBatch,
    lines: list[ValueOutcome],
    standing: tuple[int, list[int]] | None = None,
) -> Output:
    """The ``values_accepted`` answer to ``batch`` in its seller's inbox (``standing``: to a
    batch numbered 0, where the stream's numbering stands)."""
    answer = trusted(
        ValuesAccepted,
        stream_id=batch.stream_id,
        seller_id=batch.seller_id,
        outcomes=lines,
        batch_seq=batch.batch_seq,
        next_batch_seq=None if standing is None else standing[0],
        missing_batch_seqs=None if standing is None else standing[1],
    )
    inbox = ctx.topics.inbox(batch.seller_id)
    return Output(inbox, batch.items[-1].value_id.encode(), dump(answer))


def _answered_again(ctx: Context, stream: Stream[Product], batch: ValueBatch) -> Outcome:
    """A numbered batch the stream applied, sent again: answered with the bytes of its first
    answer, and nothing else happens (its values are not looked at again: a number is
    recognised after their marks are forgotten, §6.4.1)."""
    reg = stream.registration
    outcome = Outcome("value", "duplicate", stream_id=batch.stream_id, mechanism=reg.mechanism)
    outcome.items = [("duplicate", None)] * len(batch.items)
    outcome.outputs.append(_answer(ctx, batch, _all_in(batch)))
    outcome.figures = stream.figures()
    return outcome


def batch_capacity(ctx: Context, stream: Stream[Product]) -> int:
    """Most values one batch of this stream may carry now: each value is delivered to every
    holder and walks the chain up to the highest level held."""
    reg = stream.registration
    product = type(stream.product)
    holders = len(stream.state.holders)
    walk = len(stream.terms.levels) if holders else 1
    by_output = ctx.limits.max_event_output_bytes // (
        max(1, holders) * release_bytes(reg.release_width(), sealed=True)
    )
    by_work = ctx.limits.max_event_work // ctx.limits.work(
        product.chains_walked(reg, 1), walk, product.work_width(reg)
    )
    return max(1, min(MAX_BATCH, by_output, by_work))


def _check_batch_cost(ctx: Context, stream: Stream[Product], items: int) -> None:
    cap = batch_capacity(ctx, stream)
    if items > cap:
        raise Reject(
            "batch_too_large",
            f"stream {stream.id!r} takes at most {cap} values per batch now "
            f"({len(stream.state.holders)} holders receive each value); split this batch of "
            f"{items} (the client library does it for you)",
            max_values=cap,
        )


def _checked(stream: Stream[Product], item: ValueItem) -> Exact | Reject:
    """The value's numbers checked by its stream's product, or their refusal (raised when the
    value's turn comes, as any refusal of one value of a batch)."""
    try:
        with acting_for(stream.registration.seller_id):
            return stream.product.exact(item)
    except Reject as rej:
        return rej


def _one(
    ctx: Context,
    stream: Stream[Product],
    item: ValueItem,
    exact: Exact | Reject,
    src: Source,
    out: Outcome,
) -> ValueOutcome:
    """One value of a batch; a refusal of it is recorded, never raised."""
    try:
        with acting_for(stream.registration.seller_id):
            status, released, new_noise = ingest_value(ctx, stream, item, exact)
    except Reject as rej:  # the operators see it; the seller sees it in values_accepted
        out.outputs += rejection(ctx, "value", src, rej, request_id=item.value_id).outputs[:1]
        out.items.append(("rejected", rej.reason))
        return trusted(
            ValueOutcome,
            value_id=item.value_id,
            status="rejected",
            reason=rej.reason,
            message=rej.message,
        )
    out.items.append((status, None))
    out.releases += released
    out.new_noise += new_noise
    return trusted(ValueOutcome, value_id=item.value_id, status=status)


def ingest_value(
    ctx: Context, stream: Stream[Product], item: ValueItem, exact: Exact | Reject
) -> tuple[str, int, int]:
    """Apply one value whose numbers its product checked (``exact``, or their refusal);
    return (status, releases queued, new chain steps computed)."""
    if isinstance(exact, Reject):
        raise exact
    product = stream.product
    ctx.admission.admit(
        "value", item.published_at_ms, stream.state.watermark_ms, item.value_id, stream.id
    )
    known = product.known(ctx, stream, item.value_id)
    if known is not None:
        _check_same(stream, item.value_id, exact.digest, known)
        released, new_noise = product.resend(ctx, stream, item.value_id, known)
        return "duplicate", released, new_noise
    stream.ledger.check_open(item.published_at_ms, item.value_id)
    released, new_noise = product.ingest(ctx, stream, item, exact)
    return "accepted", released, new_noise


def _check_same(stream: Stream[Any], value_id: str, digest: str, known: ValueState) -> None:
    """Refuse (``conflicting_value``) a known value id sent again with other numbers."""
    if isinstance(known, EvictedValue):
        old = known.digest
    else:
        entry = stream.entry(value_id)
        assert entry is not None  # a stored state its stream does not count is not "known"
        old = entry.digest
    if old != digest:
        raise Reject(
            "conflicting_value",
            f"value id {value_id!r} was already published on stream {stream.id!r} with "
            "different numbers; value ids must be unique, use a new id",
        )
