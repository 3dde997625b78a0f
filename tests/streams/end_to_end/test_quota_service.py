"""Per-buyer quotas on the real broker and a real worker: a stream registered with a buyer share
shows it in the catalog, withholds deliveries from the holder beyond its share while another
still gets them, refuses a purchase beyond it with what fits and when (and then sells what
fits), counts both, and keeps what each window has used across a restart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streams.clients.client import MarketClient, now_ms
from streams.wire.events import (
    SCHEMAS,
    DeliveriesWithheld,
    LinearLevelSpec,
    PurchaseFulfilled,
    Rejection,
    ValueReleased,
)

from ..conftest import Market
from ..helpers import buy, inbox_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]
W = 600_000  # ten-minute windows: the next one starts less than the allowed clock skew ahead
ROOT = Path(__file__).resolve().parents[3]


def reg() -> dict[str, Any]:
    """One buyer may use half of each cap: 1 of the stream's cap of 2 and of each window's."""
    return {
        "stream_id": "home",
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 3,
        "steps": [0.25, 0.5, 1.0],
        "cap": 2.0,
        "retain_last": 8,
        "pricing": LinearLevelSpec(rate_per_level=100.0),
        "privacy_unit": "window",
        "window": {"duration_ms": W, "cap": 2.0},
        "buyer_share": 0.5,
    }


def delivered(events: list[Any]) -> dict[str, list[str]]:
    """Value ids released, and withheld with their reason, from one inbox."""
    out: dict[str, list[str]] = {"released": [], "withheld": []}
    for e in events:
        SCHEMAS["inbox"].validate_json(e.model_dump_json())
        if isinstance(e, ValueReleased):
            out["released"] += [r.value_id for r in e.releases]
        elif isinstance(e, DeliveriesWithheld):
            out["withheld"] += [f"{v}:{e.reason}" for v in e.value_ids]
    return out


async def inboxes(c: MarketClient, values: int) -> dict[str, dict[str, list[str]]]:
    """What alice and bob were delivered or told, once each has heard of ``values`` values."""

    def heard(events: list[Any]) -> bool:
        seen = delivered(events)
        return len(seen["released"]) + len(seen["withheld"]) >= values

    return {b: delivered(await inbox_until(c, b, heard)) for b in ("alice", "bob")}


def catalog_text(market: Market) -> str:
    """The catalog as a person reads it, from the CLI."""
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    return subprocess.run(
        [sys.executable, "-m", "streams", *pre, "catalog"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    ).stdout


Q = "buyer_quota_exceeded"


def test_buyer_shares_end_to_end(market: Market) -> None:
    w1 = market.start_worker()
    market.open_accounts("seller1", "alice", "bob", "carol")
    base = now_ms() // W * W  # the current window's start: every value below is in the past

    async def first(c: MarketClient) -> Any:
        entry = await c.register(reg())
        assert not isinstance(entry, Rejection), entry
        for who, level in (("alice", 0.5), ("bob", 0.25)):
            got = await buy(c, who, "home", target_level=level, max_price_minor=1000)
            assert isinstance(got, PurchaseFulfilled), got
        for i in range(3):  # alice: 0.5 twice is her share; bob: 3 × 0.25
            await c.publish(
                "home", [20.0, 21.0, float(i)], value_id=f"v{i}", published_at_ms=base + i
            )
        market.wait_ingested("home", 3)
        over = await buy(c, "carol", "home", target_level=0.5, max_price_minor=1000)
        other = await buy(c, "carol", "home", target_level=0.25, max_price_minor=1000)
        return over, other, await inboxes(c, 3)

    over, other, seen = market.run(first)
    assert seen["alice"] == {"released": ["v0", "v1"], "withheld": [f"v2:{Q}"]}
    assert seen["bob"] == {"released": ["v0", "v1", "v2"], "withheld": []}
    assert isinstance(over, Rejection) and over.reason == Q  # 3 × 0.5 = 1.5 > 1
    assert over.details["best_level"] == 0.25 and over.details["window"]["end_ms"] == base + W
    assert "the most accurate level that fits now is 0.25" in over.message
    assert "count against the next window" in over.message
    assert isinstance(other, PurchaseFulfilled)  # what fits her share, beside alice and bob
    assert "each buyer at most 50 % of the cap and of each window's cap" in catalog_text(market)
    assert w1.metric("emarket_buyer_quota_refusals_total", {"kind": "purchase"}) == 1
    assert w1.metric("emarket_buyer_quota_refusals_total", {"kind": "delivery"}) == 1

    w1.stop()  # the counts live in the stream's table: a new worker goes on from them
    market.start_worker()

    async def after(c: MarketClient) -> Any:
        for vid, at in (("v3", base + 3), ("v4", base + 4), ("n0", base + W)):
            await c.publish("home", [1.0, 1.0, 1.0], value_id=vid, published_at_ms=at)
        market.wait_ingested("home", 6)
        return await inboxes(c, 6)

    seen = market.run(after)
    assert seen["alice"] == {
        "released": ["v0", "v1", "n0"],
        "withheld": [f"v2:{Q}", f"v3:{Q}", f"v4:{Q}"],
    }
    assert seen["bob"] == {"released": ["v0", "v1", "v2", "v3", "n0"], "withheld": [f"v4:{Q}"]}
