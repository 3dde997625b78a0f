"""Subscription deliveries: every new value, at the level each holder holds, to its topic.

A value event queues one release per holder of its stream; :meth:`Deliveries.drain` turns the
queue into one ``value_released`` event per (buyer, stream), sealed for the holder's key when it
named one. Inside :meth:`Deliveries.batch` nothing is drained per event, so the releases of a
whole batch reach each buyer as one message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from numpy.typing import NDArray

from ..wire.events import UNIT_OF, ReleasedValue, ValueReleased
from ..wire.sealing import delivery_aad, seal_releases
from ..wire.topics import Topics
from .outputs import Output, dump
from .state import StreamState

__all__ = ["Deliveries"]


class Deliveries:
    """Releases waiting to be delivered, grouped by (buyer, stream)."""

    def __init__(self, topics: Topics, seal_secret: bytes) -> None:
        self._topics = topics
        self._seal_secret = seal_secret
        self._pending: dict[tuple[str, str], list[ReleasedValue]] = {}
        self._batching = False

    def queue(
        self, st: StreamState, value_id: str, seq: int, by_level: Mapping[float, NDArray[Any]]
    ) -> int:
        """Queue ``value_id``'s release at each holder's level (``by_level``); return how many."""
        sid = st.registration.stream_id
        listed = {lvl: v.tolist() for lvl, v in by_level.items()}
        for buyer, holder in st.holders.items():
            release = ReleasedValue.model_construct(
                value_id=value_id, seq=seq, level=holder.level, values=listed[holder.level]
            )
            self._pending.setdefault((buyer, sid), []).append(release)
        return len(st.holders)

    @contextlib.contextmanager
    def batch(self, streams: Mapping[str, StreamState]) -> Iterator[list[Output]]:
        """Hold deliveries back while the block runs; on exit append them to the yielded list."""
        outputs: list[Output] = []
        self._batching = True
        try:
            yield outputs
        finally:
            self._batching = False
            outputs.extend(self.drain(streams))

    def drain_unless_batching(self, streams: Mapping[str, StreamState]) -> list[Output]:
        return [] if self._batching else self.drain(streams)

    def drain(self, streams: Mapping[str, StreamState]) -> list[Output]:
        """One ``value_released`` event per (buyer, stream) with everything queued."""
        outputs = []
        for (buyer, sid), releases in self._pending.items():
            st = streams[sid]
            holder = st.holders.get(buyer)
            sealed = None
            if holder is not None and holder.public_key:
                sealed = seal_releases(
                    holder.public_key, releases, delivery_aad(sid, buyer), self._seal_secret
                )
            event = ValueReleased.model_construct(
                buyer_id=buyer,
                stream_id=sid,
                level_unit=UNIT_OF[st.registration.mechanism],
                releases=[] if sealed else releases,
                sealed=sealed,
            )
            key = releases[-1].value_id.encode()
            outputs.append(Output(self._topics.buyer(buyer), key, dump(event)))
        self._pending.clear()
        return outputs
