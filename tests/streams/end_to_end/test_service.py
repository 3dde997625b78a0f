"""The market service end to end: real broker, real Faust worker processes, real metrics."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from market.receipts import verify_receipt
from streams.clients.client import MarketClient, TopicReader, now_ms
from streams.core.keys import public_key_from_b64
from streams.wire.events import (
    SCHEMAS,
    LinearLevelSpec,
    PurchaseFulfilled,
    QuoteAnswer,
    Rejection,
)

from ..conftest import Market
from ..helpers import party, purchase, value

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def reg(stream: str = "temp", **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "stream_id": stream,
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 4,
        "steps": [0.5, 1.0, 2.0],
        "cap": 4.0,
        "retain_last": 8,
        "pricing": LinearLevelSpec(rate_per_level=100.0),
    }
    base.update(kw)
    return base


def test_register_publish_buy_three_steps_tail(market: Market) -> None:
    w = market.start_worker()
    market.open_accounts("seller1", "alice")
    alice = party("alice")

    async def scenario(c: MarketClient) -> dict[str, Any]:
        entry = await c.register(reg())
        assert not isinstance(entry, Rejection), entry
        truth = {}
        for i in range(8):
            vals = list(np.arange(4.0) + i)
            truth[await c.publish("temp", vals, value_id=f"v{i}")] = vals
        return {"entry": entry, "truth": truth}

    ctx = market.run(scenario)
    market.wait_ingested("temp", 8)
    key = public_key_from_b64(ctx["entry"].market_public_key)

    async def buy(c: MarketClient) -> list[Any]:
        outs = [await c.quote("temp", party=alice)]
        for _ in range(3):
            outs.append(await c.buy("temp", max_price_minor=1000, party=alice))
        outs.append(await c.buy("temp", max_price_minor=1000, party=alice))  # no higher step
        return outs

    quote, *buys, top = market.run(buy)
    assert isinstance(quote, QuoteAnswer) and quote.price_minor == 50
    assert [b.level_after for b in buys] == [0.5, 1.0, 2.0]
    assert [b.price_minor for b in buys] == [50, 50, 100]
    assert isinstance(top, Rejection) and top.reason == "no_higher_step"
    for b in buys:
        assert isinstance(b, PurchaseFulfilled)
        assert sorted(r.value_id for r in b.releases) == sorted(ctx["truth"])
        rel = [(r.value_id, r.level, np.asarray(r.values)) for r in b.releases]
        verify_receipt(
            b.receipt.model_dump(),
            b.receipt.signature,
            rel,
            key,
            opening=bytes.fromhex(b.opening or ""),
        )

    async def more(c: MarketClient) -> list[Any]:
        await c.publish("temp", [1.0, 2.0, 3.0, 4.0], value_id="late")
        return [ev async for ev in c.tail(idle_timeout=3.0, party=alice)]

    events = market.run(more)
    kinds = [e.type for e in events]
    assert kinds.count("purchase_fulfilled") == 3 and kinds.count("quote") == 1
    late = [e for e in events if e.type == "value_released"]
    assert len(late) == 1 and late[0].releases[0].level == 2.0
    for e in events:  # every event in the buyer's inbox matches the published schema
        SCHEMAS["inbox"].validate_json(e.model_dump_json())

    assert w.metric("emarket_purchases_total", {"outcome": "fulfilled"}) == 3
    assert w.metric("emarket_privacy_spent", {"stream": "temp"}) == 2.0
    assert w.metric("emarket_revenue_minor_total", {"stream": "temp"}) == 200
    assert w.metric("emarket_values_ingested_total", {"status": "accepted"}) == 9
    assert w.metric("emarket_rejections_total", {"reason": "no_higher_step"}) == 1
    lat = w.metric("emarket_purchase_latency_seconds_count")
    assert lat >= 4


def test_lossless_joint_law_over_the_wire(market: Market) -> None:
    """Across many values, successive releases share the stored sample at rate (ε1/ε2)²."""
    market.start_worker()
    market.open_accounts("seller1", "bob")
    bob = party("bob")
    n_values, dim = 40, 100

    async def go(c: MarketClient) -> tuple[Any, Any]:
        await c.register(reg("big", dimension=dim, retain_last=n_values, steps=[1.0, 2.0]))
        for i in range(n_values):
            await c.publish("big", [0.0] * dim, value_id=f"v{i}")
        market.wait_ingested("big", n_values)
        a = await c.buy("big", max_price_minor=10**6, party=bob)
        b = await c.buy("big", max_price_minor=10**6, party=bob)
        return a, b

    a, b = market.run(go)
    ya = np.concatenate([r.values for r in sorted(a.releases, key=lambda r: r.value_id)])
    yb = np.concatenate([r.values for r in sorted(b.releases, key=lambda r: r.value_id)])
    assert ya.size == n_values * dim
    frac = float(np.mean(ya == yb))
    assert abs(frac - 0.25) < 0.025, frac  # sd 0.0061 at n = 4000; fresh noise gives 0


def test_bad_events_on_every_topic_are_rejected_and_worker_survives(market: Market) -> None:
    w = market.start_worker()
    market.open_accounts("seller1", "eve")
    t = market.topics
    m = {"market": t.prefix}
    bad = [
        (t.registrations, b"not json"),
        (t.registrations, json.dumps({"type": "register_stream", "stream_id": "x"}).encode()),
        (t.values, b"\x00\xff"),
        (t.values, value("nope", "a", [1.0], **m)),  # signed, for a stream that does not exist
        (t.purchases, b"[]"),
        (t.purchases, purchase("nope", "eve", "p", max_price=1, requested_at_ms=now_ms(), **m)),
    ]

    async def go(c: MarketClient) -> list[Rejection]:
        for topic, payload in bad:
            await c.send(topic, "nope", payload)  # keyed as a client keys it
        reader = TopicReader(c.bootstrap, t.rejections)
        await reader.start()
        got: list[Rejection] = []
        try:
            for _ in range(100):
                got += [Rejection.model_validate_json(v) for _, v in await reader.poll(0.2)]
                if len(got) >= len(bad):
                    break
        finally:
            await reader.stop()
        entry = await c.register(reg("after"))  # still processing
        assert not isinstance(entry, Rejection)
        return got

    got = market.run(go)
    assert sorted(r.reason for r in got) == sorted(
        [
            "invalid_event",
            "invalid_event",
            "invalid_event",
            "unknown_stream",
            "invalid_event",
            "unknown_stream",
        ]
    )
    assert {r.source_topic for r in got} == {t.registrations, t.values, t.purchases}
    assert all(r.message and (r.payload or r.source_topic == t.values) for r in got)
    assert all(r.payload_sha256 for r in got)  # a value batch is named, never quoted
    assert w.alive()
    assert w.metric("emarket_rejections_total") == len(bad)
