"""Attacks on per-buyer shares (docs/protocol.md §6.3.1, streams/core/quotas.py): a buyer
exceeding its share at the edge, by many decimals, by a resend, by a second account, by an
upgrade, as a fresh buyer, and registrations whose share rounds to nothing or past 1."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from math import floor
from typing import Any

import pytest

from market.privacy_units import cap_of, spend_of
from streams.core.quotas import share_of
from streams.wire.events import StreamRegistration

from ..helpers import market_core, registration, value
from .market import T, buy, core, publish, received, refusal, state, windowed

SHARED = {"buyer_share": 0.5}


def ledger_fields(c: Any) -> tuple[Any, ...]:
    """What a release or a charge writes in the stream's record."""
    st = state(c)
    return (
        {b: h.model_dump() for b, h in st.holders.items()},
        st.revenue_minor,
        st.spent_nano,
        dict(st.window_spent_nano),
        dict(st.window_values),
        [e.level for e in st.window],
    )


def got(outcomes: list[Any], who: str) -> int:
    return sum(received(o, who).count("value_released") for o in outcomes)


def test_a_share_is_the_exact_floor_of_share_times_cap() -> None:
    """§6.3.1: the share is ⌊s·⌊cap⌋⌋, s read from its canonical decimal. With s =
    0.596287174529407 and a cap of 123456.789123457 that is 73615699962898 nano-units; a level
    one nano above it (73615.699962899) must be refused. (quotas._part multiplies Decimals in
    the default 28-digit context, which rounds the 30-digit product up across an integer.)"""
    s, cap = 0.596287174529407, 123456.789123457
    exact = floor(Fraction(Decimal(repr(s))) * cap_of(cap))
    assert exact == 73615699962898
    c = core(steps=[1.0, 73615.699962899], cap=cap, buyer_share=s)
    share = share_of(state(c).registration)
    assert share is not None
    out = buy(c, "alice", "a1", 73615.699962899)
    assert spend_of(73615.699962899) == exact + 1
    assert out.status == "rejected", "a level above the buyer's exact share was sold"
    assert share.of_cap == exact


def test_a_level_equal_to_the_share_fits_and_one_value_more_is_withheld() -> None:
    """Share 0.5 of a cap of 1 and of a window cap of 1: 0.5 is sold exactly (0.5000000001 is
    not, as the stream's share); at 0.1 a buyer gets exactly five values of a window."""
    c = windowed([0.1, 0.5, 0.5000000001], 0.5000000001, 1.0, **SHARED)
    assert refusal(buy(c, "bob", "b0", 0.5000000001)).reason == "buyer_quota_exceeded"
    assert buy(c, "alice", "a1", 0.1).status == "fulfilled"
    outs = [publish(c, f"v{i}", i) for i in range(7)]
    assert got(outs, "alice") == 5
    assert [received(o, "alice") for o in outs[5:]] == [["deliveries_withheld"]] * 2
    assert state(c).window_values == {0: 7}


def test_a_third_of_three_is_below_one_and_holds_nine_tenths() -> None:
    """0.3333333333333333 · 3 is 1.0 in doubles but 0.9999999999999999 exactly: a buyer at 0.1
    gets nine values of a window with cap 3, not ten."""
    c = windowed([0.1], 0.6, 3.0, buyer_share=0.3333333333333333)
    assert buy(c, "alice", "a1", 0.1).status == "fulfilled"
    outs = [publish(c, f"v{i}", i) for i in range(11)]
    assert got(outs, "alice") == 9


def test_a_resent_value_does_not_reach_a_buyer_past_its_share_or_count_twice() -> None:
    c = windowed([0.1], 0.2, 1.0, **SHARED)
    assert buy(c, "alice", "a1", 0.1).status == "fulfilled"
    outs = [publish(c, f"v{i}", i) for i in range(6)]  # the sixth is withheld
    assert got(outs, "alice") == 5
    for vid, at in (("v5", 5), ("v4", 4), ("v5", 5)):
        again = c.handle(T.values, value("s", vid, [1.0, 2.0, 3.0], published_at_ms=at))
        assert got([again], "alice") == 0 or vid == "v4"
    assert state(c).window_values == {0: 6}
    assert state(c).window_spent_nano == {0: 500_000_000}


def test_a_resent_purchase_is_neither_charged_nor_spent_again() -> None:
    c = windowed([0.1, 0.2], 0.4, 1.0, **SHARED)
    for i in range(2):
        publish(c, f"v{i}", i)
    assert buy(c, "alice", "a1", 0.2).status == "fulfilled"
    before = ledger_fields(c)
    for sent_at in (10**9, 10**9 + 1, 10**9 + 60_000):  # the same bytes, and signed anew
        again = buy(c, "alice", "a1", 0.2, requested_at_ms=sent_at)
        assert again.status == "duplicate"
    assert ledger_fields(c) == before


def test_an_upgrade_past_the_values_already_had_is_refused_and_charges_nothing() -> None:
    """At 0.05 a buyer had ten values of a window (its whole share of 0.5): buying 0.1 would
    count those ten at 0.1, twice the share."""
    c = windowed([0.05, 0.1], 0.2, 1.0, **SHARED)
    assert buy(c, "alice", "a1", 0.05).status == "fulfilled"
    outs = [publish(c, f"v{i}", i) for i in range(10)]
    assert got(outs, "alice") == 10
    before = ledger_fields(c)
    rej = refusal(buy(c, "alice", "a2", 0.1))
    assert rej.reason == "buyer_quota_exceeded" and rej.details["window"] is not None
    assert ledger_fields(c) == before


def test_a_fresh_buyer_gets_no_more_of_a_window_than_its_share() -> None:
    """A buyer holding nothing is counted with the retained values only (2 of 8): it buys at
    0.2, gets those two (0.4 of its 0.5), and then nothing more of the window."""
    c = windowed([0.2], 0.4, 1.0, retain_last=2, **SHARED)
    for i in range(8):
        publish(c, f"v{i}", i)
    bought = buy(c, "bob", "b1", 0.2)
    assert bought.status == "fulfilled"
    outs = [publish(c, f"w{i}", 8 + i) for i in range(3)]
    assert got(outs, "bob") == 0
    assert len(json.loads(bought.outputs[0].value)["releases"]) == 2  # 0.4 of its 0.5


def test_two_accounts_each_keep_their_share_and_together_the_window_cap() -> None:
    """A buyer opening a second account gets a second share (shares are per account, §6.3.1);
    each account stays within its own, and all of them together within the window's cap."""
    c = windowed([0.1, 0.2], 0.5, 1.0, buyer_share=0.4)
    assert buy(c, "alice", "a1", 0.1).status == "fulfilled"
    assert buy(c, "bob", "b1", 0.2).status == "fulfilled"  # the same person, a second account
    outs = [publish(c, f"v{i}", i) for i in range(8)]
    alice, bob = got(outs, "alice"), got(outs, "bob")
    assert (alice, bob) == (4, 2)
    assert state(c).window_spent_nano[0] <= cap_of(1.0)


@pytest.mark.parametrize("share", [5e-324, 1e-300, 1e-10, 0.09999999])
def test_a_share_leaving_less_than_the_lowest_step_is_refused(share: float) -> None:
    c = market_core("seller1", now=10**9)
    out = c.handle(T.registrations, registration("s", steps=[0.1, 1.0], cap=1.0, buyer_share=share))
    rej = refusal(out)
    assert rej.reason == "invalid_event" and "--buyer-share" in rej.message


@pytest.mark.parametrize("share", [1.0000000000000002, 2.0, 0.0, -0.5, "NaN", "Infinity"])
def test_a_share_outside_zero_to_one_is_refused_by_the_wire(share: Any) -> None:
    body = json.loads(registration("s", steps=[0.1, 1.0], cap=1.0, buyer_share=0.5))
    body["buyer_share"] = share
    with pytest.raises(ValueError):
        StreamRegistration.model_validate(body)
    c = market_core("seller1", now=10**9)
    assert c.handle(T.registrations, json.dumps(body).encode()).status == "rejected"


def test_a_subscriber_gets_no_value_beyond_its_exact_window_share() -> None:
    """The window's share ⌊0.2200000000000022 · 9090.909090909⌋ is 1999.999999999 exactly
    (in nano-units 1999999999999, the 30-digit product being 1999999999999.99…98): a holder
    of 100 may have 19 values of a window, not 20 (2000 > its share)."""
    s, window_cap = 0.2200000000000022, 9090.909090909
    exact = floor(Fraction(Decimal(repr(s))) * cap_of(window_cap))
    assert exact == 2 * 10**12 - 1
    c = windowed([100.0], 500.0, window_cap, retain_last=4, buyer_share=s)
    assert buy(c, "alice", "a1", 100.0).status == "fulfilled"
    outs = [publish(c, f"v{i}", i) for i in range(21)]
    assert got(outs, "alice") == 19, "a holder got more of a window than its exact share"
