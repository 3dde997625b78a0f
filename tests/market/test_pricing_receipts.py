"""Price schedules (property tests) and signed receipts (tamper tests)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from market import DiscreteLaplace, Gaussian, Laplace, Poisson, ReceiptError, ScheduleError
from market.errors import InvalidLevelError
from market.mechanisms import _precision
from market.pricing import LinearInLevel, LinearInPrecision, PriceTable, schedule_from_spec
from market.receipts import Receipt, commitment, key_id, sign_receipt, verify_receipt

MECHS = st.sampled_from([Laplace(1.0), Laplace(3.0), Gaussian(0.5), Poisson(2.0)])
SCHEDULES = st.one_of(
    st.builds(LinearInPrecision, st.floats(0, 1e4)),
    st.builds(LinearInLevel, st.floats(0, 1e4)),
)
LEVELS = st.floats(0.01, 20.0)


@settings(max_examples=200, deadline=None)
@given(mech=MECHS, sched=SCHEDULES, path=st.lists(LEVELS, min_size=1, max_size=10))
def test_stepwise_cost_equals_direct_cost(mech, sched, path) -> None:  # type: ignore[no-untyped-def]
    """Any path of upgrades costs exactly the direct price of its final level, to the cent."""
    held, paid = 0.0, 0
    for lv in path:
        paid += sched.step_price(mech, held, lv)
        held = max(held, lv)
    assert paid == sched.price(mech, held)


@settings(max_examples=200, deadline=None)
@given(mech=MECHS, sched=SCHEDULES, levels=st.lists(LEVELS, min_size=2, max_size=6))
def test_accepted_schedules_are_subadditive(mech, sched, levels) -> None:  # type: ignore[no-untyped-def]
    """Releases whose precisions add up to at least a target's never cost less than it."""
    *parts, target = levels
    assume(sum(mech.precision(p) for p in parts) >= mech.precision(target))
    assert sum(sched.price(mech, p) for p in parts) >= sched.price(mech, target)


def test_downgrade_is_free() -> None:
    s = LinearInLevel(100.0)
    assert s.step_price(Laplace(), 2.0, 1.0) == 0
    assert s.step_price(Laplace(), 2.0, 2.0) == 0


def test_prices_round_up_to_minor_units() -> None:
    assert LinearInLevel(10.0).price(Laplace(), 0.05) == 1  # 0.5 cents -> 1 cent
    assert LinearInLevel(10.0).price(Laplace(), 0.1) == 1  # exact float noise absorbed


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        ({1.0: 100, 2.0: 50}, "decreases"),
        ({1.0: 10, 2.0: 100}, "superadditive"),  # Laplace: 4x precision for 10x price
        ({1.0: -1}, "integers >= 0"),
        ({1.0: 1.5}, "integers >= 0"),
        ({math.nan: 1}, "finite"),
        ({}, "at least one"),
    ],
)
def test_invalid_tables_rejected_with_reason(prices, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ScheduleError, match=message):
        t = PriceTable(prices)
        t.validate(Laplace(), list(t.prices), max(t.prices))


@settings(max_examples=100, deadline=None)
@given(a=st.floats(0.1, 5), b=st.floats(0.1, 5), pa=st.integers(1, 10**6), k=st.floats(1.01, 50))
def test_superadditive_tables_always_rejected(a, b, pa, k) -> None:  # type: ignore[no-untyped-def]
    """If the unit price rises by a factor k > 1 between two levels, validation refuses."""
    lo, hi = sorted((a, b))
    assume(hi > lo * 1.001)
    mech = Laplace()
    pb = math.ceil(pa * k * mech.precision(hi) / mech.precision(lo))
    table = PriceTable({lo: pa, hi: pb})
    with pytest.raises(ScheduleError, match="superadditive"):
        table.validate(mech, [lo, hi], hi)


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "linear_level", "rate_per_level": -1},
        {"kind": "linear_level", "rate_per_level": float("inf")},
        {"kind": "linear_precision"},
        {"kind": "nope"},
        {"kind": "table", "prices": [1, 2]},
    ],
)
def test_invalid_specs(spec) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ScheduleError):
        schedule_from_spec(spec)


def test_table_sells_only_its_levels() -> None:
    t = PriceTable({1.0: 100, 2.0: 150})
    t.validate(Laplace(), [1.0, 2.0], 2.0)
    assert t.step_price(Laplace(), 1.0, 2.0) == 50
    with pytest.raises(InvalidLevelError, match="not for sale"):
        t.price(Laplace(), 1.5)
    assert schedule_from_spec(t.spec()) == t


# ------------------------------------------------------------------------------ receipts
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
RELEASES = [("v1", 2.0, np.array([1.5, -0.25])), ("v2", 2.0, np.array([3.0, 4.0]))]
OPENING = bytes(range(100, 132))


def _receipt() -> Receipt:
    return Receipt(
        purchase_id="p1",
        buyer_id="alice",
        stream_id="s",
        seller_id="bob",
        mechanism="laplace",
        value_ids=("v1", "v2"),
        level_before=1.0,
        level_after=2.0,
        price_minor=150,
        currency="EUR",
        commitment=commitment(OPENING, RELEASES),
        requested_at_ms=1_700_000_000_000,
        market_key_id=key_id(KEY.public_key()),
    )


def test_valid_receipt_verifies() -> None:
    r = _receipt()
    assert verify_receipt(
        dataclasses.asdict(r), sign_receipt(r, KEY), RELEASES, KEY.public_key(), opening=OPENING
    )


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Receipt)])
def test_tampering_with_any_field_fails(field: str) -> None:
    r = _receipt()
    sig = sign_receipt(r, KEY)
    data = dataclasses.asdict(r)
    v = data[field]
    data[field] = (
        v + 1 if isinstance(v, (int, float)) else ("v1",) if isinstance(v, tuple) else v + "x"
    )
    with pytest.raises(ReceiptError):
        verify_receipt(data, sig, RELEASES, KEY.public_key(), opening=OPENING)


@settings(max_examples=100, deadline=None)
@given(i=st.integers(0, 1), j=st.integers(0, 1), bits=st.integers(0, 63))
def test_tampering_with_any_released_number_fails(i: int, j: int, bits: int) -> None:
    r = _receipt()
    sig = sign_receipt(r, KEY)
    tampered = [(vid, lv, v.copy()) for vid, lv, v in RELEASES]
    tampered[i][2].view(np.uint64)[j] ^= np.uint64(1 << bits)
    with pytest.raises(ReceiptError, match="differ"):
        verify_receipt(dataclasses.asdict(r), sig, tampered, KEY.public_key(), opening=OPENING)


def test_wrong_key_and_bad_signature() -> None:
    r = _receipt()
    sig = sign_receipt(r, KEY)
    other = Ed25519PrivateKey.generate()
    with pytest.raises(ReceiptError, match="market key"):
        verify_receipt(dataclasses.asdict(r), sig, RELEASES, other.public_key(), opening=OPENING)
    with pytest.raises(ReceiptError, match="signature"):
        verify_receipt(
            dataclasses.asdict(r), "AAAA" + sig[4:], RELEASES, KEY.public_key(), opening=OPENING
        )
    with pytest.raises(ReceiptError, match="exactly"):
        verify_receipt(dataclasses.asdict(r), sig, RELEASES[:1], KEY.public_key(), opening=OPENING)


def test_the_negative_price_table_is_refused() -> None:
    """The red team's table: steps [0.5, 1], cap 4, level 2 cheaper than level 1 (a step 1 → 2
    would have cost −1.50). Refused whether 2 is a step or not."""
    table = PriceTable({0.5: 100, 1: 200, 2: 50, 4: 400})
    with pytest.raises(ScheduleError, match="neither a step nor the cap"):
        table.validate(Laplace(), [0.5, 1.0], 4.0)
    with pytest.raises(ScheduleError, match="decreases"):
        table.validate(Laplace(), [0.5, 1.0, 2.0], 4.0)
    with pytest.raises(ScheduleError, match="no price for level"):
        PriceTable({0.5: 100, 4: 400}).validate(Laplace(), [0.5, 1.0], 4.0)


@settings(max_examples=300, deadline=None)
@given(
    levels=st.lists(st.floats(0.01, 100), min_size=1, max_size=6, unique=True),
    prices=st.lists(st.integers(0, 10**6), min_size=6, max_size=6),
    mech=st.sampled_from([Laplace(), Gaussian(), Poisson()]),
)
def test_every_step_of_an_accepted_table_costs_at_least_zero(levels, prices, mech) -> None:  # type: ignore[no-untyped-def]
    """Random tables: whatever validation accepts, every step up between sellable levels costs
    >= 0 and a more accurate level never costs less."""
    from market.pricing import plan_step, sellable_levels

    steps = sorted(levels)
    try:  # two spellings of one level (100.0 and 99.99999999999999) are refused: fine
        table = PriceTable(dict(zip(steps, prices, strict=False)))
        table.validate(mech, steps, steps[-1])
    except ScheduleError:
        return
    sell = sellable_levels(steps, steps[-1])
    for i, held in enumerate([0.0, *sell]):
        for target in sell[i:]:
            assert plan_step(table, mech, steps, steps[-1], held, target).price_minor >= 0
    pairs = itertools.pairwise(sell)
    assert all(table.price(mech, a) <= table.price(mech, b) for a, b in pairs)


def test_memoised_precision_is_kept_per_law_not_per_equal_looking_fields() -> None:
    """``Mechanism.precision`` is cached by (mechanism, level): mechanisms of different families
    with the same fields hash alike, and a cache keyed by anything less than the class would
    price one family with another's variance."""
    alike = [Gaussian(1.0), Poisson(1.0), DiscreteLaplace(1.0), Laplace(1.0), Laplace(1)]
    assert hash(Gaussian(1.0)) == hash(Poisson(1.0))  # the fields alone: one hash
    for order in (alike, alike[::-1]):
        _precision.cache_clear()
        for mech in order:
            for level in (0.5, 1, 2.0):
                assert mech.precision(level) == 1.0 / mech.variance(level), (mech, level)
    assert Laplace(1).precision(1) == Laplace(1.0).precision(1.0)  # one law, one entry
    assert Gaussian(1.0).precision(0.5) != Poisson(1.0).precision(0.5)
