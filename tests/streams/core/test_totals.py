"""Running totals on MarketCore (plain dicts): increments in, running sums out, through a binary
tree of lossless Gaussian node releases (streams/core/products/totals.py)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from streams.core import MarketCore, Stores
from streams.core.context import Limits
from streams.core.products.totals import completed_by, decomposition
from streams.wire.events import (
    INBOX_EVENT,
    PurchaseFulfilled,
    QuoteAnswer,
    Rejection,
    StreamRegistration,
    ValueReleased,
)
from streams.wire.signing import canonical_bytes
from streams.wire.topics import Topics

from ..helpers import (
    SIGNED_FOR,
    TEST_KEYS,
    assert_registration_refused,
    market_core,
    purchase,
    quote,
    registration,
    value,
    values,
)

T = Topics("t")
TOTALS = {"mechanism": "gaussian", "product": "running_totals", "tree_height": 10}


def new_core(**kw: Any) -> MarketCore:
    return market_core("seller1", "alice", "bob", **kw)


def totals_stream(c: MarketCore, sid: str = "tot", **kw: Any) -> None:
    body = {**TOTALS, "steps": [0.5, 1.0, 2.0], "cap": 2.0, "dimension": 2, "retain_last": 4, **kw}
    out = c.handle(T.registrations, registration(sid, **body))
    assert out.status == "accepted", out.outputs[0].value[:400]


def inbox(outcome: Any, who: str) -> list[Any]:
    return [INBOX_EVENT.validate_json(o.value) for o in outcome.outputs if o.topic == T.inbox(who)]


def node_keys(c: MarketCore, sid: str = "tot") -> list[str]:
    return sorted(k for k in c.stores.releases if k.startswith(f"{sid}/."))


def test_the_tree_decomposes_every_prefix_into_popcount_nodes() -> None:
    for t in range(1, 300):
        nodes = decomposition(t)
        covered = [i for j, m in nodes for i in range(m << j, (m + 1) << j)]
        assert covered == list(range(t)) and len(nodes) == t.bit_count()
        # the nodes an increment completes end exactly at it
        assert all(((m + 1) << j) == t for j, m in completed_by(t - 1))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"product": "running_totals"}, "needs a tree_height"),
        ({"tree_height": 5}, "needs a tree_height"),
        ({**TOTALS, "mechanism": "laplace"}, "gaussian"),
        ({**TOTALS, "sealed": True}, "neither sealed"),
        (
            {**TOTALS, "privacy_unit": "window", "window": {"duration_ms": 60_000, "cap": 9.0}},
            "neither sealed",
        ),
        ({**TOTALS, "tree_height": 41}, "less than or equal"),
    ],
)
def test_registrations_that_cannot_be_sold_as_totals_are_refused(fields: Any, says: str) -> None:
    assert_registration_refused(new_core(), fields, says)


def test_the_signature_binds_the_product_and_the_tree() -> None:
    reg = StreamRegistration.model_validate_json(registration("s", **TOTALS))
    taller = reg.model_copy(update={"tree_height": 3})
    assert canonical_bytes(SIGNED_FOR, reg) != canonical_bytes(SIGNED_FOR, taller)
    forged = json.loads(registration("s", **TOTALS))
    forged["tree_height"] = 3  # a lower sensitivity under the seller's signature
    assert new_core().handle(T.registrations, json.dumps(forged).encode()).reason == (
        "bad_signature"
    )


def test_subscribers_get_each_running_total_and_purchases_the_retained_ones() -> None:
    c = new_core()
    totals_stream(c)
    assert c.handle(T.purchases, purchase("tot", "alice", "a0")).status == "fulfilled"
    delivered = {}
    for i in range(9):
        out = c.handle(T.values, value("tot", f"v{i}", [1.0, float(i)]))
        (ev,) = inbox(out, "alice")
        assert isinstance(ev, ValueReleased) and ev.error_model is not None
        (r,) = ev.releases
        assert (r.value_id, r.level, r.terms) == (f"v{i}", 0.5, (i + 1).bit_count())
        delivered[r.value_id] = r.values
    # the nodes kept: what the four retained totals and every later one need, nothing more
    assert node_keys(c) == ["tot/.0.6", "tot/.0.8", "tot/.1.2", "tot/.2.0", "tot/.3.0"]
    out = c.handle(T.purchases, purchase("tot", "bob", "b0"))  # level 0.5, as alice holds
    (ev,) = inbox(out, "bob")
    assert isinstance(ev, PurchaseFulfilled)
    assert [r.value_id for r in ev.releases] == ["v5", "v6", "v7", "v8"]
    assert all(r.values == delivered[r.value_id] for r in ev.releases)  # the same bytes
    out = c.handle(T.purchases, purchase("tot", "bob", "b1"))  # one step up: refined
    (ev,) = inbox(out, "bob")
    assert [r.level for r in ev.releases] == [1.0] * 4
    assert [r.terms for r in ev.releases] == [2, 3, 1, 2]


def test_resends_replay_the_total_and_never_count_twice() -> None:
    c = new_core()
    totals_stream(c)
    c.handle(T.purchases, purchase("tot", "alice", "a0"))
    first = [c.handle(T.values, value("tot", f"v{i}", [1.0, 2.0])) for i in range(6)]
    again = c.handle(T.values, value("tot", "v5", [1.0, 2.0]))
    assert again.status == "duplicate"
    assert inbox(again, "alice")[0].releases == inbox(first[5], "alice")[0].releases
    assert c.stores.streams["tot"].next_seq == 6
    old = c.handle(T.values, value("tot", "v0", [1.0, 2.0]))  # no longer retained: nothing
    assert old.status == "duplicate" and inbox(old, "alice") == []
    clash = c.handle(T.values, value("tot", "v3", [5.0, 2.0]))
    assert clash.reason == "conflicting_value"


def test_a_full_tree_refuses_more_increments() -> None:
    c = new_core()
    totals_stream(c, tree_height=3)
    out = c.handle(T.values, values("tot", [(f"v{i}", [1.0, 1.0]) for i in range(9)]))
    lines = [(x, y) for x, y in out.items]
    assert lines[:8] == [("accepted", None)] * 8 and lines[8] == ("rejected", "stream_full")


def test_node_state_stays_bounded_over_a_long_stream() -> None:
    c = new_core()
    totals_stream(c, tree_height=12, retain_last=3)
    c.handle(T.purchases, purchase("tot", "alice", "a0", target_level=2.0))
    for b in range(40):  # 50 a batch: the batch bound counts the tree nodes each value walks
        items = [(f"v{b}-{i}", [1.0, 0.0]) for i in range(50)]
        assert c.handle(T.values, values("tot", items)).status == "accepted"
        assert len(node_keys(c)) <= 2 * 3 + 2 * 13
    assert c.stores.streams["tot"].next_seq == 2000
    want = {f"tot/.{j}.{m}" for t in (1998, 1999, 2000) for j, m in decomposition(t)}
    assert set(node_keys(c)) == want  # exactly what the three retained totals are made of


def test_quotes_state_the_error_of_the_least_accurate_total() -> None:
    c = new_core()
    totals_stream(c, sensitivity=1.0)
    (ans,) = inbox(c.handle(T.purchases, quote("tot", "alice", "q")), "alice")
    assert isinstance(ans, QuoteAnswer) and ans.error_model is not None
    # Δ² (height + 1) / (2ρ), the sensitivity times 1 + 2^-12 for the nodes' float sums
    node_sd = math.sqrt(11 / (2 * 0.5)) * (1 + 2.0**-12)
    assert ans.error_model.std == pytest.approx(node_sd)
    assert ans.offers[0].rmse == pytest.approx(node_sd * math.sqrt(10))


def test_released_totals_have_the_tree_laws_and_are_lossless_across_levels() -> None:
    """Noise of the total after t increments ~ N(0, popcount(t)·Δ²(h+1)/(2ρ)); across two
    levels the covariance is the variance of the more accurate total (lossless)."""
    dim, h = 20_000, 4
    c = new_core(limits=Limits(max_message_bytes=16 << 20))
    totals_stream(c, tree_height=h, dimension=dim, retain_last=16, steps=[0.5, 2.0], cap=2.0)
    rng = np.random.default_rng(8)
    x = rng.integers(-5, 6, size=(11, dim)).astype(float)
    for i, row in enumerate(x):
        c.handle(T.values, value("tot", f"v{i}", row.tolist()))
    got = {}
    for pid, lvl in (("a", 0.5), ("b", 2.0)):
        out = c.handle(T.purchases, purchase("tot", "alice", pid, target_level=lvl))
        (ev,) = inbox(out, "alice")
        got[lvl] = {
            r.seq + 1: np.asarray(r.values) - x[: r.seq + 1].sum(axis=0) for r in ev.releases
        }
    for t in (1, 7, 8, 11):
        for lvl in (0.5, 2.0):
            sd = math.sqrt(t.bit_count() * (h + 1) / (2 * lvl))
            assert stats.kstest(got[lvl][t] / sd, "norm").pvalue > 1e-3, (t, lvl)
        var_hi = t.bit_count() * (h + 1) / (2 * 2.0)
        cov = float(np.mean(got[0.5][t] * got[2.0][t]))
        assert abs(cov - var_hi) < 5 * var_hi * math.sqrt(2 / dim) * 2, (t, cov, var_hi)
    # totals sharing tree nodes share their noise: 7 = 4 + 2 + 1 and 8 = 8 share nothing,
    # 11 = 8 + 2 + 1 and 8 share the node of the first eight
    assert abs(float(np.mean(got[2.0][8] * got[2.0][11])) - (h + 1) / 4) < 0.1
    assert abs(float(np.mean(got[2.0][7] * got[2.0][8]))) < 0.1


def test_a_rejected_increment_leaves_no_node_behind() -> None:
    c = new_core()
    totals_stream(c)
    out = c.handle(T.values, value("tot", "bad", [1.0]))  # wrong dimension
    assert out.reason == "wrong_dimension" and node_keys(c) == []
    rej = Rejection.model_validate_json(out.outputs[0].value)
    assert "dimension" in rej.message


def test_accuracy_orders_and_intervals_are_for_the_totals() -> None:
    """An RMS target on a totals stream is met by its least accurate total (tree_height nodes):
    √(10·11/(2ρ)) is 10.5, 7.4, 5.2 at ρ = 0.5, 1, 2; the client's intervals widen by √terms."""
    from streams.clients.intervals import intervals

    c = new_core()
    totals_stream(c)
    for i in range(3):
        c.handle(T.values, value("tot", f"v{i}", [1.0, 2.0]))
    out = c.handle(T.purchases, purchase("tot", "alice", "a", accuracy={"rmse": 8.0}))
    (ev,) = inbox(out, "alice")
    assert isinstance(ev, PurchaseFulfilled) and ev.level_after == 1.0
    node_hw = ev.error_model.half_widths["95"]  # type: ignore[union-attr]
    for r in ev.releases:
        lo, hi = intervals(ev, 0.95)[r.value_id]
        assert np.allclose((hi - lo) / 2, node_hw * math.sqrt(r.terms or 0))
    out = c.handle(T.purchases, purchase("tot", "bob", "b", accuracy={"rmse": 1.0}))
    rej = Rejection.model_validate_json(out.outputs[0].value)
    assert rej.reason == "accuracy_not_for_sale" and rej.details["best_level"] == 2.0
    assert rej.details["best_error"] == pytest.approx(math.sqrt(55 / 2) * (1 + 2.0**-12))
    assert "least accurate total" in rej.message


# -- found by the review of the feature (each failed before its fix) ----------------------------
def test_a_total_that_would_overflow_is_refused_and_leaves_nothing() -> None:
    c = new_core()
    totals_stream(c, dimension=1)
    reg = c.stores.streams["tot"].registration
    limit = min(c.streams.built(reg)[1].chain.value_limit, reg.totals_limit())
    assert c.handle(T.values, value("tot", "a", [0.75 * limit])).status == "accepted"
    out = c.handle(T.values, value("tot", "b", [0.5 * limit]))  # each fits, the total does not
    assert out.reason == "invalid_value" and node_keys(c) == ["tot/.0.0"]
    assert c.stores.streams["tot"].next_seq == 1


def test_a_retained_increment_stays_known_after_a_restart_forgot_its_mark() -> None:
    """The rebuilt dedup index used to forget the marks of increments still retained: the same
    id was then taken as a second increment."""
    stores = Stores()
    c = market_core("seller1", "alice", now=100_000, stores=stores, dedup_horizon_ms=10_000)
    totals_stream(c, dimension=1)
    c.handle(T.purchases, purchase("tot", "alice", "a0", requested_at_ms=100_000))
    first = c.handle(T.values, value("tot", "v0", [1.0], published_at_ms=1_000))
    c.handle(T.values, value("tot", "v1", [1.0], published_at_ms=20_000))
    restarted = MarketCore(stores, TEST_KEYS, T, clock=lambda: 100_000, dedup_horizon_ms=10_000)
    restarted.handle(T.values, value("tot", "v2", [1.0], published_at_ms=20_000))
    again = restarted.handle(T.values, value("tot", "v0", [1.0], published_at_ms=20_000))
    assert again.status == "duplicate"
    assert [e.value_id for e in stores.streams["tot"].window] == ["v0", "v1", "v2"]
    assert inbox(again, "alice")[0].releases == inbox(first, "alice")[0].releases
