"""Repair after a partial batch: a replayed batch whose stream records were lost.

A batch's records (values' states and marks, purchase outcomes) are acknowledged before its
streams' records, and its outputs only after both (:mod:`streams.worker.batch`). A worker that
dies in between leaves the records durable and the streams' records as they were, and nothing
of the batch was sent. The batch is then replayed, possibly in another order (values and
purchases travel on different topics), and its events meet records their stream does not count.

Invariant: the stream's record is the truth about what the stream has released and charged.
Every value or purchase record is either counted by it or *ahead* of it, and a record ahead of
its stream was never seen by anyone (state before output). So the stream never takes a record's
word for what happened: the event is decided again against the stream as it is —

* a value whose state (or mark) is stored but which its stream does not count is ingested
  again, not taken for a resend (its noise is a pure function of the request: the same
  releases) — :func:`ahead_of_stream`. A mark's arrival number alone cannot say so once a
  replay that skipped the value gave its number to another, so each worker incarnation numbers
  under its own numbering (:meth:`~streams.core.stream.Stream.number_under`) and the stream's
  record keeps where each earlier numbering ended: a mark under a numbering the record does not
  know was numbered by a lost batch. A mark names the numbering its value was *counted* under,
  not the one of the batch that evicted it (:func:`mark_of`): a lost batch may evict a value an
  earlier, durable batch counted, and that value is not ahead of its stream;
* a value a lost batch evicted has its mark (its exact numbers are gone) while the window still
  lists it: it leaves the window before the window is released — :func:`settle_evictions`;
* a fulfilled purchase the stream does not count stands only where it was made: the buyer holds
  the level it held then, the window holds exactly the values its receipt covers and every
  privacy window still has room; its charge is then applied as it was then. Anywhere else it
  is fulfilled or refused afresh, and its record replaced — :func:`outcome_stands`.

After any crash and replay, each privacy window's sum is therefore the sum of its values'
largest levels in the releases actually sent, and each holder holds (and paid for) exactly the
outcomes it was sent.
"""

from __future__ import annotations

from typing import Any

from ...wire.events import PurchaseFulfilled
from ..outputs import Reject
from ..state import EvictedValue, PurchaseRecord, StreamState, ValueEntry, ValueState, record_key
from ..stream import Stream
from .records import Records

__all__ = ["ahead_of_stream", "counted_under", "mark_of", "outcome_stands", "settle_evictions"]


def counted_under(st: StreamState, seq: int) -> int:
    """The numbering the arrival number ``seq`` (below ``st.next_seq``) was counted under: the
    oldest that ended past it, else the current one.

    Numberings end in arrival order (their ends and counts grow together), so each covers the
    numbers from where the one before it ended. A number older than every numbering the record
    keeps gets the oldest kept: once that one is dropped too,
    :attr:`~streams.core.state.StreamState.numbering_floor` covers it.
    """
    past = [(end, n >> 31, n) for n, end in st.numberings.items() if seq < end]
    return min(past)[2] if past else st.numbering


def mark_of(stream: Stream[Any], entry: ValueEntry) -> EvictedValue:
    """The mark a value leaves when it leaves the window: its arrival number under the
    numbering that counted it (:func:`counted_under`).

    Not the stream's current numbering: a batch lost at ``mid_state`` may have evicted a value
    that the stream's durable record still counts (a worker replaying uncommitted events
    ingests new values that push an old one out). Its mark, named after the lost batch's
    numbering, would read as ahead of the record, and a replay of the value (uncommitted too)
    would ingest it a second time (``values_ingested`` one over).
    """
    numbering = counted_under(stream.state, entry.seq)
    return EvictedValue(entry.seq, entry.digest, entry.published_at_ms, numbering)


def ahead_of_stream(stream: Stream[Any], value_id: str, known: ValueState) -> bool:
    """Whether a value's record was written by a batch whose stream record is not durable: the
    stream does not count it (not in the window; a mark numbered at or after the end of the
    numbering that counted it, or under a numbering the record does not know: a lost batch's
    arrival numbers may since have been given to other values)."""
    if isinstance(known, EvictedValue):
        st = stream.state
        end = st.next_seq if known.numbering == st.numbering else st.numberings.get(known.numbering)
        if end is None:  # a lost batch's, unless older than the numberings the record dropped
            return known.numbering >> 31 > st.numbering_floor
        return known.seq >= end
    return stream.entry(value_id) is None


def settle_evictions(records: Records, stream: Stream[Any]) -> None:
    """Drop from the window the values a lost batch evicted (their mark is stored)."""
    sid = stream.id
    stream.keep_only([e for e in stream.state.window
                      if not isinstance(records.value(record_key(sid, e.value_id)),
                                        EvictedValue)])  # fmt: skip


def outcome_stands(stream: Stream[Any], buyer_id: str, done: PurchaseRecord) -> bool:
    """Whether a fulfilled purchase's kept outcome may be sent (again) as it is.

    It may if the stream counts it (the buyer holds its level: levels only grow, so a stream
    that never counted it holds less), or if the stream is where the purchase was made; its
    charge, and the release of exactly the values its receipt covers, are then applied now.
    Otherwise (``False``) the outcome was kept by a lost batch replayed in another order and
    was never sent: the purchase is decided afresh, so no value is counted at a level it was
    never sent at and none is sent at a level not counted.

    A record the stream does not count still holds its outcome's bytes (they are dropped only
    once its batch's outputs are sent, after the stream's record is durable), whose receipt
    names the values the purchase covered; without them nothing shows where it was made.
    """
    if stream.held(buyer_id) >= done.level_after and buyer_id in stream.state.holders:
        return True
    if done.payload is None:
        return False
    receipt = PurchaseFulfilled.model_validate_json(done.payload).receipt
    ledger = stream.ledger
    level = ledger.level(done.level_after)
    covered = [e.value_id for e in stream.state.window]
    if stream.held(buyer_id) != done.level_before or covered != receipt.value_ids:
        return False
    try:
        ledger.check_purchase(level)  # another order may have filled a window since
    except Reject:
        return False
    stream.charge(buyer_id, done.level_after, done.price_minor)
    ledger.record_purchase(level)
    return True
