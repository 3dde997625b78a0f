"""A genuine, older record of a stream with a per-buyer share appended again to the streams
changelog (a stranger may write any topic of the embedded broker): the count of a window's
values it carries is lower, which would reopen a buyer's share of the window. It must not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streams.clients.client import MarketClient, now_ms
from streams.wire.events import DeliveriesWithheld, LinearLevelSpec, Rejection, ValueReleased

from ..conftest import Market
from ..helpers import buy, inbox_until
from ..worker.test_forged_state import append, opened, read_changelog, wait_for
from ..worker.test_history import refused

pytestmark = [pytest.mark.broker, pytest.mark.slow]

W = 600_000


def shared_stream() -> dict[str, Any]:
    """One buyer may use half of a window's cap of 1: one value at 0.5."""
    return {
        "stream_id": "q",
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 3,
        "steps": [0.5],
        "cap": 1.0,
        "retain_last": 4,
        "pricing": LinearLevelSpec(rate_per_level=100.0),
        "privacy_unit": "window",
        "window": {"duration_ms": W, "cap": 1.0},
        "buyer_share": 0.5,
    }


def released(events: list[Any]) -> list[str]:
    return [r.value_id for e in events if isinstance(e, ValueReleased) for r in e.releases]


def withheld(events: list[Any]) -> list[str]:
    return [v for e in events if isinstance(e, DeliveriesWithheld) for v in e.value_ids]


def test_an_older_stream_record_appended_again_reopens_no_share(market: Market) -> None:
    market.start_worker()
    market.open_accounts("seller1", "alice")
    base = now_ms() // W * W

    async def before(c: MarketClient) -> Any:
        assert not isinstance(await c.register(shared_stream()), Rejection)
        bought = await buy(c, "alice", "q", target_level=0.5, max_price_minor=1000)
        await c.publish("q", [1.0, 2.0, 3.0], value_id="v0", published_at_ms=base)
        return bought

    assert not isinstance(market.run(before), Rejection)
    market.wait_ingested("q", 1)
    stale = [r for r in market.run(lambda c: read_changelog(market, "streams")) if r.key == b"q"]

    async def second(c: MarketClient) -> list[Any]:
        await c.publish("q", [1.0, 2.0, 3.0], value_id="v1", published_at_ms=base + 1)
        return await inbox_until(c, "alice", lambda evs: "v1" in withheld(evs) + released(evs))

    told = market.run(second)
    assert released(told) == ["v0"] and withheld(told) == ["v1"]  # the share: one value
    market.stop_workers()
    old = stale[-1]  # the record after v0: one value counted
    assert json.loads(opened("streams", old) or b"{}")["window_values"] == {str(base // W): 1}
    market.run(
        lambda c: append(
            market, "streams", [(old.key, old.value, list(old.headers), old.partition)]
        )
    )
    market.start_worker()

    async def third(c: MarketClient) -> list[Any]:
        await c.publish("q", [1.0, 2.0, 3.0], value_id="v2", published_at_ms=base + 2)
        return await inbox_until(c, "alice", lambda evs: "v2" in withheld(evs) + released(evs))

    told = market.run(third)
    assert "v2" not in released(told), f"the rollback reopened alice's share: {told}"
    wait_for("the rollback counted", lambda: refused(market, "older", "streams") >= 1)
    led = market.ledger()["q"]
    assert led["privacy_window"]["spent_by_window_start_ms"] == {str(base): 0.5}, led
