"""A seller's value → its release state, the stream's window, eviction and deliveries.

A new value gets a :class:`~market.release_state.ReleaseState` holding its exact numbers (or, on a
sealed stream, only its release at the cap) and is released at once at every level its stream's
holders hold, which the deliveries then send them. The stream keeps the newest ``retain_last``
values; an older one leaves an :class:`~streams.core.state.EvictedValue` marker so a resend is
recognised, until the dedup horizon lets the marker go.

A resend of a known value id with the same numbers re-emits what is stored and draws no noise; with
other numbers it is refused (``conflicting_value``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from market import Mechanism, ReleaseState

from ..wire.events import ValueEvent
from .context import Context
from .outputs import Outcome, Reject
from .state import EvictedValue, StreamState, ValueEntry, ValueState, record_key

__all__ = ["digest_values", "ingest_value"]


def digest_values(arr: np.ndarray[Any, Any]) -> str:
    """SHA-256 of a value's exact numbers, as stored (what makes a resend identical)."""
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def ingest_value(ctx: Context, raw: bytes) -> Outcome:
    """Apply one ``value`` event."""
    ev = ValueEvent.model_validate_json(raw)
    st = ctx.stream(ev.stream_id)
    reg = st.registration
    mech, _ = ctx.pricing(reg)
    exact = mech.validate_value(ev.values, dimension=reg.dimension)
    digest = digest_values(exact)
    ctx.horizon.admit("value", ev.published_at_ms, st.watermark_ms, ev.value_id, ev.stream_id)
    key = record_key(ev.stream_id, ev.value_id)
    known = ctx.stores.releases.get(key)
    if known is not None:
        return _resent(ctx, st, ev.value_id, digest, known)
    state, new_noise = _release_state(ctx, st, ev.value_id, mech, exact)
    seq = _append(ctx, st, ev, digest)
    _evict(ctx, st)
    ctx.stores.releases[key] = state
    ctx.stores.streams[ev.stream_id] = st
    released = ctx.deliveries.queue(st, ev.value_id, seq, state)
    return Outcome(
        "value",
        "accepted",
        ctx.deliveries.drain_unless_batching(ctx.stores.streams),
        stream_id=ev.stream_id,
        mechanism=reg.mechanism,
        releases=released,
        new_noise=new_noise,
        figures=ctx.figures(st),
    )


def _release_state(
    ctx: Context, st: StreamState, value_id: str, mech: Mechanism, exact: np.ndarray[Any, Any]
) -> tuple[ReleaseState, int]:
    """The new value's release state, released at every held level; and the new samples."""
    reg = st.registration
    sid = reg.stream_id
    if reg.sealed:
        state = ReleaseState.sealed(mech, exact, cap=reg.cap, rng=ctx.rngs(sid, value_id, reg.cap))
        new_noise = 1
    else:
        state = ReleaseState(mech, exact, cap=reg.cap)
        new_noise = 0
    for lv in sorted({h.level for h in st.holders.values()}):
        if lv not in state:
            new_noise += 1
        state.release(lv, rng=ctx.rngs(sid, value_id, lv))
    st.spent = max(st.spent, state.spent)
    return state, new_noise


def _append(ctx: Context, st: StreamState, ev: ValueEvent, digest: str) -> int:
    """Add the value to its stream's window; return its arrival number."""
    seq = st.next_seq
    st.window.append(
        ValueEntry(
            value_id=ev.value_id,
            seq=seq,
            digest=digest,
            received_at_ms=ctx.clock(),
            published_at_ms=ev.published_at_ms,
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


def _resent(
    ctx: Context, st: StreamState, value_id: str, digest: str, known: ValueState
) -> Outcome:
    """A known value id: re-emit what is stored (nothing once evicted), never draw noise."""
    if isinstance(known, EvictedValue):
        seq, old_digest = known.seq, known.digest
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
    released = 0
    if isinstance(known, ReleaseState):
        released = ctx.deliveries.queue(st, value_id, seq, known)
    return Outcome(
        "value",
        "duplicate",
        ctx.deliveries.drain_unless_batching(ctx.stores.streams),
        stream_id=st.registration.stream_id,
        mechanism=st.registration.mechanism,
        releases=released,
    )
