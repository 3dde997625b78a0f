"""Attacks on the exact accounting (docs/protocol.md §6.3, docs/math.md §9): a window overspent
by rounding or by order, a tiny spend after exhaustion, levels with many decimals, the extremes
of the level range, and a record an earlier version wrote with float sums."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

from market.privacy_units import cap_of, spend_of
from streams.core.codecs import decode_stream, encode_stream

from ..helpers import registration
from .market import T, buy, publish, received, refusal, snapshot, state, windowed


def exact(level: float) -> Fraction:
    """A level as the decimal the seller wrote (its canonical decimal), exactly."""
    return Fraction(Decimal(repr(level)))


def test_a_tenth_and_a_fifth_fill_three_tenths_and_a_nano_more_is_refused() -> None:
    """0.1 + 0.2 is 0.30000000000000004 in doubles: exact sums must let them fill a window cap
    of 0.3, and then refuse the smallest level there is (10⁻⁹) to a holder and a buyer."""
    c = windowed([1e-9, 0.1, 0.2], 0.2, 0.3)
    assert buy(c, "alice", "a1", 0.1).status == "fulfilled"
    publish(c, "v0", 0)  # alice: 0.1
    assert buy(c, "bob", "b1", 0.2).status == "fulfilled"  # v0 raised to 0.2
    out = publish(c, "v1", 1)  # bob's 0.2 does not fit (0.4), alice's 0.1 fills 0.3
    assert received(out, "alice") == ["value_released"]
    assert received(out, "bob") == ["deliveries_withheld"]
    assert state(c).window_spent_nano == {0: 300_000_000}
    assert buy(c, "carol", "c1", 1e-9).status == "fulfilled"  # no new spend: v0, v1 above it
    out = publish(c, "v2", 2)
    assert out.withheld == 3, "a tiny spend after exhaustion was let through"
    assert state(c).window_spent_nano == {0: 300_000_000}


def test_the_smallest_level_after_exhaustion_is_refused_to_a_purchase() -> None:
    """A window spent to its cap, exactly: a purchase at 10⁻⁹ that would raise one value by a
    nano is refused, and the record does not move."""
    c = windowed([1e-9, 0.5], 0.5, 1.0)
    assert buy(c, "alice", "a1", 0.5).status == "fulfilled"
    publish(c, "v0", 0)
    publish(c, "v1", 1)  # 0.5 + 0.5: the cap, exactly
    assert buy(c, "bob", "b1", 1e-9).status == "fulfilled"  # costs the window nothing
    out = publish(c, "v2", 2)  # v2: alice's 0.5 and bob's 1e-9 both refused
    assert out.withheld == 2
    before = snapshot(c)
    rej = refusal(buy(c, "carol", "c1", 0.5))  # would raise v2 from 0 to 0.5
    assert rej.reason == "privacy_window_full"
    assert snapshot(c) == before


def test_levels_with_many_decimals_never_record_less_than_released_in_any_order() -> None:
    """Levels with more than nine decimals (1.5e-9, 0.1000000001, thirds) bought in either
    order over three values: every window's recorded sum is at least the exact sum of its
    values' canonical decimals and at most the cap, and both orders end with the same sums
    (three thirds, 0.9999999999999999 exactly, are recorded as 1.000000002: refused)."""
    steps = [1.5e-9, 0.1000000001, 0.3333333333333333, 0.3333333334]
    finals = []
    for order in (steps, steps[::-1]):
        c = windowed(steps, 0.3333333334, 1.0)
        for i in range(3):
            publish(c, f"v{i}", i)
        for i, lv in enumerate(order):
            buy(c, ("alice", "bob", "carol", "dave")[i], f"p{i}", lv)
            st = state(c)
            real = sum((exact(e.level) for e in st.window), Fraction(0))
            assert Fraction(st.window_spent_nano[0], 10**9) >= real
            assert st.window_spent_nano[0] <= cap_of(1.0)
            assert st.window_spent_nano[0] == sum(spend_of(e.level) for e in st.window)
        finals.append(dict(state(c).window_spent_nano))
    assert finals[0] == finals[1] == {0: 3 * spend_of(0.1000000001)}


def test_a_window_cap_of_one_nano_holds_exactly_one_smallest_value() -> None:
    c = windowed([1e-9], 1e-9, 1e-9)
    assert buy(c, "alice", "a1", 1e-9).status == "fulfilled"
    assert received(publish(c, "v0", 0), "alice") == ["value_released"]
    assert received(publish(c, "v1", 1), "alice") == ["deliveries_withheld"]
    assert state(c).window_spent_nano == {0: 1}


def test_the_largest_caps_are_counted_exactly() -> None:
    """Levels up to 10⁹ (10¹⁸ nano-units): a window cap of 10⁹ holds one value at 10⁹ and not
    a nano more (Gaussian noise, levels in ρ)."""
    c = windowed([1.0, 1e9], 1e9, 1e9, mechanism="gaussian")
    assert buy(c, "alice", "a1", 1e9).status == "fulfilled"
    assert buy(c, "bob", "b1", 1.0).status == "fulfilled"
    out = publish(c, "v0", 0)
    assert received(out, "alice") == ["value_released"]
    assert state(c).window_spent_nano == {0: 10**18}
    out = publish(c, "v1", 1)
    assert out.withheld == 2 and state(c).window_spent_nano[0] == 10**18


def test_a_record_with_float_sums_never_counts_less_than_its_values_spent() -> None:
    """A record an earlier version wrote: ``window_spent`` a float sum of doubles, here
    1e7 + 2.5e-9 + 2.5e-9 + 2.5e-9, which doubles (an ulp of 1e7 is 1.86e-9) round to
    1e7 + 5.59e-9. Read back, the window's sum must not be below what its retained values
    are recorded as spending (1e16 + 9 nano-units): else the cap can be exceeded by the
    difference."""
    c = windowed([2.5e-9, 1e7], 1e7, 2e7)
    legacy = encode_stream(state(c)).decode()
    levels = [1e7, 2.5e-9, 2.5e-9, 2.5e-9]
    entries = ",".join(
        f'{{"value_id":"v{i}","seq":{i},"digest":"d{i}","received_at_ms":{i},'
        f'"published_at_ms":{i},"level":{lv!r}}}'
        for i, lv in enumerate(levels)
    )
    float_sum = 0.0
    for lv in levels:
        float_sum += lv  # what the earlier version added up
    assert '"window":[]' in legacy and '"window_spent_nano":{}' in legacy
    legacy = legacy.replace('"window":[]', f'"window":[{entries}]', 1)
    legacy = legacy.replace('"window_spent_nano":{}', f'"window_spent":{{"0":{float_sum!r}}}', 1)
    record = decode_stream(legacy.encode())
    spent = sum(spend_of(e.level) for e in record.window)
    assert spent == 10**16 + 9
    short = spent - record.window_spent_nano[0]
    assert short <= 0, f"the float sum {float_sum!r} reads back {short} nano-units below its values"


def test_subnormal_and_sub_nano_levels_never_reach_the_ledger() -> None:
    """A level below 10⁻⁹ would be a spend of one unit for a release noised far less: a
    registration offering one, and a purchase naming one, are refused and change nothing."""
    c = windowed([1e-9, 0.5], 0.5, 1.0)
    for i, steps in enumerate(([5e-324, 0.5], [1e-10, 0.5], [2.2250738585072014e-308, 0.5])):
        out = c.handle(T.registrations, registration(f"x{i}", steps=steps, cap=0.5))
        assert refusal(out).reason == "invalid_level"
    for i, level in enumerate((5e-324, 1e-10, 9.99999999e-10)):
        assert buy(c, "alice", f"p{i}", level).status == "rejected"
    st = state(c)
    assert (st.holders, st.revenue_minor, st.spent_nano, st.window_spent_nano) == ({}, 0, 0, {})
