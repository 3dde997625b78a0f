"""Two workers share the streams; a cap holds under racing buyers and a worker's death."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from streams.clients.client import MarketClient
from streams.wire.events import LinearLevelSpec, PurchaseFulfilled, Rejection

from ..conftest import Market
from ..helpers import buy

pytestmark = [pytest.mark.broker, pytest.mark.slow]

STREAMS = [f"s{i}" for i in range(6)]
BUYERS = 2  # racing each other on every stream, each at every target
CAP = 2.0


def reg(stream: str) -> dict[str, Any]:
    return dict(
        stream_id=stream,
        mechanism="gaussian",
        sensitivity=1.0,
        dimension=2,
        steps=[0.5, 1.0, CAP],
        cap=CAP,
        retain_last=5,
        pricing=LinearLevelSpec(rate_per_level=10.0),
    )


def test_two_workers_racing_buyers_never_exceed_the_cap(market: Market) -> None:
    w1 = market.start_worker()
    w2 = market.start_worker()
    market.open_accounts("seller1", *(f"u{b}" for b in range(BUYERS)))

    async def setup(c: MarketClient) -> None:
        for s in STREAMS:
            entry = await c.register(reg(s))
            assert not isinstance(entry, Rejection)
        for s in STREAMS:
            for i in range(5):
                await c.publish(s, [float(i), 1.0], value_id=f"v{i}")

    market.run(setup)
    for s in STREAMS:
        market.wait_ingested(s, 5)
    owned = [set(w.get("/ledger", token=market.operator_token())["streams"]) for w in (w1, w2)]
    assert owned[0] and owned[1] and not owned[0] & owned[1], owned  # scaled out by stream

    targets = [0.5, 1.0, 1.5, CAP, CAP + 0.5, 3.0, 1e6]

    async def race(c: MarketClient) -> list[Any]:
        async def one(buyer: str, stream: str, target: float) -> Any:
            return await buy(
                c,
                buyer,
                stream,
                target_level=target,
                max_price_minor=10**9,
                resend_every=8,
                timeout=90,
            )

        jobs = [one(f"u{b}", s, t) for b in range(BUYERS) for s in STREAMS for t in targets]
        results = []
        for i in range(0, len(jobs), 16):  # 16 purchases in flight at a time
            if i == 48:
                w1.kill()  # a worker dies mid-race; its streams move to the survivor
            results += await asyncio.gather(*jobs[i : i + 16])
        return results

    results = market.run(race)
    asked = [(f"u{b}", s, t) for b in range(BUYERS) for s in STREAMS for t in targets]
    fulfilled = [r for r in results if isinstance(r, PurchaseFulfilled)]
    rejected = [r for r in results if isinstance(r, Rejection)]
    assert len(fulfilled) + len(rejected) == len(results)
    reasons = collections.Counter(r.reason for r in rejected)
    assert set(reasons) <= {"level_above_cap", "level_not_for_sale", "already_held"}, reasons
    assert (
        reasons["level_above_cap"] == BUYERS * len(STREAMS) * 3
    )  # the three targets above the cap
    assert reasons["level_not_for_sale"] == BUYERS * len(STREAMS)  # 1.5 is not a step
    # the steps of one buyer race each other: a step that arrives after a higher one was
    # fulfilled is refused as already held (never charged), and says what the buyer holds
    for (_, _, target), r in zip(asked, results, strict=True):
        if isinstance(r, Rejection) and r.reason == "already_held":
            assert target in (0.5, 1.0, CAP) and r.details["held_level"] >= target, (target, r)
    top = {(r.buyer_id, r.stream_id) for r in fulfilled if r.level_after == CAP}
    assert top == {(b, s) for b, s, _ in asked}  # every buyer reached the cap on every stream
    assert max(r.level_after for r in fulfilled) == CAP
    assert all(rel.level <= CAP for r in fulfilled for rel in r.releases)
    ledger = w2.get("/ledger", token=market.operator_token())["streams"]
    assert set(ledger) == set(STREAMS)  # the survivor recovered every stream
    assert all(s["privacy_spent"] <= CAP for s in ledger.values())
    # one lossless process per value: every (stream, value, level) has one vector
    seen: dict[tuple[str, str, float], set[tuple[float, ...]]] = collections.defaultdict(set)
    for r in fulfilled:
        for rel in r.releases:
            seen[(r.stream_id, rel.value_id, rel.level)].add(tuple(rel.values))
    assert all(len(v) == 1 for v in seen.values())
