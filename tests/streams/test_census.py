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

from streams.core import MarketCore, Stores, context
from streams.core.context import Limits
from streams.wire.topics import Topics

from .helpers import MARKET, TEST_KEYS, market_core, quote, registration

T = Topics(MARKET)
HISTOGRAM = {"mechanism": "gaussian", "steps": [0.5, 1.0], "cap": 1.0, "dimension": 5,
             "product": "histogram", "histogram": {"key_space": "strings"}}  # fmt: skip


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
    a, b = (c.ctx.terms(r).histogram for r in regs)
    assert a is not None and a is b


def test_a_worker_holding_every_stream_keeps_every_stream_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Quotes never rebuild terms while the market is within its bounds (they were evicted
    beyond 4,096 streams, and a histogram stream's cost 0.5 s to rebuild on every quote)."""
    monkeypatch.setattr(context, "MAX_CACHED_TERMS", 2)
    c = market_core("seller1", "alice", limits=Limits(max_streams=12))
    ids = [s for p in range(T.partitions) for s in _ids(math.ceil(12 / T.partitions), p)]
    for sid in ids:
        assert _register(c, sid).status == "accepted"
    built = dict(c.ctx._terms)
    for sid in ids:
        assert c.handle(T.purchases, quote(sid, "alice", f"q{sid}")).status == "answered"
    assert all(c.ctx._terms[s] is built[s] for s in ids)  # the same objects: nothing rebuilt
