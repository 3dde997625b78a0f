"""How many streams each input partition holds: the bound on the streams table.

Streams are never deleted (their records answer resends and carry the ledger), so without a
bound a seller — or many accounts, which cost nothing to open — could register streams until a
worker's memory ran out, each histogram stream also costing a survival law to build and keep.
The market therefore holds at most ``Limits.max_streams`` streams, of which at most
``Limits.max_histogram_streams`` sell histograms, split evenly over the input partitions: a
partition holds at most its share, whichever worker owns it, so the bound holds however the
partitions are spread over workers and after every rebalance.

The counts live in the data: they are rebuilt from the streams table by one scan after a
restart or a rebalance (:meth:`StreamCensus.invalidate`), then kept up to date as streams are
registered — a refused registration costs no scan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..wire.events import StreamRegistration
from ..wire.topics import Topics
from .histograms import is_histogram
from .outputs import Reject

__all__ = ["StreamCensus"]


class StreamCensus:
    """Streams and histogram streams per input partition, on this worker's partitions."""

    def __init__(self, topics: Topics, streams: Mapping[str, Any]) -> None:
        self._topics = topics
        self._streams = streams
        self._counts: dict[int, list[int]] | None = None

    def check_room(self, reg: StreamRegistration, max_streams: int, max_histograms: int) -> None:
        """Raise ``too_many_streams`` unless ``reg``'s partition has room for one more stream
        (of its kind)."""
        partition = self._topics.partition_of(reg.stream_id)
        held, histograms = self._count(partition)
        parts = self._topics.partitions
        share = math.ceil(max_streams / parts)
        if held >= share:
            raise Reject(
                "too_many_streams",
                f"the market holds its maximum of {max_streams} streams ({share} on each of its "
                f"{parts} partitions, and partition {partition} of stream id "
                f"{reg.stream_id!r} is full); ask the operators (EMARKET_MAX_STREAMS)",
                max_streams=max_streams,
            )
        hshare = math.ceil(max_histograms / parts)
        if is_histogram(reg) and histograms >= hshare:
            raise Reject(
                "too_many_streams",
                f"the market holds its maximum of {max_histograms} histogram streams ({hshare} "
                f"on each of its {parts} partitions, and partition {partition} of stream id "
                f"{reg.stream_id!r} is full); ask the operators (EMARKET_MAX_HISTOGRAM_STREAMS)",
                max_streams=max_histograms,
            )

    def added(self, reg: StreamRegistration) -> None:
        """Count a stream just registered."""
        counts = self._count(self._topics.partition_of(reg.stream_id))
        counts[0] += 1
        counts[1] += int(is_histogram(reg))

    def invalidate(self) -> None:
        """Forget the counts; the next registration recounts the table in one scan (needed
        after every rebalance: the table may then hold partitions another worker filled)."""
        self._counts = None

    def _count(self, partition: int) -> list[int]:
        if self._counts is None:
            counts: dict[int, list[int]] = {}
            for sid in list(self._streams):
                st = self._streams[sid]
                c = counts.setdefault(self._topics.partition_of(sid), [0, 0])
                c[0] += 1
                c[1] += int(is_histogram(st.registration))
            self._counts = counts
        return self._counts.setdefault(partition, [0, 0])
