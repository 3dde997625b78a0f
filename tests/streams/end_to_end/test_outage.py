"""Broker outages: the worker reports them, holds its batch, and recovers by itself."""

from __future__ import annotations

import os
import signal
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streams.broker.embedded import EmbeddedBroker
from streams.clients.client import MarketClient, now_ms
from streams.wire.events import LinearLevelSpec, PurchaseFulfilled

from .. import helpers
from ..conftest import Market
from ..helpers import buy

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A broker of this test's own: pausing or restarting it must not disturb other tests."""
    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as b:
        yield b


def health(w: Any) -> tuple[int, dict[str, Any] | None]:
    try:
        return 200, w.get("/health", timeout=5)
    except urllib.error.HTTPError as exc:
        return exc.code, None


def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def reg() -> dict[str, Any]:
    return dict(
        stream_id="s",
        mechanism="laplace",
        sensitivity=1.0,
        dimension=2,
        steps=[0.5, 1.0, 2.0],
        cap=2.0,
        retain_last=50,
        pricing=LinearLevelSpec(rate_per_level=10.0),
    )


def test_paused_broker_is_reported_and_nothing_acknowledged_is_lost(
    own_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    market = Market(own_broker, tmp_path)
    try:
        w = market.start_worker()
        market.open_accounts("seller1", *(f"b{b}" for b in range(5)))
        t0 = now_ms()

        async def before(c: MarketClient) -> None:
            await c.register(reg())
            for i in range(20):
                await c.publish("s", [1.0, float(i)], value_id=f"v{i}")
            for b in range(5):  # acknowledged by the broker before the outage
                payload = helpers.purchase(
                    "s",
                    f"b{b}",
                    f"p{b}",
                    max_price=100,
                    market=market.topics.prefix,
                    requested_at_ms=t0,
                )
                await c.send(market.topics.purchases, "s", payload)

        market.run(before)
        assert own_broker.pid is not None
        os.kill(own_broker.pid, signal.SIGSTOP)  # the broker stops answering: an outage
        try:
            wait_for(lambda: health(w)[0] == 503, 20, "/health to report the outage")
            assert w.alive()
            assert "unreachable" in Path(w.log_path or "").read_text()  # type: ignore[arg-type]
        finally:
            os.kill(own_broker.pid, signal.SIGCONT)
        wait_for(lambda: health(w)[0] == 200, 30, "/health to recover")
        assert "reachable again" in Path(w.log_path or "").read_text()  # type: ignore[arg-type]
        assert w.metric("emarket_broker_up") == 1

        async def after(c: MarketClient) -> list[Any]:
            outs = []
            for b in range(5):
                outs.append(
                    await buy(
                        c,
                        f"b{b}",
                        "s",
                        max_price_minor=100,
                        purchase_id=f"p{b}",
                        resend_every=20,
                        timeout=60,
                        requested_at_ms=t0,
                    )
                )
            return outs

        outs = market.run(after)
        # values and purchases are separate topics: a purchase covers the values ingested
        # before it; none of the 25 events sent before the outage may be lost
        assert all(isinstance(o, PurchaseFulfilled) for o in outs), outs
        assert w.metric("emarket_values_ingested_total", {"status": "accepted"}) == 20
        assert w.metric("emarket_purchases_total", {"outcome": "fulfilled"}) == 5
    finally:
        market.stop()


def test_broker_restart_is_survived_and_documented_loss(
    own_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """The in-memory broker loses everything on restart (documented); the worker process must
    report the outage, survive it and reconnect without manual action."""
    market = Market(own_broker, tmp_path)
    try:
        w = market.start_worker()
        market.open_accounts("seller1")
        market.run(lambda c: c.register(reg()))
        own_broker.stop()
        wait_for(lambda: health(w)[0] == 503, 20, "/health to report the outage")
        own_broker.start()
        wait_for(lambda: health(w)[0] == 200, 30, "/health to recover")
        assert w.alive()
    finally:
        market.stop()
