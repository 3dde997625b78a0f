"""Replay records bounded in bytes: decisions not outcomes, caps, resends and quotes limited."""

from __future__ import annotations

from typing import Any

import pytest

from streams.core import EvictedValue, MarketCore, PurchaseRecord, Stores
from streams.core.codecs import CODECS, decode_purchase, decode_value, encode_purchase, encode_value
from streams.core.context import Limits
from streams.core.replay.records import ANSWER_INTERVAL_MS, Caps
from streams.core.state import PURCHASE_RECORD_BYTES, VALUE_MARK_BYTES
from streams.wire.events import INBOX_EVENT, PurchaseFulfilled, Rejection
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS, open_accounts, purchase, quote, registration, value

T = Topics("t")
ID = "x" * 64  # the longest id the grammar allows


def new_core(now: list[int], stores: Stores | None = None, **limits: Any) -> MarketCore:
    c = MarketCore(stores or Stores(), TEST_KEYS, T, clock=lambda: now[0], limits=Limits(**limits))
    open_accounts(c, "seller1", "alice", "sealed_alice", "bob")
    return c


def inbox(out: Any, who: str) -> list[Any]:
    return [INBOX_EVENT.validate_json(o.value) for o in out.outputs if o.topic == T.inbox(who)]


# -- sizes -----------------------------------------------------------------------------------------
def test_a_decided_purchase_and_a_mark_fit_their_bounds_in_the_stores_codecs() -> None:
    fulfilled = PurchaseRecord(
        fingerprint="ab" * 32,
        status="fulfilled",
        stream_id=ID,
        requested_at_ms=2**62,
        price_minor=2**62,
        level_before=1.2345678901234567,
        level_after=2.0**60,
        first_seq=2**40,
        count=100_000,
        decided_at_ms=2**62,
        digest="cd" * 32,
    )
    refused = PurchaseRecord(
        fingerprint="ab" * 32,
        status="rejected",
        stream_id=ID,
        requested_at_ms=2**62,
        decided_at_ms=2**62,
        reason="idempotency_key_reused_and_then_some_more_words",
    )
    encode, decode = CODECS["purchases"]
    for rec in (fulfilled, refused):
        data = encode(rec)
        assert len(data) <= PURCHASE_RECORD_BYTES, len(data)
        assert decode(data) == rec
    mark = EvictedValue(2**40, "ef" * 32, 2**62)
    data = CODECS["releases"][0](mark)
    assert len(data) <= VALUE_MARK_BYTES and CODECS["releases"][1](data) == mark


def test_records_a_market_keeps_are_within_the_bounds() -> None:
    """Realistic records, as the core writes them: long ids, sealed buyers, refusals."""
    now = [1_000]
    c = new_core(now)
    sid = "s" * 64
    c.handle(T.registrations, registration(sid, retain_last=2))
    for i in range(5):
        c.handle(T.values, value(sid, f"{'v' * 60}{i:04d}", [1.0, 2.0, 3.0]))
    for buyer in ("alice", "sealed_alice"):
        out = c.handle(T.purchases, purchase(sid, buyer, "p" * 64))
        assert out.status == "fulfilled", out.reason
    c.handle(T.purchases, purchase(sid, "bob", "q" * 64, max_price=1))  # refused
    now[0] += 1
    c.handle(T.values, value(sid, "later", [1.0, 2.0, 3.0]))  # a later batch: outcomes sent
    sizes = {k: len(encode_purchase(r)) for k, r in c.stores.purchases.items()}
    assert len(sizes) == 3 and max(sizes.values()) <= PURCHASE_RECORD_BYTES, sizes
    assert all(r.payload is None for r in c.stores.purchases.values())
    marks = [encode_value(v) for v in c.stores.releases.values() if isinstance(v, EvictedValue)]
    assert len(marks) == 4 and max(map(len, marks)) <= VALUE_MARK_BYTES


def test_a_mark_whose_digest_is_not_a_sha256_is_kept_as_text() -> None:
    odd = EvictedValue(12, "not-a-sha:256", 99)
    data = encode_value(odd)
    assert data.startswith(b"EVIC") and decode_value(data) == odd
    sha = EvictedValue(12, "ab" * 32, 99)
    assert len(encode_value(sha)) == 52 and decode_value(encode_value(sha)) == sha
    with pytest.raises(ValueError, match="not a purchase record"):
        decode_purchase(b'{"fingerprint": "ab"}')


# -- resends ---------------------------------------------------------------------------------------
def test_a_sealed_purchase_is_recomputed_byte_for_byte_while_its_values_are_retained() -> None:
    now = [1_000]
    c = new_core(now)
    c.handle(T.registrations, registration("temp", retain_last=4))
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    c.handle(T.values, value("temp", "v1", [1.0, 2.0, 3.0]))
    first = c.handle(T.purchases, purchase("temp", "sealed_alice", "p"))
    (ev,) = inbox(first, "sealed_alice")
    assert isinstance(ev, PurchaseFulfilled) and ev.sealed is not None
    c.handle(T.values, value("temp", "v2", [4.0, 2.0, 3.0]))  # the window moves on
    now[0] += ANSWER_INTERVAL_MS
    c.ctx.records.inboxes_remade([T.inbox("sealed_alice")])  # else a resend adds nothing
    again = c.handle(T.purchases, purchase("temp", "sealed_alice", "p"))
    assert again.status == "duplicate" and again.outputs[0].value == first.outputs[0].value
    now[0] += ANSWER_INTERVAL_MS
    for i in range(3, 6):  # v0 leaves the window: the outcome cannot be recomputed
        c.handle(T.values, value("temp", f"v{i}", [1.0, 2.0, 3.0]))
    late = c.handle(T.purchases, purchase("temp", "sealed_alice", "p", requested_at_ms=1_001))
    (notice,) = late.outputs
    rej = Rejection.model_validate_json(notice.value)
    assert (late.status, rej.reason, rej.details["retry_after_ms"]) == (
        "duplicate",
        "already_answered",
        None,
    )
    assert "inbox" in rej.message and c.stores.streams["temp"].revenue_minor == 50


def test_a_flood_of_resends_gets_one_outcome_per_interval_and_notices_between() -> None:
    now = [1_000]
    c = new_core(now)
    c.handle(T.registrations, registration("temp"))
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    first = c.handle(T.purchases, purchase("temp", "alice", "p"))
    sent = 0
    for i in range(100):
        now[0] += 500  # 50 s of resends, two a second, each signed anew
        out = c.handle(T.purchases, purchase("temp", "alice", "p", requested_at_ms=1_001 + i))
        assert out.status == "duplicate" and len(out.outputs) == 1
        sent += out.outputs[0].value == first.outputs[0].value
        assert out.outputs[0].value == first.outputs[0].value or out.reason == "already_answered"
    assert sent == 5  # one a 10 s
    assert c.stores.streams["temp"].revenue_minor == 50


def test_a_batch_that_dies_before_its_outputs_are_sent_is_answered_in_full_on_replay() -> None:
    """State is durable before outputs are sent: a worker dying in between replays the batch.
    The purchase's values were evicted later in that batch, so its outcome cannot be
    recomputed: the record still carries its bytes, which the replay sends."""
    now = [1_000]
    stores = Stores()
    c = new_core(now, stores)
    c.handle(T.registrations, registration("temp", retain_last=1))
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    with c.batch():
        first = c.handle(T.purchases, purchase("temp", "alice", "p"))
        c.handle(T.values, value("temp", "v1", [1.0, 2.0, 3.0]))  # evicts v0
    restarted = new_core(now, stores)  # the outputs were never sent
    with restarted.batch():
        again = restarted.handle(T.purchases, purchase("temp", "alice", "p"))
        restarted.handle(T.values, value("temp", "v1", [1.0, 2.0, 3.0]))
    assert again.status == "duplicate" and again.outputs[0].value == first.outputs[0].value
    assert stores.purchases["alice/temp/p"].payload is not None
    with restarted.batch():  # the replay's outputs were sent: only the decision is kept
        restarted.handle(T.values, value("temp", "v2", [1.0, 2.0, 3.0]))
    assert stores.purchases["alice/temp/p"].payload is None
    assert stores.streams["temp"].revenue_minor == 50


# -- caps ------------------------------------------------------------------------------------------
def test_a_stream_keeps_at_most_its_cap_of_purchases_and_refuses_what_it_forgot() -> None:
    now = [10_000]
    c = new_core(now, record_caps=Caps(purchases=3))
    c.handle(T.registrations, registration("temp", steps=[float(i) for i in range(1, 9)], cap=8.0))
    for i in range(5):
        now[0] += 1_000
        out = c.handle(T.purchases, purchase("temp", "alice", f"p{i}", requested_at_ms=now[0]))
        assert out.status == "fulfilled", out.reason
    assert sorted(c.stores.purchases) == ["alice/temp/p2", "alice/temp/p3", "alice/temp/p4"]
    now[0] += ANSWER_INTERVAL_MS
    old = c.handle(T.purchases, purchase("temp", "alice", "p1", requested_at_ms=12_000))
    assert old.reason == "request_too_old"  # never fulfilled again
    assert c.stores.streams["temp"].holders["alice"].purchases == 5
    kept = c.handle(T.purchases, purchase("temp", "alice", "p2", requested_at_ms=13_000))
    assert kept.status == "duplicate"
    new = c.handle(T.purchases, purchase("temp", "bob", "n", requested_at_ms=now[0]))
    assert new.status == "fulfilled", new.reason


def test_a_stream_keeps_at_most_its_cap_of_marks_and_refuses_what_it_forgot() -> None:
    now = [10_000]
    c = new_core(now, record_caps=Caps(marks=3))
    c.handle(T.registrations, registration("temp", retain_last=1))
    for i in range(6):
        out = c.handle(T.values, value("temp", f"v{i}", [1.0, 2.0, 3.0], published_at_ms=1_000 + i))
        assert out.status == "accepted", out.reason
    marks = [k for k, v in c.stores.releases.items() if isinstance(v, EvictedValue)]
    assert sorted(marks) == ["temp/v2", "temp/v3", "temp/v4"]
    old = c.handle(T.values, value("temp", "v1", [9.0, 2.0, 3.0], published_at_ms=1_001))
    assert old.items[0][1] == "value_too_old" or old.reason == "value_too_old", old
    assert c.stores.streams["temp"].next_seq == 6  # never ingested again
    ok = c.handle(T.values, value("temp", "v9", [1.0, 2.0, 3.0], published_at_ms=1_010))
    assert ok.status == "accepted", ok.reason


def test_refusals_on_unknown_streams_are_capped_per_partition_and_say_so() -> None:
    now = [10_000]
    c = new_core(now, record_caps=Caps(unknown=2))
    reasons = []
    for i in range(3):
        out = c.handle(T.purchases, purchase("nowhere", "alice", f"p{i}", requested_at_ms=now[0]))
        reasons.append(out.reason)
    assert reasons == ["unknown_stream"] * 3 and len(c.stores.purchases) == 2
    rej = Rejection.model_validate_json(out.outputs[0].value)
    assert "not recorded" in rej.message


# -- quotes ----------------------------------------------------------------------------------------
def test_quotes_are_rate_limited_per_account_with_a_time_to_wait() -> None:
    now = [1_000]
    c = new_core(now, max_quotes_per_minute=3)
    c.handle(T.registrations, registration("temp"))
    got = [c.handle(T.purchases, quote("temp", "alice", f"q{i}")) for i in range(4)]
    assert [o.status for o in got] == ["answered"] * 3 + ["rejected"]
    rej = Rejection.model_validate_json(got[3].outputs[0].value)
    assert (rej.reason, rej.details["retry_after_ms"]) == ("rate_limited", 20_000)
    assert c.handle(T.purchases, quote("temp", "bob", "q")).status == "answered"  # per account
    now[0] += 20_000
    assert c.handle(T.purchases, quote("temp", "alice", "q9")).status == "answered"
