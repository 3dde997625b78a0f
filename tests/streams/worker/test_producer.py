"""The worker's send policy against the real broker: permanent failures are dead-lettered
after bounded retries and the rest of the batch is delivered; state is never dead-lettered.

The worker normally sends through Faust's producer; here the same :class:`Producer` sends
through a real aiokafka producer (Faust's producer is a thin wrapper over it), whose request
limit is small so that a real ``MessageSizeTooLargeError`` is raised for one record.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from streams.broker.admin import ensure_topics
from streams.broker.embedded import EmbeddedBroker
from streams.clients.client import TopicReader
from streams.wire.events import DeadLetter
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.faults import FaultInjector
from streams.worker.metrics import build_metrics
from streams.worker.producer import Producer
from streams.worker.tables import Record

pytestmark = [pytest.mark.broker]

LIMIT = 4096


class _FaustLikeProducer:
    """Faust's ``producer.send(topic, key, value, partition, timestamp, headers)`` over aiokafka."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: Any,
        timestamp: Any,
        headers: Any,
    ) -> Any:
        return await self._producer.send(topic, value, key=key, partition=partition)


class _App:
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = _FaustLikeProducer(producer)


async def _read(bootstrap: str, topic: str) -> list[bytes]:
    reader = TopicReader(bootstrap, topic)
    await reader.start()
    out: list[bytes] = []
    try:
        while batch := await reader.poll(1.0):
            out += [v for _, v in batch]
    finally:
        await reader.stop()
    return out


def test_a_permanent_failure_is_dead_lettered_and_the_batch_goes_on(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    topics = Topics(f"t{uuid.uuid4().hex[:8]}", 1)
    settings = replace(Settings(broker=broker.url, data_dir=tmp_path), permanent_retries=2)
    metrics = build_metrics()

    async def go() -> tuple[list[bytes], list[bytes], bool]:
        await ensure_topics(broker.bootstrap, topics)
        raw = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=LIMIT)
        await raw.start()
        try:
            p = Producer(_App(raw), settings, topics, metrics, FaultInjector({}))
            big = b"x" * (2 * LIMIT)
            await p.send_all(
                [
                    Record(topics.catalog, b"a", b"small one"),
                    Record(topics.catalog, b"b", big),
                    Record(topics.catalog, b"c", b"small two"),
                ]
            )
            # state must never be skipped: the same record as state is retried, not dropped
            state = p.send_all([Record(topics.catalog, b"s", big)], dead_letter=False)
            try:
                await asyncio.wait_for(state, 3.0)
                held = False
            except TimeoutError:
                held = True
        finally:
            await raw.stop()
        return (
            await _read(broker.bootstrap, topics.catalog),
            await _read(broker.bootstrap, topics.deadletters),
            held,
        )

    catalog, letters, held = asyncio.run(go())
    assert catalog == [b"small one", b"small two"]
    (letter,) = [DeadLetter.model_validate_json(v) for v in letters]
    assert letter.reason == "MessageSizeTooLargeError" and letter.topic == topics.catalog
    assert letter.value_bytes == 2 * LIMIT
    assert letter.value_sha256 == hashlib.sha256(b"x" * (2 * LIMIT)).hexdigest()
    assert len(letter.value_prefix) <= 1024
    assert held, "a state record was dropped instead of retried"
    counted = metrics.registry.get_sample_value(
        "emarket_dead_letters_total",
        {"reason": "too_large"},  # the record keeps the error
    )
    assert counted == 1
