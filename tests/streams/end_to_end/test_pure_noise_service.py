"""Forgetting is harmless, on the real broker with real workers.

* The seller's attack of issue #12: make the market forget a value, publish it again — the
  subscription delivers the very same level-2 release and the stream's privacy spent is
  unchanged.
* Two markets with no state in common but the same secret, fed the same events, emit the same
  bytes: every release and every purchase outcome (a second worker racing on a value can only
  produce the same vector).
* A worker started with another noise secret refuses to start rather than re-noise.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streams.clients.client import MarketClient, TopicReader
from streams.wire.events import LinearLevelSpec

from ..conftest import Market
from ..helpers import buy

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DAY = 86_400_000
SECRET = {
    "EMARKET_NOISE_SECRET": base64.b64encode(b"shared noise secret, 32 bytes!!!").decode(),
    "EMARKET_SIGNING_KEY": base64.b64encode(bytes(range(32))).decode(),
}


def reg(stream: str, dim: int, steps: list[float], retain: int) -> dict[str, Any]:
    return dict(
        stream_id=stream,
        mechanism="laplace",
        sensitivity=1.0,
        dimension=dim,
        steps=steps,
        cap=steps[-1],
        retain_last=retain,
        pricing=LinearLevelSpec(rate_per_level=100.0),
    )


async def buyer_events(c: MarketClient, topic: str) -> list[dict[str, Any]]:
    reader = TopicReader(c.bootstrap, topic)
    await reader.start()
    out: list[dict[str, Any]] = []
    try:
        while batch := await reader.poll(1.0):
            out += [json.loads(v) for _, v in batch]
    finally:
        await reader.stop()
    return out


def test_forgotten_value_resent_by_the_seller_is_not_renoised(market: Market) -> None:
    w = market.start_worker()
    market.open_accounts("seller1", "b")
    now = time.time_ns() // 1_000_000
    dim = 20_000
    x = list(np.random.default_rng(5).normal(20.0, 2.0, dim))  # the seller's data, not noise

    async def go(c: MarketClient) -> list[dict[str, Any]]:
        await c.register(reg("s", dim, [1.0, 2.0, 4.0], 1))
        # V is 7 days old minus 30 minutes: still inside the horizon
        await c.publish("s", x, value_id="V", published_at_ms=now - 7 * DAY + 1_800_000)
        market.wait_ingested("s", 1)
        for step in (1.0, 2.0):
            out = await buy(c, "b", "s", target_level=step, max_price_minor=10**6)
            assert out.type == "purchase_fulfilled", out
        # W from 50 minutes in the future (inside the clock skew): V is evicted and forgotten
        await c.publish("s", [0.0] * dim, value_id="W", published_at_ms=now + 3_000_000)
        market.wait_ingested("s", 2)
        # ...and V is sent again, restamped as `publish --value-id V` used to do
        await c.publish("s", x, value_id="V", published_at_ms=now)
        market.wait_ingested("s", 3)
        return await buyer_events(c, market.topics.inbox("b"))

    events = market.run(go)
    level2 = [
        tuple(r["values"])
        for e in events
        for r in e.get("releases", [])
        if r["value_id"] == "V" and r["level"] == 2.0
    ]
    assert len(level2) == 2  # the purchase, then the subscription delivery of the resend
    assert level2[0] == level2[1], "a released level was sampled again"
    assert market.ledger()["s"]["privacy_spent"] == 2.0
    assert w.metric("emarket_values_ingested_total", {"status": "accepted"}) == 3


def _second_market(market: Market, tmp: Path) -> Market:
    tmp.mkdir(parents=True, exist_ok=True)
    return Market(market.broker, tmp)  # its own prefix, app id and data directory


def test_same_events_same_secret_same_bytes_without_shared_state(
    market: Market, tmp_path: Path
) -> None:
    """Market B shares nothing with market A but the secret: fed A's event log (values, then
    purchases in other orders), it emits the identical releases and purchase outcomes."""
    b_market = _second_market(market, tmp_path / "b")
    try:
        market.start_worker_env(SECRET)
        b_market.start_worker_env(SECRET)
        for m in (market, b_market):
            m.open_accounts("seller1", "x", "y", "z")
        t0 = time.time_ns() // 1_000_000

        async def feed(m: Market, order: list[tuple[str, float]]) -> list[dict[str, Any]]:
            async with m.client() as c:
                await c.register(reg("s", 30, [0.5, 1.0, 2.0, 4.0], 5))
                for i in range(5):
                    await c.publish(
                        "s", list(np.arange(30.0) * i), value_id=f"v{i}", published_at_ms=t0
                    )
                m.wait_ingested("s", 5)
                for buyer, level in order:
                    await buy(
                        c,
                        buyer,
                        "s",
                        target_level=level,
                        max_price_minor=10**6,
                        purchase_id=f"{buyer}-{level:g}".replace(".", "_"),
                        requested_at_ms=t0,
                    )
                buyers = sorted({b for b, _ in order})
                return [e for b in buyers for e in await buyer_events(c, m.topics.inbox(b))]

        a = asyncio.run(feed(market, [("x", 0.5), ("x", 1.0), ("x", 4.0), ("y", 2.0)]))
        # B: other buyers first, and z buys the top level directly
        b = asyncio.run(
            feed(b_market, [("y", 2.0), ("z", 4.0), ("x", 0.5), ("x", 1.0), ("x", 4.0)])
        )
    finally:
        b_market.stop()
    releases: dict[tuple[str, float], set[tuple[float, ...]]] = collections.defaultdict(set)
    outcomes: dict[str, set[str]] = collections.defaultdict(set)
    for e in a + b:
        for r in e.get("releases", []):
            releases[(r["value_id"], r["level"])].add(tuple(r["values"]))
        if e["type"] == "purchase_fulfilled" and e["buyer_id"] != "z":
            outcomes[e["purchase_id"]].add(json.dumps(e, sort_keys=True))
    assert len(releases) == 5 * 4 and all(len(v) == 1 for v in releases.values())
    # x and y made the same purchases in both markets: receipts and all, byte for byte
    assert len(outcomes) == 4 and all(len(v) == 1 for v in outcomes.values()), outcomes.keys()


def test_worker_with_another_secret_refuses_to_start(market: Market) -> None:
    market.start_worker()
    other = {"EMARKET_NOISE_SECRET": base64.b64encode(b"x" * 32).decode()}
    with pytest.raises(RuntimeError, match="exited with status 6"):
        market.start_worker_env(other)
    log = market.logs()
    assert "noise secret" in log and "EMARKET_NOISE_SECRET" in log
