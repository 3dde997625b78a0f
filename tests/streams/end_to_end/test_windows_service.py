"""Privacy windows on the real broker and a real worker: a subscription that would exceed the
window cap is withheld and reported, a purchase that would is refused, the window rolls, the
sums survive a restart, and the gauges say where each stream stands."""

from __future__ import annotations

from typing import Any

import pytest

from streams.clients.client import MarketClient, now_ms
from streams.wire.events import (
    SCHEMAS,
    DeliveriesWithheld,
    LinearLevelSpec,
    PurchaseFulfilled,
    QuoteAnswer,
    Rejection,
    ValueReleased,
)

from ..conftest import Market
from ..helpers import buy, inbox_until, party

pytestmark = [pytest.mark.broker, pytest.mark.slow]
W = 600_000  # ten-minute windows: the next one starts less than the allowed clock skew ahead


def reg() -> dict[str, Any]:
    return {
        "stream_id": "home",
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 3,
        "steps": [0.5, 1.0, 2.0],
        "cap": 2.0,
        "retain_last": 8,
        "pricing": LinearLevelSpec(rate_per_level=100.0),
        "privacy_unit": "window",
        "window": {"duration_ms": W, "cap": 2.5},
    }


def delivered(events: list[Any]) -> dict[str, list[str]]:
    """Value ids released and withheld, from one inbox."""
    out: dict[str, list[str]] = {"released": [], "withheld": []}
    for e in events:
        SCHEMAS["inbox"].validate_json(e.model_dump_json())
        if isinstance(e, ValueReleased):
            out["released"] += [r.value_id for r in e.releases]
        elif isinstance(e, DeliveriesWithheld):
            out["withheld"] += e.value_ids
    return out


async def inboxes(c: MarketClient, values: int) -> dict[str, dict[str, list[str]]]:
    """What alice and bob were delivered or told, once each has heard of ``values`` values."""

    def heard(events: list[Any]) -> bool:
        seen = delivered(events)
        return len(seen["released"]) + len(seen["withheld"]) >= values

    return {b: delivered(await inbox_until(c, b, heard)) for b in ("alice", "bob")}


def test_window_accounting_end_to_end(market: Market) -> None:
    w1 = market.start_worker()
    market.open_accounts("seller1", "alice", "bob", "carol")
    base = now_ms() // W * W  # the current window's start: every value below is in the past

    async def first(c: MarketClient) -> Any:
        entry = await c.register(reg())
        assert not isinstance(entry, Rejection), entry
        for who, level in (("alice", 1.0), ("bob", 0.5)):
            got = await buy(c, who, "home", target_level=level, max_price_minor=1000)
            assert isinstance(got, PurchaseFulfilled), got
        for i in range(4):  # costs 1, 1, then 0.5 (bob only), then nothing fits
            await c.publish(
                "home", [20.0, 21.0, float(i)], value_id=f"v{i}", published_at_ms=base + i
            )
        market.wait_ingested("home", 4)
        over = await buy(c, "carol", "home", target_level=2.0, max_price_minor=1000)
        q = await c.quote("home", party=party("carol"))
        return over, q, await inboxes(c, 4)

    over, q, seen = market.run(first)
    assert seen["alice"] == {"released": ["v0", "v1"], "withheld": ["v2", "v3"]}
    assert seen["bob"] == {"released": ["v0", "v1", "v2"], "withheld": ["v3"]}
    assert isinstance(over, Rejection) and over.reason == "privacy_window_full"
    assert over.details["window"]["headroom"] == 0.0 and "no level fits now" in over.message
    assert isinstance(q, QuoteAnswer) and q.privacy_window is not None
    assert {o.level: o.fits_window for o in q.offers} == {0.5: False, 1.0: False, 2.0: False}
    assert w1.metric("emarket_privacy_window_spent", {"stream": "home", "unit": "epsilon"}) == 2.5
    assert w1.metric("emarket_privacy_window_headroom", {"stream": "home"}) == 0.0
    assert w1.metric("emarket_privacy_window_cap", {"stream": "home"}) == 2.5
    assert w1.metric("emarket_deliveries_withheld_total", {"stream": "home"}) == 3
    assert w1.metric("emarket_rejections_total", {"reason": "privacy_window_full"}) == 1

    w1.stop()  # the sums live in the stream's table: a new worker goes on from them
    w2 = market.start_worker()
    led = market.ledger()["home"]
    assert led["privacy_unit"] == "window"
    assert led["privacy_window"]["spent_by_window_start_ms"] == {str(base): 2.5}

    async def after(c: MarketClient) -> Any:
        await c.publish("home", [1.0, 1.0, 1.0], value_id="v4", published_at_ms=base + 4)
        await c.publish("home", [1.0, 1.0, 1.0], value_id="n0", published_at_ms=base + W)
        market.wait_ingested("home", 6)
        return await inboxes(c, 6)

    seen = market.run(after)
    assert seen["alice"] == {"released": ["v0", "v1", "n0"], "withheld": ["v2", "v3", "v4"]}
    assert seen["bob"] == {"released": ["v0", "v1", "v2", "n0"], "withheld": ["v3", "v4"]}
    assert market.ledger()["home"]["privacy_window"]["spent_by_window_start_ms"] == {
        str(base): 2.5,
        str(base + W): 1.0,
    }
    assert w2.metric("emarket_privacy_window_spent", {"stream": "home"}) == 1.0
    assert w2.metric("emarket_privacy_window_headroom", {"stream": "home"}) == 1.5
