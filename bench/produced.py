"""What a workload made the broker store: the records produced to a set of topics in a window.

Take :func:`ends` before the window and :func:`produced_since` after it; every record whose
timestamp is in the window is counted under its topic, with its key, value and header bytes
(what a client produced; the broker's record-batch framing, ~70 B a batch and ~10 B a record,
is not counted). The start offsets only save reading what came before: the embedded broker
answers an end offset at the start of its newest record batch, so the records are told apart by
their timestamps, not by offsets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.broker.kafka_internals import fresh_metadata

__all__ = ["Produced", "ends", "produced_since"]


@dataclass(frozen=True)
class Produced:
    """Records and bytes per topic produced in a window by ``events`` events."""

    events: int
    topics: dict[str, tuple[int, int]]

    def per_event(self, kind: Callable[[str], str]) -> dict[str, tuple[float, float]]:
        """Records and bytes per event, summed over the topics of each ``kind(topic)``."""
        out: dict[str, tuple[float, float]] = {}
        for topic, (records, size) in self.topics.items():
            r, b = out.get(kind(topic), (0.0, 0.0))
            out[kind(topic)] = (r + records / self.events, b + size / self.events)
        return out

    @property
    def bytes_per_event(self) -> float:
        return sum(b for _, b in self.topics.values()) / self.events

    @property
    def records_per_event(self) -> float:
        return sum(r for r, _ in self.topics.values()) / self.events


def _consumer(bootstrap: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 << 20,
        fetch_max_bytes=64 << 20,
        fetch_max_wait_ms=50,
    )


async def _partitions(c: AIOKafkaConsumer, want: Callable[[str], bool]) -> list[TopicPartition]:
    cluster = await fresh_metadata(c)  # not the consumer's cached view
    return [
        TopicPartition(t, p)
        for t in sorted(cluster.topics())
        if want(t)
        for p in sorted(cluster.partitions_for_topic(t) or ())
    ]


async def ends(bootstrap: str, want: Callable[[str], bool]) -> dict[TopicPartition, int]:
    """The end offset of every partition of the topics ``want`` accepts."""
    c = _consumer(bootstrap)
    await c.start()
    try:
        tps = await _partitions(c, want)
        got: dict[TopicPartition, int] = await c.end_offsets(tps) if tps else {}
        return got
    finally:
        await c.stop()


async def produced_since(
    bootstrap: str,
    want: Callable[[str], bool],
    start: dict[TopicPartition, int],
    since_ms: int,
    events: int,
) -> Produced:
    """Every record of the topics ``want`` accepts stamped at or after ``since_ms``, read from
    ``start`` (0 for a partition made since) to the end."""
    c = _consumer(bootstrap)
    await c.start()
    counted: dict[str, tuple[int, int]] = {}
    try:
        tps = await _partitions(c, want)
        end = await c.end_offsets(tps) if tps else {}
        todo = [tp for tp in tps if end[tp] > start.get(tp, 0)]
        if todo:
            c.assign(todo)
            for tp in todo:
                c.seek(tp, max(0, start.get(tp, 0) - 1))
        while todo:
            for tp, records in (await c.getmany(*todo, timeout_ms=500)).items():
                for rec in records:
                    if rec.timestamp < since_ms:
                        continue
                    size = max(0, rec.serialized_key_size) + max(0, rec.serialized_value_size)
                    size += sum(len(k) + len(v or b"") for k, v in rec.headers)
                    n, b = counted.get(tp.topic, (0, 0))
                    counted[tp.topic] = (n + 1, b + size)
            todo = [tp for tp in todo if await c.position(tp) < end[tp]]
    finally:
        await c.stop()
    return Produced(events, counted)
