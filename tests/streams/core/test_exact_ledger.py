"""Exact privacy accounting and the one gate (issue 43): the ledger adds whole nano-units of the
levels' canonical decimals, spends rounded up and caps down, and records a release only after
every check passed and the release was made."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from market.privacy_units import cap_of, level_of, spend_of, whole_nanos
from streams.core import MarketCore
from streams.core.codecs import decode_stream
from streams.core.ledger import Made
from streams.core.outputs import Reject
from streams.core.products import Product
from streams.core.state import ValueEntry
from streams.core.stream import Stream
from streams.wire.topics import Topics

from .. import helpers
from ..helpers import market_core, registration, value

T = Topics("t")
W = 60_000
NOW = 10**9


def _core(steps: list[float], cap: float, window_cap: float, retain_last: int = 16) -> MarketCore:
    c = market_core("seller1", "alice", "bob", "carol", now=NOW)
    out = c.handle(
        T.registrations,
        registration(
            "s",
            steps=steps,
            cap=cap,
            retain_last=retain_last,
            privacy_unit="window",
            window={"duration_ms": W, "cap": window_cap},
        ),
    )
    assert out.status == "accepted", out.outputs[0].value
    return c


def _buy(c: MarketCore, buyer: str, pid: str, level: float) -> Any:
    req = helpers.purchase("s", buyer, pid, target_level=level, requested_at_ms=NOW)
    return c.handle(T.purchases, req)


def _exact(level: float) -> Fraction:
    """A level as the decimal the seller wrote (its canonical decimal), exactly."""
    return Fraction(Decimal(repr(level)))


# -- the unit ------------------------------------------------------------------------------------
def test_levels_convert_from_their_canonical_decimal_spends_up_and_caps_down() -> None:
    assert spend_of(0.1) == cap_of(0.1) == 10**8  # from the double 0.1000…055: 100000001
    assert (spend_of(0.3333333334), cap_of(0.3333333334)) == (333333334, 333333333)
    assert (spend_of(1e-10), cap_of(1e-10)) == (1, 0)  # a spend is never rounded to nothing
    assert spend_of(1e9) == 10**18 and level_of(10**18) == 1e9
    assert whole_nanos(2.5) and whole_nanos(1e-9) and not whole_nanos(1.5e-9)
    assert level_of(spend_of(0.1) * 3) == 0.3  # what statuses show: the decimal, not 0.3…04


def test_ten_steps_of_a_tenth_fit_a_cap_of_one_exactly() -> None:
    c = _core([0.1], 0.1, 1.0)
    assert _buy(c, "alice", "a1", 0.1).status == "fulfilled"
    for k in range(10):
        out = c.handle(T.values, value("s", f"v{k}", [1.0, 2.0, 3.0], published_at_ms=k))
        assert out.status == "accepted" and out.withheld == 0, k
        assert out.figures is not None and out.figures.window_headroom == (9 - k) / 10
    assert c.stores.streams["s"].window_spent_nano == {0: 10**9}
    out = c.handle(T.values, value("s", "v10", [1.0, 2.0, 3.0], published_at_ms=10))
    assert out.withheld == 1


@settings(max_examples=60)
@given(
    steps=st.lists(
        st.decimals(min_value="0.000000001", max_value="3", places=11), min_size=1, max_size=3
    ).map(lambda xs: sorted({float(x) for x in xs})),
    room=st.integers(0, 3 * 10**9),
    plan=st.lists(
        st.tuples(st.sampled_from(["alice", "bob", "value"]), st.integers(0, 2)), max_size=12
    ),
)
@example(steps=[0.3333333334], room=666_666_666, plan=[("alice", 0)] + [("value", 0)] * 3)
def test_a_window_cap_is_never_exceeded_by_rounding(
    steps: list[float], room: int, plan: list[tuple[str, int]]
) -> None:
    """Whatever the levels (up to 11 decimals, finer than the unit), the window cap (from the
    top level rounded up to the unit, plus ``room`` nano-units) and the order of purchases and
    values, each window's values were released at levels whose exact decimals add up to at most
    its cap, and the recorded sum is that of the values' losses rounded up."""
    window_cap = level_of(spend_of(steps[-1]) + room)
    c = _core(steps, steps[-1], window_cap)
    for i, (who, k) in enumerate(plan):
        if who == "value":
            c.handle(T.values, value("s", f"v{i}", [1.0, 2.0, 3.0], published_at_ms=k * W + i))
        else:
            _buy(c, who, f"p{i}", steps[k % len(steps)])
    record = c.stores.streams["s"]
    for k in range(3):
        entries = [e for e in record.window if e.published_at_ms // W == k]
        assert sum(_exact(e.level) for e in entries) <= _exact(window_cap)
        assert record.window_spent_nano.get(k, 0) == sum(spend_of(e.level) for e in entries)


def _stream(c: MarketCore) -> Iterator[Stream[Product]]:
    with c.streams.event():
        yield c.streams.load("s")


@pytest.mark.parametrize("order", list(itertools.permutations([0.1, 0.2, 0.3, 0.7])))
def test_sums_in_any_order_agree(order: tuple[float, ...]) -> None:
    c = _core([0.1, 0.2, 0.3, 0.7], 0.7, 5.0)
    for stream in _stream(c):
        ledger = stream.ledger
        for i, lv in enumerate(order):
            entry = ValueEntry(f"v{i}", i, "d" * 64, 0, published_at_ms=i)
            ledger.deliver(
                i,
                ledger.level(0.0),
                {ledger.level(lv)},
                lambda f, e=entry: Made(e, [x.value for x in f], None),
            )
        assert stream.state.window_spent_nano == {0: 1_300_000_000}  # 1.3, exactly


def test_nothing_is_recorded_when_a_release_fails_and_nothing_released_when_a_check_fails() -> None:
    c = _core([0.5, 1.0], 1.0, 1.0, retain_last=2)
    assert _buy(c, "alice", "a1", 0.5).status == "fulfilled"
    c.handle(T.values, value("s", "v0", [1.0, 2.0, 3.0], published_at_ms=0))
    for stream in _stream(c):
        before = stream.state.model_dump()

        def boom(*_: Any) -> Any:
            raise Reject("internal_error", "the release failed")

        ledger = stream.ledger
        with pytest.raises(Reject, match="the release failed"):
            ledger.sell("bob", ledger.level(1.0), 100, boom)
        entry = stream.state.window[0]
        with pytest.raises(Reject, match="the release failed"):
            ledger.deliver(0, ledger.level(entry.level), {ledger.level(1.0)}, boom)
        assert stream.state.model_dump() == before and stream.charged == []
        c.handle(T.values, value("s", "v1", [1.0, 2.0, 3.0], published_at_ms=1))  # fills it
    for stream in _stream(c):
        ledger = stream.ledger
        with pytest.raises(Reject) as refused:
            ledger.sell("bob", ledger.level(1.0), 100, boom)  # never called
        assert refused.value.reason == "privacy_window_full"


def test_a_record_with_float_sums_is_read_with_its_spends_rounded_up() -> None:
    """A float sum is read with a margin of 2⁻³⁰ of itself (what 2²³ additions of doubles can
    have lost), then rounded up: never below the exact sum of the levels it added up."""
    old = b'{"spent": 0.30000000000000004, "window_spent": {"0": 0.1, "1": 1e-10, "2": 1e7}}'
    record = decode_stream(old)
    assert record.spent_nano == 300_000_001  # 0.3 + 2.8e-10: the margin is below a unit here
    assert record.window_spent_nano == {0: 10**8 + 1, 1: 1, 2: 10**16 + 9_313_226}
