"""Where the changes of one issue meet: breaks an adversarial review of their merge found
(each test failed before its fix)."""

from __future__ import annotations

import json

from streams.core.replay.admission import MAX_CLOCK_SKEW_MS
from streams.wire.topics import Topics

from ..helpers import market_core, purchase, registration, value

T = Topics("t")
NOW = 10**12


def test_refused_purchases_stamped_ahead_fill_the_cap_and_block_every_honest_purchase() -> None:
    """A free buyer sends refused purchases (max price 0) stamped up to the allowed skew
    ahead; each refusal is a record counted against the stream's cap (2,048 by default), and
    once the cap forgets the buyer's own records the watermark moves one horizon past them:
    every honest purchase stamped now was refused as ``request_too_old`` for the next hour.
    Refusals are now kept apart, at most ``Caps.refusals`` a stream, never pushing out another
    record nor moving the watermark; past that a refusal says it is not recorded."""
    c = market_core("seller1", "alice", "mallory", now=NOW)
    assert c.handle(T.registrations, registration("s")).status == "accepted"
    assert c.handle(T.values, value("s", "v1", [1.0, 2.0, 3.0])).status == "accepted"
    cap = c.ctx.limits.record_caps.purchases
    ahead = NOW + MAX_CLOCK_SKEW_MS
    for i in range(cap + 1):
        out = c.handle(
            T.purchases, purchase("s", "mallory", f"m{i}", max_price=0, requested_at_ms=ahead)
        )
        assert out.reason == "price_too_high"
    assert b"not recorded" in out.outputs[0].value  # past the cap of refusals
    out = c.handle(T.purchases, purchase("s", "alice", "a1", requested_at_ms=NOW))
    assert (out.status, out.reason) == ("fulfilled", None), out.reason


def test_a_refused_sealed_value_is_not_echoed_on_the_rejections_topic() -> None:
    """A value too large for the release grid is refused with its exact coordinate in the
    message (``market.mechanisms.check_range``), on the world-readable rejections topic and in
    the seller's inbox, though the seller sealed it to the market's key."""
    c = market_core("seller1", now=NOW)
    assert c.handle(T.registrations, registration("s")).status == "accepted"
    secret = 123456789.0e200
    out = c.handle(T.values, value("s", "v1", [secret, 1.0, 2.0]))
    assert out.reason == "invalid_value"
    for o in out.outputs:
        assert b"1.23457e+208" not in o.value, (
            o.topic,
            json.loads(o.value).get("message") or json.loads(o.value)["outcomes"],
        )


def test_a_value_evicted_before_many_rebalances_is_still_recognised_when_resent() -> None:
    """Every restart or rebalance used to open a new numbering of a stream's arrivals, and a
    record kept the ends of its last 64 only: a mark left before more rebalances than that was
    taken for a lost batch's, and the value ingested again (delivered and counted twice, even
    under other numbers). Batches now count wholly or not at all (#39): a mark is its stream's,
    however many rebalances pass, and a resend is recognised."""
    c = market_core("seller1", "x", now=NOW)
    assert c.handle(T.registrations, registration("s", retain_last=1)).status == "accepted"
    assert c.handle(T.values, value("s", "v1", [1.0, 2.0, 3.0])).status == "accepted"
    for i in range(66):  # restarts, rebalances (anyone may join the group)
        c.invalidate_indexes()
        assert c.handle(T.values, value("s", f"w{i}", [0.0, 0.0, 0.0])).status == "accepted"
    again = c.handle(T.values, value("s", "v1", [1.0, 2.0, 3.0]))
    other = c.handle(T.values, value("s", "v1", [9.0, 9.0, 9.0]))
    assert (again.status, other.reason) == ("duplicate", "conflicting_value"), (
        again.status,
        other.status,
        other.reason,
    )
