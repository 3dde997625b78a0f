"""Where streams are loaded and saved: once per event, in one place.

An event loads the stream it is about with :meth:`Streams.load` (or :meth:`Streams.find`, when
the stream may not exist); every load of one stream in one event returns the same
:class:`~streams.core.stream.Stream`. When the event ends, :meth:`Streams.event` saves every
stream it changed, whether the event was applied or refused: the stored record and the one in
memory never differ. Nothing else writes the streams store.

A stream's terms and product are built from its registration once per worker and cached with
the registration they were built from, so a stream id that another worker registered
differently is never served from a stale entry.

**Holders apart.** A stream with many holders would write all of them with every event that
changes its record (each purchase, each value: 120 kB at 2,000 holders). Past
:data:`INLINE_HOLDERS` holders changed, the record therefore refers to a *holders base*
(:class:`~.state.HoldersBase`: every holder as of a generation, in the ``holders`` store) and
carries only the holders changed since; once those pass about √(2n) of the n holders, a new
base is written. The record stays the truth and never refers to a base that can change:

* a base is written to the one of two slots the stored record does *not* name, at most once
  per stream and batch, so the slot the stored record names is never overwritten while that
  record is the stream's.

**Registered apart.** How a stream was registered (:class:`~.state.Registered`: the signed
registration, its catalog entry) never changes, so it is not rewritten with the record: it is
written to the ``registered`` store once, in the batch that registers the stream, and the
record's codec leaves it out (:mod:`.codecs`). A batch's records count wholly or not at all
(:mod:`streams.worker.recovery`), so a stream's record always finds its registration, and a
registration lost with its batch is decided afresh when replayed.

Nothing else writes the ``holders`` or ``registered`` stores, and a stream is put back together
(its registration, its base, then the holders its record carries) once when it is first
loaded, then kept whole in memory (the registration shared with the ``registered`` store).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..wire.events import StreamRegistration
from .holds import settle
from .keys import MarketKeys
from .outputs import Reject
from .products import Product, product_for
from .state import (
    BaseRef,
    Holder,
    HoldersBase,
    Registered,
    Stores,
    StreamRecord,
    StreamState,
    holders_key,
    registered_of,
    with_registration,
)
from .stream import Stream
from .terms import Terms, terms_of

__all__ = ["INLINE_HOLDERS", "MAX_CACHED_TERMS", "Streams", "holders_of"]

INLINE_HOLDERS = 32
"""Holders changed since its base (or in all) a stream's record carries before a new holders
base is due; with √(2n) of n holders beyond that, what a record carries plus the bases written
(one per that many changes) is about 2√(2n) holders per write instead of n."""

MAX_CACHED_TERMS = 4096
"""Streams whose terms a worker keeps built at least (a histogram stream's hold its survival law,
about 300 kB at 16 levels, shared by streams with the same parameters); the cache holds
``Limits.max_streams`` if that is more, so a worker holding every stream the market may have
never rebuilds one."""

Built = tuple[StreamRegistration, Terms, Product]


@dataclass
class _Whole:
    """A stream's record as stored (``stored``) and whole (``whole``: with its registration and
    every holder, the same object when the stored one is), the holders changed since the base,
    the batch that last wrote a base, and whether ``registered`` has yet to be written."""

    stored: StreamRecord
    whole: StreamState
    since: dict[str, None]
    based_in: int = -1
    unregistered: bool = False


def _base_due(holders: int, since: int) -> bool:
    """Whether the record's changed holders are many enough for a new base."""
    return since > max(INLINE_HOLDERS, math.isqrt(2 * holders))


def holders_of(stores: Stores, stream_id: str, record: StreamRecord) -> Mapping[str, Holder]:
    """Every holder of a stored record (its base's, updated by those it carries), to read."""
    ref = record.holders_base
    if ref is None:
        return record.holders
    base = stores.holders.get(holders_key(stream_id, ref.slot))
    if base is None or base.gen != ref.gen:
        raise RuntimeError(
            f"stream {stream_id!r} names holders base {ref} which the holders store does not "
            "hold: its state is inconsistent"
        )
    return {**base.holders, **record.holders}


class Streams:
    """The streams of this worker's partitions, as events load and save them."""

    def __init__(
        self,
        stores: Stores,
        keys: MarketKeys,
        max_streams: int,
        batch: Callable[[], int] = lambda: 0,
        clock: Callable[[], int] = lambda: 0,
    ) -> None:
        self._stores = stores
        self._keys = keys
        self._max_cached = max(MAX_CACHED_TERMS, max_streams)
        self._built: dict[str, Built] = {}
        self._loaded: dict[str, Stream[Product]] = {}
        self._whole: dict[str, _Whole] = {}
        self._batch = batch  # the batch being applied (its writes are persisted together)
        self._clock = clock  # the market's clock: when reservations lapse

    @contextlib.contextmanager
    def event(self) -> Iterator[None]:
        """The scope of one event: on exit, save every stream it changed, and forget them."""
        try:
            yield
        finally:
            loaded, self._loaded = self._loaded, {}
            for stream in loaded.values():
                if stream.changed:
                    self._stores.streams[stream.id] = self._stored(stream)

    def load(self, stream_id: str) -> Stream[Product]:
        """The stream, or a refusal: ``unknown_stream``, or ``market_secret_mismatch`` if a
        market with another noise secret registered it (serving it would re-noise released
        levels)."""
        stream = self.find(stream_id)
        if stream is None:
            raise Reject(
                "unknown_stream",
                f"stream {stream_id!r} is not registered; check the catalog for available streams",
            )
        fingerprint = stream.state.registered.secret_fingerprint
        if fingerprint != self._keys.noise_fingerprint:
            raise Reject(
                "market_secret_mismatch",
                f"stream {stream_id!r} was registered by a market whose noise secret has "
                f"fingerprint {fingerprint}, but this worker's is "
                f"{self._keys.noise_fingerprint}; serving it would re-noise released levels. "
                "Operators: start the worker with the market's EMARKET_NOISE_SECRET",
            )
        return stream

    def registered(self, stream_id: str) -> Registered | None:
        """How the stream was registered, ``None`` if it is not (it has no record), to read
        only (nothing is built or checked)."""
        stream = self._loaded.get(stream_id)
        if stream is not None:
            return stream.state.registered
        stored = self._stores.streams.get(stream_id)
        return None if stored is None else registered_of(self._stores, stream_id, stored)

    def find(self, stream_id: str) -> Stream[Product] | None:
        """The stream, ``None`` if it is not registered (its noise secret is not checked: for
        the records kept about it, not for releasing). Its reservations are settled by the
        market's clock as it is loaded (:func:`~.holds.settle`), once per event."""
        stream = self._loaded.get(stream_id)
        if stream is not None:
            return stream
        state = self._whole_state(stream_id)
        if state is None:
            return None
        _, terms, product = self.built(state.registration)
        stream = Stream(state, terms, product)
        if state.reservations and settle(state.reservations, self._clock()):
            stream.touch()  # once per event, before anything reads what is held
        self._loaded[stream_id] = stream
        return stream

    def create(self, state: StreamState, terms: Terms) -> Stream[Product]:
        """A newly registered stream (its product built now: a histogram stream's survival
        law is the one costly part of a registration, built after every check)."""
        reg = state.registration
        built = (reg, terms, product_for(reg, terms))
        self._keep(built)
        stream = Stream(state, terms, built[2])
        stream.touch()
        self._loaded[reg.stream_id] = stream
        self._whole[reg.stream_id] = _Whole(
            state, state, dict.fromkeys(state.holders), unregistered=True
        )
        return stream

    def built(self, reg: StreamRegistration) -> Built:
        """The registration's terms and product, built once per registration and worker."""
        cached = self._built.pop(reg.stream_id, None)
        if cached is None or (cached[0] is not reg and cached[0] != reg):
            terms = terms_of(reg)
            cached = (reg, terms, product_for(reg, terms))
        self._keep(cached)
        return cached

    # -- registered and holders apart (see the module docstring) -------------------------------
    def _whole_state(self, stream_id: str) -> StreamState | None:
        """The stream's record whole, put together once per stored record."""
        stored = self._stores.streams.get(stream_id)
        if stored is None:
            self._whole.pop(stream_id, None)
            return None
        kept = self._whole.get(stream_id)
        if kept is None or kept.stored is not stored:
            kept = self._whole[stream_id] = self._put_together(stream_id, stored)
        return kept.whole

    def _put_together(self, stream_id: str, stored: StreamRecord) -> _Whole:
        """A stored record with its registration and every holder (the stored object itself
        when it has both)."""
        whole = with_registration(self._stores, stream_id, stored)
        if stored.holders_base is not None:
            whole = whole.model_copy(
                update={"holders": dict(holders_of(self._stores, stream_id, stored))}
            )
        return _Whole(stored, whole, dict.fromkeys(stored.holders))

    def _stored(self, stream: Stream[Product]) -> StreamState:
        """What the stream's record stores: every holder, or a holders base and the holders
        changed since it (a new base when they are many, at most one per batch); its
        registration is written apart, once."""
        kept = self._whole[stream.id]
        whole = stream.state
        if kept.unregistered:
            self._stores.registered[stream.id] = whole.registered
            kept.unregistered = False
        kept.since.update(dict.fromkeys(stream.charged))
        stream.charged.clear()
        batch = self._batch()
        if kept.based_in != batch and _base_due(len(whole.holders), len(kept.since)):
            ref = whole.holders_base
            slot, gen = (0, 1) if ref is None else (1 - ref.slot, ref.gen + 1)
            self._stores.holders[holders_key(stream.id, slot)] = HoldersBase(
                gen=gen, holders=dict(whole.holders)
            )
            whole.holders_base = BaseRef(slot=slot, gen=gen)
            kept.since.clear()
            kept.based_in = batch
        stored = whole
        if whole.holders_base is not None:
            stored = whole.model_copy(update={"holders": {b: whole.holders[b] for b in kept.since}})
        kept.stored, kept.whole = stored, whole
        return stored

    def cached(self) -> dict[str, Any]:
        """Stream id → what is cached for it (for tests and the operators' figures)."""
        return dict(self._built)

    def _keep(self, built: Built) -> None:
        sid = built[0].stream_id
        self._built.pop(sid, None)
        self._built[sid] = built  # newest last: the least recently used go first
        while len(self._built) > self._max_cached:
            del self._built[next(iter(self._built))]
