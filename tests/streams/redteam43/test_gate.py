"""Attacks on the one gate (streams/core/ledger.py: ``PrivacyLedger.sell``, ``deliver``): a
release that fails half way must leave no spend and no charge, a refusal must charge nothing,
and a release beyond what the gate let through must not be recorded as less."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest

from market import MarketError
from streams.core import purchases
from streams.core.ledger import Made
from streams.core.state import ValueEntry

from ..helpers import quote
from .market import NOW, T, buy, publish, received, refusal, state, windowed
from .test_shares import ledger_fields


class Boom(Exception):
    """What a release raises half way (after it computed and sealed some of its output)."""


def test_a_purchase_whose_release_raises_records_nothing() -> None:
    c = windowed([0.1, 0.5], 0.5, 1.0)
    for i in range(2):
        publish(c, f"v{i}", i)
    assert buy(c, "bob", "b1", 0.1).status == "fulfilled"
    before = ledger_fields(c)

    def release() -> NoReturn:
        raise Boom

    with c.streams.event():
        stream = c.streams.load("s")
        with pytest.raises(Boom):
            stream.ledger.sell("alice", stream.ledger.level(0.5), 50, release)
        with pytest.raises(Boom):
            stream.ledger.sell("bob", stream.ledger.level(0.5), 40, release)
    assert ledger_fields(c) == before


def test_a_delivery_whose_release_raises_records_nothing() -> None:
    c = windowed([0.1, 0.5], 0.5, 1.0, buyer_share=1.0)
    assert buy(c, "alice", "a1", 0.5).status == "fulfilled"
    publish(c, "v0", 0)
    before = ledger_fields(c)
    with c.streams.event():
        stream = c.streams.load("s")
        ledger = stream.ledger

        def release(fits: frozenset[Any]) -> Made[None]:
            stream.state.window.append(
                ValueEntry(value_id="v1", seq=9, digest="d", received_at_ms=1, published_at_ms=1)
            )
            raise Boom

        with pytest.raises(Boom):
            ledger.deliver(1, ledger.level(0.0), {ledger.level(0.5)}, release, new=True)
        stream.state.window.pop()  # the caller's own write, undone: the ledger's must be none
    assert ledger_fields(c) == before


def test_a_delivery_beyond_what_the_gate_let_through_is_not_recorded() -> None:
    """A product that releases a level the window has no room for is stopped, and the
    overspend is not recorded as a smaller one."""
    c = windowed([0.1, 0.5], 0.5, 1.0)
    assert buy(c, "alice", "a1", 0.5).status == "fulfilled"
    publish(c, "v0", 0)
    publish(c, "v1", 1)  # the window is full
    before = ledger_fields(c)
    with c.streams.event():
        stream = c.streams.load("s")
        ledger = stream.ledger
        entry = ValueEntry(value_id="v2", seq=9, digest="d", received_at_ms=2, published_at_ms=2)

        def release(fits: frozenset[Any]) -> Made[None]:
            assert not fits
            return Made(entry, [0.5], None)  # released anyway

        with pytest.raises(AssertionError):
            ledger.deliver(2, ledger.level(0.0), {ledger.level(0.5)}, release, new=True)
    assert ledger_fields(c) == before


def test_a_purchase_failing_half_way_through_the_core_charges_and_spends_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The purchase's release made every value's release, then failed signing its receipt: the
    buyer is refused and nothing is charged or spent; bought again, it is charged once."""
    c = windowed([0.1, 0.5], 0.5, 1.0)
    for i in range(2):
        publish(c, f"v{i}", i)
    before = ledger_fields(c)

    def fail(*args: Any, **kw: Any) -> NoReturn:
        raise MarketError("the signing key is gone")

    with monkeypatch.context() as m:
        m.setattr(purchases, "sign_receipt", fail)
        assert "gone" in refusal(buy(c, "alice", "a1", 0.5)).message
    assert ledger_fields(c) == before
    assert buy(c, "alice", "a2", 0.5).status == "fulfilled"
    st = state(c)
    assert (st.holders["alice"].paid_minor, st.revenue_minor) == (50, 50)
    assert st.window_spent_nano == {0: 1_000_000_000}


def test_a_refused_purchase_charges_and_spends_nothing() -> None:
    c = windowed([0.1, 0.5], 0.5, 1.0, buyer_share=1.0)
    assert buy(c, "alice", "a1", 0.5).status == "fulfilled"
    publish(c, "v0", 0)
    publish(c, "v1", 1)
    assert buy(c, "bob", "b1", 0.1).status == "fulfilled"  # no new spend, charged 10
    before = ledger_fields(c)
    out = publish(c, "v2", 2)
    assert received(out, "bob") == ["deliveries_withheld"]
    assert ledger_fields(c)[:3] == before[:3]  # no holder, revenue or stream spend moved
    mid = ledger_fields(c)
    for i, (buyer, level) in enumerate((("carol", 0.1), ("bob", 0.5), ("carol", 0.5))):
        assert refusal(buy(c, buyer, f"r{i}", level)).reason == "privacy_window_full"
    assert ledger_fields(c) == mid


def test_quotes_and_the_predicates_change_nothing() -> None:
    """The checks a quote runs (and the ledger's predicates) are the gate's, without its
    writes: asking them, for every buyer and level, moves no spend, count or charge."""
    c = windowed([0.1, 0.5], 0.5, 1.0, buyer_share=1.0)
    assert buy(c, "alice", "a1", 0.1).status == "fulfilled"
    publish(c, "v0", 0)
    before = ledger_fields(c)
    for i, buyer in enumerate(("alice", "bob")):
        for j, level in enumerate((None, 0.1, 0.5)):
            kw: dict[str, Any] = {"requested_at_ms": NOW}
            if level is not None:
                kw["target_level"] = level
            out = c.handle(T.purchases, quote("s", buyer, f"q{i}{j}", **kw))
            assert out.status in ("answered", "accepted", "fulfilled"), out.status
    with c.streams.event():
        ledger = c.streams.load("s").ledger
        levels = [ledger.level(lv) for lv in (0.1, 0.5, 1e-9)]
        ledger.fitting_purchase(levels)
        ledger.fitting_purchase(levels, fresh=True)
        ledger.over_share(0.5, 0)
        ledger.room("alice", 0)
    assert ledger_fields(c) == before
