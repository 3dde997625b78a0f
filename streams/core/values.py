"""A seller's signed batch of values → chain states, the stream's window, eviction, deliveries.

A new value gets a :class:`~market.chain.ChainState` holding its exact numbers (or, on a sealed
stream, only its release at the cap) and is released at once at every level its stream's holders
hold, which the deliveries then send them. The stream keeps the newest ``retain_last`` values; an
older one leaves an :class:`~streams.core.state.EvictedValue` marker so a resend is recognised,
until the dedup horizon lets the marker go.

Every release is a pure function of the market's noise secret, the stream's chain, the value's
id, a digest of its exact numbers and the step (:mod:`market.chain`). A resend of a known value
id with the same numbers re-emits the same releases; with other numbers it is refused
(``conflicting_value``); and a resend the market has forgotten gets the very same releases
again, never fresh noise.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from numpy.typing import NDArray

from market import ChainState
from market.histogram_chain import HistogramValue
from market.mechanisms import check_range

from ..wire.events import (
    MAX_BATCH,
    StreamRegistration,
    ValueBatch,
    ValueItem,
    ValueOutcome,
    ValuesAccepted,
)
from .auth import acting_for, authenticate
from .context import Context, Terms
from .delivery import Release, release_bytes
from .histograms import histogram_value, released, work_width
from .outputs import Outcome, Output, Reject, dump
from .placement import check_partition
from .rejections import Source, rejection
from .state import EvictedValue, StreamState, ValueEntry, ValueState, record_key
from .totals import (
    add_increment,
    chains_walked,
    is_totals,
    retain_nodes,
    terms_of,
    totals_for,
)
from .windows import admit_value, index_of, is_window, open_for_value, prune

__all__ = [
    "digest_values",
    "held_releases",
    "ingest_batch",
    "ingest_value",
    "settle_evictions",
    "store_state",
    "value_identity",
]


def digest_values(arr: np.ndarray[Any, Any]) -> str:
    """SHA-256 of a value's exact numbers as little-endian f64 or i64 (what makes a resend
    identical, and part of its noise's identity: ``docs/protocol.md`` §1.3)."""
    little = np.ascontiguousarray(arr, arr.dtype.newbyteorder("<"))
    return hashlib.sha256(little.tobytes()).hexdigest()


def value_identity(stream_id: str, value_id: str, digest: str) -> tuple[str, str, str]:
    """What a value's noise is keyed by: other numbers under the same id get other noise."""
    return (stream_id, value_id, digest)


def ingest_batch(ctx: Context, src: Source, *, final: bool = True) -> Outcome:
    """Apply one signed ``values`` batch: each value is accepted or refused on its own.

    The seller learns which in one ``values_accepted`` event; each refused value is also shown
    to the operators as a rejection.
    """
    batch = ValueBatch.model_validate_json(src[3])
    authenticate(ctx, batch, batch.seller_id, final=final)
    with acting_for(batch.seller_id, batch.stream_id):
        check_partition(ctx, src, batch.stream_id)
        st = ctx.stream(batch.stream_id)
        if st.registration.seller_id != batch.seller_id:
            raise Reject(
                "not_your_stream",
                f"stream {batch.stream_id!r} belongs to seller {st.registration.seller_id!r}; "
                f"{batch.seller_id!r} cannot publish into it",
            )
        _check_batch_cost(ctx, st, len(batch.items))
    outcome = Outcome("value", "accepted", stream_id=batch.stream_id,
                      mechanism=st.registration.mechanism)  # fmt: skip
    lines: list[ValueOutcome] = []
    withheld = ctx.deliveries.withheld_total
    for item in batch.items:
        lines.append(_one(ctx, st, item, src, outcome))
    outcome.withheld = ctx.deliveries.withheld_total - withheld
    ctx.stores.streams[batch.stream_id] = st
    answer = ValuesAccepted(stream_id=batch.stream_id, seller_id=batch.seller_id, outcomes=lines)
    inbox = ctx.topics.inbox(batch.seller_id)
    outcome.outputs.append(Output(inbox, batch.items[-1].value_id.encode(), dump(answer)))
    outcome.outputs.extend(ctx.deliveries.drain_unless_batching(ctx.stores.streams))
    outcome.figures = ctx.figures(st)
    statuses = {line.status for line in lines}
    if statuses == {"rejected"}:
        outcome.status, outcome.reason = "rejected", lines[0].reason
    elif "accepted" not in statuses:
        outcome.status = "duplicate"
    return outcome


def batch_capacity(ctx: Context, st: StreamState) -> int:
    """Most values one batch of this stream may carry now: each value is delivered to every
    holder and walks the chain up to the highest level held."""
    reg = st.registration
    holders = len(st.holders)
    walk = len(ctx.terms(reg).chain.levels) if holders else 1
    by_output = ctx.limits.max_event_output_bytes // (
        max(1, holders) * release_bytes(reg.release_width(), sealed=True)
    )
    by_work = ctx.limits.max_event_work // ctx.limits.work(chains_walked(reg, 1), walk,
                                                           work_width(reg))  # fmt: skip
    return max(1, min(MAX_BATCH, by_output, by_work))


def _check_batch_cost(ctx: Context, st: StreamState, items: int) -> None:
    cap = batch_capacity(ctx, st)
    if items > cap:
        raise Reject(
            "batch_too_large",
            f"stream {st.registration.stream_id!r} takes at most {cap} values per batch now "
            f"({len(st.holders)} holders receive each value); split this batch of {items} "
            "(the client library does it for you)",
            max_values=cap,
        )


def _one(ctx: Context, st: StreamState, item: ValueItem, src: Source, out: Outcome) -> ValueOutcome:
    """One value of a batch; a refusal of it is recorded, never raised."""
    seller = st.registration.seller_id
    try:
        with acting_for(seller):
            status, released, new_noise = ingest_value(ctx, st, item)
    except Reject as rej:  # the operators see it; the seller sees it in values_accepted
        out.outputs += rejection(ctx, "value", src, rej, request_id=item.value_id).outputs[:1]
        out.items.append(("rejected", rej.reason))
        return ValueOutcome(value_id=item.value_id, status="rejected", reason=rej.reason,
                            message=rej.message)  # fmt: skip
    out.items.append((status, None))
    out.releases += released
    out.new_noise += new_noise
    return ValueOutcome(value_id=item.value_id, status=status)


def ingest_value(ctx: Context, st: StreamState, item: ValueItem) -> tuple[str, int, int]:
    """Apply one value; return (status, releases queued, new chain steps computed)."""
    reg = st.registration
    terms = ctx.terms(reg)
    exact, digest = _exact(terms, reg, item)
    ctx.horizon.admit("value", item.published_at_ms, st.watermark_ms, item.value_id,
                      reg.stream_id)  # fmt: skip
    key = record_key(reg.stream_id, item.value_id)
    known = ctx.stores.releases.get(key)
    if known is not None and _ahead_of_stream(st, item.value_id, known):
        known = None  # written by a batch whose stream record was lost: ingested again
    if known is None and is_totals(reg):  # a retained increment is known by its window entry
        entry = next((e for e in st.window if e.value_id == item.value_id), None)
        if entry is not None:  # (its mark may have been forgotten by a rebuilt horizon index)
            known = EvictedValue(entry.seq, entry.digest, entry.published_at_ms)
    if known is not None:
        released, new_noise = _resent(ctx, st, item.value_id, digest, known)
        return "duplicate", released, new_noise
    if is_window(reg):
        open_for_value(st, index_of(reg, item.published_at_ms), item.value_id)
    if isinstance(exact, HistogramValue):
        state: ChainState | HistogramValue = exact
    elif is_totals(reg):
        return _increment(ctx, st, terms, item, exact, digest)
    elif reg.sealed:
        state = terms.chain.seal(exact, value_identity(reg.stream_id, item.value_id, digest),
                                 ctx.noise)  # fmt: skip
    else:
        state = terms.chain.open(exact)
    held, levels = _admitted(st, item.published_at_ms, 0.0)
    ident = value_identity(reg.stream_id, item.value_id, digest)
    by_level, new_noise = held_releases(ctx, st, terms, state, ident, levels)
    st.spent = max(st.spent, *by_level, 0.0)
    if reg.sealed:  # the market holds its cap-level release
        new_noise += 1
        st.spent = max(st.spent, reg.cap)
    seq = _append(ctx, st, item, digest, max(by_level, default=0.0))
    _evict(ctx, st)
    store_state(ctx, key, state)
    released = _deliver(ctx, st, item, seq, by_level, held)
    return "accepted", released, new_noise


def _ahead_of_stream(st: StreamState, value_id: str, known: ValueState) -> bool:
    """Whether a value's record was written by a batch whose stream record is not durable.

    A batch's records are acknowledged before its streams' records (:mod:`streams.worker.batch`):
    a worker that dies between the two leaves a value's state (or its mark) stored while its
    stream does not count it — not in the window, or numbered at or after the next arrival. The
    batch is replayed, and the value is ingested again, not taken for a resend (its noise is a
    pure function of the request: the same releases).
    """
    if isinstance(known, EvictedValue):
        return known.seq >= st.next_seq
    return all(e.value_id != value_id for e in st.window)


def settle_evictions(ctx: Context, st: StreamState) -> None:
    """Drop from the window the values a batch whose stream record was lost had evicted.

    That batch's records are durable (:mod:`streams.worker.batch`): a value it evicted has its
    eviction mark, not its state, while the stream's window still lists it. It would leave the
    window when the evicting value is ingested again; a purchase that comes first completes
    the eviction instead (the evicting value then finds the window one shorter, and evicts
    nothing more). Running totals keep a mark for every increment: nothing to settle there.
    """
    if is_totals(st.registration):
        return
    sid = st.registration.stream_id
    kept = [e for e in st.window
            if not isinstance(ctx.stores.releases.get(record_key(sid, e.value_id)), EvictedValue)]
    if len(kept) < len(st.window):
        st.window = kept
        ctx.stores.streams[sid] = st


def _exact(
    terms: Terms, reg: StreamRegistration, item: ValueItem
) -> tuple[NDArray[Any] | HistogramValue, str]:
    """The value's exact numbers (or counts, on a histogram stream) and their digest."""
    if terms.histogram is not None:
        value = histogram_value(terms.histogram, reg, item)
        return value, value.digest()
    if item.keys is not None:
        raise Reject(
            "invalid_value",
            f"value {item.value_id!r} has keys, but stream {reg.stream_id!r} is not a histogram "
            "stream: send its numbers in `values` only",
        )
    if item.inexact_integer and np.issubdtype(terms.mechanism.dtype, np.integer):
        raise Reject(
            "invalid_value",
            f"value {item.value_id!r} holds an integer beyond 2**53, which cannot be read exactly "
            f"(it would become another count); counts on stream {reg.stream_id!r} must be at "
            "most 2**53 in magnitude",
        )
    exact = terms.mechanism.validate_value(item.values, dimension=reg.dimension)
    if not is_totals(reg):  # a running total's bound is its nodes' (streams.core.totals)
        check_range(exact, terms.chain.value_limit)
    return exact, digest_values(exact)


def _increment(
    ctx: Context, st: StreamState, terms: Terms, item: ValueItem, exact: NDArray[Any], digest: str
) -> tuple[str, int, int]:
    """One increment of a running-totals stream: the tree nodes it completes, and the running
    total after it at every level held (:mod:`streams.core.totals`)."""
    oldest = st.window[0].seq + 1 if st.window else None
    add_increment(ctx, st, terms, exact)
    by_level, new_noise = _held_totals(ctx, st, terms, st.next_seq + 1)
    st.spent = max(st.spent, *by_level, 0.0)
    seq = _append(ctx, st, item, digest, max(by_level, default=0.0))
    key = record_key(st.registration.stream_id, item.value_id)
    ctx.stores.releases[key] = EvictedValue(seq, digest, item.published_at_ms)  # its dedup mark
    _evict(ctx, st)
    retain_nodes(ctx, st, oldest)
    released = ctx.deliveries.queue(st, item.value_id, seq, by_level, terms=terms_of(seq + 1))
    return "accepted", released, new_noise


def _held_totals(
    ctx: Context, st: StreamState, terms: Terms, count: int
) -> tuple[dict[float, Release], int]:
    """The running total after ``count`` increments at every level the holders hold."""
    by_level: dict[float, Release] = {}
    new_noise = 0
    for lv in sorted({h.level for h in st.holders.values()}):
        (by_level[lv],), drawn = totals_for(ctx, st, terms, [count], lv)
        new_noise += drawn
    return by_level, new_noise


def _admitted(
    st: StreamState, published_at_ms: int, current: float
) -> tuple[set[float], set[float]]:
    """The levels held on the stream, and those a value may be released at (all of them on an
    ``event`` stream; those its privacy window has room for on a ``window`` stream)."""
    held = {h.level for h in st.holders.values()}
    if not is_window(st.registration):
        return held, held
    return held, admit_value(st, index_of(st.registration, published_at_ms), current, held)


def _deliver(
    ctx: Context,
    st: StreamState,
    entry: ValueItem | ValueEntry,
    seq: int,
    by_level: dict[float, Release],
    held: set[float],
) -> int:
    """Queue the value's releases for the holders it fits (``held``: the levels they hold);
    tell the others it is withheld."""
    released = ctx.deliveries.queue(st, entry.value_id, seq, by_level)
    missing = held - by_level.keys()
    if missing:  # only a privacy window withholds: every other level held is released
        assert is_window(st.registration), f"levels held but not released: {missing}"
        window = index_of(st.registration, entry.published_at_ms)
        ctx.deliveries.withhold(st, entry.value_id, window, set(by_level))
    return released


def store_state(ctx: Context, key: str, state: ChainState | HistogramValue) -> None:
    """Store a value's chain state, its cache trimmed so the record fits in one message and
    packed (a histogram value is only its counts: nothing to trim)."""
    if isinstance(state, ChainState):
        state.trim(ctx.limits.max_message_bytes // 2)
        state.pack()  # at rest: one array for its steps (market.chain.ChainState, Notes)
    ctx.stores.releases[key] = state


def held_releases(
    ctx: Context,
    st: StreamState,
    terms: Terms,
    state: ChainState | HistogramValue,
    ident: tuple[str, ...],
    levels: set[float],
    released_before: float = 0.0,
) -> tuple[dict[float, Release], int]:
    """The value released at each of ``levels`` (held by the stream's holders, admitted by
    its privacy window); and the new steps drawn.

    One walk down the chain computes them all: from the most accurate level (or the most
    accurate step cached) down to the least accurate of ``levels``. A histogram is recomputed
    from its counts every time: what counts as new there is a level above ``released_before``
    (the most accurate released of it so far), so a resend adds none.
    """
    if isinstance(state, HistogramValue):
        assert terms.histogram is not None
        by_level, _ = released(terms.histogram, state, ident, levels, ctx.rngs)
        return dict(by_level), sum(lv > released_before for lv in by_level)
    chain = terms.chain
    steps = {chain.step_of(lv) for lv in levels}
    if not steps:
        return {}, 0
    new_noise = chain.new_steps(state, min(steps))
    return {chain.levels[k]: chain.release([state], k, [ident], ctx.noise)[0]
            for k in sorted(steps)}, new_noise  # fmt: skip


def _append(ctx: Context, st: StreamState, ev: ValueItem, digest: str, level: float) -> int:
    """Add the value to its stream's window (released up to ``level``); return its arrival
    number."""
    seq = st.next_seq
    st.window.append(
        ValueEntry(
            value_id=ev.value_id,
            seq=seq,
            digest=digest,
            received_at_ms=ctx.clock(),
            published_at_ms=ev.published_at_ms,
            level=level,
        )
    )
    st.next_seq += 1
    st.values_ingested += 1
    st.watermark_ms = max(st.watermark_ms, ev.published_at_ms)
    return seq


def _evict(ctx: Context, st: StreamState) -> None:
    """Keep the newest ``retain_last`` values; forget markers the horizon no longer needs."""
    sid = st.registration.stream_id
    while len(st.window) > st.registration.retain_last:
        old = st.window.pop(0)
        okey = record_key(sid, old.value_id)
        ctx.stores.releases[okey] = EvictedValue(old.seq, old.digest, old.published_at_ms)
        ctx.horizon.remember("value", sid, old.published_at_ms, okey)
    ctx.horizon.forget("value", sid, st.watermark_ms, ctx.stores.releases)
    prune(st, ctx.horizon.horizon_ms)


def _resent(
    ctx: Context, st: StreamState, value_id: str, digest: str, known: ValueState
) -> tuple[int, int]:
    """A known value id: re-emit its releases (nothing once evicted); they are the same bytes."""
    entry = None
    if isinstance(known, EvictedValue):
        seq, old_digest = known.seq, known.digest
        if is_totals(st.registration):  # an increment's mark: its total, while retained
            entry = next((e for e in st.window if e.value_id == value_id), None)
    else:
        entry = next(e for e in st.window if e.value_id == value_id)
        seq, old_digest = entry.seq, entry.digest
    if old_digest != digest:
        raise Reject(
            "conflicting_value",
            f"value id {value_id!r} was already published on stream "
            f"{st.registration.stream_id!r} with different numbers; value ids must be unique, "
            "use a new id",
        )
    released = new_noise = 0
    if is_totals(st.registration) and entry is not None:
        by_level, new_noise = _held_totals(ctx, st, ctx.terms(st.registration), entry.seq + 1)
        terms = terms_of(entry.seq + 1)
        return ctx.deliveries.queue(st, value_id, seq, by_level, terms=terms), new_noise
    if isinstance(known, ChainState | HistogramValue) and entry is not None:
        ident = value_identity(st.registration.stream_id, value_id, digest)
        held, levels = _admitted(st, entry.published_at_ms, entry.level)
        by_level, new_noise = held_releases(ctx, st, ctx.terms(st.registration), known, ident,
                                            levels, entry.level)  # fmt: skip
        entry.level = max(entry.level, *by_level, 0.0)
        st.spent = max(st.spent, entry.level)
        released = _deliver(ctx, st, entry, seq, by_level, held)
    return released, new_noise
