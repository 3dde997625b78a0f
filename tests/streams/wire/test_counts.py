"""Discrete Laplace (exact counts) streams on MarketCore: what registration and the wire refuse,
and the market identity's check of the discrete sampler."""

from __future__ import annotations

import pytest

from market.chain import noise_check
from market.histogram_chain import noise_check_histogram
from streams.wire.events import ValueItem
from streams.wire.topics import Topics
from streams.worker.identity import MarketIdentityError, _compare, identity_of

from ..helpers import TEST_KEYS, market_core, registration, value

T = Topics("t")


@pytest.mark.parametrize(
    ("steps", "sensitivity"),
    [([1e-9, 1.0], 2.0**20), ([1.0, 746.0], 1.0), ([10.0**9], 10.0**6 / 10.0**3)],
)
def test_levels_the_sampler_cannot_serve_are_refused_at_registration(
    steps: list[float], sensitivity: float
) -> None:
    """A bottom step below ε/Δ = 2^-48 (noise that might not fit int64) is refused; ε/Δ above
    ~745 made the price schedule divide by a zero variance (internal_error)."""
    c = market_core("seller1")
    out = c.handle(
        T.registrations,
        registration(
            "n", mechanism="discrete_laplace", sensitivity=sensitivity, steps=steps, cap=steps[-1]
        ),
    )
    assert (out.status, out.reason) == ("rejected", "invalid_level"), out.outputs[0].value[:300]


def test_a_count_beyond_2_to_the_53_is_refused_not_rounded() -> None:
    """On counts streams only: a real-valued stream takes the number (as the nearest double),
    as it always did; a counts stream would store another count than the one sent (every
    spelling of the double is refused alike: tests/streams/wire/test_one_meaning.py)."""
    c = market_core("seller1", accept_clear_values=True)  # the JSON text is the point
    c.handle(
        T.registrations,
        registration("n", mechanism="discrete_laplace", dimension=1, steps=[1.0], cap=1.0),
    )
    c.handle(
        T.registrations, registration("r", dimension=1, sensitivity=1024.0, steps=[1.0], cap=1.0)
    )  # a grid of 2^-2: it holds 2^53
    for sid, status in (("n", "rejected"), ("r", "accepted")):
        # the signature covers the double 2**53, which the JSON integer 2**53 + 1 also reads as
        raw = value(sid, "x", [2.0**53], clear=True).replace(
            b"9007199254740992.0", b"9007199254740993"
        )
        out = c.handle(T.values, raw)
        assert out.status == status, out.outputs[0].value[:300]
        assert out.items[0][1] == (None if status == "accepted" else "invalid_value")
    assert out.status == "accepted"
    ok = ValueItem.model_validate_json(
        '{"value_id": "x", "values": [9007199254740992, 1e20], "published_at_ms": 1}'
    )
    assert ok.values == [2.0**53, 1e20]  # read as doubles; a counts stream refuses the first


def test_the_market_identity_refuses_another_format_or_check_with_what_to_do() -> None:
    """A market made with noise format v1 (no ``noise_format``) is refused with what to do; under
    the same format, a worker whose check or histogram check differs is refused too."""
    ours = identity_of(TEST_KEYS)
    assert ours.noise_format == 2 and ours.noise_check == noise_check()
    _compare(ours, ours, "t.market")
    v1 = ours.model_copy(
        update={
            "noise_format": None,
            "noise_derivation": "emarket-chain-v1",
            "noise_check_discrete": "5f88" + "0" * 60,
        }
    )
    with pytest.raises(MarketIdentityError, match=r"noise format v1.*new market.*--prefix"):
        _compare(ours, v1, "t.market")
    for field in ("noise_check", "noise_check_histogram"):
        with pytest.raises(MarketIdentityError, match="other noise"):
            _compare(ours, ours.model_copy(update={field: "0" * 64}), "t.market")
    # pinned: docs/protocol.md §1.9 (histogram chains); a change fails here first
    assert noise_check_histogram() == (
        "ccb2cee1410b1918cb02b9b496f64d586ae53ff5d0ae84f50ee7e1729efc9434"
    )


@pytest.mark.parametrize(
    ("fields", "numbers", "keys", "says"),
    [
        (
            {"mechanism": "discrete_laplace"},
            [3.0, -4.0],
            None,
            "coordinate 1 (counting from 0) is negative",
        ),
        (
            {"mechanism": "discrete_laplace"},
            [2.5, 1.0],
            None,
            "coordinate 0 (counting from 0) is not a whole number",
        ),
        ({"mechanism": "poisson", "steps": [1.0]}, [0.0, -1.0], None, "coordinate 1"),
        (
            {
                "mechanism": "gaussian",
                "product": "histogram",
                "histogram": {"key_space": "strings", "false_keys": 1.0},
            },
            [5.0, -3.0],
            ["a", "b"],
            "count 1 (counting from 0) is negative",
        ),
        (
            {
                "mechanism": "gaussian",
                "product": "histogram",
                "histogram": {"key_space": "strings", "false_keys": 1.0},
            },
            [2.5, 3.0],
            ["a", "b"],
            "count 0 (counting from 0) is not a whole number",
        ),
    ],
    ids=[
        "dlap-negative",
        "dlap-fraction",
        "poisson-negative",
        "histogram-negative",
        "histogram-fraction",
    ],
)
def test_a_counts_stream_refuses_negative_and_fractional_counts(
    fields: dict[str, object], numbers: list[float], keys: list[str] | None, says: str
) -> None:
    """`--values -4` on a discrete Laplace stream was taken and released as `-8.0`; a
    histogram took `Paris,-3` and `Paris,2.5`. Both are refused (`invalid_count`), naming the
    index, never the number; whole counts (0 and -0 among them) are taken."""
    c = market_core("seller1")
    reg = {"dimension": 2, "steps": [0.5, 1.0], "cap": 1.0, **fields}
    assert c.handle(T.registrations, registration("n", **reg)).status == "accepted"
    extra = {} if keys is None else {"keys": keys}
    out = c.handle(T.values, value("n", "bad", numbers, **extra))
    (line,) = [o for o in out.outputs if o.topic == T.inbox("seller1")]
    assert out.items[0][1] == "invalid_count" and says in line.value.decode(), line.value[:400]
    assert b"-4" not in line.value and b"2.5" not in line.value  # never the seller's numbers
    good = value("n", "good", [0.0, -0.0] if keys is None else [1.0, 7.0], **extra)
    assert c.handle(T.values, good).status == "accepted"
