"""Watermarks: how far each stream's records reach back, kept in the stream's own record.

Each stream carries two watermarks, the newest publication time of a value and the newest
request time of a purchase; records older than a watermark minus the dedup horizon are
forgotten (:mod:`.records`) and events that old refused (:mod:`.admission`). Being in the
stream's record, a watermark is every worker's: a copy reaching a worker whose clock is behind
is refused by it where that worker's own clock would have let it in.

Invariants: a purchase watermark is never ahead of the market's clock, whatever a request
claims, except one horizon past the newest record a cap forgot (:func:`cap_purchases`, a time
the clock had admitted); it is never more than the horizon and the skew behind the clock; and it
moves in whole steps (:data:`~.records.WATERMARK_STEP_MS`) or past a forgotten record, so
refused or replayed purchases rewrite the stream's record at most once a step.

When a stream holds more records than its cap (:class:`~.records.Caps`), the oldest are
forgotten and the watermark moved one horizon past the newest of them: every event as old is
then refused as too old, exactly as if the horizon had passed it, so nothing forgotten can be
applied twice.
"""

from __future__ import annotations

from typing import Any

from ..stream import Stream
from .admission import MAX_CLOCK_SKEW_MS
from .records import CLOCK_RECORD_MS, Records

__all__ = [
    "advance_purchases",
    "cap_purchases",
    "cap_values",
    "floor_purchases",
    "heap_of",
    "saw_value",
]


def saw_value(stream: Stream[Any], published_at_ms: int) -> None:
    """A value published at ``published_at_ms`` was accepted: the value watermark follows."""
    st = stream.state
    if published_at_ms > st.watermark_ms:
        st.watermark_ms = published_at_ms
        stream.touch()


def floor_purchases(records: Records, stream: Stream[Any]) -> None:
    """Raise the purchase watermark to a step past the clock minus the allowed skew (the
    clock's verdict on old purchases, kept in the data), forgetting what it lets go."""
    st = stream.state
    floor = records.clock() - MAX_CLOCK_SKEW_MS
    if st.purchase_watermark_ms < floor:
        st.purchase_watermark_ms = floor = floor + records.step_ms
        stream.touch()
        records.forget_purchases(stream.id, floor)


def advance_purchases(
    records: Records, stream: Stream[Any] | None, stream_id: str, ts: int
) -> None:
    """After a purchase stamped ``ts`` was decided: move the watermark towards ``ts`` (never
    past the clock, in whole steps) and forget the outcomes beyond the horizon. On a stream
    the market does not know, outcomes expire by the clock instead."""
    if stream is None:
        heap = records.unknown(stream_id)
        records.forget_purchases(heap, records.clock() - CLOCK_RECORD_MS)
        return
    st = stream.state
    step = records.step_ms
    moved = min(ts, records.clock()) // step * step
    if moved > st.purchase_watermark_ms:
        st.purchase_watermark_ms = moved
        stream.touch()
    records.forget_purchases(stream.id, st.purchase_watermark_ms)
    cap_purchases(records, stream)
    records.settle(stream.id)


def cap_purchases(records: Records, stream: Stream[Any]) -> None:
    """Keep at most :attr:`~.records.Caps.purchases` records: forget the oldest beyond it,
    and move the watermark so their request times are refused from now on."""
    newest = records.over_cap_purchases(stream.id)
    st = stream.state
    if newest is not None and st.purchase_watermark_ms <= newest + records.horizon_ms:
        st.purchase_watermark_ms = newest + records.horizon_ms + 1
        stream.touch()
        records.forget_purchases(stream.id, st.purchase_watermark_ms)


def cap_values(records: Records, stream: Stream[Any]) -> None:
    """Keep at most :attr:`~.records.Caps.marks` eviction marks: forget the oldest beyond it,
    and move the value watermark so their publication times are refused from now on."""
    newest = records.over_cap_values(stream.id)
    st = stream.state
    if newest is not None and st.watermark_ms <= newest + records.horizon_ms:
        st.watermark_ms = newest + records.horizon_ms + 1
        stream.touch()
    records.settle(stream.id)


def heap_of(
    records: Records, stream: Stream[Any] | None, stream_id: str, *, refused: bool = False
) -> str:
    """Which heap a purchase record of ``stream_id`` expires from (``refused``: a refusal's,
    kept apart so that refusals, free to cause, never push a fulfilment's record out)."""
    if stream is None:
        return records.unknown(stream_id)
    return records.refused(stream_id) if refused else stream_id
