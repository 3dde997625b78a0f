"""Per-buyer quotas on MarketCore (plain dicts): a stream registered with a ``buyer_share`` keeps
each buyer within that share of the stream's cap and of each privacy window's cap, in exact
integers, refusing purchases and withholding deliveries beyond it, and saying what fits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streams.clients.commands.output import offers_table
from streams.core import MarketCore
from streams.core.codecs import decode_stream, encode_stream
from streams.core.quotas import share_of
from streams.wire.events import (
    INBOX_EVENT,
    DeliveriesWithheld,
    PurchaseFulfilled,
    QuoteAnswer,
    Rejection,
    StreamRegistration,
    ValueReleased,
)
from streams.wire.topics import Topics

from .. import helpers
from ..helpers import TEST_KEYS, market_core, quote, registration, value

T = Topics("t")
W = 60_000
NOW = 10**9


def purchase(stream_id: str, buyer: str, pid: str, **kw: Any) -> bytes:
    kw.setdefault("requested_at_ms", NOW)
    return helpers.purchase(stream_id, buyer, pid, **kw)


def shared(stream_id: str = "home", **kw: Any) -> bytes:
    """A window stream where one buyer may use half of each cap: 0.5 of the stream's cap of 1,
    1 of each window's cap of 2."""
    body = {
        "steps": [0.1, 0.25, 0.5, 1.0],
        "cap": 1.0,
        "retain_last": 4,
        "privacy_unit": "window",
        "window": {"duration_ms": W, "cap": 2.0},
        "buyer_share": 0.5,
        **kw,
    }
    return registration(stream_id, **body)


def new_core(reg: bytes | None = None) -> MarketCore:
    c = market_core("seller1", "alice", "bob", "carol", now=NOW)
    out = c.handle(T.registrations, reg or shared())
    assert out.status == "accepted", out.outputs[0].value
    return c


def inbox(outcome: Any, who: str) -> list[Any]:
    return [INBOX_EVENT.validate_json(o.value) for o in outcome.outputs if o.topic == T.inbox(who)]


def publish(c: MarketCore, vid: str, at_ms: int, stream_id: str = "home") -> Any:
    out = c.handle(T.values, value(stream_id, vid, [1.0, 2.0, 3.0], published_at_ms=at_ms))
    assert out.status == "accepted", out.outputs
    return out


def buy(c: MarketCore, buyer: str, pid: str, **kw: Any) -> Any:
    return c.handle(T.purchases, purchase("home", buyer, pid, **kw))


def refusal(out: Any) -> Rejection:
    assert out.status == "rejected", out.outputs
    return Rejection.model_validate_json(out.outputs[0].value)


def test_a_share_is_exact_nine_tenths_fit_three_tenths_of_three() -> None:
    """0.3 of a window cap of 3 is 0.9 exactly (in floats, 0.3·3·10⁹ floors to 899,999,999):
    nine values at 0.1 reach the holder, the tenth is withheld, and the window's own cap
    (3) still has room."""
    c = new_core(
        registration(
            "home",
            steps=[0.1, 1.0],
            cap=1.0,
            retain_last=4,
            privacy_unit="window",
            window={"duration_ms": W, "cap": 3.0},
            buyer_share=0.3,
        )
    )
    st = c.stores.streams["home"]
    share = share_of(st.registration)  # type: ignore[attr-defined]
    assert share is not None and (share.of_cap, share.of_window) == (300_000_000, 900_000_000)
    assert buy(c, "alice", "a1", target_level=0.1).status == "fulfilled"
    got = [inbox(publish(c, f"v{i}", i), "alice") for i in range(10)]
    assert [type(e) for (e,) in got] == [ValueReleased] * 9 + [DeliveriesWithheld]
    assert st.window_values == {0: 10} and st.window_spent_nano == {0: 900_000_000}


def test_a_buyer_at_its_share_is_refused_while_another_buyer_still_buys() -> None:
    c = new_core()
    too_high = refusal(buy(c, "carol", "c1", target_level=1.0))  # above half the stream's cap
    assert too_high.reason == "buyer_quota_exceeded" and too_high.details["window"] is None
    assert too_high.details["limit"] == 0.5 and too_high.details["best_level"] == 0.5
    assert "above one buyer's share of this stream's cap" in too_high.message
    for i in range(4):
        publish(c, f"v{i}", i)
    assert buy(c, "alice", "a1", target_level=0.25).status == "fulfilled"  # 4 × 0.25: all of 1
    rej = refusal(buy(c, "alice", "a2", target_level=0.5))  # 4 × 0.5 = 2 > 1
    assert rej.reason == "buyer_quota_exceeded"
    assert rej.details["best_level"] is None and rej.details["buyer_share"] == 0.5
    assert (rej.details["limit"], rej.details["would_use"]) == (1.0, 2.0)
    assert (rej.details["window"]["start_ms"], rej.details["window"]["end_ms"]) == (0, W)
    assert "no level above what you hold fits now" in rej.message
    assert "Values published from 1970-01-01T00:01:00Z count against the next window" in (
        rej.message
    )
    rej = refusal(buy(c, "bob", "b0", target_level=0.5))  # bob holds nothing: 0.25 fits him
    assert rej.details["best_level"] == 0.25
    assert "the most accurate level that fits now is 0.25" in rej.message
    assert buy(c, "bob", "b1", target_level=0.25).status == "fulfilled"  # bob has his own share
    st = c.stores.streams["home"]
    assert st.holders.keys() == {"alice", "bob"} and st.holders["alice"].level == 0.25
    assert st.window_spent_nano == {0: 10**9}  # nothing refused was released
    # "the most accurate I can afford" and a quote skip what is beyond the buyer's share
    (ans,) = inbox(
        c.handle(T.purchases, quote("home", "carol", "q1", requested_at_ms=NOW)), "carol"
    )
    assert isinstance(ans, QuoteAnswer)
    assert [(o.level, o.fits_share, o.fits_window) for o in ans.offers] == [
        (0.1, True, True),
        (0.25, True, True),
        (0.5, False, True),
        (1.0, False, False),
    ]
    table = offers_table(ans).splitlines()  # as the CLI's quote shows it
    assert [row.endswith("(over one buyer's share now)") for row in table[1:5]] == [
        False,
        False,
        True,
        True,
    ]
    (ev,) = inbox(buy(c, "carol", "c2", most_accurate=True, max_price_minor=10_000), "carol")
    assert isinstance(ev, PurchaseFulfilled) and ev.level_after == 0.25


def test_a_buyer_that_joins_late_in_a_window_counts_only_what_it_gets() -> None:
    """A buyer that holds nothing has been released nothing: its first purchase gives it the
    retained values alone, and its share counts those; a holder is counted for every value of
    the window (it may have had each, at most at the level it holds)."""
    c = new_core()
    for i in range(8):  # eight values of window 0, four of them retained
        publish(c, f"v{i}", i)
    assert c.stores.streams["home"].window_values == {0: 8}
    (ans,) = inbox(
        c.handle(T.purchases, quote("home", "carol", "q1", requested_at_ms=NOW)), "carol"
    )
    assert [o.fits_share for o in ans.offers] == [True, True, False, False]
    assert buy(c, "carol", "c1", target_level=0.25).status == "fulfilled"  # 4 × 0.25 = 1
    rej = refusal(buy(c, "carol", "c2", target_level=0.5))  # a holder now: 8 × 0.5 > 1
    assert rej.reason == "buyer_quota_exceeded" and rej.details["would_use"] == 4.0
    assert rej.details["best_level"] is None  # nothing above what carol holds fits her now
    out = publish(c, "v8", 8)  # 9 × 0.25 > 1: withheld from her for the rest of the window
    assert [e.reason for e in inbox(out, "carol")] == ["buyer_quota_exceeded"]
    assert buy(c, "alice", "a1", most_accurate=True, max_price_minor=10_000).status == ("fulfilled")


def test_deliveries_are_withheld_from_the_holder_over_its_share_only() -> None:
    c = new_core()
    assert buy(c, "alice", "a1", target_level=0.5).status == "fulfilled"
    assert buy(c, "bob", "b1", target_level=0.25).status == "fulfilled"
    for i in range(2):  # alice: 2 × 0.5 = 1, her whole share of window 0
        out = publish(c, f"v{i}", i)
        assert [type(e) for e in inbox(out, "alice") + inbox(out, "bob")] == [ValueReleased] * 2
    out = publish(c, "v2", 2)
    (held,) = inbox(out, "alice")
    assert isinstance(held, DeliveriesWithheld) and held.reason == "buyer_quota_exceeded"
    assert held.value_ids == ["v2"] and held.level == 0.5
    assert "at your level 0.5 is 2 values of a window" in held.message
    assert "1970-01-01T00:01:00Z" in held.message
    assert [type(e) for e in inbox(out, "bob")] == [ValueReleased]  # 3 × 0.25 < 1
    assert (out.withheld, out.quota_withheld) == (1, 1)
    st = c.stores.streams["home"]
    assert st.window_values == {0: 3} and st.window_spent_nano == {0: 1_250_000_000}
    # a value sent again is counted once, and still withheld from alice
    again = c.handle(T.values, value("home", "v2", [1.0, 2.0, 3.0], published_at_ms=2))
    assert again.status == "duplicate" and st.window_values == {0: 3}
    assert [type(e) for e in inbox(again, "alice")] == [DeliveriesWithheld]
    # bob's share runs out at his fifth value; the next window reaches both again
    publish(c, "v3", 3)
    out = publish(c, "v4", 4)
    assert [e.reason for e in inbox(out, "bob")] == ["buyer_quota_exceeded"]
    out = publish(c, "n0", W)
    assert [type(e) for e in inbox(out, "alice") + inbox(out, "bob")] == [ValueReleased] * 2
    # the stream's own window cap still says privacy_window_full
    assert st.window_values == {0: 5, 1: 1}


def test_a_restarted_core_keeps_the_counts_and_streams_without_a_share_store_none() -> None:
    c = new_core()
    c.handle(T.registrations, registration("plain", buyer_share=0.5))
    c.handle(
        T.registrations,
        registration("w", privacy_unit="window", window={"duration_ms": W, "cap": 4.0}),
    )
    buy(c, "alice", "a1", target_level=0.5)
    publish(c, "v0", 0)
    publish(c, "v1", 1)
    record = c.stores.streams["home"]
    assert decode_stream(encode_stream(record)).window_values == {0: 2}
    second = MarketCore(c.stores, TEST_KEYS, T, clock=lambda: NOW)
    out = second.handle(T.values, value("home", "v2", [1.0, 2.0, 3.0], published_at_ms=2))
    assert [e.reason for e in inbox(out, "alice")] == ["buyer_quota_exceeded"]
    publish(c, "p0", 0, "plain")
    publish(c, "w0", 0, "w")
    for sid in ("plain", "w"):  # their records are the bytes they were before shares existed
        assert b"window_values" not in encode_stream(c.stores.streams[sid])


def test_event_streams_limit_the_level_one_buyer_holds() -> None:
    c = new_core(registration("home", buyer_share=0.5))  # levels 0.5, 1, 2, 4; at most 2
    assert buy(c, "alice", "a1", target_level=2.0).status == "fulfilled"
    rej = refusal(buy(c, "alice", "a2", target_level=4.0))  # the cap
    assert rej.reason == "buyer_quota_exceeded" and rej.details["limit"] == 2.0
    assert "no level fits now" not in rej.message  # 0.5 … 2 fit (2 is already held)
    assert [type(e) for e in inbox(publish(c, "v0", 0), "alice")] == [ValueReleased]


def test_the_ledger_says_the_room_a_buyer_has_left() -> None:
    c = new_core()
    buy(c, "alice", "a1", target_level=0.25)
    for i in range(3):
        publish(c, f"v{i}", i)
    stream = c.streams.load("home")  # as a handler loads it
    assert stream.ledger.room("alice", 0) == 250_000_000  # 1 − 3 × 0.25
    assert stream.ledger.room("bob", 0) == 10**9  # holds nothing yet
    assert stream.ledger.room("alice", 7) == 10**9  # a window without values
    assert new_core(registration("p")).streams.load("p").ledger.room("alice", 0) is None


def test_a_share_that_leaves_nothing_to_buy_is_refused() -> None:
    c = market_core("seller1", now=NOW)
    out = c.handle(T.registrations, shared("s", buyer_share=0.05))  # 0.05 of 1 < the step 0.1
    assert (out.status, out.reason) == ("rejected", "invalid_event")
    assert (
        "raise --buyer-share or --cap"
        in Rejection.model_validate_json(out.outputs[0].value).message
    )
    assert c.handle(T.registrations, shared("s", buyer_share=0.1)).status == "accepted"


def test_the_signature_binds_the_share_and_the_wire_bounds_it() -> None:
    c = market_core("seller1", now=NOW)
    forged = json.loads(shared())
    forged["buyer_share"] = 1.0  # a larger share under the seller's signature
    out = c.handle(T.registrations, json.dumps(forged).encode())
    assert (out.status, out.reason) == ("rejected", "bad_signature")
    body = {**json.loads(shared()), "key_id": "0" * 16, "signature": "A" * 86 + "=="}
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="buyer_share"):
            StreamRegistration.model_validate({**body, "buyer_share": bad})
