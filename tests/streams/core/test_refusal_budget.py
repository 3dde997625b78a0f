"""Refusals that cost the sender, not the market (issue #40, item 2).

Garbage written to an input topic costs its writer one produce; answered one by one it cost the
market a rejection and a signed refusal each (about a kilobyte), and the embedded broker keeps
all of it. What the market writes in answer to events no account was proven to send is bounded
per input partition and interval (docs/protocol.md §9, :mod:`streams.core.refusal_budget`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.flood_garbage import write_garbage
from streams.clients.client import MarketClient, now_ms
from streams.core import MarketCore, Stores
from streams.core.refusal_budget import RefusalBounds
from streams.wire.events import LinearPrecisionSpec, PurchaseFulfilled, Refusal, Rejection
from streams.wire.topics import Topics

from ..conftest import Market
from ..helpers import MARKET, TEST_KEYS, buy, open_accounts, purchase


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _core(clock: Clock, *parties: str) -> MarketCore:
    core = MarketCore(Stores(), TEST_KEYS, Topics(MARKET), clock=clock)
    open_accounts(core, *parties)
    return core


def test_the_same_garbage_is_refused_once() -> None:
    clock = Clock()
    core = _core(clock)
    t = core.ctx.topics
    first = core.handle(t.purchases, b"x", partition=0, offset=0)
    assert {o.topic for o in first.outputs} == {t.rejections, t.refusals}
    again = [core.handle(t.purchases, b"x", partition=0, offset=i) for i in range(1, 100)]
    assert all(o.outputs == [] and o.dropped == "repeated" for o in again)
    assert all(o.status == "rejected" and o.reason == "invalid_event" for o in again)
    elsewhere = core.handle(t.purchases, b"x", partition=1, offset=0)  # a copy is answered there
    assert len(elsewhere.outputs) == 2


def test_beyond_the_bound_refusals_are_counted_and_summed_up_once() -> None:
    clock = Clock()
    core = _core(clock)
    t = core.ctx.topics
    bounds: RefusalBounds = core.ctx.limits.refusals
    outs = [
        core.handle(t.purchases, f"junk{i}".encode(), partition=2, offset=i) for i in range(500)
    ]
    answered = [o for o in outs if o.outputs]
    assert len(answered) == bounds.per_interval
    assert sum(o.dropped == "over_bound" for o in outs) == 500 - bounds.per_interval
    clock.now += bounds.interval_ms
    later = core.handle(t.purchases, b"later", partition=3, offset=0)
    summary = [o for o in later.outputs if o.key and o.key.startswith(b"refusals_dropped")]
    rejections = [
        Rejection.model_validate_json(o.value) for o in later.outputs if o.topic == t.rejections
    ]
    told = [r for r in rejections if r.reason == "refusals_dropped"]
    assert len(told) == 1 and len(summary) == 1
    d = told[0].details
    assert (told[0].source_topic, told[0].source_partition) == (t.purchases, 2)
    assert d["over_bound"] == 500 - bounds.per_interval and d["repeated"] == 0
    assert d["reasons"] == {"invalid_event": 500 - bounds.per_interval}
    assert (d["first_offset"], d["last_offset"]) == (bounds.per_interval, 499)
    refusal = Refusal.model_validate_json(summary[0].value)
    assert refusal.reason == "refusals_dropped" and summary[0].topic == t.refusals
    assert any(h == "emarket-answer" for h, _ in summary[0].headers)  # signed, as every refusal
    clock.now += bounds.interval_ms
    quiet = core.handle(t.purchases, b"quiet", partition=3, offset=1)
    assert not [o for o in quiet.outputs if o.key and o.key.startswith(b"refusals_dropped")]


def test_a_proven_senders_refusals_are_never_dropped() -> None:
    clock = Clock()
    core = _core(clock, "bob")
    t = core.ctx.topics
    for i in range(100):  # far beyond the bound: purchases of a stream that does not exist
        out = core.handle(
            t.purchases,
            purchase("nope", "bob", f"p{i}"),
            partition=t.partition_of("nope"),
            offset=i,
        )
        assert out.dropped is None and any(o.topic == t.inbox("bob") for o in out.outputs)
    # copies of one of them are not the budget's: they add nothing to bob's inbox (#40), and
    # are never counted as dropped either
    again = core.handle(
        t.purchases, purchase("nope", "bob", "p0"), partition=t.partition_of("nope"), offset=100
    )
    assert again.dropped is None and again.reason == "already_answered"


def test_every_topic_the_market_writes_has_a_byte_bound_kafka_holds() -> None:
    """``retention.bytes`` on every topic that deletes (Kafka deletes closed segments only, so
    its segments are smaller than the bound); compacted ones roll segments too. The identity
    record alone has none: its first record is the trust root."""
    t = Topics("t", 4)
    specs = [*t.specs(), t.inbox_spec("alice")]
    for spec in specs:
        c = spec.config
        if spec.name == t.identity:
            assert "retention.bytes" not in c
            continue
        if "delete" in c["cleanup.policy"]:
            assert int(c["segment.bytes"]) < int(c["retention.bytes"]) <= 4096 * 1024**2, spec
        else:
            assert int(c["segment.bytes"]) <= 64 * 1024**2, spec
    assert {s.name for s in specs} >= {t.rejections, t.refusals, t.deadletters, t.catalog}


# -- on the embedded broker, with a worker ------------------------------------------------------
FLOOD_S = 10.0
RATE = 2_000  # garbage records a second, over the four partitions of the purchases topic


async def _read(bootstrap: str, topic: str) -> list[bytes]:
    """The values of ``topic``'s one partition, read to the end."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        out: list[bytes] = []
        idle = 0
        while idle < 3:
            got = await consumer.getmany(tp, timeout_ms=200, max_records=10_000)
            batch = [r.value or b"" for records in got.values() for r in records]
            out += batch
            idle = 0 if batch else idle + 1
        return out
    finally:
        await consumer.stop()


def _summaries(rejections: list[bytes]) -> list[Rejection]:
    """The ``refusals_dropped`` summaries among the rejections topic's records."""
    return [
        r for r in map(Rejection.model_validate_json, rejections) if r.reason == "refusals_dropped"
    ]


@pytest.mark.broker
@pytest.mark.slow
def test_a_garbage_flood_costs_the_market_a_bounded_number_of_records(market: Market) -> None:
    """Garbage at 2,000 records a second for 10 s on the purchases topic: what the market writes
    in answer (to the rejections and refusals topics) stays within the stated bound (on main:
    two records per garbage record), and a buyer's purchase sent during the flood is answered."""
    w = market.start_worker()
    market.open_accounts("seller1", "bob")
    t = market.topics

    async def go(c: MarketClient) -> tuple[int, Any]:
        entry = await c.register(
            {
                "stream_id": "s",
                "mechanism": "laplace",
                "sensitivity": 1.0,
                "dimension": 1,
                "steps": [1.0],
                "cap": 1.0,
                "retain_last": 1,
                "pricing": LinearPrecisionSpec(rate_per_precision=0.0),
            }
        )
        assert not isinstance(entry, Rejection), entry
        await c.publish("s", [1.0], value_id="v0")
        market.wait_ingested("s", 1)
        garbage = write_garbage(market.broker.bootstrap, t.purchases, RATE, FLOOD_S, 4, 4)
        flood = asyncio.create_task(garbage)
        await asyncio.sleep(FLOOD_S / 2)
        bought = await buy(
            c, "bob", "s", max_price_minor=0, purchase_id="during", requested_at_ms=now_ms()
        )
        return await flood, bought

    t0 = time.monotonic()
    sent, bought = market.run(go)
    assert isinstance(bought, PurchaseFulfilled), bought
    deadline = time.monotonic() + 60
    while market.metric("emarket_purchases_total", outcome="rejected") < sent:  # all of it read
        assert time.monotonic() < deadline, "the worker never read the whole flood"
        time.sleep(0.2)
    duration_ms = int((time.monotonic() - t0) * 1000)
    rejections = asyncio.run(_read(market.broker.bootstrap, t.rejections))
    written = len(rejections) + len(asyncio.run(_read(market.broker.bootstrap, t.refusals)))
    bound = RefusalBounds().records_bound(t.partitions, duration_ms)
    assert sent >= FLOOD_S * RATE * 0.8, sent
    assert written <= bound, (written, bound, sent)
    # an interval's summary goes out with the first event after it ended: on a busy machine
    # the whole flood may be read within one interval, so garbage trickles on until it is
    deadline = time.monotonic() + 60
    while not (told := _summaries(asyncio.run(_read(market.broker.bootstrap, t.rejections)))):
        assert time.monotonic() < deadline, "no refusals_dropped summary on the rejections topic"
        asyncio.run(write_garbage(market.broker.bootstrap, t.purchases, 400, 0.01, 4, 4))
        time.sleep(2)
    assert {r.source_topic for r in told} == {t.purchases}
    dropped = market.metric("emarket_refusals_dropped_total")
    assert dropped >= sent - bound / 2, (dropped, sent)
    assert w.alive()
