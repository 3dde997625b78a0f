"""What a worker writes to the broker per purchase, counted on the broker (issue 45).

Each purchase's decision record reaches the ``purchases`` changelog once (not once with the
outcome's bytes and again without them), and each sale reaches the seller once, in a signed
``sales`` notice, whatever batches the purchases fell in.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.produced import ends, produced_since
from streams.clients.client import MarketClient, now_ms
from streams.wire.events import LinearLevelSpec, PurchaseFulfilled, Rejection, Sales

from ..conftest import Market
from ..helpers import party, tail

pytestmark = [pytest.mark.broker]

BUYERS = ("alice", "bob")


def _changelog(topic: str) -> bool:
    return topic.endswith("-purchases-changelog")


def test_a_purchase_writes_one_decision_record_and_one_sale(market: Market) -> None:
    market.start_worker()
    market.open_accounts("seller1", *BUYERS)
    reg: dict[str, Any] = {
        "stream_id": "temp",
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 2,
        "steps": [0.5, 1.0, 2.0],
        "cap": 4.0,
        "retain_last": 8,
        "pricing": LinearLevelSpec(rate_per_level=100.0),
    }

    async def setup(c: MarketClient) -> None:
        assert not isinstance(await c.register(reg), Rejection)
        for i in range(2):
            await c.publish("temp", [1.0, float(i)], value_id=f"v{i}")

    market.run(setup)
    market.wait_ingested("temp", 2)
    boot = market.broker.bootstrap
    start, since = asyncio.run(ends(boot, _changelog)), now_ms()

    async def buy_all(c: MarketClient) -> list[Any]:
        outs: list[Any] = []
        for _ in range(3):  # each step by both buyers at once: batches of one or two
            outs += await asyncio.gather(
                *(c.buy("temp", max_price_minor=1000, party=party(b)) for b in BUYERS)
            )
        await c.publish("temp", [2.0, 2.0], value_id="v2")  # the stream's next event
        return outs

    outs = market.run(buy_all)
    assert all(isinstance(o, PurchaseFulfilled) for o in outs), outs
    market.wait_ingested("temp", 3)
    made = asyncio.run(produced_since(boot, _changelog, start, since, len(outs)))
    assert made.records_per_event == 1.0, made.topics  # no second write without the bytes

    async def told(c: MarketClient) -> tuple[list[Any], list[Any]]:
        notices = [e async for e in tail(c, "seller1", idle_timeout=2.0)]
        sales = [s async for s in c.sales(party=party("seller1"))]
        return notices, sales

    notices, sales = market.run(told)
    listed = [s.receipt_sha256 for n in notices if isinstance(n, Sales) for s in n.sales]
    assert len(listed) == len(set(listed)) == len(sales) == len(outs)
    assert len([n for n in notices if isinstance(n, Sales)]) <= len(outs)
