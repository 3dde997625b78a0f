"""What anyone may create for free is bounded: openings per input partition and minute, quotes
per account and minute, streams per seller (issue #29).

The red team opened 2,000 accounts in 0.1 s, and 4 free accounts filled the market's streams
table in 6 s; 5,000 quotes held purchases for seconds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from streams.core import MarketCore, Stores
from streams.core.allowance import RateLimit
from streams.core.context import Limits
from streams.wire.topics import Topics

from ..helpers import MARKET, TEST_KEYS, account, open_accounts, quote, registration

T = Topics(MARKET)


class Clock:
    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _core(clock: Clock, **limits: Any) -> MarketCore:
    return MarketCore(Stores(), TEST_KEYS, T, clock=clock, limits=Limits(**limits))


def _names(n: int, partition: int, prefix: str = "a") -> list[str]:
    """``n`` account ids whose openings belong on ``partition``."""
    ids = (f"{prefix}{i}" for i in range(10_000))
    return [a for a in ids if T.partition_of(a) == partition][:n]


def _rejection(out: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(out.outputs[0].value)
    return body


def test_openings_are_bounded_per_partition_and_minute() -> None:
    clock = Clock()
    c = _core(clock, max_openings_per_minute=4 * T.partitions)  # 4 a minute on each partition
    first, other = _names(6, 0), _names(1, 1)
    assert [c.handle(T.accounts, account(a)).status for a in first[:4]] == ["accepted"] * 4
    out = c.handle(T.accounts, account(first[4]))
    assert (out.status, out.reason) == ("rejected", "rate_limited")
    rej = _rejection(out)
    assert rej["details"]["limit"] == "openings_per_minute"
    assert rej["details"]["retry_after_ms"] == 15_000  # a token every 15 s
    assert "EMARKET_MAX_OPENINGS_PER_MINUTE" in rej["message"]
    assert rej["sender_id"] is None and rej["claimed_id"] == first[4]  # nobody is proven
    assert first[4] not in c.stores.accounts
    assert c.handle(T.accounts, account(other[0])).status == "accepted"  # its own share
    assert c.handle(T.accounts, account(first[0])).status == "duplicate"  # a resend is free
    clock.now += 15_000
    assert c.handle(T.accounts, account(first[4])).status == "accepted"
    assert c.handle(T.accounts, account(first[5])).reason == "rate_limited"


def test_a_flood_of_openings_opens_at_most_the_market_wide_rate() -> None:
    clock = Clock()
    c = _core(clock, max_openings_per_minute=40)
    names = [f"f{i}" for i in range(400)]
    outs = [c.handle(T.accounts, account(a)).status for a in names]
    assert outs.count("accepted") == 40 and len(c.stores.accounts) == 40


def test_quotes_are_bounded_per_account_and_minute() -> None:
    clock = Clock()
    c = _core(clock, max_quotes_per_minute=3)
    open_accounts(c, "seller1", "buyer1", "buyer2")
    assert c.handle(T.registrations, registration("s")).status == "accepted"
    answers = [c.handle(T.purchases, quote("s", "buyer1", f"q{i}")) for i in range(4)]
    assert [o.status for o in answers] == ["answered"] * 3 + ["rejected"]
    assert answers[3].reason == "rate_limited"
    rej = _rejection(answers[3])
    assert rej["sender_id"] == "buyer1" and rej["details"]["limit"] == "quotes_per_minute"
    assert rej["details"]["retry_after_ms"] == 20_000
    # the operators, the sender's inbox and the public refusal record (docs/protocol.md §12.5)
    assert [o.topic for o in answers[3].outputs] == [T.rejections, T.inbox("buyer1"), T.refusals]
    assert c.handle(T.purchases, quote("s", "buyer2", "q0")).status == "answered"  # per account
    clock.now += 20_000
    assert c.handle(T.purchases, quote("s", "buyer1", "q9")).status == "answered"


def test_a_handful_of_free_accounts_cannot_fill_the_streams_table() -> None:
    """The red team filled the table from 4 accounts (1,024 streams each of 4,096)."""
    limits = Limits()
    assert limits.max_streams // limits.max_streams_per_seller >= 64
    assert limits.max_histogram_streams // limits.max_histogram_streams_per_seller >= 32


def test_a_rate_limit_forgets_idle_keys() -> None:
    clock = Clock()
    rate = RateLimit(2, clock)
    for i in range(5_000):
        assert rate.take(f"k{i}") == 0
        clock.now += 100  # 5,000 keys over 500 s: most are idle for over a minute
    assert len(rate) < 2_048
    assert rate.take("k4999") == 0 and rate.take("k4999") > 0  # a recent key is still counted
    with pytest.raises(ValueError, match="at least 1"):
        RateLimit(0, clock)
