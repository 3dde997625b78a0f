"""MarketCore on plain dicts: the business rules without a broker."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pytest

from market.receipts import verify_receipt
from streams.core import EvictedValue, MarketCore, Stores, purchases
from streams.core.rejections import best_effort_ids
from streams.core.replay.records import (
    ANSWER_INTERVAL_MS,
    CLOCK_RECORD_MS,
    MAX_FAR_FUTURE_RECORDS,
)
from streams.wire.events import INBOX_EVENT, CatalogEntry, PurchaseFulfilled, QuoteAnswer, Rejection
from streams.wire.topics import Topics

from ..helpers import (
    SIGNED_FOR,
    TEST_KEYS,
    open_accounts,
    party,
    purchase,
    quote,
    registration,
    signed_for,
    value,
    values,
)

T = Topics("t")
PARTIES = ("seller1", "alice", "bob", "carol", "sealed_alice")


def new_core(**kw: Any) -> MarketCore:
    c = MarketCore(Stores(), TEST_KEYS, T, clock=kw.pop("clock", lambda: 1_000), **kw)
    open_accounts(c, *PARTIES)
    return c


@pytest.fixture
def core() -> MarketCore:
    c = new_core()
    assert c.handle(T.registrations, registration("temp")).status == "accepted"
    return c


def buyer_events(outcome) -> list:  # type: ignore[no-untyped-def]
    """Events for buyers: every inbox but the seller's (which gets values_accepted)."""
    return [
        INBOX_EVENT.validate_json(o.value)
        for o in outcome.outputs
        if o.topic.startswith("t.inbox.") and o.topic != "t.inbox.seller1"
    ]


def test_register_publishes_catalog_entry(core: MarketCore) -> None:
    out = core.handle(T.registrations, registration("other"))
    (o,) = out.outputs
    assert o.topic == T.catalog and o.key == b"other"
    entry = CatalogEntry.model_validate_json(o.value)
    assert [p.price_minor for p in entry.prices] == [50, 100, 200, 400]
    assert entry.market_key_id == TEST_KEYS.key_id


def test_duplicate_and_conflicting_registration(core: MarketCore) -> None:
    assert core.handle(T.registrations, registration("temp")).status == "duplicate"
    out = core.handle(T.registrations, registration("temp", cap=8.0))
    assert (out.status, out.reason) == ("rejected", "stream_exists")


def test_buy_three_steps_then_subscribe(core: MarketCore) -> None:
    for i in range(3):
        core.handle(T.values, value("temp", f"v{i}", [20.0 + i, 1.0, 2.0]))
    levels, paid = [], 0
    for step in range(3):
        out = core.handle(T.purchases, purchase("temp", "alice", f"p{step}"))
        assert out.status == "fulfilled", out.reason
        (ev,) = buyer_events(out)
        assert isinstance(ev, PurchaseFulfilled)
        levels.append(ev.level_after)
        paid += ev.price_minor
        assert [r.value_id for r in ev.releases] == ["v0", "v1", "v2"]
        releases = [(r.value_id, r.level, np.array(r.values)) for r in ev.releases]
        verify_receipt(
            ev.receipt.model_dump(),
            ev.receipt.signature,
            releases,
            TEST_KEYS.public_key,
            opening=bytes.fromhex(ev.opening or ""),
        )
    assert levels == [0.5, 1.0, 2.0]
    assert paid == 200  # exactly P(2.0): stepwise equals direct
    sub = core.handle(T.values, value("temp", "v3", [1.0, 2.0, 3.0]))
    (ev,) = buyer_events(sub)
    assert ev.type == "value_released" and ev.releases[0].level == 2.0
    assert core.stores.streams["temp"].spent_nano == 2 * 10**9


def test_duplicate_purchase_reemits_identical_bytes_and_charges_once() -> None:
    """A resend whose outcome is in the inbox adds nothing to it; once the inbox was lost, a
    resend is answered with the very bytes first sent, recomputed from the decision, at most
    once every ANSWER_INTERVAL_MS; in between it gets a short notice, never silence."""
    now = [1_000]
    core = new_core(clock=lambda: now[0])
    core.handle(T.registrations, registration("temp"))
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    first = core.handle(T.purchases, purchase("temp", "alice", "p1"))
    kept = core.handle(T.purchases, purchase("temp", "alice", "p1"))  # a copy: nothing
    assert (kept.status, kept.reason, kept.outputs) == ("duplicate", "already_answered", [])
    record = core.stores.purchases["alice/temp/p1"]
    assert record.payload is None  # a later batch: the outcome was sent, only the decision kept
    now[0] += ANSWER_INTERVAL_MS
    core.ctx.records.inboxes_remade([T.inbox("alice")])  # the inbox was lost, and made again
    again = core.handle(T.purchases, purchase("temp", "alice", "p1", requested_at_ms=5))
    assert again.status == "duplicate"
    assert again.outputs[0].value == first.outputs[0].value  # recomputed, byte for byte
    copy = core.handle(T.purchases, purchase("temp", "alice", "p1", requested_at_ms=5))
    assert copy.outputs == []  # a copy of that resend
    soon = core.handle(T.purchases, purchase("temp", "alice", "p1", requested_at_ms=6))
    assert (soon.status, soon.reason) == ("duplicate", "already_answered")  # signed anew
    (notice,) = soon.outputs
    rej = Rejection.model_validate_json(notice.value)
    assert rej.details["retry_after_ms"] == ANSWER_INTERVAL_MS and len(notice.value) < 1024
    assert core.stores.streams["temp"].holders["alice"].paid_minor == 50
    assert core.stores.streams["temp"].revenue_minor == 50


def test_reused_purchase_id_with_other_parameters_is_rejected(core: MarketCore) -> None:
    core.handle(T.purchases, purchase("temp", "alice", "p1"))
    out = core.handle(T.purchases, purchase("temp", "alice", "p1", target_level=2.0))
    assert out.reason == "idempotency_key_reused"


def test_buyers_share_one_release_process(core: MarketCore) -> None:
    """Two buyers at the same level get the same bits: a coalition learns one release."""
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    a = buyer_events(core.handle(T.purchases, purchase("temp", "alice", "p", target_level=1.0)))
    b = buyer_events(core.handle(T.purchases, purchase("temp", "bob", "p", target_level=1.0)))
    assert a[0].releases[0].values == b[0].releases[0].values
    assert core.stores.streams["temp"].spent_nano == 10**9


def test_price_too_high_quotes_the_price() -> None:
    now = [1_000]
    core = new_core(clock=lambda: now[0])
    core.handle(T.registrations, registration("temp"))
    out = core.handle(T.purchases, purchase("temp", "alice", "p1", max_price=10, target_level=2.0))
    assert out.reason == "price_too_high"
    rej = Rejection.model_validate_json(out.outputs[0].value)
    assert rej.details["quoted_price_minor"] == 200
    # as people read it, without the price the buyer offered
    assert "costs 2.00 EUR, more than the purchase's max_price_minor" in rej.message
    # the refusal is recorded: a resend gets the same refusal, however the stream has changed
    now[0] += ANSWER_INTERVAL_MS
    core.ctx.records.inboxes_remade([T.inbox("alice")])  # else a resend adds nothing to it
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    again = core.handle(
        T.purchases, purchase("temp", "alice", "p1", max_price=10**6, target_level=2.0)
    )
    assert again.reason == "idempotency_key_reused"  # other terms, same id
    again = core.handle(
        T.purchases, purchase("temp", "alice", "p1", max_price=10, target_level=2.0)
    )
    assert (again.status, again.reason) == ("duplicate", "price_too_high")
    assert "alice" not in core.stores.streams["temp"].holders


def test_quote_does_not_buy(core: MarketCore) -> None:
    out = core.handle(T.purchases, quote("temp", "alice", "q1", target_level=4.0))
    (ev,) = buyer_events(out)
    assert ev.type == "quote" and ev.price_minor == 400
    assert "alice" not in core.stores.streams["temp"].holders


def test_a_purchase_of_no_more_than_the_level_held_is_refused_with_what_to_do() -> None:
    """It used to be fulfilled at no cost with the held release: each such request stored the
    window's whole outcome (up to ~1 MiB) for the horizon and sent it again (red team, fifth
    round). Its releases are in the buyer's inbox, and the purchase that bought them resends
    them."""
    now = [1_000]
    core = new_core(clock=lambda: now[0])
    core.handle(T.registrations, registration("temp"))
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    bought = purchase("temp", "alice", "a", target_level=2.0)
    hi = buyer_events(core.handle(T.purchases, bought))[0]
    for pid, level in (("b", 0.5), ("c", 2.0)):
        out = core.handle(T.purchases, purchase("temp", "alice", pid, target_level=level))
        assert (out.status, out.reason, out.price_minor) == ("rejected", "already_held", 0)
        rej = Rejection.model_validate_json(out.outputs[0].value)
        assert rej.details["held_level"] == 2.0 and "inbox" in rej.message
        assert len(out.outputs[0].value) < 4096  # what is stored for it is small
    now[0] += ANSWER_INTERVAL_MS
    core.ctx.records.inboxes_remade([T.inbox("alice")])  # else a resend adds nothing to it
    again = buyer_events(core.handle(T.purchases, bought))[0]
    assert again.releases[0].values == hi.releases[0].values


@pytest.mark.parametrize(
    ("topic", "payload", "reason"),
    [
        (T.values, b"{not json", "invalid_event"),
        (T.values, b"\xff\xfe", "invalid_event"),
        (T.values, value("nope", "v", [1.0, 2.0, 3.0]), "unknown_stream"),
        (T.values, value("temp", "v", [1.0, 2.0]), "wrong_dimension"),
        (T.values, value("temp", "v", [1, float("nan"), 2]), "invalid_value"),  # signed NaN
        (T.values, value("temp", "v", [1, float("inf"), 2]), "invalid_value"),
        (T.values, value("temp", "v", ["a", 1, 2]), "invalid_event"),  # type: ignore[list-item]
        (T.values, value("temp", "bad id!", [1, 2, 3]), "invalid_event"),
        (T.purchases, purchase("temp", "alice", "p", target_level=5.0), "level_above_cap"),
        (T.purchases, purchase("temp", "alice", "p", target_level=-1.0), "invalid_event"),
        (T.purchases, purchase("temp", "alice", "p", currency="USD"), "currency_mismatch"),
        (T.purchases, purchase("zzz", "alice", "p"), "unknown_stream"),
        (T.purchases, b'{"type":"refund"}', "invalid_event"),
        (T.registrations, registration("s2", steps=[2.0, 1.0]), "invalid_event"),
        (
            T.registrations,
            registration(
                "s2",
                pricing={"kind": "table", "prices": {"1": 10, "2": 100}},
                steps=[1.0, 2.0],
                cap=2.0,
            ),
            "invalid_schedule",
        ),
        ("t.unknown", b"{}", "unknown_topic"),
    ],
)
def test_bad_input_becomes_a_rejection_with_reason(
    core: MarketCore, topic: str, payload: bytes, reason: str
) -> None:
    ids = best_effort_ids(payload)  # on the partition its id maps to, as a client sends it
    routing = ids.get("stream_id") if topic != T.accounts else ids.get("account_id")
    partition = T.partition_of(routing) if routing else 2
    out = core.handle(topic, payload, partition=partition, offset=7)
    assert (out.status, out.reason) == ("rejected", reason)
    rej = Rejection.model_validate_json(out.outputs[0].value)
    assert out.outputs[0].topic == T.rejections
    assert rej.reason == reason and rej.message
    assert (rej.source_partition, rej.source_offset) == (partition, 7)
    assert rej.payload_sha256 == hashlib.sha256(payload).hexdigest()
    if topic == T.values:  # a seller's numbers are never quoted
        assert (rej.payload, rej.payload_truncated) == ("", True)
        return
    original = (
        rej.payload.encode()
        if rej.payload_encoding == "utf-8"
        else __import__("base64").b64decode(rej.payload)
    )
    assert original == payload


def test_rejected_purchase_also_reaches_the_buyer(core: MarketCore) -> None:
    out = core.handle(T.purchases, purchase("temp", "alice", "p", target_level=9.0))
    assert {o.topic for o in out.outputs} == {T.rejections, T.refusals, "t.inbox.alice"}


def test_resent_value_is_deduplicated_never_renoised(core: MarketCore) -> None:
    core.handle(T.purchases, purchase("temp", "alice", "p1"))
    first = core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    again = core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    assert again.status == "duplicate" and again.new_noise == 0
    assert buyer_events(again) == buyer_events(first)  # the same releases, re-delivered
    conflict = core.handle(T.values, value("temp", "v0", [9.0, 2.0, 3.0]))
    assert conflict.reason == "conflicting_value"


def test_evicted_value_resend_is_recognised(core: MarketCore) -> None:
    for i in range(6):  # retain_last = 4
        core.handle(T.values, value("temp", f"v{i}", [1.0, 2.0, float(i)]))
    assert [e.value_id for e in core.stores.streams["temp"].window] == ["v2", "v3", "v4", "v5"]
    assert isinstance(core.stores.releases["temp/v0"], EvictedValue)  # vectors dropped
    again = core.handle(T.values, value("temp", "v0", [1.0, 2.0, 0.0]))
    assert again.status == "duplicate" and again.new_noise == 0 and not buyer_events(again)


def test_no_higher_step_and_table_levels(core: MarketCore) -> None:
    for i, lv in enumerate([0.5, 1.0, 2.0]):
        core.handle(T.purchases, purchase("temp", "alice", f"p{i}", target_level=lv))
    out = core.handle(T.purchases, purchase("temp", "alice", "p9"))
    assert out.reason == "no_higher_step"
    core.handle(
        T.registrations,
        registration(
            "tab",
            pricing={"kind": "table", "prices": {"1": 100, "2": 150}},
            steps=[1.0, 2.0],
            cap=2.0,
        ),
    )
    out = core.handle(T.purchases, purchase("tab", "alice", "t1", target_level=1.5))
    assert out.reason == "level_not_for_sale"


def test_sealed_stream_releases_only_postprocessing(core: MarketCore) -> None:
    core.handle(T.registrations, registration("sealed", sealed=True))
    out = core.handle(T.values, value("sealed", "v0", [1.0, 2.0, 3.0]))
    state = core.stores.releases["sealed/v0"]
    assert state.exact is None and set(state.steps) == {3}  # only the cap, step 3 of 0.5..4
    assert out.new_noise == 1
    assert core.stores.streams["sealed"].spent_nano == 4 * 10**9
    ok = core.handle(T.purchases, purchase("sealed", "alice", "p1", target_level=1.0))
    assert ok.status == "fulfilled"


def test_batch_groups_subscription_deliveries_per_buyer(core: MarketCore) -> None:
    core.handle(T.purchases, purchase("temp", "alice", "p1"))
    core.handle(T.purchases, purchase("temp", "bob", "p1", target_level=1.0))
    with core.batch() as deliveries:
        for i in range(3):
            out = core.handle(T.values, value("temp", f"v{i}", [1.0, 2.0, float(i)]))
            assert out.status == "accepted" and not buyer_events(out) and out.releases == 2
    events = {o.topic: INBOX_EVENT.validate_json(o.value) for o in deliveries}
    assert set(events) == {"t.inbox.alice", "t.inbox.bob"}
    assert [r.value_id for r in events["t.inbox.bob"].releases] == ["v0", "v1", "v2"]
    assert {r.level for r in events["t.inbox.bob"].releases} == {1.0}


def test_releases_survive_json_bit_for_bit(core: MarketCore) -> None:
    core.handle(T.values, value("temp", "v0", [0.1, 1e-300, 12345.6789]))
    out = core.handle(T.purchases, purchase("temp", "alice", "p1"))
    ev = buyer_events(out)[0]
    stored = stored_release(core, "temp", "v0", 0)  # level 0.5
    assert np.array_equal(np.array(ev.releases[0].values), stored)
    assert json.loads(out.outputs[0].value)["releases"][0]["values"] == stored.tolist()


def stored_release(core: MarketCore, sid: str, vid: str, step: int) -> np.ndarray:
    """What the market holds of a value at a step: its lattice integers, as released."""
    from market import Anchor

    chain = core.streams.built(core.stores.streams[sid].registration)[1].chain
    ints = core.stores.releases[f"{sid}/{vid}"].steps[step]
    out: np.ndarray = chain.mechanism.decode(Anchor(chain.levels[step], ints))
    return out


@pytest.mark.slow
def test_lossless_joint_law_across_steps() -> None:
    """Over many values, a buyer's successive releases share the stored sample with frequency
    (ε1/ε2)², as the lossless process requires (fresh noise would share it with probability 0)."""
    c = new_core()
    c.handle(T.registrations, registration("s", dimension=200, retain_last=50, steps=[1.0, 2.0]))
    for i in range(50):
        c.handle(T.values, value("s", f"v{i}", [0.0] * 200))
    e1 = buyer_events(c.handle(T.purchases, purchase("s", "alice", "a")))[0]
    e2 = buyer_events(c.handle(T.purchases, purchase("s", "alice", "b")))[0]
    y1 = np.concatenate([r.values for r in e1.releases])
    y2 = np.concatenate([r.values for r in e2.releases])
    frac = float(np.mean(y1 == y2))
    assert abs(frac - 0.25) < 0.02, frac  # n = 10^4 coordinates, sd 0.0043


def test_sealed_releases_for_buyers_with_a_key(core: MarketCore) -> None:
    from market.errors import ReceiptError
    from streams.wire.sealing import open_event

    from ..helpers import party

    key = party("sealed_alice").sealing_key  # her account pinned its public half
    assert key is not None
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    out = core.handle(T.purchases, purchase("temp", "sealed_alice", "p1"))
    ev = buyer_events(out)[0]
    assert ev.releases == [] and ev.sealed is not None
    assert b"values" not in out.outputs[0].value  # no plaintext numbers on the topic
    opened = open_event(ev, key)
    stored = stored_release(core, "temp", "v0", 0)  # level 0.5
    assert np.array_equal(np.array(opened.releases[0].values), stored)
    rel = [(r.value_id, r.level, np.asarray(r.values)) for r in opened.releases]
    env = ev.sealed.model_dump()
    opening = bytes.fromhex(opened.opening or "")
    verify_receipt(
        ev.receipt.model_dump(),
        ev.receipt.signature,
        rel,
        TEST_KEYS.public_key,
        envelope=env,
        opening=opening,
    )
    other = dict(env, ciphertext=env["ciphertext"][:-4] + "AAA=")
    with pytest.raises(ReceiptError, match="envelope"):
        verify_receipt(
            ev.receipt.model_dump(),
            ev.receipt.signature,
            rel,
            TEST_KEYS.public_key,
            envelope=other,
            opening=opening,
        )
    sub = buyer_events(core.handle(T.values, value("temp", "v1", [4.0, 5.0, 6.0])))[0]
    assert sub.releases == [] and open_event(sub, key).releases[0].value_id == "v1"


def test_market_can_require_encryption() -> None:
    c = new_core(require_encryption=True)
    c.handle(T.registrations, registration("temp"))
    assert c.handle(T.purchases, purchase("temp", "alice", "p")).reason == "encryption_required"
    assert c.handle(T.purchases, purchase("temp", "sealed_alice", "p")).status == "fulfilled"


def test_internal_errors_become_rejections(
    core: MarketCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(purchases, "_fulfil", boom)
    out = core.handle(T.purchases, purchase("temp", "alice", "p1"))
    assert out.reason == "internal_error" and "RuntimeError" in out.outputs[0].value.decode()
    monkeypatch.undo()
    assert core.handle(T.purchases, purchase("temp", "alice", "p2")).status == "fulfilled"


def test_dedup_horizon_forgets_markers_and_refuses_old_values() -> None:
    """Eviction markers older than the horizon are dropped, and exactly those values are
    refused if they come back: memory stays bounded and nothing is ever re-noised."""
    c = new_core(clock=lambda: 10**9, dedup_horizon_ms=1000)
    c.handle(T.registrations, registration("temp", retain_last=2))
    for i in range(10):  # published 500 ms apart
        c.handle(T.values, value("temp", f"v{i}", [1.0, 2.0, 3.0], published_at_ms=500 * i))
    keys = sorted(k for k in c.stores.releases if k.startswith("temp/"))
    # window v8, v9 + markers newer than 4500 - 1000 ms: v6 (3000 ms) is gone, v7 kept
    assert keys == ["temp/v7", "temp/v8", "temp/v9"]
    old = c.handle(T.values, value("temp", "v6", [1.0, 2.0, 3.0], published_at_ms=3000))
    assert old.reason == "value_too_old" and old.new_noise == 0
    dup = c.handle(T.values, value("temp", "v7", [1.0, 2.0, 3.0], published_at_ms=3500))
    assert dup.status == "duplicate"
    future = c.handle(T.values, value("temp", "vf", [1.0, 2.0, 3.0], published_at_ms=10**10))
    assert future.reason == "value_from_the_future"


def test_purchase_outcomes_expire_beyond_the_horizon() -> None:
    now = [0]
    c = new_core(clock=lambda: now[0], dedup_horizon_ms=1000)
    c.handle(T.registrations, registration("temp"))
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    for i, lv in enumerate([0.5, 1.0, 2.0, 4.0]):  # requested 600 ms apart, as they happen
        now[0] = 600 * i
        c.handle(
            T.purchases,
            purchase("temp", "alice", f"p{i}", target_level=lv, requested_at_ms=600 * i),
        )
    assert sorted(c.stores.purchases) == ["alice/temp/p2", "alice/temp/p3"]  # p0, p1 gone
    old = c.handle(
        T.purchases, purchase("temp", "alice", "p0", target_level=0.5, requested_at_ms=0)
    )
    assert old.reason == "request_too_old"
    again = c.handle(
        T.purchases, purchase("temp", "alice", "p2", target_level=2.0, requested_at_ms=1200)
    )
    assert again.status == "duplicate"
    assert c.stores.streams["temp"].holders["alice"].paid_minor == 400  # ledger kept


DAY = 86_400_000


def _on_partition_of(stream_id: str, n: int = 1) -> list[str]:
    """``n`` other stream ids on the input partition of ``stream_id``."""
    home = T.partition_of(stream_id)
    return [s for s in (f"x{i}" for i in range(10_000)) if T.partition_of(s) == home][:n]


def test_a_refused_purchase_replayed_after_its_record_expired_is_too_old() -> None:
    """The red team's replay: a purchase refused on a stream nobody had registered was
    recorded under the market's clock only; a week later mallory registered the stream at
    exactly alice's maximum price and replayed her signed bytes, and alice paid. A purchase
    older than the horizon before the market's clock is now refused, whatever the stream; and
    the record is kept a clock skew longer, for a worker whose clock is behind (second round:
    the worker that forgot it was 2 s ahead of the one the copy reached)."""
    now = [10 * DAY]
    c = new_core(clock=lambda: now[0])
    alice_req = purchase("weather", "alice", "p1", max_price=5000, requested_at_ms=now[0])
    assert c.handle(T.purchases, alice_req).reason == "unknown_stream"
    assert c.handle(T.purchases, alice_req).status == "duplicate"  # its refusal, recorded
    nothing = _on_partition_of("weather")[0]  # records are forgotten partition by partition
    now[0] += 7 * DAY + 1000
    c.handle(T.purchases, purchase(nothing, "bob", "x", requested_at_ms=now[0]))
    reg = registration(
        "weather", steps=[1.0], cap=1.0, pricing={"kind": "linear_level", "rate_per_level": 5000}
    )
    assert c.handle(T.registrations, reg).status == "accepted"
    c.handle(T.values, value("weather", "v", [0.0, 0.0, 0.0], published_at_ms=now[0]))
    behind = MarketCore(c.stores, TEST_KEYS, T, clock=lambda: now[0] - 2000)  # a slower clock
    late = behind.handle(T.purchases, alice_req)  # the stream's watermark (its registration
    assert (late.status, late.price_minor) == ("rejected", 0)  # time) refuses it everywhere
    assert c.stores.purchases["alice/weather/p1"].status == "rejected"  # and its record is kept
    now[0] += CLOCK_RECORD_MS
    c.handle(T.purchases, purchase(nothing, "bob", "y", requested_at_ms=now[0]))  # expires it
    assert "alice/weather/p1" not in c.stores.purchases
    out = c.handle(T.purchases, alice_req)
    assert (out.status, out.reason) == ("rejected", "request_too_old")
    assert c.stores.streams["weather"].holders == {} and out.price_minor == 0
    elsewhere = purchase("nowhere", "alice", "p2", requested_at_ms=10 * DAY)  # no stream: clock
    message = Rejection.model_validate_json(c.handle(T.purchases, elsewhere).outputs[0].value)
    assert message.reason == "request_too_old" and "market's clock" in message.message
    behind.ctx.records.invalidate()
    assert behind.handle(T.purchases, alice_req).reason == "request_too_old"  # there too


def test_a_purchase_from_the_future_is_refused_for_good() -> None:
    """A refusal as from the future used to leave no record: once the clock caught up, the
    same signed bytes were fulfilled — after the buyer, told to fix her clock, had bought again
    under a new id. Now the refusal is recorded, and moves the stream's watermark no further
    than the market's clock (third round: an hour ahead, it made honest resends too old)."""
    now = [10 * DAY]
    c = new_core(clock=lambda: now[0])
    c.handle(T.registrations, registration("temp"))
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0], published_at_ms=now[0]))
    ahead = purchase("temp", "bob", "b1", requested_at_ms=now[0] + 2 * 3_600_000)
    assert c.handle(T.purchases, ahead).reason == "request_from_the_future"
    assert c.stores.streams["temp"].purchase_watermark_ms == now[0]
    assert c.handle(T.purchases, purchase("temp", "bob", "b2", requested_at_ms=now[0])).status == (
        "fulfilled"
    )
    now[0] += 3 * 3_600_000  # the clock has caught up: the copy meets its refusal
    c.ctx.records.inboxes_remade([T.inbox("bob")])  # else a resend adds nothing to it
    again = c.handle(T.purchases, ahead)
    assert (again.status, again.price_minor) == ("duplicate", 0)
    assert b"request_from_the_future" in again.outputs[0].value
    assert c.stores.streams["temp"].holders["bob"].purchases == 1


def test_a_free_purchase_dated_an_hour_ahead_moves_the_watermark_no_further_than_the_clock() -> (
    None
):
    """Third round: mallory's purchase dated clock + 1 h, refused at no cost, moved the stream's
    watermark an hour ahead: alice's resend near the horizon's edge lost its record, and with a
    short horizon every honest purchase was too old for an hour."""
    now = [10 * DAY]
    c = new_core(clock=lambda: now[0])
    c.handle(T.registrations, registration("temp"))
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0], published_at_ms=now[0]))
    mine = purchase("temp", "alice", "a1", requested_at_ms=now[0])
    assert c.handle(T.purchases, mine).status == "fulfilled"
    now[0] += 7 * DAY - 30 * 60_000
    free = purchase("temp", "bob", "m", max_price=0, requested_at_ms=now[0] + 3_600_000)
    assert c.handle(T.purchases, free).reason == "price_too_high"
    assert c.stores.streams["temp"].purchase_watermark_ms == now[0]
    assert c.handle(T.purchases, mine).status == "duplicate"  # her record is still there
    short = new_core(clock=lambda: now[0], dedup_horizon_ms=10_000)
    short.handle(T.registrations, registration("temp"))
    short.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0], published_at_ms=now[0]))
    assert short.handle(T.purchases, free).reason == "price_too_high"
    honest = purchase("temp", "alice", "a2", requested_at_ms=now[0])
    assert short.handle(T.purchases, honest).status == "fulfilled"


def test_a_purchase_too_old_by_one_clock_is_too_old_on_every_worker() -> None:
    """Third round: refused as too old by the clock (nothing recorded), the same bytes were
    fulfilled by a worker whose clock was 30 min behind. The stream's watermark now carries
    the clock's verdict."""
    stores = Stores()
    now = [100 * DAY]
    fast = MarketCore(stores, TEST_KEYS, T, clock=lambda: now[0])
    open_accounts(fast, *PARTIES)
    fast.handle(T.registrations, registration("temp"))
    fast.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0], published_at_ms=now[0]))
    stores.streams["temp"].purchase_watermark_ms = 0  # as stored before watermarks had a floor
    late = purchase(
        "temp",
        "alice",
        "p1",
        target_level=2.0,
        requested_at_ms=now[0] - 7 * DAY - 3_600_000 - 60_000,
    )
    assert fast.handle(T.purchases, late).reason == "request_too_old"
    now[0] += 5 * 60_000
    slow = MarketCore(stores, TEST_KEYS, T, clock=lambda: now[0] - 30 * 60_000)
    again = slow.handle(T.purchases, late)
    assert (again.reason, again.price_minor) == ("request_too_old", 0)
    assert "alice" not in stores.streams["temp"].holders


def test_one_purchase_id_on_two_streams_is_two_purchases_wherever_they_are_kept() -> None:
    """Records were once keyed by buyer and purchase id but kept in their stream's partition, so
    one id on two streams was two records under one key; a worker restoring both partitions kept
    one, and the other purchase was fulfilled again. Keys name the stream."""
    c = new_core()
    for sid in ("s1", "s4"):
        c.handle(T.registrations, registration(sid))
        c.handle(T.values, value(sid, "v0", [1.0, 2.0, 3.0]))
    first, second = (purchase(sid, "alice", "order-1") for sid in ("s1", "s4"))
    assert [c.handle(T.purchases, p).status for p in (first, second)] == ["fulfilled"] * 2
    assert sorted(c.stores.purchases) == ["alice/s1/order-1", "alice/s4/order-1"]
    assert [c.handle(T.purchases, p).status for p in (first, second)] == ["duplicate"] * 2
    assert c.stores.streams["s1"].holders["alice"].purchases == 1


def test_a_replayed_purchase_rewrites_its_stream_at_most_once_a_step() -> None:
    """Fourth round: the watermark's floor (the clock less the skew) was raised to exactly
    the floor, so one signed purchase, refused as too old and replayed every millisecond on a
    quiet stream, rewrote the stream's whole record every time (51 MB for 1,000 copies)."""

    class Writes(dict[str, Any]):
        count = 0

        def __setitem__(self, key: str, value: Any) -> None:
            Writes.count += 1
            super().__setitem__(key, value)

    stores = Stores()
    stores.streams = Writes()
    now = [100 * DAY]
    c = MarketCore(stores, TEST_KEYS, T, clock=lambda: now[0])
    open_accounts(c, *PARTIES)
    c.handle(T.registrations, registration("temp"))
    now[0] += 2 * 3_600_000  # an idle stream: its watermark is behind the floor
    old = purchase("temp", "alice", "old", requested_at_ms=now[0] - 8 * DAY)
    Writes.count = 0
    for _ in range(1_000):
        now[0] += 1
        assert c.handle(T.purchases, old).reason == "request_too_old"
    assert Writes.count == 1
    now[0] += c.ctx.records.step_ms
    c.handle(T.purchases, old)
    assert Writes.count == 2
    # fifth round: purchases refused at no cost, each a millisecond later than the last, moved
    # the watermark, and so rewrote the record, every time; it moves in whole steps now
    Writes.count = 0
    for i in range(1_000):
        now[0] += 1
        free = purchase("temp", "bob", f"f{i}", max_price=0, requested_at_ms=now[0])
        assert c.handle(T.purchases, free).reason == "price_too_high"
    assert Writes.count <= 1 + 1_000 // c.ctx.records.step_ms


def test_with_a_horizon_shorter_than_the_skew_every_admitted_refusal_is_recorded() -> None:
    """Second round: a purchase dated between clock + horizon and clock + skew passed the
    future check, was refused for an ordinary reason and left no record; mallory registered
    the stream and replayed it (EMARKET_DEDUP_HORIZON 30 s, alice's clock 60 s fast)."""
    now = [10 * DAY]
    c = new_core(clock=lambda: now[0], dedup_horizon_ms=30_000)
    req = purchase("weather", "alice", "p1", max_price=5000, requested_at_ms=now[0] + 60_000)
    assert c.handle(T.purchases, req).reason == "unknown_stream"
    assert "alice/weather/p1" in c.stores.purchases
    reg = registration(
        "weather", steps=[1.0], cap=1.0, pricing={"kind": "linear_level", "rate_per_level": 5000}
    )
    assert c.handle(T.registrations, reg).status == "accepted"
    c.handle(T.values, value("weather", "v", [0.0, 0.0, 0.0], published_at_ms=now[0]))
    now[0] += 60_000
    assert c.handle(T.purchases, req).status == "duplicate"


def test_purchases_dated_beyond_the_horizon_ahead_are_recorded_up_to_a_quota() -> None:
    """Their records outlive every other, so each buyer may have a few of them on record; a
    copy of a recorded one meets its refusal once the clock reaches its date (second round: it
    was refused without a record, and fulfilled when replayed a week later)."""
    now = [10 * DAY]
    c = new_core(clock=lambda: now[0])
    c.handle(T.registrations, registration("temp"))
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0], published_at_ms=now[0]))
    far = [
        purchase("temp", "bob", f"b{i}", requested_at_ms=now[0] + 8 * DAY + i)
        for i in range(MAX_FAR_FUTURE_RECORDS + 1)
    ]
    for raw in far[:-1]:
        assert c.handle(T.purchases, raw).reason == "request_from_the_future"
    assert len(c.stores.purchases) == MAX_FAR_FUTURE_RECORDS
    out = c.handle(T.purchases, far[-1])  # over the quota: refused, and it says it is not kept
    assert out.reason == "request_from_the_future" and len(c.stores.purchases) == 8
    assert "not recorded" in Rejection.model_validate_json(out.outputs[0].value).message
    other = purchase("temp", "alice", "a", requested_at_ms=now[0] + 8 * DAY)  # her own quota
    assert c.handle(T.purchases, other).reason == "request_from_the_future"
    assert "alice/temp/a" in c.stores.purchases
    now[0] += 8 * DAY  # the clock reaches their date: every recorded copy meets its refusal
    again = c.handle(T.purchases, far[0])
    assert (again.status, again.price_minor) == ("duplicate", 0)
    restarted = MarketCore(c.stores, TEST_KEYS, T, clock=lambda: 10 * DAY)  # quota from the table
    assert (
        "not recorded"
        in Rejection.model_validate_json(
            restarted.handle(T.purchases, far[-1]).outputs[0].value
        ).message
    )


def test_expiry_survives_restart_and_rebalance_with_one_scan() -> None:
    """A restarted core (new instance, same tables) and a rebalanced one (invalidated, while
    another worker wrote to the tables) rebuild the expiry heaps of every stream in one pass,
    and go on forgetting what the tables hold beyond the horizon."""

    class CountingLadders(dict[str, Any]):
        scans = 0

        def items(self) -> Any:
            CountingLadders.scans += 1
            return super().items()

    stores = Stores()
    stores.releases = CountingLadders()
    now = [0]  # the market's clock: purchases are requested as they happen
    first = MarketCore(stores, TEST_KEYS, T, clock=lambda: now[0], dedup_horizon_ms=1000)
    open_accounts(first, "seller1", "alice")
    streams = [f"s{j}" for j in range(5)]
    for sid in streams:
        first.handle(T.registrations, registration(sid, retain_last=1))
        for i in range(4):  # leaves markers for v1 and v2 (v0 is already beyond the horizon)
            first.handle(T.values, value(sid, f"v{i}", [1.0, 2.0, 3.0], published_at_ms=500 * i))
        first.handle(T.purchases, purchase(sid, "alice", f"{sid}-p0", requested_at_ms=0))
    second = MarketCore(stores, TEST_KEYS, T, clock=lambda: now[0], dedup_horizon_ms=1000)
    first.invalidate_indexes()  # what the app does on every rebalance
    for core, late in ((second, 4000), (first, 6000)):  # `second` writes what `first` never saw
        now[0] = late
        CountingLadders.scans = 0
        for sid in streams:
            core.handle(T.values, value(sid, f"w{late}", [1.0, 2.0, 3.0], published_at_ms=late))
            core.handle(T.purchases, purchase(sid, "alice", f"{sid}-q{late}", requested_at_ms=late))
        assert CountingLadders.scans == 1
        for sid in streams:  # everything published or requested before late - 1000 ms is gone
            assert sorted(k for k in stores.releases if k.startswith(f"{sid}/")) == [
                f"{sid}/w{late}"
            ]
        assert sorted(stores.purchases) == sorted(f"alice/{sid}/{sid}-q{late}" for sid in streams)


def test_catalog_states_poisson_epsilon_for_the_stream_dimension(core: MarketCore) -> None:
    """At λ = 380 one count has a guarantee (ε ≈ 1.33 at δ = 1e-6) but four counts do not
    (Andersson Thm E.2 needs λ > 23 ln(10 d/δ)); the catalog must not show the d = 1 figure."""
    omega = 1 / 380
    eps = {}
    for dim in (1, 4):
        out = core.handle(
            T.registrations,
            registration(
                f"counts{dim}", mechanism="poisson", dimension=dim, steps=[omega], cap=omega
            ),
        )
        entry = CatalogEntry.model_validate_json(out.outputs[0].value)
        assert entry.level_unit == "omega"
        eps[dim] = entry.prices[0].epsilon
    assert eps[1] is not None and abs(eps[1] - 1.326) < 1e-3
    assert eps[4] is None


def test_ids_with_dots_are_refused_and_inboxes_never_collide() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from streams.wire.events import OpenAccount
    from streams.wire.topics import Topics

    t = Topics("p")
    for bad in ("x.alice2", "a..", ".", "a.b"):
        with pytest.raises(ValueError, match="pattern"):
            party("alice").sign(
                OpenAccount,
                signed_for("p"),
                account_id=bad,
                signing_key=party("a").public_key,
                opened_at_ms=1,
            )
    ident = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)

    @settings(max_examples=300)
    @given(a=ident, b=ident)
    def distinct(a: str, b: str) -> None:
        assert (t.inbox(a) == t.inbox(b)) == (a == b)
        assert t.inbox(a) not in {
            t.accounts,
            t.values,
            t.purchases,
            t.registrations,
            t.catalog,
            t.rejections,
            t.deadletters,
            t.identity,
            t.refusals,
        }

    distinct()


def test_the_largest_stream_record_fits_its_bound() -> None:
    """A full window, every holder and every reservation kept, all with 64-character ids and
    extreme numbers; then with a buyer share's counts of values too."""
    from streams.core.codecs import CODECS, encode_stream
    from streams.core.context import Limits
    from streams.core.holds import MAX_HELD_WINDOWS, MAX_KEPT, Hold
    from streams.core.state import (
        MAX_RECENT_WINDOWS,
        Holder,
        StreamState,
        ValueEntry,
        registered_bound,
        stream_record_bound,
    )

    c = new_core(limits=Limits(max_holders=2000, max_event_work=10**9))
    fields = {
        "steps": [round(0.1 + 0.0123456789 * i, 10) for i in range(64)],
        "description": '"\\' * 250,
        "retain_last": 1000,
        "privacy_unit": "window",
        "window": {"duration_ms": 31_622_400_000, "cap": 1.2345678901234567e300},
    }
    out = c.handle(T.registrations, registration("s" * 64, cap=123456.78901234567, **fields))
    assert out.status == "accepted", out.outputs[0].value[:300]
    st = c.stores.streams["s" * 64]
    big = 2**63 - 1
    st.window = [
        ValueEntry(
            value_id=f"{i:064d}",
            seq=big,
            digest="f" * 64,
            received_at_ms=big,
            published_at_ms=big,
            level=1.2345678901234567e-300,
        )
        for i in range(1000)
    ]
    sums = 1000 + MAX_RECENT_WINDOWS + 1
    st.window_spent_nano = {big - i: 10**18 for i in range(sums)}
    st.window_floor = big
    st.holders = {
        f"{i:064d}": Holder(level=1.2345678901234567e-300, paid_minor=10**15, purchases=big)
        for i in range(2000)
    }
    st.revenue_minor, st.values_ingested, st.spent_nano = big, big, 10**18
    st.reservations = [
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
    size = len(encode_stream(StreamState.model_validate(st.model_dump())))
    assert size <= stream_record_bound(1000, 2000, windowed=True) <= 1_048_576
    st.window_values = {big - i: big for i in range(sums)}  # with a buyer share: the counts
    size = len(encode_stream(StreamState.model_validate(st.model_dump())))
    assert size <= stream_record_bound(1000, 2000, windowed=True, shared=True) <= 1_048_576
    registered = len(CODECS["registered"][0](st.registered))
    assert registered <= registered_bound(len(st.registered.catalog_payload)) <= 1_048_576


def test_a_stream_whose_record_could_outgrow_a_message_is_refused() -> None:
    from streams.core.context import Limits

    c = new_core(limits=Limits(max_message_bytes=200_000))
    out = c.handle(T.registrations, registration("wide", retain_last=1000))
    assert out.status == "rejected" and out.reason == "stream_too_large"


LOW_ORDER_KEY = "A" * 43 + "="  # the all-zero X25519 point: every shared secret is zero


def test_a_sealing_key_nothing_can_be_sealed_for_is_refused() -> None:
    """A low-order sealing key used to make every delivery on the worker fail (review F1)."""
    from streams.wire.events import OpenAccount

    c = new_core()
    evil = party("evil")
    opened = evil.sign(
        OpenAccount,
        SIGNED_FOR,
        account_id="evil",
        signing_key=evil.public_key,
        sealing_key=LOW_ORDER_KEY,
        opened_at_ms=1,
    )
    out = c.handle(T.accounts, opened.model_dump_json().encode())
    assert out.status == "rejected" and out.reason == "invalid_key"
    assert "evil" not in c.stores.accounts and not out.create_topics
    # and by rotation, signed correctly by alice with her own keys
    alice = party("alice")
    rotated = alice.rotate_to(alice, SIGNED_FOR, version=2, rotated_at_ms=2)
    bad = rotated.model_copy(update={"sealing_key": LOW_ORDER_KEY})
    from streams.wire.signing import sign

    bad = bad.model_copy(update={"signature": sign(SIGNED_FOR, bad, alice.signing_key)})
    bad = bad.model_copy(update={"new_key_signature": sign(SIGNED_FOR, bad, alice.signing_key)})
    out = c.handle(T.accounts, bad.model_dump_json().encode())
    assert out.status == "rejected" and out.reason == "invalid_key"


def test_one_holder_whose_delivery_fails_costs_only_its_own(core: MarketCore) -> None:
    """Defence in depth: even a key that slipped past validation stops nobody else."""
    core.handle(T.purchases, purchase("temp", "alice", "p1"))
    core.handle(T.purchases, purchase("temp", "bob", "p2"))
    alice = core.stores.accounts["alice"]
    core.stores.accounts["alice"] = alice.model_copy(update={"sealing_key": LOW_ORDER_KEY})
    core.ctx.directory.learn(core.stores.accounts["alice"])
    with core.batch() as deliveries:
        out = core.handle(T.values, value("temp", "v1", [1.0, 2.0, 3.0]))
    assert out.status == "accepted"
    assert [o.topic for o in deliveries] == ["t.inbox.bob"]
    assert core.handle(T.values, value("temp", "v2", [1.0, 2.0, 3.0])).status == "accepted"


def test_refusals_on_unknown_streams_expire_with_the_horizon() -> None:
    """Purchases naming streams that do not exist used to be stored forever (review F5)."""
    now = [10_000_000]
    c = new_core(clock=lambda: now[0], dedup_horizon_ms=60_000)
    for i, sid in enumerate(_on_partition_of("nowhere", 200)):
        out = c.handle(T.purchases, purchase(sid, "alice", f"p{i}", requested_at_ms=now[0]))
        assert out.reason == "unknown_stream"
    assert len(c.stores.purchases) == 200  # a resend within the horizon is recognised
    now[0] += 61_000  # kept longer than the horizon: another worker's clock may be behind
    c.handle(T.purchases, purchase("nowhere", "alice", "soon", requested_at_ms=now[0]))
    assert len(c.stores.purchases) == 201
    now[0] += CLOCK_RECORD_MS
    c.handle(T.purchases, purchase("nowhere", "alice", "late", requested_at_ms=now[0]))
    assert sorted(c.stores.purchases) == ["alice/nowhere/late", "alice/nowhere/soon"]


def test_refusals_on_unknown_streams_are_forgotten_only_on_their_own_partition() -> None:
    """Fourth round: one heap held every partition's, so an event of one partition forgot
    records of the others, and the worker sent those deletions to the changelog partition of
    the event: a restore brought the records back, without end."""
    now = [10_000_000]
    c = new_core(clock=lambda: now[0], dedup_horizon_ms=60_000)
    here, there = (
        "nowhere",
        next(
            s
            for s in (f"y{i}" for i in range(100))
            if T.partition_of(s) != T.partition_of("nowhere")
        ),
    )
    for sid in (here, there):
        c.handle(T.purchases, purchase(sid, "alice", f"p-{sid}", requested_at_ms=now[0]))
    now[0] += 61_000 + CLOCK_RECORD_MS
    c.handle(T.purchases, purchase(_on_partition_of(here)[0], "bob", "q", requested_at_ms=now[0]))
    assert f"alice/{here}/p-{here}" not in c.stores.purchases  # forgotten with its partition's
    assert f"alice/{there}/p-{there}" in c.stores.purchases  # kept until an event of its own
    c.handle(T.purchases, purchase(_on_partition_of(there)[0], "bob", "r", requested_at_ms=now[0]))
    assert f"alice/{there}/p-{there}" not in c.stores.purchases


def test_rotations_leave_no_key_behind_in_the_directory() -> None:
    """Fifth round: each rotation left its old key id in the core's index of keys, for ever."""
    from streams.clients.keys import Party

    c = new_core()
    before = len(c.ctx.directory._keys)
    current = party("alice")
    for version in range(2, 52):
        new = party(f"k{version}")
        rot = Party("alice", current.signing_key).rotate_to(
            new, SIGNED_FOR, version, rotated_at_ms=2_000
        )
        assert c.handle(T.accounts, rot.model_dump_json().encode()).status == "accepted"
        current = new
    assert len(c.ctx.directory._keys) == before
    assert c.ctx.directory.owner_of_key(c.stores.accounts["alice"].key_id) == "alice"


def test_one_event_has_bounded_output_and_work() -> None:
    """Sybil holders and long batches used to make one value event cost gigabytes and
    seconds (review F3, F4): a stream's holders and a batch's length are bounded."""
    from streams.core.context import Limits
    from streams.core.delivery import release_bytes

    limits = Limits(max_event_output_bytes=2_000_000)
    c = new_core(limits=limits)
    assert c.handle(T.registrations, registration("wide", dimension=300)).status == "accepted"
    per = release_bytes(300, sealed=True)
    assert limits.holder_limit(300) == 2_000_000 // per
    for name in ("alice", "bob", "carol"):
        assert c.handle(T.purchases, purchase("wide", name, "p")).status == "fulfilled"
    cap = 2_000_000 // (3 * per)
    rows = [(f"v{i}", [1.0] * 300) for i in range(cap + 1)]
    out = c.handle(T.values, values("wide", rows))
    assert out.status == "rejected" and out.reason == "batch_too_large"
    assert json.loads(out.outputs[0].value)["details"]["max_values"] == cap
    assert c.handle(T.values, values("wide", rows[:cap])).status == "accepted"
    # a stream whose purchase would walk too much noise is refused at registration (the
    # review's 1,000 values of dimension 23 up 65 steps: ~2 s in one event)
    steps = [round(0.001 * 1.1**i, 12) for i in range(64)]
    out = c.handle(
        T.registrations, registration("heavy", dimension=23, retain_last=1000, steps=steps, cap=1.0)
    )
    assert out.status == "rejected" and out.reason == "stream_too_large"
    assert "work units" in json.loads(out.outputs[0].value)["message"]


def test_a_stream_cannot_have_more_holders_than_one_value_can_reach() -> None:
    from streams.core.context import Limits

    c = new_core(limits=Limits(max_event_output_bytes=30_000))
    assert c.handle(T.registrations, registration("w", dimension=300)).status == "accepted"
    assert Limits(max_event_output_bytes=30_000).holder_limit(300) == 2
    assert c.handle(T.purchases, purchase("w", "alice", "p")).status == "fulfilled"
    assert c.handle(T.purchases, purchase("w", "bob", "p")).status == "fulfilled"
    out = c.handle(T.purchases, purchase("w", "carol", "p"))
    assert out.reason == "stream_full"


# ---------------------------------------------------------------- orders in the buyer's terms
def test_an_accuracy_order_buys_the_cheapest_level_that_meets_it(core: MarketCore) -> None:
    """temp: Laplace Δ = 1, steps 0.5, 1, 2, cap 4, 1.00 per unit of ε. RMS error √2/ε ≤ 1
    needs ε ≥ 1.41: level 2, at its price, with the error model of level 2."""
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    out = core.handle(T.purchases, purchase("temp", "alice", "p1", accuracy={"rmse": 1.0}))
    (ev,) = buyer_events(out)
    assert isinstance(ev, PurchaseFulfilled) and ev.level_after == 2.0 and ev.price_minor == 200
    # the lattice Laplace's noise scale is g·D/ε = (1 + 2^-12 …)·Δ/ε (docs/math.md §4.6)
    assert ev.error_model is not None
    assert ev.error_model.std == pytest.approx(2**0.5 / 2, rel=1e-3)
    assert ev.error_model.half_widths["95"] == pytest.approx(0.5 * np.log(20.0), rel=1e-3)
    # already accurate enough: nothing more to buy
    again = core.handle(T.purchases, purchase("temp", "alice", "p2", accuracy={"rmse": 2.0}))
    assert (again.reason, again.price_minor) == ("already_held", 0)


def test_an_impossible_accuracy_is_refused_with_the_best_offer(core: MarketCore) -> None:
    out = core.handle(
        T.purchases,
        purchase("temp", "alice", "p1", accuracy={"half_width": 0.1, "confidence": 0.95}),
    )
    assert (out.status, out.reason) == ("rejected", "accuracy_not_for_sale")
    rej = Rejection.model_validate_json(out.outputs[0].value)
    assert rej.details["best_level"] == 4.0
    assert rej.details["best_error"] == pytest.approx(np.log(20.0) / 4.0, rel=1e-3)
    assert "target_level 4" in rej.message


def test_most_accurate_within_the_price(core: MarketCore) -> None:
    out = core.handle(
        T.purchases, purchase("temp", "alice", "p1", max_price=150, most_accurate=True)
    )
    (ev,) = buyer_events(out)
    assert ev.level_after == 1.0 and ev.price_minor == 100
    out = core.handle(
        T.purchases, purchase("temp", "alice", "p2", max_price=99, most_accurate=True)
    )
    assert out.reason == "price_too_high"  # not even the next step: say what it costs


def test_a_quote_lists_every_level_with_its_accuracy_and_price(core: MarketCore) -> None:
    core.handle(T.purchases, purchase("temp", "alice", "p1", target_level=1.0))
    (ev,) = buyer_events(core.handle(T.purchases, quote("temp", "alice", "q1")))
    assert isinstance(ev, QuoteAnswer) and ev.level_after == 2.0
    rows = [(o.level, o.held, o.price_minor) for o in ev.offers]
    assert rows == [(0.5, True, 0), (1.0, True, 0), (2.0, False, 100), (4.0, False, 300)]
    assert [o.rmse for o in ev.offers] == pytest.approx([2.8284, 1.4142, 0.7071, 0.3536], rel=1e-3)
    (ev,) = buyer_events(
        core.handle(T.purchases, quote("temp", "alice", "q2", accuracy={"rmse": 0.5}))
    )
    assert ev.level_after == 4.0 and ev.price_minor == 300


def test_subscription_deliveries_carry_the_error_model_of_their_level(core: MarketCore) -> None:
    core.handle(T.purchases, purchase("temp", "alice", "p1", target_level=2.0))
    (ev,) = buyer_events(core.handle(T.values, value("temp", "v9", [1.0, 2.0, 3.0])))
    assert ev.type == "value_released" and ev.error_model.level == 2.0
    assert ev.error_model.unit == "epsilon" and ev.error_model.offset == 0.0


def test_the_signature_covers_the_accuracy_target(core: MarketCore) -> None:
    raw = json.loads(purchase("temp", "alice", "p1", accuracy={"rmse": 5.0}))
    raw["accuracy"]["rmse"] = 0.5  # a more accurate (dearer) level than alice signed for
    out = core.handle(T.purchases, json.dumps(raw).encode())
    assert out.reason == "bad_signature"


def test_a_quote_at_the_top_step_still_lists_what_is_for_sale(core: MarketCore) -> None:
    core.handle(T.purchases, purchase("temp", "alice", "p1", target_level=2.0))
    (ev,) = buyer_events(core.handle(T.purchases, quote("temp", "alice", "q1")))
    assert isinstance(ev, QuoteAnswer) and (ev.level_after, ev.price_minor) == (2.0, 0)
    assert [(o.level, o.held) for o in ev.offers][-1] == (4.0, False)  # the cap, by target


def test_most_accurate_at_the_top_step_with_a_small_budget_says_what_the_cap_costs(
    core: MarketCore,
) -> None:
    core.handle(T.purchases, purchase("temp", "alice", "p1", target_level=2.0))
    out = core.handle(
        T.purchases, purchase("temp", "alice", "p2", max_price=10, most_accurate=True)
    )
    assert out.reason == "price_too_high"  # the cap (4) is for sale: not "no higher step"
    rej = Rejection.model_validate_json(out.outputs[0].value)
    assert rej.details["quoted_price_minor"] == 200


def test_an_extreme_confidence_is_an_invalid_event_not_an_internal_error(core: MarketCore) -> None:
    for c in (0.99999, 1.0 - 2.0**-53):
        out = core.handle(
            T.purchases,
            purchase("temp", "alice", f"p{c}", accuracy={"half_width": 1.0, "confidence": c}),
        )
        assert out.reason == "invalid_event", out.reason


def test_event_streams_of_values_send_none_of_the_newer_fields() -> None:
    """Fields added for windows, totals and counts are left out at their defaults, so clients
    that forbid unknown fields read every message of a plain stream as before."""
    c = new_core()
    c.handle(T.registrations, registration("plain"))
    c.handle(T.purchases, purchase("plain", "alice", "a1"))
    outs = [
        c.handle(T.values, value("plain", "v0", [1.0, 2.0, 3.0])),
        c.handle(T.purchases, purchase("plain", "bob", "b1")),
        c.handle(T.purchases, quote("plain", "carol", "q1")),
        c.handle(T.registrations, registration("plain")),
    ]
    newer = (
        "terms",
        "fits_window",
        "privacy_window",
        "privacy_unit",
        '"window"',
        "product",
        "tree_height",
        "noise_check_discrete",
        '"keys"',
        '"threshold"',
        '"histogram"',
        "noise_check_histogram",
    )
    for out in outs:
        for o in out.outputs:
            assert not [f for f in newer if f in o.value.decode()], o.value[:300]


@pytest.mark.parametrize("window", [False, True])
def test_a_batch_computes_its_noise_at_once_and_releases_what_one_by_one_would(
    window: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's new values get their steps in one chain call (``Vectors.prepare``); the
    outputs, the stored states and the count of new steps are those of the values one by one,
    whatever the batch also holds (a resend, a conflicting value, an id twice)."""
    from streams.core.codecs import CODECS
    from streams.core.products.vectors import Vectors

    def run(at_once: bool) -> tuple[list[bytes], int, dict[str, Any], int]:
        if not at_once:
            monkeypatch.setattr(Vectors, "prepare", lambda *a: None)
        calls = []
        release = Vectors.new_state
        monkeypatch.setattr(
            Vectors,
            "new_state",
            lambda self, *a: calls.append(bool(self._prepared)) or release(self, *a),
        )
        c = MarketCore(Stores(), TEST_KEYS, T, clock=lambda: 1_000)
        open_accounts(c, "seller1", "alice", "bob")
        extra = {"privacy_unit": "window", "window": {"duration_ms": 60_000, "cap": 8.0}}
        c.handle(T.registrations, registration("w", cap=4.0, **(extra if window else {})))
        c.handle(T.values, value("w", "old", [1.0, 2.0, 3.0]))
        c.handle(T.purchases, purchase("w", "alice", "a", target_level=0.5))
        c.handle(T.purchases, purchase("w", "bob", "b", target_level=2.0))
        items = [(f"v{i}", [float(i), 2.0, -3.5]) for i in range(12)]
        items += [("old", [1.0, 2.0, 3.0]), ("v3", [3.0, 2.0, -3.5]), ("v4", [9.0, 9.0, 9.0])]
        with c.batch() as deliveries:
            out = c.handle(T.values, values("w", items))
        assert [s for s, _ in out.items].count("accepted") == 12, (out.reason, out.items)
        encode = CODECS["releases"][0]
        stored = {
            k: encode(v) if not isinstance(v, EvictedValue) else (v.seq, v.digest)
            for k, v in c.stores.releases.items()
        }  # a mark's numbering is the worker's
        monkeypatch.undo()
        return ([o.value for o in [*out.outputs, *deliveries]], out.new_noise, stored, sum(calls))

    at_once, one_by_one = run(True), run(False)
    assert at_once[:3] == one_by_one[:3]
    assert one_by_one[3] == 0 and at_once[3] == (0 if window else 12)
