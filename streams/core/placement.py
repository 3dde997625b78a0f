"""Placement: an event is applied only on the partition its id maps to; elsewhere it is moved.

Every table entry a worker writes goes to the changelog partition of the event that wrote it, and
each worker looks entries up only in the partitions it owns. An account or stream event produced
to a foreign partition (any producer may choose the partition; librdkafka's default partitioner
is not Kafka's) would therefore reach a worker that does not hold the real entry — and write a
*second* one: a second ``alice`` whose key every worker's account replica might read last, a
rotation the next rebalance undoes, a second stream ``s1`` in the catalog. The partition is a
function of the id in the signed payload (:meth:`~streams.wire.topics.Topics.partition_of`), so
the core recomputes it before it touches any state.

A misplaced event whose sender is proven is **forwarded**, byte for byte, to the partition it
belongs on, where the worker owning the real entries applies it like any other event. Refusing
it instead would leave no record anywhere (the worker that saw it may not write one), so the same
signed bytes copied onto the right partition later, by anyone who read them, would still be
applied — after the sender had been told "refused" and had perhaps bought again under a new
id. Forwarded, the event has one fate: its outcome, which the owner records
and every later copy only repeats. An event whose sender is not proven is refused
(``wrong_partition``): it would be refused at home too, and forwarding it would let strangers
double the market's work for free.
"""

from __future__ import annotations

from .context import Context
from .outputs import Kind, Misplaced, Outcome, Output, Reject
from .rejections import Source

__all__ = ["Misplaced", "check_partition", "forward", "refuse_misplaced"]


def check_partition(ctx: Context, src: Source, key: str) -> None:
    """Raise :class:`Misplaced` unless ``src`` sits on the input partition of ``key``.

    Call it once the sender is proven, before any state is read or written. An event without a
    partition (the core driven directly, as by library users and unit tests) is not checked.
    """
    partition = src[1]
    if partition is None:
        return
    expected = ctx.topics.partition_of(key)
    if partition != expected:
        raise Misplaced(key, expected)


def forward(kind: Kind, src: Source, where: Misplaced, stream_id: str | None) -> Outcome:
    """The outcome of a misplaced event: its exact bytes again, on the partition of its id."""
    topic, raw = src[0], src[3]
    out = Output(topic, where.key.encode(), raw, partition=where.partition)
    return Outcome(kind, "forwarded", [out], stream_id=stream_id)


def refuse_misplaced(ctx: Context, src: Source, where: Misplaced) -> Reject:
    """The refusal of a misplaced event whose sender is not proven."""
    topic, partition, key = src[0], src[1], where.key
    return Reject(
        "wrong_partition",
        f"this event about {key!r} was written to partition {partition} of {topic}, but "
        f"events about {key!r} belong on partition {where.partition} (of "
        f"{ctx.topics.partitions}), and its signature does not prove who sent it; produce it "
        f"with key {key!r} and Kafka's default murmur2 partitioner",
        expected_partition=where.partition,
        partitions=ctx.topics.partitions,
    )
