"""How many streams each input partition holds: the bound on the streams table.

Streams are never deleted (their records answer resends and carry the ledger), so without a
bound a seller — or many accounts, which cost nothing to open — could register streams until a
worker's memory ran out, each histogram stream also costing a survival law to build and keep.
The market therefore holds at most ``Limits.max_streams`` streams, of which at most
``Limits.max_histogram_streams`` sell histograms, and one seller at most
``Limits.max_streams_per_seller`` (``max_histogram_streams_per_seller``), so that one account
cannot fill the market for everyone. Each bound is
split evenly over the input partitions: a partition holds at most its share, whichever worker
owns it, so the bounds hold however the partitions are spread over workers and after every
rebalance. (A seller whose share of one partition is full can still register a stream whose id
belongs to another.)

The counts live in the data: they are rebuilt from the streams table by one scan after a
restart or a rebalance (:meth:`StreamCensus.invalidate`), then kept up to date as streams are
registered — a refused registration costs no scan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..wire.events import StreamRegistration
from ..wire.products import section_of
from ..wire.topics import Topics
from .outputs import Reject
from .state import InconsistentStream, Stores, registered_of

__all__ = ["SELLER_SHARE_FLOOR", "Quota", "StreamCensus", "capacity"]


@dataclass(frozen=True)
class Quota:
    """How many streams (and histogram streams) may exist, in the whole market and per seller."""

    streams: int
    histograms: int
    streams_per_seller: int
    histograms_per_seller: int


SELLER_SHARE_FLOOR = 4
"""A seller's share of one partition below which ``init-topics`` warns: stream ids hash
uniformly, so with a share of s per partition a seller's k-th stream is refused with
probability about that of k ids landing s + 1 in one partition — for s = 1 already the
second stream in P partitions, with probability 1/P (the birthday bound)."""


def capacity(quota: Quota, partitions: int) -> dict[str, int]:
    """What a market made with ``partitions`` input partitions holds at most per partition
    (the shares :meth:`StreamCensus.check_room` enforces) and how many workers it can use:
    the numbers to choose the partition count by, which cannot change after creation."""

    def share(limit: int) -> int:
        return math.ceil(limit / partitions)

    return {
        "partitions": partitions,
        "max_workers": partitions,
        "streams_per_partition": share(quota.streams),
        "histogram_streams_per_partition": share(quota.histograms),
        "seller_streams_per_partition": share(quota.streams_per_seller),
        "seller_histogram_streams_per_partition": share(quota.histograms_per_seller),
    }


_WHAT = {
    ("market", False): ("streams", "EMARKET_MAX_STREAMS"),
    ("market", True): ("histogram streams", "EMARKET_MAX_HISTOGRAM_STREAMS"),
    ("seller", False): ("streams of one seller", "EMARKET_MAX_STREAMS_PER_SELLER"),
    ("seller", True): (
        "histogram streams of one seller",
        "EMARKET_MAX_HISTOGRAM_STREAMS_PER_SELLER",
    ),
}


class StreamCensus:
    """Streams and histogram streams per input partition, in all and per seller, on this
    worker's partitions."""

    def __init__(self, topics: Topics, stores: Stores) -> None:
        self._topics = topics
        self._stores = stores
        self._counts: dict[tuple[int, str | None], list[int]] | None = None

    def check_room(self, reg: StreamRegistration, quota: Quota) -> None:
        """Raise ``too_many_streams`` unless ``reg``'s partition has room for one more stream of
        its kind, in all and for its seller."""
        partition = self._topics.partition_of(reg.stream_id)
        apart = section_of(reg).counted_apart
        for who, held, limits in (
            ("market", self._count(partition, None), (quota.streams, quota.histograms)),
            (
                "seller",
                self._count(partition, reg.seller_id),
                (quota.streams_per_seller, quota.histograms_per_seller),
            ),
        ):
            for kind, count, limit in ((False, held[0], limits[0]), (True, held[1], limits[1])):
                share = math.ceil(limit / self._topics.partitions)
                if (kind and not apart) or count < share:
                    continue
                noun, setting = _WHAT[(who, kind)]
                elsewhere = "another stream id may belong to a partition with room; " * (
                    who == "seller"
                )
                raise Reject(
                    "too_many_streams",
                    f"the market holds at most {limit} {noun} ({share} on each of its "
                    f"{self._topics.partitions} input partitions), and partition {partition}, "
                    f"where stream id {reg.stream_id!r} belongs, holds its share; {elsewhere}"
                    f"ask the operators to raise {setting}",
                    max_streams=limit,
                )

    def added(self, reg: StreamRegistration) -> None:
        """Count a stream just registered."""
        partition = self._topics.partition_of(reg.stream_id)
        for who in (None, reg.seller_id):
            counts = self._count(partition, who)
            counts[0] += 1
            counts[1] += int(section_of(reg).counted_apart)

    def invalidate(self) -> None:
        """Forget the counts; the next registration recounts the table in one scan (needed
        after every rebalance: the table may then hold partitions another worker filled)."""
        self._counts = None

    def _count(self, partition: int, seller: str | None) -> list[int]:
        if self._counts is None:
            counts: dict[tuple[int, str | None], list[int]] = {}
            streams = self._stores.streams
            for sid in list(streams):
                p = self._topics.partition_of(sid)
                try:
                    reg = registered_of(self._stores, sid, streams[sid]).registration
                except InconsistentStream:  # not served, but its id is taken: the market's
                    counts.setdefault((p, None), [0, 0])[0] += 1
                    continue
                for who in (None, reg.seller_id):
                    c = counts.setdefault((p, who), [0, 0])
                    c[0] += 1
                    c[1] += int(section_of(reg).counted_apart)
            self._counts = counts
        return self._counts.setdefault((partition, seller), [0, 0])
