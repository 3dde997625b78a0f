"""Placement: an event is applied only on the partition its id maps to.

Every table entry a worker writes goes to the changelog partition of the event that wrote it, and
each worker looks entries up only in the partitions it owns. An account or stream event produced
to a foreign partition (any producer may choose the partition) would therefore reach a worker
that does not hold the real entry — and write a *second* one: a second ``alice`` whose key every
worker's account replica might read last, a rotation the next rebalance undoes, a second stream
``s1`` in the catalog. The partition is a function of the id in the signed payload
(:meth:`~streams.wire.topics.Topics.partition_of`), so the core recomputes it and refuses the
event before it touches any state.
"""

from __future__ import annotations

from .context import Context
from .outputs import Reject
from .rejections import Source

__all__ = ["check_partition"]


def check_partition(ctx: Context, src: Source, key: str) -> None:
    """Raise ``wrong_partition`` unless ``src`` sits on the input partition of ``key``.

    An event without a partition (the core driven directly, as by library users and unit tests)
    is not checked.
    """
    topic, partition = src[0], src[1]
    if partition is None:
        return
    expected = ctx.topics.partition_of(key)
    if partition != expected:
        raise Reject(
            "wrong_partition",
            f"this event about {key!r} was written to partition {partition} of {topic}, but "
            f"events about {key!r} belong on partition {expected} (of {ctx.topics.partitions}); "
            f"produce it with key {key!r} and Kafka's default murmur2 partitioner",
            expected_partition=expected,
            partitions=ctx.topics.partitions,
        )
