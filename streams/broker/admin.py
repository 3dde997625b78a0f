"""Topic administration with aiokafka (works on Apache Kafka and on the embedded broker)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from ..wire.topics import Topics, TopicSpec
from .kafka_internals import fresh_metadata

__all__ = ["PartitionCountError", "check_input_partitions", "ensure_topics", "wait_for_broker"]

log = logging.getLogger(__name__)


async def wait_for_broker(bootstrap: str, timeout: float = 30.0, **auth: Any) -> None:
    """Return once the broker answers a metadata request, or raise TimeoutError."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Exception | None = None
    while loop.time() < deadline:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000, **auth)
        try:
            await admin.start()
            await admin.list_topics()
            return
        except (KafkaConnectionError, OSError) as exc:
            last = exc
            await asyncio.sleep(0.2)
        finally:
            await admin.close()
    raise TimeoutError(f"broker {bootstrap} did not answer within {timeout}s: {last}")


async def ensure_topics(
    bootstrap: str, specs: list[TopicSpec] | Topics, replication: int = 1, **auth: Any
) -> list[str]:
    """Create missing topics; return the names created. Existing topics are left alone."""
    if isinstance(specs, Topics):
        specs = specs.specs()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000, **auth)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):  # a concurrent creator won
                await admin.create_topics(
                    [
                        NewTopic(s.name, s.partitions, replication, topic_configs=s.config)
                        for s in missing
                    ]
                )
        return [s.name for s in missing]
    finally:
        await admin.close()


class PartitionCountError(RuntimeError):
    """An input topic has another partition count than the market is configured with."""


async def check_input_partitions(
    bootstrap: str, topics: Topics, state: Sequence[str] = (), **auth: Any
) -> None:
    """Raise :class:`PartitionCountError` unless every input topic, and each of the workers'
    ``state`` topics that exists, has ``topics.partitions``.

    The market refuses an event that is not on the partition Kafka's default partitioner gives
    its id (:meth:`Topics.partition_of`, computed with ``topics.partitions``). Input topics made
    beforehand with another count would have every event refused, and a changelog or the
    progress changelog with another count (made by someone else) would leave partitions without
    their state: stop at start-up instead, saying what to change.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000, **auth)
    await admin.start()
    try:
        cluster = await fresh_metadata(admin)
    finally:
        await admin.close()
    wrong = {
        name: len(parts)
        for name in (*topics.inputs(), *state)
        if (parts := cluster.partitions_for_topic(name)) and len(parts) != topics.partitions
    }
    if wrong and not set(wrong) & set(topics.inputs()):
        found = ", ".join(f"{name} has {n}" for name, n in sorted(wrong.items()))
        raise PartitionCountError(
            f"the market's state topics have {topics.partitions} partitions but {found}: made "
            "by someone else (on a broker without ACLs anyone may). Its state cannot be read "
            "there: delete the topic if it holds nothing of the market's, or restore it "
            "(docs/operations.md, 'State that does not verify')"
        )
    if wrong:
        found = ", ".join(f"{name} has {n}" for name, n in sorted(wrong.items()))
        raise PartitionCountError(
            f"the market is configured with {topics.partitions} partitions per input topic but "
            f"{found}: start the workers with EMARKET_PARTITIONS (--partitions) equal to the "
            "topics' count (every worker and client of a market must agree on it)"
        )
