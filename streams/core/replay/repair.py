"""Repair after a partial batch: a replayed batch whose stream records were lost.

A batch's records (values' states and marks, purchase outcomes) are acknowledged before its
streams' records (:mod:`streams.worker.batch`), so a worker that dies between the two leaves
the first durable and the stream's record as it was. The batch is then replayed, and each
event meets records its stream does not count. Invariant: after the replay, the stream counts
exactly what its durable records say happened, each thing once:

* a value whose state (or mark) is stored but which its stream does not count is ingested
  again, not taken for a resend (its noise is a pure function of the request: the same
  releases) — :func:`ahead_of_stream`;
* a value a lost batch evicted has its mark while the window still lists it: a purchase
  completes the eviction first — :func:`settle_evictions`;
* a fulfilled purchase whose outcome is stored but whose charge, holding and privacy spent
  were lost is charged again, once — :func:`restore_charge`.
"""

from __future__ import annotations

from typing import Any

from ..state import EvictedValue, PurchaseRecord, ValueState, record_key
from ..stream import Stream
from .records import Records

__all__ = ["ahead_of_stream", "restore_charge", "settle_evictions"]


def ahead_of_stream(stream: Stream[Any], value_id: str, known: ValueState) -> bool:
    """Whether a value's record was written by a batch whose stream record is not durable: the
    stream does not count it (not in the window, or numbered at or after the next arrival)."""
    if isinstance(known, EvictedValue):
        return known.seq >= stream.state.next_seq
    return stream.entry(value_id) is None


def settle_evictions(records: Records, stream: Stream[Any]) -> None:
    """Drop from the window the values a lost batch evicted (their mark is stored)."""
    sid = stream.id
    stream.keep_only([e for e in stream.state.window
                      if not isinstance(records.value(record_key(sid, e.value_id)),
                                        EvictedValue)])  # fmt: skip


def restore_charge(stream: Stream[Any], buyer_id: str, done: PurchaseRecord) -> None:
    """Apply a fulfilled purchase's charge again if the stream's record does not show it (the
    holder then holds the level, so a later replay changes nothing)."""
    if stream.held(buyer_id) >= done.level_after and buyer_id in stream.state.holders:
        return
    stream.charge(buyer_id, done.level_after, done.price_minor)
    stream.ledger.record_purchase(stream.ledger.level(done.level_after))
