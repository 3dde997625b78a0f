"""Discrete Laplace (exact counts) streams on MarketCore: what registration and the wire refuse,
and the market identity's check of the discrete sampler."""

from __future__ import annotations

from typing import Any

import pytest

from market.chain import noise_check_discrete
from market.histogram_chain import noise_check_histogram
from streams.wire.events import MarketIdentity, ValueItem
from streams.wire.topics import Topics
from streams.worker.identity import MarketIdentityError, _compare

from .helpers import market_core, registration, value

T = Topics("t")


@pytest.mark.parametrize(
    ("steps", "sensitivity"),
    [([2.0**-21, 1.0], 1.0), ([1.0, 746.0], 1.0), ([10.0**9], 10.0**6 / 10.0**3)],
)
def test_levels_the_sampler_cannot_serve_are_refused_at_registration(
    steps: list[float], sensitivity: float
) -> None:
    """A bottom step below ε/Δ = 2^-20 used to be sold and then refuse every value; ε/Δ above
    ~745 made the price schedule divide by a zero variance (internal_error)."""
    c = market_core("seller1")
    out = c.handle(T.registrations, registration(
        "n", mechanism="discrete_laplace", sensitivity=sensitivity, steps=steps,
        cap=steps[-1]))  # fmt: skip
    assert (out.status, out.reason) == ("rejected", "invalid_level"), out.outputs[0].value[:300]


def test_a_count_beyond_2_to_the_53_is_refused_not_rounded() -> None:
    """On counts streams only: a real-valued stream takes the number (as the nearest double),
    as it always did; a counts stream would store another count than the one sent."""
    c = market_core("seller1")
    c.handle(T.registrations, registration("n", mechanism="discrete_laplace", dimension=1,
                                            steps=[1.0], cap=1.0))  # fmt: skip
    c.handle(T.registrations, registration("r", dimension=1, steps=[1.0], cap=1.0))
    for sid, status in (("n", "rejected"), ("r", "accepted")):
        # the signature covers the double 2**53, which the JSON integer 2**53 + 1 also reads as
        raw = value(sid, "x", [2.0**53]).replace(b"9007199254740992.0", b"9007199254740993")
        out = c.handle(T.values, raw)
        assert out.status == status, out.outputs[0].value[:300]
        assert out.items[0][1] == (None if status == "accepted" else "invalid_value")
    assert out.status == "accepted"
    ok = ValueItem.model_validate_json('{"value_id": "x", "values": [9007199254740992, 1e20], '
                                       '"published_at_ms": 1}')  # fmt: skip
    assert not ok.inexact_integer and ok.values == [2.0**53, 1e20]


@pytest.mark.parametrize(
    ("field", "check", "which", "pinned"),
    [
        ("noise_check_discrete", noise_check_discrete, "discrete Laplace check",
         "5f883d8a10b631021039c2cc8f555e328d2a1d07a03e44e52f7a4fa2dd2acc9c"),
        ("noise_check_histogram", noise_check_histogram, "histogram check",
         "155db6e4162a19c8c28eda45839b2d6e17efba01842e60365d6b0d97e02b037a"),
    ],
)  # fmt: skip
def test_the_market_identity_checks_each_newer_sampler_when_recorded(
    field: str, check: Any, which: str, pinned: str
) -> None:
    ours = MarketIdentity(noise_secret_fingerprint="f", noise_derivation="d", noise_check="c",
                          market_key_id="k", created_at_ms=1, **{field: check()})  # fmt: skip
    _compare(ours, ours, "t.market")
    _compare(ours, ours.model_copy(update={field: None}), "t.market")  # a market made before it
    with pytest.raises(MarketIdentityError, match=f"other noise.*{which}"):
        _compare(ours, ours.model_copy(update={field: "0" * 64}), "t.market")
    # pinned: a platform that draws other noise from the same key fails here first
    assert check() == pinned
    _compare(ours, ours, "t.market")
    _compare(ours, ours.model_copy(update={"noise_check_discrete": None}), "t.market")  # older
    other = ours.model_copy(update={"noise_check_discrete": "0" * 64})
    with pytest.raises(MarketIdentityError, match="other noise"):
        _compare(ours, other, "t.market")
    # pinned: a platform that draws other discrete noise from the same key fails here first
    assert noise_check_discrete() == (
        "5f883d8a10b631021039c2cc8f555e328d2a1d07a03e44e52f7a4fa2dd2acc9c")  # fmt: skip
