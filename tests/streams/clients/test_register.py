"""Registering a stream against a live worker: what the client reads to find its entry."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from streams.clients.client import MarketClient
from streams.wire.events import CatalogEntry

from ..conftest import Market
from ..helpers import party

pytestmark = [pytest.mark.broker]

FIELDS = {
    "mechanism": "laplace",
    "sensitivity": 1.0,
    "dimension": 2,
    "steps": [0.5, 1.0],
    "cap": 1.0,
    "retain_last": 4,
    "pricing": {"kind": "linear_level", "rate_per_level": 100},
    "currency": "EUR",
}


def test_a_registration_reads_the_catalog_from_its_end(market: Market) -> None:
    """The entry answering a registration is newer than the send, so the client reads the
    catalog from its end: a registration costs the same at the 4,000th stream as at the
    first. Read from the beginning, every record before it would be read (and checked) again:
    here, 40 records the market did not sign, each warned about."""
    market.start_worker()
    market.open_accounts("seller1")
    warnings: list[str] = []

    async def go(c: MarketClient) -> None:
        prod = AIOKafkaProducer(bootstrap_servers=market.broker.bootstrap)
        await prod.start()
        try:
            for i in range(40):
                await prod.send_and_wait(market.topics.catalog, b"{}", key=f"junk{i}".encode())
        finally:
            await prod.stop()
        first = await c.register({"stream_id": "first", **FIELDS}, timeout=60)
        assert isinstance(first, CatalogEntry), first
        warnings.clear()  # the newest record may be read again (an end one record too far)
        second = await c.register({"stream_id": "second", **FIELDS}, timeout=60)
        assert isinstance(second, CatalogEntry), second
        assert second.registration.stream_id == "second"

    async def run() -> None:
        async with MarketClient(
            market.broker.bootstrap,
            market.topics,
            party=party("seller1"),
            on_warning=warnings.append,
        ) as c:
            await go(c)

    asyncio.run(run())
    assert [w for w in warnings if market.topics.catalog in w] == []
