"""Reservations on the real broker and a real worker, in one walk: a reservation holds its room
against other buyers (who may fill what is left of the window, and no more), lapses by the
market's clock and releases its room, is one per buyer and stream, survives a restart, the
purchase naming it gets exactly its terms, and a rolled-back record does not bring it back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from streams.clients.client import MarketClient, now_ms
from streams.wire.events import (
    LinearLevelSpec,
    PurchaseFulfilled,
    Rejection,
    Reservation,
)

from ..conftest import Market
from ..helpers import buy, party
from ..worker.test_forged_state import append, opened, read_changelog, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]
W = 600_000  # ten-minute windows: the next one starts less than the allowed clock skew ahead
CAROL_HOLD_MS = 6_000


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
        "window": {"duration_ms": W, "cap": 3.0},
    }


async def reserve(c: MarketClient, who: str, rid: str, **kw: Any) -> Any:
    return await c.reserve("home", reservation_id=rid, party=party(who), **kw)


def test_a_reservation_holds_lapses_is_bounded_and_survives_a_restart(market: Market) -> None:
    w1 = market.start_worker()
    market.open_accounts("seller1", "alice", "bob", "carol")
    base = now_ms() // W * W
    got = market.run(lambda c: before_the_restart(c, market, base))
    carol, early, late = got["carol"], got["alice_early"], got["carol_late"]
    assert isinstance(carol, Reservation) and [h.room for h in carol.held] == [2.0], carol
    assert isinstance(early, Rejection) and early.reason == "privacy_window_full", early
    assert isinstance(late, Rejection) and late.reason == "reservation_expired", late
    assert late.details["expired_at_ms"] == carol.expires_at_ms
    alice = got["alice"]
    assert isinstance(alice, Reservation), alice
    assert (alice.level_before, alice.level_after, alice.price_minor) == (0.0, 1.0, 100)
    assert isinstance(got["again"], Rejection) and got["again"].reason == "reservation_limit"
    assert isinstance(got["bob"], PurchaseFulfilled), got["bob"]
    bob_more = got["bob_more"]
    assert isinstance(bob_more, Rejection) and bob_more.reason == "privacy_window_full", bob_more
    bought = got["alice_bought"]
    assert isinstance(bought, PurchaseFulfilled), bought
    assert (bought.level_after, bought.price_minor) == (1.0, 100)
    assert isinstance(got["bob_holds"], Reservation) and got["bob_holds"].price_minor == 50
    assert w1.metric("emarket_reservations_held", {"stream": "home"}) == 1
    assert w1.metric("emarket_rejections_total", {"reason": "reservation_limit"}) == 1
    assert market.ledger()["home"]["reservations_held"] == 1  # bob's

    # a stranger appends the stream's record from while alice's reservation was held; bob's
    # reservation lives in the stream's record: the worker started next holds it
    rollback = old_record_while_held(market, "a1")
    w1.stop()
    market.run(lambda c: append(market, "streams", [rollback]))
    w2 = market.start_worker()
    wait_for(
        "the old record refused",
        lambda: (
            market.metric("emarket_state_records_refused_total", reason="older", store="streams")
            >= 1
        ),
    )

    async def after(c: MarketClient) -> tuple[Any, Any]:
        again = await buy(
            c, "alice", "home", target_level=1.0, max_price_minor=100, reservation_id="a1"
        )
        bob = await buy(c, "bob", "home", max_price_minor=50, reservation_id="b1")
        return again, bob

    again, bob = market.run(after)
    assert isinstance(again, Rejection) and again.reason == "reservation_used", again
    assert isinstance(bob, PurchaseFulfilled) and bob.level_after == 1.0, bob
    window = market.ledger()["home"]["privacy_window"]["spent_by_window_start_ms"]
    # bob's 0.5 on both values (1.0), then alice's 1.0 adds 0.5 on each: her room held 2.0 and
    # what bob released meanwhile covered half of it; bob's step to 1.0 then adds nothing
    assert window == {str(base): 2.0}
    assert w2.metric("emarket_reservations_held", {"stream": "home"}) == 0


async def before_the_restart(c: MarketClient, market: Market, base: int) -> dict[str, Any]:
    """Carol's reservation holds, then lapses; alice's holds against bob, who fills the rest
    of the window; alice buys on hers; bob reserves the next step."""
    entry = await c.register(reg())
    assert not isinstance(entry, Rejection), entry
    for i in range(2):
        await c.publish("home", [20.0, 21.0, float(i)], value_id=f"v{i}", published_at_ms=base)
    market.wait_ingested("home", 2)
    out: dict[str, Any] = {}
    # carol holds 2.0 of the window's 3.0 for a few seconds: alice's reservation, asked next,
    # does not fit (the hold must outlast a busy machine's delay between the two answers)
    out["carol"] = await reserve(c, "carol", "c1", target_level=1.0, hold_ms=CAROL_HOLD_MS)
    out["alice_early"] = await reserve(c, "alice", "a0", target_level=1.0, hold_ms=120_000)
    while now_ms() <= out["carol"].expires_at_ms:  # the market's clock passes its expiry
        await asyncio.sleep(0.05)
    out["carol_late"] = await buy(
        c, "carol", "home", target_level=1.0, max_price_minor=1000, reservation_id="c1"
    )
    out["alice"] = await reserve(c, "alice", "a1", target_level=1.0, hold_ms=120_000)
    out["again"] = await reserve(c, "alice", "a2", hold_ms=120_000)
    # bob fills the rest of the window; one step more would eat alice's room
    out["bob"] = await buy(c, "bob", "home", target_level=0.5, max_price_minor=1000)
    out["bob_more"] = await buy(c, "bob", "home", target_level=1.0, max_price_minor=1000)
    out["alice_bought"] = await buy(
        c, "alice", "home", target_level=1.0, max_price_minor=100, reservation_id="a1"
    )
    out["bob_holds"] = await reserve(c, "bob", "b1", hold_ms=120_000)
    return out


def old_record_while_held(market: Market, rid: str) -> Any:
    """The stream's last changelog record in which reservation ``rid`` was held, to append
    again (what anyone who reads the changelog can do)."""
    records = market.run(lambda c: read_changelog(market, "streams"))

    def holds(r: Any) -> bool:
        plain = opened("streams", r) if r.key == b"home" and r.value is not None else None
        kept = json.loads(plain)["reservations"] if plain else []
        return any(h["reservation_id"] == rid and h["status"] == "held" for h in kept)

    held = [r for r in records if holds(r)]
    old = held[-1]
    return (old.key, old.value, list(old.headers), old.partition)
