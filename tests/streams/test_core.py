"""MarketCore on plain dicts: the business rules without a broker."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from market.receipts import verify_receipt
from streams.core import EvictedValue, MarketCore, Stores, purchases
from streams.wire.events import BUYER_EVENT, CatalogEntry, PurchaseFulfilled, Rejection
from streams.wire.topics import Topics

from .helpers import TEST_KEYS, purchase, quote, registration, value

T = Topics("t")


@pytest.fixture
def core() -> MarketCore:
    c = MarketCore(Stores(), TEST_KEYS, T, clock=lambda: 1_000)
    assert c.handle(T.registrations, registration("temp")).status == "accepted"
    return c


def buyer_events(outcome) -> list:  # type: ignore[no-untyped-def]
    return [
        BUYER_EVENT.validate_json(o.value)
        for o in outcome.outputs
        if o.topic.startswith("t.buyer.")
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
            ev.receipt.model_dump(), ev.receipt.signature, releases, TEST_KEYS.public_key
        )
    assert levels == [0.5, 1.0, 2.0]
    assert paid == 200  # exactly P(2.0): stepwise equals direct
    sub = core.handle(T.values, value("temp", "v3", [1.0, 2.0, 3.0]))
    (ev,) = buyer_events(sub)
    assert ev.type == "value_released" and ev.releases[0].level == 2.0
    assert core.stores.streams["temp"].spent == 2.0


def test_duplicate_purchase_reemits_identical_bytes_and_charges_once(core: MarketCore) -> None:
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    first = core.handle(T.purchases, purchase("temp", "alice", "p1"))
    again = core.handle(T.purchases, purchase("temp", "alice", "p1", requested_at_ms=5))
    assert again.status == "duplicate"
    assert again.outputs[0].value == first.outputs[0].value
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
    assert core.stores.streams["temp"].spent == 1.0


def test_price_too_high_quotes_the_price(core: MarketCore) -> None:
    out = core.handle(T.purchases, purchase("temp", "alice", "p1", max_price=10, target_level=2.0))
    assert out.reason == "price_too_high"
    rej = Rejection.model_validate_json(out.outputs[0].value)
    assert rej.details["quoted_price_minor"] == 200
    assert "200" in rej.message
    # the rejection is stored: a resend gets the same answer
    again = core.handle(
        T.purchases, purchase("temp", "alice", "p1", max_price=10, target_level=2.0)
    )
    assert again.status == "duplicate" and again.outputs[0].value == out.outputs[0].value


def test_quote_does_not_buy(core: MarketCore) -> None:
    out = core.handle(T.purchases, quote("temp", "alice", "q1", target_level=4.0))
    (ev,) = buyer_events(out)
    assert ev.type == "quote" and ev.price_minor == 400
    assert "alice" not in core.stores.streams["temp"].holders


def test_downgrade_is_free_and_returns_held_release(core: MarketCore) -> None:
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    hi = buyer_events(core.handle(T.purchases, purchase("temp", "alice", "a", target_level=2.0)))[0]
    lo = buyer_events(core.handle(T.purchases, purchase("temp", "alice", "b", target_level=0.5)))[0]
    assert lo.price_minor == 0 and lo.level_after == 2.0
    assert lo.releases[0].values == hi.releases[0].values


@pytest.mark.parametrize(
    ("topic", "payload", "reason"),
    [
        (T.values, b"{not json", "invalid_event"),
        (T.values, b"\xff\xfe", "invalid_event"),
        (T.values, value("nope", "v", [1.0, 2.0, 3.0]), "unknown_stream"),
        (T.values, value("temp", "v", [1.0, 2.0]), "wrong_dimension"),
        (
            T.values,
            b'{"type":"value","stream_id":"temp","value_id":"v","values":[1,NaN,2],"published_at_ms":1}',
            "invalid_value",
        ),
        (
            T.values,
            b'{"type":"value","stream_id":"temp","value_id":"v","values":[1,Infinity,2],"published_at_ms":1}',
            "invalid_value",
        ),
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
    out = core.handle(topic, payload, partition=2, offset=7)
    assert (out.status, out.reason) == ("rejected", reason)
    rej = Rejection.model_validate_json(out.outputs[0].value)
    assert out.outputs[0].topic == T.rejections
    assert rej.reason == reason and rej.message
    assert (rej.source_partition, rej.source_offset) == (2, 7)
    original = (
        rej.payload.encode()
        if rej.payload_encoding == "utf-8"
        else __import__("base64").b64decode(rej.payload)
    )
    assert original == payload


def test_rejected_purchase_also_reaches_the_buyer(core: MarketCore) -> None:
    out = core.handle(T.purchases, purchase("temp", "alice", "p", target_level=9.0))
    assert {o.topic for o in out.outputs} == {T.rejections, "t.buyer.alice"}


def test_resent_value_is_deduplicated_never_renoised(core: MarketCore) -> None:
    core.handle(T.purchases, purchase("temp", "alice", "p1"))
    first = core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    again = core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    assert again.status == "duplicate" and again.new_noise == 0
    assert again.outputs[0].value == first.outputs[0].value
    conflict = core.handle(T.values, value("temp", "v0", [9.0, 2.0, 3.0]))
    assert conflict.reason == "conflicting_value"


def test_evicted_value_resend_is_recognised(core: MarketCore) -> None:
    for i in range(6):  # retain_last = 4
        core.handle(T.values, value("temp", f"v{i}", [1.0, 2.0, float(i)]))
    assert [e.value_id for e in core.stores.streams["temp"].window] == ["v2", "v3", "v4", "v5"]
    assert isinstance(core.stores.releases["temp/v0"], EvictedValue)  # vectors dropped
    again = core.handle(T.values, value("temp", "v0", [1.0, 2.0, 0.0]))
    assert again.status == "duplicate" and again.new_noise == 0 and not again.outputs


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
    assert core.stores.streams["sealed"].spent == 4.0
    ok = core.handle(T.purchases, purchase("sealed", "alice", "p1", target_level=1.0))
    assert ok.status == "fulfilled"


def test_batch_groups_subscription_deliveries_per_buyer(core: MarketCore) -> None:
    core.handle(T.purchases, purchase("temp", "alice", "p1"))
    core.handle(T.purchases, purchase("temp", "bob", "p1", target_level=1.0))
    with core.batch() as deliveries:
        for i in range(3):
            out = core.handle(T.values, value("temp", f"v{i}", [1.0, 2.0, float(i)]))
            assert out.status == "accepted" and not out.outputs and out.releases == 2
    events = {o.topic: BUYER_EVENT.validate_json(o.value) for o in deliveries}
    assert set(events) == {"t.buyer.alice", "t.buyer.bob"}
    assert [r.value_id for r in events["t.buyer.bob"].releases] == ["v0", "v1", "v2"]
    assert {r.level for r in events["t.buyer.bob"].releases} == {1.0}


def test_releases_survive_json_bit_for_bit(core: MarketCore) -> None:
    core.handle(T.values, value("temp", "v0", [0.1, 1e-300, 12345.6789]))
    out = core.handle(T.purchases, purchase("temp", "alice", "p1"))
    ev = buyer_events(out)[0]
    stored = core.stores.releases["temp/v0"].steps[0]  # level 0.5
    assert np.array_equal(np.array(ev.releases[0].values), stored)
    assert json.loads(out.outputs[0].value)["releases"][0]["values"] == stored.tolist()


@pytest.mark.slow
def test_lossless_joint_law_across_steps() -> None:
    """Over many values, a buyer's successive releases share the stored sample with frequency
    (ε1/ε2)², as the lossless process requires (fresh noise would share it with probability 0)."""
    c = MarketCore(Stores(), TEST_KEYS, T)
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
    from market.envelope import generate_keypair
    from market.errors import ReceiptError
    from streams.wire.sealing import open_event

    key, pub = generate_keypair()
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    out = core.handle(T.purchases, purchase("temp", "alice", "p1", buyer_public_key=pub))
    ev = buyer_events(out)[0]
    assert ev.releases == [] and ev.sealed is not None
    assert b"values" not in out.outputs[0].value  # no plaintext numbers on the topic
    opened = open_event(ev, key)
    stored = core.stores.releases["temp/v0"].steps[0]  # level 0.5
    assert np.array_equal(np.array(opened.releases[0].values), stored)
    rel = [(r.value_id, r.level, np.asarray(r.values)) for r in opened.releases]
    env = ev.sealed.model_dump()
    verify_receipt(ev.receipt.model_dump(), ev.receipt.signature, rel, TEST_KEYS.public_key,
                   envelope=env)  # fmt: skip
    other = dict(env, ciphertext=env["ciphertext"][:-4] + "AAA=")
    with pytest.raises(ReceiptError, match="envelope"):
        verify_receipt(ev.receipt.model_dump(), ev.receipt.signature, rel, TEST_KEYS.public_key,
                       envelope=other)  # fmt: skip
    sub = buyer_events(core.handle(T.values, value("temp", "v1", [4.0, 5.0, 6.0])))[0]
    assert sub.releases == [] and open_event(sub, key).releases[0].value_id == "v1"


def test_market_can_require_encryption() -> None:
    c = MarketCore(Stores(), TEST_KEYS, T, require_encryption=True)
    c.handle(T.registrations, registration("temp"))
    assert c.handle(T.purchases, purchase("temp", "a", "p")).reason == "encryption_required"


def test_internal_errors_become_rejections(
    core: MarketCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(purchases, "fulfil", boom)
    out = core.handle(T.purchases, purchase("temp", "alice", "p1"))
    assert out.reason == "internal_error" and "RuntimeError" in out.outputs[0].value.decode()
    monkeypatch.undo()
    assert core.handle(T.purchases, purchase("temp", "alice", "p2")).status == "fulfilled"


def test_dedup_horizon_forgets_markers_and_refuses_old_values() -> None:
    """Eviction markers older than the horizon are dropped, and exactly those values are
    refused if they come back: memory stays bounded and nothing is ever re-noised."""
    c = MarketCore(Stores(), TEST_KEYS, T, clock=lambda: 10**9, dedup_horizon_ms=1000)
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
    c = MarketCore(Stores(), TEST_KEYS, T, clock=lambda: 10**9, dedup_horizon_ms=1000)
    c.handle(T.registrations, registration("temp"))
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    for i, lv in enumerate([0.5, 1.0, 2.0, 4.0]):  # requested 600 ms apart
        c.handle(T.purchases, purchase("temp", "alice", f"p{i}", target_level=lv,
                                       requested_at_ms=600 * i))  # fmt: skip
    assert sorted(c.stores.purchases) == ["alice/p2", "alice/p3"]  # p0, p1 forgotten
    old = c.handle(T.purchases, purchase("temp", "alice", "p0", target_level=0.5,
                                         requested_at_ms=0))  # fmt: skip
    assert old.reason == "request_too_old"
    again = c.handle(T.purchases, purchase("temp", "alice", "p2", target_level=2.0,
                                           requested_at_ms=1200))  # fmt: skip
    assert again.status == "duplicate"
    assert c.stores.streams["temp"].holders["alice"].paid_minor == 400  # ledger kept


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
    first = MarketCore(stores, TEST_KEYS, T, clock=lambda: 10**9, dedup_horizon_ms=1000)
    streams = [f"s{j}" for j in range(5)]
    for sid in streams:
        first.handle(T.registrations, registration(sid, retain_last=1))
        for i in range(4):  # leaves markers for v1 and v2 (v0 is already beyond the horizon)
            first.handle(T.values, value(sid, f"v{i}", [1.0, 2.0, 3.0], published_at_ms=500 * i))
        first.handle(T.purchases, purchase(sid, "alice", f"{sid}-p0", requested_at_ms=0))
    second = MarketCore(stores, TEST_KEYS, T, clock=lambda: 10**9, dedup_horizon_ms=1000)
    first.invalidate_indexes()  # what the app does on every rebalance
    for core, late in ((second, 4000), (first, 6000)):  # `second` writes what `first` never saw
        CountingLadders.scans = 0
        for sid in streams:
            core.handle(T.values, value(sid, f"w{late}", [1.0, 2.0, 3.0], published_at_ms=late))
            core.handle(T.purchases, purchase(sid, "alice", f"{sid}-q{late}",
                                              requested_at_ms=late))  # fmt: skip
        assert CountingLadders.scans == 1
        for sid in streams:  # everything published or requested before late - 1000 ms is gone
            assert sorted(k for k in stores.releases if k.startswith(f"{sid}/")) == [
                f"{sid}/w{late}"
            ]
        assert sorted(stores.purchases) == sorted(f"alice/{sid}-q{late}" for sid in streams)


def test_catalog_states_poisson_epsilon_for_the_stream_dimension(core: MarketCore) -> None:
    """At λ = 380 one count has a guarantee (ε ≈ 1.33 at δ = 1e-6) but four counts do not
    (Andersson Thm E.2 needs λ > 23 ln(10 d/δ)); the catalog must not show the d = 1 figure."""
    omega = 1 / 380
    eps = {}
    for dim in (1, 4):
        out = core.handle(T.registrations, registration(
            f"counts{dim}", mechanism="poisson", dimension=dim, steps=[omega], cap=omega))
        entry = CatalogEntry.model_validate_json(out.outputs[0].value)
        assert entry.level_unit == "omega"
        eps[dim] = entry.prices[0].epsilon
    assert eps[1] is not None and abs(eps[1] - 1.326) < 1e-3
    assert eps[4] is None
