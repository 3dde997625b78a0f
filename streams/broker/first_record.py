"""The first record of a topic's partition 0, tombstones included: how the worker and the
clients read the market's trust root (docs/protocol.md §12.1.1), so both read the same record."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from .kafka_internals import fresh_metadata

__all__ = ["first_record"]


async def first_record(
    bootstrap: str, topic: str, *, timeout: float, wait_for_one: bool, **auth: Any
) -> tuple[int, bytes | None] | None:
    """(offset, value) of the first record of ``topic``'s partition 0, the value None for a
    tombstone; None if the partition is empty and ``wait_for_one`` is False (a worker that may
    claim the market), else waits for one (a client waiting for a market's first worker).

    Raises
    ------
    TimeoutError
        No record (or, with ``wait_for_one`` False, no answer showing the partition is empty)
        within ``timeout`` seconds.
    """
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50, **auth
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        assigned = False
        while time.monotonic() < deadline:
            if not assigned:
                # consumer.partitions_for_topic reads cached metadata: ask the broker afresh
                cluster = await fresh_metadata(consumer)
                if 0 not in (cluster.partitions_for_topic(topic) or set()):
                    await asyncio.sleep(0.1)
                    continue
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                assigned = True
            batch = await consumer.getmany(tp, timeout_ms=200, max_records=1)
            for rec in batch.get(tp, []):
                return int(rec.offset), None if rec.value is None else bytes(rec.value)
            high = consumer.highwater(tp)  # from a fetch response, right on every broker
            if not wait_for_one and high is not None and await consumer.position(tp) >= high:
                return None
        raise TimeoutError(f"no record on {topic} (partition 0) within {timeout:g}s")
    finally:
        await consumer.stop()
