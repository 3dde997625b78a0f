"""A market with v2 inboxes on the broker (docs/protocol.md §8.5): accounts opened make no topic;
two buyers and a seller share one partition of ``<p>.inbox``, each reads its own answers,
deliveries and sales only, and a co-reader of the partition sees routes and sealed bytes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from streams.clients.client import MarketClient, TopicReader
from streams.clients.inbox_reader import routes_of
from streams.clients.keys import Party
from streams.wire.events import AccountState, PurchaseFulfilled, Rejection, ValueReleased

from .. import helpers
from ..conftest import Market

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SELLER, ALICE, BOB = "sealed-seller", "sealed-alice", "sealed-bob"
REG = {
    "stream_id": "temp",
    "mechanism": "laplace",
    "sensitivity": 1.0,
    "dimension": 3,
    "steps": [0.5, 1.0, 2.0],
    "cap": 4.0,
    "retain_last": 4,
    "pricing": {"kind": "linear_level", "rate_per_level": 100},
}


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _raw_partition(c: MarketClient, want: int) -> list[tuple[bytes | None, bytes, Any]]:
    """Everything on ``<p>.inbox``, as anyone reading it sees it (at least ``want`` records)."""
    reader = TopicReader(c.bootstrap, c.topics.shared_inbox)
    await reader.start()
    got: list[tuple[bytes | None, bytes, Any]] = []
    try:
        for _ in range(200):
            got += await reader.poll_records(0.3)
            if len(got) >= want:
                break
    finally:
        await reader.stop()
    return got


def _has(events: list[Any], kind: type, n: int = 1) -> bool:
    return sum(isinstance(e, kind) for e in events) >= n


def test_a_v2_market_keeps_its_topics_and_each_account_reads_its_own(market: Market) -> None:
    market.settings = replace(market.settings, inboxes=2, inbox_partitions=1)
    market.topics = market.settings.topics()
    market.start_worker()
    seller, alice, bob = (helpers.party(n) for n in (SELLER, ALICE, BOB))

    async def go(c: MarketClient) -> None:
        await c.market_key()
        before = await _topics(c.bootstrap)
        for p in (seller, alice, bob):
            assert (await c.open_account(p)).type == "account"
        plain = await c.open_account(helpers.party("plain"))
        assert isinstance(plain, Rejection) and plain.reason == "encryption_required"
        assert await _topics(c.bootstrap) == before  # no topic per account
        assert not [t for t in before if t.startswith(f"{c.topics.prefix}.inbox.")]

        await c.register(REG, party=seller)
        await c.publish_batch(
            c.value_batch("temp", [("v0", [1.0, 2.0, 3.0], None)], party=seller), party=seller
        )
        for buyer in (alice, bob):
            got = await c.buy("temp", party=buyer, target_level=1.0, max_price_minor=10**6)
            assert isinstance(got, PurchaseFulfilled) and got.releases, got
        await c.publish_batch(
            c.value_batch("temp", [("v1", [4.0, 5.0, 6.0], None)], party=seller), party=seller
        )

        for name, other in ((ALICE, BOB), (BOB, ALICE)):
            mine = await helpers.inbox_until(c, name, lambda e: _has(e, ValueReleased))
            assert _has(mine, PurchaseFulfilled) and _has(mine, ValueReleased)
            for e in mine:  # nothing of the other buyer's
                assert other not in e.model_dump_json(), e
        sales = [s async for s in c.sales(party=seller, idle_timeout=1.0)]
        for _ in range(20):
            if len(sales) == 2:
                break
            await asyncio.sleep(0.5)
            sales = [s async for s in c.sales(party=seller, idle_timeout=1.0)]
        assert len(sales) == 2 and {s.stream_id for s in sales} == {"temp"}

        # a rotation moves alice to a new route: its answer and what follows are read there,
        # and what came before under the old one (the key file keeps the old sealing key)
        new = replace(Party.generate(ALICE), key_version=2).holding([alice])
        rotated = await c.rotate_keys(new, 2, party=alice)
        assert isinstance(rotated, AccountState) and rotated.version == 2, rotated
        again = await c.buy("temp", party=new, target_level=2.0, max_price_minor=10**6)
        assert isinstance(again, PurchaseFulfilled), again
        both = [e async for e in c.tail(party=new, idle_timeout=1.0)]
        assert sum(isinstance(e, PurchaseFulfilled) for e in both) == 2

        routes = {
            r.encode()
            for p in (seller, alice, bob, new)
            for r in routes_of(p, c.topics, c._inbox_sealing_key or "")
        }
        seen = await _raw_partition(c, 10)
        assert {k for k, _, _ in seen} == routes  # one partition, four pseudonyms
        for _, value, headers in seen:  # nothing else in the clear
            assert value[0] == 2 and not headers
            for word in (b"sealed", b"temp", b"purchase", b"account", b"sale"):
                assert word not in value

    market.run(go)
    assert market.workers[0].proc is not None and market.workers[0].proc.poll() is None
