"""The streams table is bounded: ``Limits.max_streams`` streams, of which
``Limits.max_histogram_streams`` histogram streams, each input partition at most its even share.

Streams are never deleted, accounts cost nothing to open, and a histogram stream keeps a
survival law (~300 kB) in memory: the red team registered streams without end, and once more
histogram streams existed than a worker kept built, every free quote rebuilt one (0.5 s).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from streams.core import MarketCore, Stores, stream_store
from streams.core.census import SELLER_SHARE_FLOOR, capacity
from streams.core.context import Limits
from streams.wire.topics import Topics

from ..helpers import MARKET, TEST_KEYS, market_core, quote, registration

T = Topics(MARKET)
HISTOGRAM = {
    "mechanism": "gaussian",
    "steps": [0.5, 1.0],
    "cap": 1.0,
    "dimension": 5,
    "product": "histogram",
    "histogram": {"key_space": "strings"},
}


def _ids(n: int, partition: int) -> list[str]:
    """``n`` stream ids on ``partition``."""
    return [s for s in (f"s{i}" for i in range(10_000)) if T.partition_of(s) == partition][:n]


def _register(c: MarketCore, sid: str, **kw: Any) -> Any:
    return c.handle(T.registrations, registration(sid, **kw))


def test_each_partition_holds_at_most_its_share_of_the_streams() -> None:
    limits = Limits(max_streams=8, max_histogram_streams=8)  # 2 on each of 4 partitions
    c = market_core("seller1", limits=limits)
    full, other = _ids(3, 0), _ids(2, 1)
    assert [_register(c, s).status for s in full[:2]] == ["accepted", "accepted"]
    out = _register(c, full[2])
    assert (out.status, out.reason) == ("rejected", "too_many_streams")
    assert "EMARKET_MAX_STREAMS" in out.outputs[0].value.decode()
    assert full[2] not in c.stores.streams
    assert [_register(c, s).status for s in other] == ["accepted", "accepted"]  # room elsewhere
    assert _register(c, full[0]).status == "duplicate"  # a resend is no new stream


def test_histogram_streams_have_their_own_smaller_share() -> None:
    c = market_core("seller1", limits=Limits(max_streams=40, max_histogram_streams=4))
    ids = _ids(3, 2)
    assert _register(c, ids[0], **HISTOGRAM).status == "accepted"
    out = _register(c, ids[1], **HISTOGRAM)
    assert (out.status, out.reason) == ("rejected", "too_many_streams")
    assert "EMARKET_MAX_HISTOGRAM_STREAMS" in out.outputs[0].value.decode()
    assert _register(c, ids[2]).status == "accepted"  # a vector stream still fits


def test_one_seller_holds_at_most_its_share_so_one_account_cannot_fill_the_market() -> None:
    """The red team filled every histogram slot of a partition from one free account; other
    sellers could then register none there."""
    limits = Limits(max_streams_per_seller=8, max_histogram_streams_per_seller=4)
    c = market_core("seller1", "seller2", limits=limits)
    ids = _ids(4, 1)
    for sid in ids[:2]:
        assert _register(c, sid, seller_id="seller2").status == "accepted"
    out = _register(c, ids[2], seller_id="seller2")
    assert (out.status, out.reason) == ("rejected", "too_many_streams")
    message = out.outputs[0].value.decode()
    assert "EMARKET_MAX_STREAMS_PER_SELLER" in message and "another stream id" in message
    assert _register(c, ids[2]).status == "accepted"  # seller1's share of it is untouched
    assert _register(c, _ids(1, 2)[0], seller_id="seller2").status == "accepted"  # elsewhere
    h = _ids(6, 3)
    assert _register(c, h[0], seller_id="seller2", **HISTOGRAM).status == "accepted"
    assert _register(c, h[1], seller_id="seller2", **HISTOGRAM).reason == "too_many_streams"


def test_a_refused_registration_builds_no_survival_law_and_caches_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registration refused by a cheap check (here its price schedule) used to build its
    histogram chain first and keep it cached: ~0.3 s and ~0.3 MB each, without bound."""
    from market.histogram_chain import HistogramChain
    from streams.core.products import histograms

    histograms.shared_chain.cache_clear()  # no chain built by an earlier test
    built: list[Any] = []
    survival = HistogramChain._survival
    monkeypatch.setattr(
        HistogramChain, "_survival", lambda self: built.append(self) or survival(self)
    )
    c = market_core("seller1")
    bad = {**HISTOGRAM, "pricing": {"kind": "table", "prices": {"0.5": 100}}}  # no price at 1.0
    out = _register(c, "h1", **bad)
    assert out.status == "rejected" and out.reason != "too_many_streams", out.reason
    assert built == [] and c.streams.cached() == {}
    assert _register(c, "h2", **HISTOGRAM).status == "accepted"
    assert len(built) == 1 and list(c.streams.cached()) == ["h2"]


def test_the_counts_live_in_the_table_across_restarts_and_rebalances() -> None:
    stores = Stores()
    limits = Limits(max_streams=8)
    first = market_core("seller1", stores=stores, limits=limits)
    ids = _ids(3, 3)
    for sid in ids[:2]:
        assert _register(first, sid).status == "accepted"
    restarted = MarketCore(stores, TEST_KEYS, T, clock=lambda: 1_000, limits=limits)
    assert _register(restarted, ids[2]).reason == "too_many_streams"
    # another worker filled a partition while this one did not own it: a rebalance recounts
    other = _ids(2, 1)
    assert _register(restarted, other[0]).status == "accepted"
    assert _register(first, other[1]).status == "accepted"  # `first` counted before
    first.invalidate_indexes()
    assert _register(first, _ids(3, 1)[2]).reason == "too_many_streams"


def test_streams_with_the_same_histogram_parameters_share_one_survival_law() -> None:
    c = market_core("seller1", limits=Limits(max_histogram_streams=16))
    for sid in ("h1", "h2"):
        assert _register(c, sid, **HISTOGRAM).status == "accepted"
    regs = [c.stores.streams[s].registration for s in ("h1", "h2")]
    a, b = (c.streams.built(r)[2].chain for r in regs)  # type: ignore[attr-defined]
    assert a is not None and a is b


def test_a_worker_holding_every_stream_keeps_every_stream_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Quotes never rebuild terms while the market is within its bounds (they were evicted
    beyond 4,096 streams, and a histogram stream's cost 0.5 s to rebuild on every quote)."""
    monkeypatch.setattr(stream_store, "MAX_CACHED_TERMS", 2)
    c = market_core("seller1", "alice", limits=Limits(max_streams=12))
    ids = [s for p in range(T.partitions) for s in _ids(math.ceil(12 / T.partitions), p)]
    for sid in ids:
        assert _register(c, sid).status == "accepted"
    built = c.streams.cached()
    for sid in ids:
        assert c.handle(T.purchases, quote(sid, "alice", f"q{sid}")).status == "answered"
    assert all(c.streams.cached()[s][1] is built[s][1] for s in ids)  # the same: nothing rebuilt


def test_capacity_states_the_shares_the_census_enforces() -> None:
    """What ``init-topics`` prints is what a registration meets: the seller's share of a
    partition, checked against the census itself on a market of 4 partitions."""
    room = capacity(Limits(max_streams_per_seller=8).stream_quota, T.partitions)
    assert room["max_workers"] == T.partitions
    assert room["seller_streams_per_partition"] == math.ceil(8 / T.partitions)
    c = market_core("seller1", limits=Limits(max_streams_per_seller=8))
    ids = _ids(room["seller_streams_per_partition"] + 1, 0)
    for sid in ids[:-1]:
        assert _register(c, sid).status == "accepted"
    assert _register(c, ids[-1]).reason == "too_many_streams"
    big = capacity(Limits().stream_quota, 128)
    assert big["seller_streams_per_partition"] == 1 < SELLER_SHARE_FLOOR  # the case warned of
