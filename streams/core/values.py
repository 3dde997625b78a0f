"""A seller's value → its chain state, the stream's window, eviction and deliveries.

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

from ..wire.events import ValueEvent
from .context import Context, Terms
from .outputs import Outcome, Reject
from .state import EvictedValue, StreamState, ValueEntry, ValueState, record_key

__all__ = ["digest_values", "held_releases", "ingest_value", "value_identity"]


def digest_values(arr: np.ndarray[Any, Any]) -> str:
    """SHA-256 of a value's exact numbers, as stored (what makes a resend identical)."""
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def value_identity(stream_id: str, value_id: str, digest: str) -> tuple[str, str, str]:
    """What a value's noise is keyed by: other numbers under the same id get other noise."""
    return (stream_id, value_id, digest)


def ingest_value(ctx: Context, raw: bytes) -> Outcome:
    """Apply one ``value`` event."""
    ev = ValueEvent.model_validate_json(raw)
    st = ctx.stream(ev.stream_id)
    reg = st.registration
    terms = ctx.terms(reg)
    exact = terms.mechanism.validate_value(ev.values, dimension=reg.dimension)
    digest = digest_values(exact)
    ctx.horizon.admit("value", ev.published_at_ms, st.watermark_ms, ev.value_id, ev.stream_id)
    key = record_key(ev.stream_id, ev.value_id)
    known = ctx.stores.releases.get(key)
    if known is not None:
        return _resent(ctx, st, ev.value_id, digest, known)
    ident = value_identity(ev.stream_id, ev.value_id, digest)
    chain = terms.chain
    state = chain.seal(exact, ident, ctx.rngs) if reg.sealed else chain.open(exact)
    by_level, new_noise = held_releases(ctx, st, terms, state, ident)
    st.spent = max(st.spent, *by_level, 0.0)
    if reg.sealed:  # the market holds its cap-level release
        new_noise += 1
        st.spent = max(st.spent, reg.cap)
    seq = _append(ctx, st, ev, digest)
    _evict(ctx, st)
    ctx.stores.releases[key] = state
    ctx.stores.streams[ev.stream_id] = st
    released = ctx.deliveries.queue(st, ev.value_id, seq, by_level)
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


def held_releases(
    ctx: Context, st: StreamState, terms: Terms, state: ChainState, ident: tuple[str, ...]
) -> tuple[dict[float, NDArray[Any]], int]:
    """The value released at every level the stream's holders hold; and the new steps drawn.

    One walk along the chain computes them all: up to the most accurate level held on an open
    chain, down to the least accurate on a sealed one.
    """
    chain = terms.chain
    steps = {chain.step_of(h.level) for h in st.holders.values()}
    if not steps:
        return {}, 0
    far = min(steps) if chain.sealed else max(steps)
    new_noise = chain.new_steps(state, far)
    chain.release([state], far, [ident], ctx.rngs)
    for k in steps:  # cached by the walk unless a state lost its cache in between
        chain.release([state], k, [ident], ctx.rngs)
    return {chain.levels[k]: state.steps[k] for k in steps}, new_noise


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
    """A known value id: re-emit its releases (nothing once evicted); they are the same bytes."""
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
    released = new_noise = 0
    if isinstance(known, ChainState):
        ident = value_identity(st.registration.stream_id, value_id, digest)
        by_level, new_noise = held_releases(ctx, st, ctx.terms(st.registration), known, ident)
        released = ctx.deliveries.queue(st, value_id, seq, by_level)
    return Outcome(
        "value",
        "duplicate",
        ctx.deliveries.drain_unless_batching(ctx.stores.streams),
        stream_id=st.registration.stream_id,
        mechanism=st.registration.mechanism,
        releases=released,
        new_noise=new_noise,
    )
