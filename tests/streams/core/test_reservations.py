"""Reservations on MarketCore (plain dicts, a clock the test moves): a reservation holds a
purchase's level, price and privacy room for its buyer until it expires by the market's clock;
other buyers see the room as spent; a purchase naming it gets its terms; bounds refuse the rest."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streams.core import MarketCore, Stores
from streams.core.context import Limits
from streams.core.holds import (
    HOLD_BYTES,
    MAX_HELD_WINDOWS,
    MAX_KEPT,
    MAX_PER_STREAM,
    Hold,
    admit,
    consume,
    held_by_others,
)
from streams.core.holds import settle as settle_holds
from streams.core.outputs import Reject
from streams.wire.events import (
    INBOX_EVENT,
    DeliveriesWithheld,
    PurchaseFulfilled,
    QuoteAnswer,
    Rejection,
    Reservation,
    ReserveRequest,
    ValueReleased,
)
from streams.wire.topics import Topics

from .. import helpers
from ..helpers import TEST_KEYS, open_accounts, party, registration, signed_for, value

T = Topics("t")
W = 60_000
NOW = 10**9
WINDOWED = {"privacy_unit": "window", "window": {"duration_ms": W, "cap": 2.5}}


class Clock:
    """The market's clock, moved by the test."""

    def __init__(self, now: int = NOW) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def new_core(clock: Clock, stores: Stores | None = None) -> MarketCore:
    core = MarketCore(stores or Stores(), TEST_KEYS, T, clock=clock)
    open_accounts(core, "seller1", "alice", "bob", "carol", "dave", "erin", "frank")
    return core


def windowed_core(clock: Clock) -> MarketCore:
    core = new_core(clock)
    body = {"steps": [0.5, 1.0, 2.0], "cap": 2.0, "retain_last": 4, **WINDOWED}
    assert core.handle(T.registrations, registration("home", **body)).status == "accepted"
    return core


def reserve(stream_id: str, buyer: str, rid: str, **kw: Any) -> bytes:
    body: dict[str, Any] = {
        "reservation_id": rid,
        "buyer_id": buyer,
        "stream_id": stream_id,
        "hold_ms": 60_000,
        "requested_at_ms": NOW,
    }
    body.update(kw)
    event = party(buyer).sign(ReserveRequest, signed_for("t"), **body)
    return event.model_dump_json().encode()


def purchase(stream_id: str, buyer: str, pid: str, **kw: Any) -> bytes:
    kw.setdefault("requested_at_ms", NOW)
    return helpers.purchase(stream_id, buyer, pid, **kw)


def publish(core: MarketCore, vid: str, at_ms: int) -> Any:
    out = core.handle(T.values, value("home", vid, [1.0, 2.0, 3.0], published_at_ms=at_ms))
    assert out.status == "accepted", out.outputs
    return out


def inbox(outcome: Any, who: str) -> list[Any]:
    return [INBOX_EVENT.validate_json(o.value) for o in outcome.outputs if o.topic == T.inbox(who)]


def refused(out: Any) -> Rejection:
    assert out.status == "rejected", out
    return Rejection.model_validate_json(out.outputs[0].value)


def spent(core: MarketCore) -> dict[int, Any]:
    st = core.stores.streams["home"]
    return dict(getattr(st, "window_spent_nano", None) or st.window_spent)


# ------------------------------------------------------------------- the holds, on their own
def hold(buyer: str, room: dict[int, int], **kw: Any) -> Hold:
    fields: dict[str, Any] = {
        "reservation_id": f"r-{buyer}",
        "buyer_id": buyer,
        "requested_at_ms": 0,
        "fingerprint": "f",
        "expires_at_ms": 100,
        "keep_until_ms": 200,
        "level_before": 0.0,
        "level": 1.0,
        "price_minor": 100,
        "room": room,
    }
    return Hold(**{**fields, **kw})


def test_room_held_by_others_excludes_the_buyer_and_what_is_not_held() -> None:
    holds = [hold("a", {0: 5, 1: 2}), hold("b", {0: 3}), hold("c", {0: 7}, status="used")]
    assert held_by_others(holds, "a") == {0: 3}
    assert held_by_others(holds, "b") == {0: 5, 1: 2}
    assert held_by_others(holds, None) == {0: 8, 1: 2}  # a delivery: every reservation's room


def test_settle_lapses_at_expiry_and_drops_at_the_keeping_time() -> None:
    holds = [hold("a", {0: 5}), hold("b", {0: 3}, expires_at_ms=150, keep_until_ms=300)]
    assert not settle_holds(holds, 99)
    assert settle_holds(holds, 100)
    assert [(h.status, h.room) for h in holds] == [("lapsed", {}), ("held", {0: 3})]
    assert settle_holds(holds, 200)  # a's record is dropped; b lapsed at 150
    assert [(h.buyer_id, h.status) for h in holds] == [("b", "lapsed")]
    assert consume(holds, "b") is None  # a lapsed reservation holds nothing to use


def test_the_bounds_refuse_with_when_to_try_again() -> None:
    holds = [hold("a", {0: 5})]
    with pytest.raises(Reject, match="you hold reservation 'r-a'") as held:
        admit(holds, "a", 1, 50)
    assert held.value.details["retry_at_ms"] == 100
    holds[0].status = "lapsed"
    with pytest.raises(Reject, match="reserve on this stream again from 200") as lapsed:
        admit(holds, "a", 1, 150)
    assert lapsed.value.details["retry_at_ms"] == 200
    holds[0].status = "used"
    admit(holds, "a", 1, 150)  # after a purchase a buyer may reserve again at once
    with pytest.raises(Reject, match="no later than your reservation"):
        admit(holds, "a", 0, 150)  # ... but not with an older request (a copy of one)
    full = [hold(f"b{i}", {0: 1}, expires_at_ms=100 + i) for i in range(MAX_PER_STREAM)]
    with pytest.raises(Reject, match=f"maximum of {MAX_PER_STREAM} reservations") as most:
        admit(full, "z", 1, 50)
    assert most.value.details["retry_at_ms"] == 100
    kept = [hold(f"b{i}", {}, status="used", keep_until_ms=300 + i) for i in range(MAX_KEPT)]
    with pytest.raises(Reject, match=f"keeps its maximum of {MAX_KEPT}") as many:
        admit(kept, "z", 1, 50)
    assert many.value.details["retry_at_ms"] == 300


# ------------------------------------------------------------------- reserve, on the core
def test_a_reservation_is_answered_signed_with_its_terms_room_and_expiry() -> None:
    clock = Clock()
    core = windowed_core(clock)
    publish(core, "v0", 0)
    publish(core, "v1", 1)
    out = core.handle(T.purchases, reserve("home", "alice", "r1", target_level=1.0))
    assert (out.kind, out.status) == ("reserve", "accepted")
    (ans,) = inbox(out, "alice")
    assert isinstance(ans, Reservation)
    assert (ans.level_before, ans.level_after, ans.price_minor) == (0.0, 1.0, 100)
    assert ans.expires_at_ms == NOW + 60_000 and ans.level_unit == "epsilon"
    assert [(h.start_ms, h.end_ms, h.room) for h in ans.held] == [(0, W, 2.0)]
    assert out.outputs[0].key == b"r1" and out.figures and out.figures.reservations_held == 1
    # a copy of the same bytes is counted and answered nowhere; the id reused is refused
    again = core.handle(T.purchases, reserve("home", "alice", "r1", target_level=1.0))
    assert (again.status, again.outputs) == ("duplicate", [])
    other = core.handle(T.purchases, reserve("home", "alice", "r1", target_level=2.0))
    assert refused(other).reason == "idempotency_key_reused"
    assert refused(core.handle(T.purchases, reserve("home", "alice", "r2"))).reason == (
        "reservation_limit"
    )


def test_reservations_too_old_or_from_the_future_are_refused() -> None:
    clock = Clock()
    core = windowed_core(clock)
    old = reserve("home", "alice", "r1", requested_at_ms=NOW - 60_000)
    assert "that time has passed" in refused(core.handle(T.purchases, old)).message
    ahead = reserve("home", "alice", "r2", requested_at_ms=NOW + 120_001)
    assert refused(core.handle(T.purchases, ahead)).reason == "request_from_the_future"


def test_a_reservation_holds_its_room_against_other_buyers_and_its_buyer_gets_its_terms() -> None:
    clock = Clock()
    core = windowed_core(clock)
    publish(core, "v0", 0)
    publish(core, "v1", 1)
    assert core.handle(T.purchases, reserve("home", "alice", "r1", target_level=1.0)).status == (
        "accepted"
    )
    # 2.0 of the window's 2.5 is held for alice: bob's purchase of 1.0 (2.0 more) does not fit
    rej = refused(core.handle(T.purchases, purchase("home", "bob", "b1", target_level=1.0)))
    assert rej.reason == "privacy_window_full"
    assert (
        "headroom 2.5" in rej.message
        and "2 of its headroom is held by buyers' reservations" in (rej.message)
    )
    (q,) = inbox(
        core.handle(T.purchases, helpers.quote("home", "bob", "q1", requested_at_ms=NOW)), "bob"
    )
    assert isinstance(q, QuoteAnswer)
    assert [(o.level, o.fits_window) for o in q.offers] == [
        (0.5, False),
        (1.0, False),
        (2.0, False),
    ]
    # alice's own quote sees her room as hers
    (mine,) = inbox(
        core.handle(T.purchases, helpers.quote("home", "alice", "q2", requested_at_ms=NOW)),
        "alice",
    )
    assert [(o.level, o.fits_window) for o in mine.offers][:2] == [(0.5, True), (1.0, True)]
    clock.now += 30_000
    out = core.handle(
        T.purchases, purchase("home", "alice", "a1", target_level=1.0, reservation_id="r1")
    )
    (got,) = inbox(out, "alice")
    assert isinstance(got, PurchaseFulfilled)
    assert (got.level_after, got.price_minor) == (1.0, 100)
    st = core.stores.streams["home"]
    assert [(h.buyer_id, h.status, h.room) for h in st.reservations] == [("alice", "used", {})]
    again = purchase("home", "alice", "a2", target_level=2.0, reservation_id="r1")
    assert refused(core.handle(T.purchases, again)).reason == "reservation_used"


def test_deliveries_see_the_room_held() -> None:
    clock = Clock()
    core = windowed_core(clock)
    assert core.handle(T.purchases, purchase("home", "bob", "b1", target_level=1.0)).status == (
        "fulfilled"
    )
    publish(core, "v0", 0)  # delivered to bob at 1.0: spent 1.0
    assert core.handle(T.purchases, reserve("home", "alice", "r1", target_level=2.0)).status == (
        "accepted"
    )  # 1.0 more on v0: 0.5 left for everyone else
    out = publish(core, "v1", 1)  # bob's 1.0 on v1 would eat alice's room: withheld
    (told,) = inbox(out, "bob")
    assert isinstance(told, DeliveriesWithheld)
    assert "1 of its headroom is held by buyers' reservations" in told.message
    clock.now += 60_000  # alice's reservation lapses: its room is free again
    out = publish(core, "v2", 2)
    assert [type(e) for e in inbox(out, "bob")] == [ValueReleased]


def test_expiry_releases_the_room_and_a_purchase_naming_it_is_refused_with_when() -> None:
    clock = Clock()
    core = windowed_core(clock)
    publish(core, "v0", 0)
    publish(core, "v1", 1)
    core.handle(T.purchases, reserve("home", "alice", "r1", target_level=1.0, hold_ms=10_000))
    clock.now += 10_000
    assert core.handle(T.purchases, purchase("home", "bob", "b1", target_level=1.0)).status == (
        "fulfilled"
    )
    late = purchase("home", "alice", "a1", target_level=1.0, reservation_id="r1")
    rej = refused(core.handle(T.purchases, late))
    assert rej.reason == "reservation_expired" and rej.details["expired_at_ms"] == NOW + 10_000
    again = refused(core.handle(T.purchases, reserve("home", "alice", "r2")))
    assert again.reason == "reservation_limit" and again.details["retry_at_ms"] == NOW + 20_000
    unknown = purchase("home", "carol", "c1", reservation_id="nope")
    assert refused(core.handle(T.purchases, unknown)).reason == "reservation_unknown"


def test_a_live_reservation_survives_a_restart() -> None:
    clock = Clock()
    core = windowed_core(clock)
    publish(core, "v0", 0)
    publish(core, "v1", 1)
    core.handle(T.purchases, reserve("home", "alice", "r1", target_level=1.0))
    second = MarketCore(core.stores, TEST_KEYS, T, clock=clock)
    rej = refused(second.handle(T.purchases, purchase("home", "bob", "b1", target_level=1.0)))
    assert rej.reason == "privacy_window_full"
    out = second.handle(
        T.purchases, purchase("home", "alice", "a1", target_level=1.0, reservation_id="r1")
    )
    assert out.status == "fulfilled"


def test_a_stream_holds_a_bounded_number_of_reservations() -> None:
    clock = Clock()
    core = new_core(clock)
    assert core.handle(T.registrations, registration("plain")).status == "accepted"
    buyers = ["alice", "bob", "carol", "dave", "erin"]
    for b in buyers[:MAX_PER_STREAM]:
        assert core.handle(T.purchases, reserve("plain", b, "r1")).status == "accepted"
    rej = refused(core.handle(T.purchases, reserve("plain", buyers[-1], "r1")))
    assert rej.reason == "reservation_limit" and rej.details["retry_at_ms"] == NOW + 60_000


def test_the_reservations_a_record_keeps_fit_the_bound_it_counts() -> None:
    """Every record a stream keeps at its largest (64-character ids, extreme numbers, room in
    the most windows) fits :data:`HOLD_BYTES` each: the stream's record bound counts them."""
    big = 2**63 - 1
    holds = [
        Hold(
            reservation_id="r" * 64,
            buyer_id=f"{i:064d}",
            requested_at_ms=big,
            fingerprint="f" * 64,
            expires_at_ms=big,
            keep_until_ms=big,
            level_before=1.2345678901234567e-300,
            level=1.2345678901234567e-300,
            price_minor=10**15,
            room={big - k: 10**18 for k in range(MAX_HELD_WINDOWS)},
        )
        for i in range(MAX_KEPT)
    ]
    record = {"reservations": [h.model_dump(mode="json") for h in holds]}
    assert len(json.dumps(record, separators=(",", ":"))) <= HOLD_BYTES * MAX_KEPT


def test_a_reservation_keeps_its_buyer_a_place_among_the_holders() -> None:
    clock = Clock()
    core = MarketCore(Stores(), TEST_KEYS, T, clock=clock, limits=Limits(max_holders=1))
    open_accounts(core, "seller1", "alice", "bob")
    assert core.handle(T.registrations, registration("plain")).status == "accepted"
    assert core.handle(T.purchases, reserve("plain", "alice", "r1")).status == "accepted"
    rej = refused(core.handle(T.purchases, purchase("plain", "bob", "b1")))
    assert rej.reason == "stream_full" and "reservation keeps them a place" in rej.message
    assert refused(core.handle(T.purchases, reserve("plain", "bob", "r1"))).reason == "stream_full"
    bought = purchase("plain", "alice", "a1", reservation_id="r1")
    assert core.handle(T.purchases, bought).status == "fulfilled"


def test_a_reservation_keeps_within_the_buyers_share_and_quotes_say_both() -> None:
    """A reservation passes the whole gate, the buyer's share too: one above it is refused
    ``buyer_quota_exceeded`` naming what fits; the quote table says both what fits the
    window's room (the buyer's own reservation is its own) and what fits its share."""
    clock = Clock()
    core = new_core(clock)
    body = {"steps": [0.25, 0.5, 1.0], "cap": 1.0, "retain_last": 4, "buyer_share": 0.5}
    reg = registration("home", **body, **WINDOWED | {"window": {"duration_ms": W, "cap": 2.0}})
    assert core.handle(T.registrations, reg).status == "accepted"
    for i in range(4):
        publish(core, f"v{i}", i)
    # 0.5 on the window's 4 values uses 2 of it: the window's cap has room, alice's share (1) not
    rej = refused(core.handle(T.purchases, reserve("home", "alice", "r1", target_level=0.5)))
    assert rej.reason == "buyer_quota_exceeded" and rej.details["best_level"] == 0.25
    assert core.stores.streams["home"].reservations == []
    ok = core.handle(T.purchases, reserve("home", "alice", "r2", target_level=0.25))
    assert [type(e) for e in inbox(ok, "alice")] == [Reservation]

    def offers(buyer: str, qid: str) -> list[tuple[float, bool | None, bool | None]]:
        q_event = helpers.quote("home", buyer, qid, requested_at_ms=NOW)
        (q,) = inbox(core.handle(T.purchases, q_event), buyer)
        assert isinstance(q, QuoteAnswer)
        return [(o.level, o.fits_window, o.fits_share) for o in q.offers]

    # alice's reservation holds 1 of the window's 2: bob's 0.5 (2 more) no longer fits it
    assert offers("bob", "q1") == [(0.25, True, True), (0.5, False, False), (1.0, False, False)]
    assert offers("alice", "q2") == [(0.25, True, True), (0.5, True, False), (1.0, False, False)]
    out = core.handle(
        T.purchases, purchase("home", "alice", "a1", target_level=0.25, reservation_id="r2")
    )
    assert [type(e) for e in inbox(out, "alice")] == [PurchaseFulfilled]
