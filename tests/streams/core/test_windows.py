"""Privacy windows on MarketCore (plain dicts): a ``window`` stream never lets the values of one
window spend more than its cap, refuses or withholds what would, and says so."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from market.privacy_units import level_of
from streams.core import MarketCore
from streams.core.state import MAX_RECENT_WINDOWS
from streams.wire.events import (
    INBOX_EVENT,
    DeliveriesWithheld,
    PurchaseFulfilled,
    QuoteAnswer,
    Rejection,
    StreamRegistration,
    ValueReleased,
)
from streams.wire.signing import canonical_bytes
from streams.wire.topics import Topics

from .. import helpers
from ..helpers import (
    SIGNED_FOR,
    TEST_KEYS,
    assert_registration_refused,
    market_core,
    quote,
    registration,
    value,
)

T = Topics("t")
W = 60_000  # one-minute windows
NOW = 10**9  # the market's clock: windows 0 … 16,666 are in the past
WINDOWED = {"privacy_unit": "window", "window": {"duration_ms": W, "cap": 2.5}}


def purchase(stream_id: str, buyer: str, pid: str, **kw: Any) -> bytes:
    """A signed purchase requested now (the market refuses one older than its horizon)."""
    kw.setdefault("requested_at_ms", NOW)
    return helpers.purchase(stream_id, buyer, pid, **kw)


def new_core(**kw: Any) -> MarketCore:
    return market_core("seller1", "alice", "bob", "carol", now=NOW, **kw)


def windowed(stream_id: str = "home", **kw: Any) -> bytes:
    body = {"steps": [0.5, 1.0, 2.0], "cap": 2.0, "retain_last": 4, **WINDOWED, **kw}
    return registration(stream_id, **body)


@pytest.fixture
def core() -> MarketCore:
    c = new_core()
    out = c.handle(T.registrations, windowed())
    assert out.status == "accepted", out.outputs[0].value
    return c


def inbox(outcome: Any, who: str) -> list[Any]:
    return [INBOX_EVENT.validate_json(o.value) for o in outcome.outputs if o.topic == T.inbox(who)]


def publish(core: MarketCore, vid: str, at_ms: int) -> Any:
    out = core.handle(T.values, value("home", vid, [1.0, 2.0, 3.0], published_at_ms=at_ms))
    assert out.status == "accepted", out.outputs
    return out


def spent(core: MarketCore) -> dict[int, float]:
    return {k: level_of(v) for k, v in core.stores.streams["home"].window_spent_nano.items()}


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"privacy_unit": "window"}, "needs a window"),
        ({"window": {"duration_ms": W, "cap": 1.0}}, "needs a window"),
        (
            {
                **WINDOWED,
                "mechanism": "poisson",
                "steps": [10.0],
                "cap": 10.0,
                "window": {"duration_ms": W, "cap": 20.0},
            },
            "add up",
        ),
        ({**WINDOWED, "sealed": True}, "unsealed"),
        ({**WINDOWED, "window": {"duration_ms": W, "cap": 1.5}}, "below the stream's cap"),
        ({**WINDOWED, "window": {"duration_ms": 1_000, "cap": 1.0}}, "greater than or equal"),
        (
            {**WINDOWED, "window": {"duration_ms": W, "cap": 4.0000000001}},
            "give the window cap as 4.0,",
        ),
    ],
)
def test_registrations_that_cannot_be_accounted_are_refused(fields: Any, says: str) -> None:
    assert_registration_refused(new_core(), fields, says)


def test_the_signature_binds_the_window_and_event_streams_sign_as_before() -> None:
    reg = StreamRegistration.model_validate_json(windowed())
    bigger = reg.model_copy(update={"window": reg.window.model_copy(update={"cap": 25.0})})  # type: ignore[union-attr]
    assert canonical_bytes(SIGNED_FOR, reg) != canonical_bytes(SIGNED_FOR, bigger)
    c = new_core()
    forged = json.loads(windowed())
    forged["window"]["cap"] = 25.0  # a bigger cap under the seller's signature
    out = c.handle(T.registrations, json.dumps(forged).encode())
    assert (out.status, out.reason) == ("rejected", "bad_signature")
    plain = StreamRegistration.model_validate_json(registration("s"))
    as_event = plain.model_copy(update={"privacy_unit": "event"})
    assert canonical_bytes(SIGNED_FOR, plain) == canonical_bytes(SIGNED_FOR, as_event)
    with pytest.raises(ValidationError):
        StreamRegistration.model_validate({**json.loads(windowed()), "privacy_unit": "event"})


def test_deliveries_over_the_window_cap_are_withheld_and_reported(core: MarketCore) -> None:
    assert core.handle(T.purchases, purchase("home", "alice", "a1", target_level=1.0)).status == (
        "fulfilled"
    )
    assert core.handle(T.purchases, purchase("home", "bob", "b1", target_level=0.5)).status == (
        "fulfilled"
    )
    publish(core, "v0", 0)  # alice 1.0, bob 0.5 → the value costs 1.0
    publish(core, "v1", 1)  # 2.0 spent
    out = publish(core, "v2", 2)  # headroom 0.5: bob's 0.5 fits, alice's 1.0 does not
    (bob_ev,) = inbox(out, "bob")
    assert isinstance(bob_ev, ValueReleased) and bob_ev.releases[0].value_id == "v2"
    (held,) = inbox(out, "alice")
    assert isinstance(held, DeliveriesWithheld)
    assert held.value_ids == ["v2"] and held.level == 1.0 and held.reason == "privacy_window_full"
    assert (held.window.start_ms, held.window.end_ms) == (0, W)
    assert (held.window.spent, held.window.cap, held.window.headroom) == (2.5, 2.5, 0.0)
    assert "1970-01-01T00:01:00Z" in held.message
    assert out.withheld == 1
    out = publish(core, "v3", 3)  # nothing fits: both are told, nothing is released
    assert [type(e) for e in inbox(out, "alice") + inbox(out, "bob")] == [DeliveriesWithheld] * 2
    assert out.releases == 0 and out.new_noise == 0
    assert spent(core) == {0: 2.5}
    levels = {e.value_id: e.level for e in core.stores.streams["home"].window}
    assert levels == {"v0": 1.0, "v1": 1.0, "v2": 0.5, "v3": 0.0}
    out = publish(core, "v4", W)  # the next window: both are delivered again
    assert [type(e) for e in inbox(out, "alice") + inbox(out, "bob")] == [ValueReleased] * 2
    assert spent(core) == {0: 2.5, 1: 1.0}


def test_a_purchase_that_would_overspend_is_refused_with_headroom_and_what_fits(
    core: MarketCore,
) -> None:
    for i in range(2):
        publish(core, f"v{i}", i)
    assert core.handle(T.purchases, purchase("home", "alice", "a1", target_level=1.0)).status == (
        "fulfilled"
    )
    assert spent(core) == {0: 2.0}
    out = core.handle(T.purchases, purchase("home", "bob", "b2", target_level=2.0))
    assert (out.status, out.reason) == ("rejected", "privacy_window_full")
    rej = Rejection.model_validate_json(out.outputs[0].value)
    assert rej.details["window"]["headroom"] == 0.5 and rej.details["best_level"] == 1.0
    assert "would spend 2 more" in rej.message and "the most accurate level that fits now is 1" in (
        rej.message
    )
    assert spent(core) == {0: 2.0}  # nothing was released
    assert core.stores.streams["home"].holders.keys() == {"alice"}
    # bob may buy what alice holds: the values are already released at it (lossless)
    out = core.handle(T.purchases, purchase("home", "bob", "b1", target_level=1.0))
    assert out.status == "fulfilled" and spent(core) == {0: 2.0}
    # "the most accurate I can afford" skips what does not fit
    out = core.handle(T.purchases, purchase("home", "carol", "c1", most_accurate=True))
    (ev,) = inbox(out, "carol")
    assert isinstance(ev, PurchaseFulfilled) and ev.level_after == 1.0


def test_quotes_say_which_levels_fit_and_the_window(core: MarketCore) -> None:
    publish(core, "v0", 0)
    publish(core, "v1", 1)
    core.handle(T.purchases, purchase("home", "alice", "a1", target_level=1.0))
    (ans,) = inbox(core.handle(T.purchases, quote("home", "bob", "q1", requested_at_ms=NOW)), "bob")
    assert isinstance(ans, QuoteAnswer) and ans.privacy_window is not None
    assert [(o.level, o.fits_window) for o in ans.offers] == [
        (0.5, True),
        (1.0, True),
        (2.0, False),
    ]
    assert (ans.privacy_window.spent, ans.privacy_window.headroom) == (2.0, 0.5)
    event_core = new_core()
    event_core.handle(T.registrations, registration("plain"))
    asked = quote("plain", "bob", "q1", requested_at_ms=NOW)
    (ans,) = inbox(event_core.handle(T.purchases, asked), "bob")
    assert ans.privacy_window is None and {o.fits_window for o in ans.offers} == {None}


def test_purchases_become_possible_again_when_the_full_window_leaves_the_retained_values() -> None:
    c = new_core()
    c.handle(T.registrations, windowed(window={"duration_ms": W, "cap": 4.5}))
    c.handle(T.purchases, purchase("home", "alice", "a1", target_level=0.5))
    for i in range(9):
        publish(c, f"v{i}", i)  # 9 × 0.5: window 0 is full
    assert spent(c) == {0: 4.5}
    out = c.handle(T.purchases, purchase("home", "bob", "b1", target_level=1.0))
    assert out.reason == "privacy_window_full"
    assert "New values count against the next window from 1970-01-01T00:01:00Z" in (
        Rejection.model_validate_json(out.outputs[0].value).message
    )
    for i in range(4):  # four values of window 1 push window 0 out of the retained four
        publish(c, f"w{i}", W + i)
    assert [e.value_id for e in c.stores.streams["home"].window] == ["w0", "w1", "w2", "w3"]
    out = c.handle(T.purchases, purchase("home", "bob", "b2", target_level=1.0))
    assert out.status == "fulfilled"
    assert spent(c) == {0: 4.5, 1: 4.0}  # 4 × 0.5 delivered, then 4 × 0.5 more


def test_resends_replay_without_spending_again(core: MarketCore) -> None:
    core.handle(T.purchases, purchase("home", "alice", "a1", target_level=1.0))
    first = publish(core, "v0", 0)
    again = core.handle(T.values, value("home", "v0", [1.0, 2.0, 3.0], published_at_ms=0))
    assert again.status == "duplicate" and spent(core) == {0: 1.0}
    assert inbox(again, "alice")[0].releases == inbox(first, "alice")[0].releases


def test_restarted_core_keeps_the_sums(core: MarketCore) -> None:
    core.handle(T.purchases, purchase("home", "alice", "a1", target_level=1.0))
    for i in range(2):
        publish(core, f"v{i}", i)
    second = MarketCore(core.stores, TEST_KEYS, T, clock=lambda: NOW)
    out = second.handle(T.values, value("home", "v2", [1.0, 2.0, 3.0], published_at_ms=2))
    assert [type(e) for e in inbox(out, "alice")] == [DeliveriesWithheld]
    assert spent(second) == {0: 2.0}


def test_sums_stay_bounded_and_a_value_is_never_counted_from_zero() -> None:
    """Old sums are dropped (at most MAX_RECENT_WINDOWS beyond the retained values'); a value
    published into a dropped window is refused, never accounted as if the window were empty."""
    c = new_core()
    c.handle(T.registrations, windowed(retain_last=2))
    c.handle(T.purchases, purchase("home", "alice", "a1", target_level=2.0))
    n = MAX_RECENT_WINDOWS + 40
    for k in range(n):
        publish(c, f"v{k}", k * W)
    st = c.stores.streams["home"]
    assert len(st.window_spent_nano) <= MAX_RECENT_WINDOWS + 2
    assert st.window_spent_nano[n - 1] == 2 * 10**9 and 0 not in st.window_spent_nano
    out = c.handle(T.values, value("home", "late", [1.0, 2.0, 3.0], published_at_ms=5))
    assert (out.status, out.reason) == ("rejected", "privacy_window_closed")
    assert 0 not in st.window_spent_nano
    publish(c, "recent", (n - 3) * W + 7)  # a window still accounted takes values
    assert st.window_spent_nano[n - 3] == 2 * 10**9  # … and it was full: the value was withheld


def test_the_dedup_horizon_drops_the_sums_no_value_can_join_any_more() -> None:
    """With a short dedup horizon the sums go sooner, and older values are refused as too old."""
    c = new_core(dedup_horizon_ms=5 * W)
    c.handle(T.registrations, windowed(retain_last=1))
    for k in range(10):
        publish(c, f"v{k}", k * W)
    assert sorted(c.stores.streams["home"].window_spent_nano) == [4, 5, 6, 7, 8, 9]
    out = c.handle(T.values, value("home", "old", [1.0, 2.0, 3.0], published_at_ms=W))
    assert out.reason == "value_too_old"


# -- found by the review of the feature (each failed before its fix) ----------------------------
def test_a_tiny_spend_after_exhaustion_is_refused_and_what_was_released_still_fits() -> None:
    """A window filled exactly to its cap by one value: the least level for sale (10⁻⁹, one
    nano-unit) of a new value is withheld, and a purchase releasing it on that value is refused
    (with a float slack both went through); a resend of the value at the levels it was released
    at, and a purchase that releases nothing new, cost nothing and go through."""
    c = new_core()
    c.handle(
        T.registrations,
        registration(
            "s",
            steps=[1e-9, 1.0],
            cap=1.0,
            retain_last=4,
            privacy_unit="window",
            window={"duration_ms": W, "cap": 1.0},
        ),
    )
    c.handle(T.purchases, purchase("s", "alice", "a1", target_level=1.0))
    c.handle(T.purchases, purchase("s", "bob", "b1", target_level=1e-9))
    c.handle(T.values, value("s", "v0", [1.0, 1.0, 1.0], published_at_ms=0))
    assert c.stores.streams["s"].window_spent_nano == {0: 10**9}  # the cap, exactly
    late = c.handle(T.values, value("s", "v1", [2.0, 2.0, 2.0], published_at_ms=1))
    assert [type(e) for e in inbox(late, "bob")] == [DeliveriesWithheld]
    assert c.stores.streams["s"].window_spent_nano == {0: 10**9}
    again = c.handle(T.values, value("s", "v0", [1.0, 1.0, 1.0], published_at_ms=0))
    assert [type(e) for e in inbox(again, "bob")] == [ValueReleased]
    out = c.handle(T.purchases, purchase("s", "carol", "c1", target_level=1e-9))
    assert (out.status, out.reason) == ("rejected", "privacy_window_full")  # v1 would spend 1
    for k in range(1, 5):  # four windows of one value each: v0 and v1 leave the retained four
        c.handle(T.values, value("s", f"v{k + 1}", [2.0, 2.0, 2.0], published_at_ms=k * W))
    out = c.handle(T.purchases, purchase("s", "carol", "c2", target_level=1e-9))
    assert out.status == "fulfilled"  # every retained value was released at 1.0 already
    assert [c.stores.streams["s"].window_spent_nano[k] for k in range(1, 5)] == [10**9] * 4


def test_a_level_no_window_could_take_cannot_be_registered() -> None:
    """A cap above the window cap used to be sold on an empty stream and never delivered."""
    out = new_core().handle(T.registrations, windowed("s", window={"duration_ms": W, "cap": 1.5}))
    assert out.reason == "invalid_event"


def test_withheld_notices_in_one_batch_name_the_level_each_value_was_withheld_at() -> None:
    c = new_core()
    c.handle(
        T.registrations,
        registration(
            "s",
            steps=[0.5, 1.0],
            cap=1.0,
            retain_last=1,
            privacy_unit="window",
            window={"duration_ms": W, "cap": 1.0},
        ),
    )
    c.handle(T.purchases, purchase("s", "alice", "a1", target_level=0.5))
    for i in range(2):  # window 0 is full
        c.handle(T.values, value("s", f"v{i}", [1.0, 1.0, 1.0], published_at_ms=i))
    with c.batch() as outputs:
        c.handle(T.values, value("s", "v2", [1.0, 1.0, 1.0], published_at_ms=2))  # at 0.5
        c.handle(T.values, value("s", "v3", [1.0, 1.0, 1.0], published_at_ms=W))  # evicts v2
        assert c.handle(T.purchases, purchase("s", "alice", "a2", target_level=1.0)).status == (
            "fulfilled"
        )
        c.handle(T.values, value("s", "v4", [1.0, 1.0, 1.0], published_at_ms=3))  # at 1.0
    notices = [INBOX_EVENT.validate_json(o.value) for o in outputs if o.topic == T.inbox("alice")]
    held = {(e.level, tuple(e.value_ids)) for e in notices if isinstance(e, DeliveriesWithheld)}
    assert held == {(0.5, ("v2",)), (1.0, ("v4",))}


def test_a_quote_checks_a_level_below_the_one_held_at_the_held_level() -> None:
    c = new_core()
    c.handle(T.registrations, windowed())
    c.handle(T.purchases, purchase("home", "alice", "a1", target_level=1.0))
    c.handle(T.purchases, purchase("home", "bob", "b1", target_level=0.5))
    for i in range(3):  # v2 reaches bob at 0.5 and is withheld from alice
        publish(c, f"v{i}", i)
    (ans,) = inbox(c.handle(T.purchases, quote("home", "alice", "q", requested_at_ms=NOW)), "alice")
    fits = {o.level: o.fits_window for o in ans.offers}
    out = c.handle(T.purchases, purchase("home", "alice", "a2", target_level=0.5))
    assert fits[0.5] is False and out.reason == "already_held"  # (nothing to buy below it)
