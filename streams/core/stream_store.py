"""Where streams are loaded and saved: once per event, in one place.

An event loads the stream it is about with :meth:`Streams.load` (or :meth:`Streams.find`, when
the stream may not exist); every load of one stream in one event returns the same
:class:`~streams.core.stream.Stream`. When the event ends, :meth:`Streams.event` saves every
stream it changed, whether the event was applied or refused: the stored record and the one in
memory never differ. Nothing else writes the streams store.

A stream's terms and product are built from its registration once per worker and cached with
the registration they were built from, so a stream id that another worker registered
differently is never served from a stale entry.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from typing import Any

from ..wire.events import StreamRegistration
from .keys import MarketKeys
from .outputs import Reject
from .products import Product, product_for
from .state import Stores, StreamState
from .stream import Stream
from .terms import Terms, terms_of

__all__ = ["MAX_CACHED_TERMS", "Streams"]

MAX_CACHED_TERMS = 4096
"""Streams whose terms a worker keeps built at least (a histogram stream's hold its survival law,
about 300 kB at 16 levels, shared by streams with the same parameters); the cache holds
``Limits.max_streams`` if that is more, so a worker holding every stream the market may have
never rebuilds one."""

Built = tuple[StreamRegistration, Terms, Product]


def new_numbering() -> int:
    """The random id of this worker incarnation's numberings (31 bits, never 0: 0 is the
    numbering of records written before numberings existed; :meth:`Stream.number_under`)."""
    return secrets.randbits(31) | 1


class Streams:
    """The streams of this worker's partitions, as events load and save them."""

    def __init__(self, stores: Stores, keys: MarketKeys, max_streams: int) -> None:
        self._stores = stores
        self.numbering = new_numbering()
        self._keys = keys
        self._max_cached = max(MAX_CACHED_TERMS, max_streams)
        self._built: dict[str, Built] = {}
        self._loaded: dict[str, Stream[Product]] = {}

    @contextlib.contextmanager
    def event(self) -> Iterator[None]:
        """The scope of one event: on exit, save every stream it changed, and forget them."""
        try:
            yield
        finally:
            loaded, self._loaded = self._loaded, {}
            for stream in loaded.values():
                if stream.changed:
                    self._stores.streams[stream.id] = stream.state

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
        fingerprint = stream.state.secret_fingerprint
        if fingerprint != self._keys.noise_fingerprint:
            raise Reject(
                "market_secret_mismatch",
                f"stream {stream_id!r} was registered by a market whose noise secret has "
                f"fingerprint {fingerprint}, but this worker's is "
                f"{self._keys.noise_fingerprint}; serving it would re-noise released levels. "
                "Operators: start the worker with the market's EMARKET_NOISE_SECRET",
            )
        return stream

    def record(self, stream_id: str) -> StreamState | None:
        """The stream's stored record as it is, to read only (nothing is built or checked)."""
        stream = self._loaded.get(stream_id)
        return stream.state if stream is not None else self._stores.streams.get(stream_id)

    def find(self, stream_id: str) -> Stream[Product] | None:
        """The stream, ``None`` if it is not registered (its noise secret is not checked: for
        the records kept about it, not for releasing)."""
        stream = self._loaded.get(stream_id)
        if stream is not None:
            return stream
        state = self._stores.streams.get(stream_id)
        if state is None:
            return None
        _, terms, product = self.built(state.registration)
        stream = Stream(state, terms, product)
        stream.number_under(self.numbering)
        self._loaded[stream_id] = stream
        return stream

    def renumber(self) -> None:
        """Take a new numbering (after a rebalance: streams may come back from another worker
        whose batches were lost)."""
        self.numbering = new_numbering()

    def create(self, state: StreamState, terms: Terms) -> Stream[Product]:
        """A newly registered stream (its product built now: a histogram stream's survival
        law is the one costly part of a registration, built after every check)."""
        reg = state.registration
        built = (reg, terms, product_for(reg, terms))
        self._keep(built)
        stream = Stream(state, terms, built[2])
        stream.number_under(self.numbering)
        stream.touch()
        self._loaded[reg.stream_id] = stream
        return stream

    def built(self, reg: StreamRegistration) -> Built:
        """The registration's terms and product, built once per registration and worker."""
        cached = self._built.pop(reg.stream_id, None)
        if cached is None or cached[0] != reg:
            terms = terms_of(reg)
            cached = (reg, terms, product_for(reg, terms))
        self._keep(cached)
        return cached

    def cached(self) -> dict[str, Any]:
        """Stream id → what is cached for it (for tests and the operators' figures)."""
        return dict(self._built)

    def _keep(self, built: Built) -> None:
        sid = built[0].stream_id
        self._built.pop(sid, None)
        self._built[sid] = built  # newest last: the least recently used go first
        while len(self._built) > self._max_cached:
            del self._built[next(iter(self._built))]
