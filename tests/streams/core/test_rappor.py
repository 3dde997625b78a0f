"""RAPPOR streams on MarketCore (plain dicts): members' bit reports in, randomized-response bits
out at each buyer's level, relaxed step by step (streams/core/products/rappor.py)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from market.rappor import market_response, released_bits
from streams.clients.commands import output
from streams.clients.rappor import frequencies
from streams.core import MarketCore
from streams.core.terms import terms_of
from streams.wire.events import (
    INBOX_EVENT,
    CatalogEntry,
    PurchaseFulfilled,
    QuoteAnswer,
    StreamRegistration,
    ValueReleased,
)
from streams.wire.signing import canonical_bytes
from streams.wire.topics import Topics

from ..helpers import (
    SIGNED_FOR,
    assert_registration_refused,
    market_core,
    purchase,
    quote,
    registration,
    value,
)

T = Topics("t")
K = 8
RAPPOR = {"product": "rappor", "rappor_ones": 1, "sensitivity": 2.0, "dimension": K}
STEPS = [2.0, 4.0, 8.0]


def new_core() -> MarketCore:
    return market_core("seller1", "alice", "bob")


def rappor_stream(c: MarketCore, sid: str = "rr", **kw: Any) -> bytes:
    raw = registration(sid, **{**RAPPOR, "steps": STEPS, "cap": 8.0, "retain_last": 4, **kw})
    out = c.handle(T.registrations, raw)
    assert out.status == "accepted", out.outputs[0].value[:400]
    return raw


def inbox(outcome: Any, who: str) -> list[Any]:
    return [INBOX_EVENT.validate_json(o.value) for o in outcome.outputs if o.topic == T.inbox(who)]


def one_hot(category: int) -> list[float]:
    bits = [0.0] * K
    bits[category] = 1.0
    return bits


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"product": "rappor", "sensitivity": 2.0}, "needs rappor_ones"),
        ({"rappor_ones": 1, "sensitivity": 2.0}, "needs rappor_ones"),
        ({**RAPPOR, "mechanism": "gaussian"}, "mechanism 'laplace'"),
        ({**RAPPOR, "sensitivity": 1.0}, "register it with sensitivity 2"),
        ({**RAPPOR, "rappor_ones": 9, "sensitivity": 18.0}, "exceeds the dimension 8"),
        ({**RAPPOR, "rappor_ones": 65, "dimension": 100}, "less than or equal"),
    ],
)
def test_registrations_that_cannot_be_sold_as_rappor_are_refused(
    fields: dict[str, Any], says: str
) -> None:
    assert_registration_refused(new_core(), fields, says)


def test_the_signature_binds_the_product_and_its_ones() -> None:
    reg = StreamRegistration.model_validate_json(registration("s", **RAPPOR))
    plain = reg.model_copy(update={"product": "values", "rappor_ones": None})
    more = reg.model_copy(update={"rappor_ones": 2})
    signed = canonical_bytes(SIGNED_FOR, reg)
    assert signed not in (canonical_bytes(SIGNED_FOR, plain), canonical_bytes(SIGNED_FOR, more))
    forged = json.loads(registration("s", **RAPPOR))
    del forged["product"], forged["rappor_ones"]  # its reports sold as plain numbers
    assert new_core().handle(T.registrations, json.dumps(forged).encode()).reason == (
        "bad_signature"
    )


@pytest.mark.parametrize(
    ("bits", "reason", "says"),
    [
        ([0.0] * (K - 1), "wrong_dimension", "8"),
        ([0.5] + [0.0] * (K - 1), "invalid_value", "numbers are bits, each 0 or 1"),
        ([1.0, 1.0] + [0.0] * (K - 2), "invalid_value", "sets 2 bits; the stream's rappor_ones"),
    ],
)
def test_a_report_that_is_not_the_registered_bits_is_refused(
    bits: list[float], reason: str, says: str
) -> None:
    c = new_core()
    rappor_stream(c)
    out = c.handle(T.values, value("rr", "v", bits))
    assert out.reason == reason
    assert says in out.outputs[0].value.decode()


def test_catalog_and_quote_state_each_levels_randomized_response() -> None:
    c = new_core()
    out = c.handle(T.registrations, registration("rr", **RAPPOR, steps=STEPS, cap=8.0))
    (entry,) = [
        CatalogEntry.model_validate_json(o.value) for o in out.outputs if o.topic == T.catalog
    ]
    (ans,) = inbox(c.handle(T.purchases, quote("rr", "alice", "q")), "alice")
    assert isinstance(ans, QuoteAnswer) and ans.error_model is not None
    for lv, price, offer in zip(STEPS, entry.prices, ans.offers, strict=True):
        want = market_response(2.0, K, lv)
        for said in (price.randomized_response, offer.randomized_response):
            assert said is not None and (said.p_if_0, said.p_if_1) == (want.p_if_0, want.p_if_1)
        # a higher level is a relaxed response: a smaller f, the bits closer to the truth
        assert 0 < want.p_if_0 < 0.5 * np.exp(-lv / 8) < want.p_if_1 < 1
    assert ans.error_model.randomized_response == offer_at(ans, ans.level_after)


def offer_at(ans: QuoteAnswer, level: float) -> Any:
    return next(o.randomized_response for o in ans.offers if o.level == level)


def test_subscribers_get_bits_and_purchases_relax_them_step_by_step() -> None:
    """Register → subscribe at the lowest level → values (bits delivered) → a step up → another
    (each release the bits [y + V > 1/2] of the stream's Laplace chain: the stored noise)."""
    c = new_core()
    raw = rappor_stream(c)
    reg = StreamRegistration.model_validate_json(raw)
    chain = terms_of(reg).chain
    assert c.handle(T.purchases, purchase("rr", "alice", "a0")).status == "fulfilled"
    delivered = {}
    for i in range(6):
        out = c.handle(T.values, value("rr", f"v{i}", one_hot(i % K)))
        (ev,) = inbox(out, "alice")
        assert isinstance(ev, ValueReleased) and ev.error_model is not None
        assert ev.error_model.randomized_response is not None
        (r,) = ev.releases
        assert r.level == STEPS[0] and set(r.values) <= {0.0, 1.0}
        delivered[r.value_id] = r.values
    laplace: dict[tuple[str, float], Any] = {}
    events: list[Any] = []
    for pid, lvl in (("b0", 2.0), ("b1", 4.0), ("b2", 8.0)):
        out = c.handle(T.purchases, purchase("rr", "bob", pid, target_level=lvl))
        (ev,) = inbox(out, "bob")
        assert isinstance(ev, PurchaseFulfilled) and ev.receipt is not None
        assert [r.value_id for r in ev.releases] == ["v2", "v3", "v4", "v5"]
        for r in ev.releases:
            assert r.level == lvl and set(r.values) <= {0.0, 1.0}
            if lvl == 2.0:
                assert r.values == delivered[r.value_id]  # the same bits alice was sent
            laplace[r.value_id, lvl] = r.values
        est = frequencies(ev)  # the buyer's estimate, at the level it bought
        assert est.reports == 4 and est.fraction.shape == (K,)
        assert np.all((est.low <= est.high) & (est.low >= 0) & (est.high <= 1))
        events.append(ev)
    with pytest.raises(ValueError, match="pass the releases of one level"):
        frequencies(events)
    # what `epsilon-market buy` / `tail` print: the law of the bits and the estimate
    printed = "\n".join(output.event(events[-1]))
    assert "bits: randomized response, P(1 | 0) = " in printed
    assert "frequency per bit, 95 % (4 reports): 0: " in printed
    # the bits are those of the values product's chain at the same identities: the stored noise
    ident = ("rr", "v5", state_digest(one_hot(5)))
    for k, lvl in enumerate(STEPS):
        y = chain.release([chain.open(np.asarray(one_hot(5)))], k, [ident], c.ctx.noise)[0]
        assert released_bits(y).tolist() == laplace["v5", lvl]


def state_digest(bits: list[float]) -> str:
    from streams.core.products.base import digest_values

    return digest_values(np.asarray(bits, dtype=np.float64))


def test_an_estimate_needs_a_rappor_release() -> None:
    c = new_core()
    c.handle(T.registrations, registration("plain"))
    c.handle(T.values, value("plain", "v", [1.0, 2.0, 3.0]))
    (ev,) = inbox(c.handle(T.purchases, purchase("plain", "bob", "b")), "bob")
    with pytest.raises(ValueError, match="not a release of a 'rappor' stream"):
        frequencies(ev)
