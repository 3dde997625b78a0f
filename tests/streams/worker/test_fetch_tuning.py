"""The worker's consumer fetch settings: the fetch wait and the prefetch backoff that goes with it.

aiokafka holds back every fetch to a broker while one of its partitions has fetched records the
application has not taken, for up to a backoff that is not a consumer option (0.1 s). On the
embedded broker (one broker, a 10-20 ms fetch wait) that backoff was most of the worker's
latency tail under load; :func:`streams.worker.faust_internals.prefetch_backoff` scales it with
the fetch wait, and these tests check that a worker's real consumer gets both.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.worker.app import MarketWorker
from streams.worker.config import Settings
from streams.worker.faust_internals import prefetch_backoff


def test_backoff_follows_the_fetch_wait_up_to_aiokafkas_default() -> None:
    assert prefetch_backoff(10) == pytest.approx(0.02)
    assert prefetch_backoff(20) == pytest.approx(0.04)
    assert prefetch_backoff(50) == pytest.approx(0.1)
    assert prefetch_backoff(1500) == pytest.approx(0.1)  # Kafka's setting: aiokafka's default


def _restore_patches_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker built in process patches Faust and aiokafka process-wide: put them back after."""
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from faust.tables.manager import TableManager
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    from streams.worker import faust_internals

    for owner, name in (
        (AIOKafkaConsumerThread, "_create_worker_consumer"),
        (AIOKafkaConsumerThread, "_highwaters"),
        (GroupCoordinator, "_maybe_leave_group"),
        (TableManager, "on_start"),
        (faust_internals, "_tansu_installed"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name))


@pytest.mark.broker
def test_a_workers_consumer_fetches_with_the_tuned_wait_and_backoff(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _restore_patches_after(monkeypatch)
    settings = replace(
        Settings(
            broker=broker.url,
            app_id="fetch-tuning",
            prefix="fetchtuning",
            data_dir=tmp_path,
            web_port=find_free_port(),
        ).for_tansu(),
        fetch_max_wait_ms=15,
    )
    worker = MarketWorker(settings)

    async def started_consumer() -> tuple[int, float]:
        # the consumer Faust's consumer thread builds, started against the broker: the
        # fetcher exists only once it has started
        faust_consumer = worker.app.consumer
        consumer = faust_consumer._thread._create_worker_consumer(faust_consumer.transport)
        await consumer.start()
        try:
            return consumer._fetch_max_wait_ms, consumer._fetcher._prefetch_backoff
        finally:
            await consumer.stop()

    wait_ms, backoff = asyncio.run(started_consumer())
    assert wait_ms == 15
    assert backoff == pytest.approx(0.03)
