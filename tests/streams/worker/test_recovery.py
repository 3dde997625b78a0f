"""State survives worker restarts and crashes; replays never re-noise or double-charge."""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from streams.clients.client import MarketClient, TopicReader, now_ms
from streams.wire.events import LinearLevelSpec, PurchaseFulfilled, Rejection
from streams.worker.faust_internals import true_highwaters

from .. import helpers
from ..conftest import Market
from ..helpers import buy, tail
from ..worker.test_forged_state import opened, read_changelog

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def reg(stream: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "stream_id": stream,
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 3,
        "steps": [0.25, 0.5, 1.0, 2.0],
        "cap": 4.0,
        "retain_last": 6,
        "pricing": LinearLevelSpec(rate_per_level=100.0),
    }
    base.update(kw)
    return base


def test_tansu_latest_offset_bug_and_fix(broker: Any) -> None:
    """Documents the broker bug the Tansu workarounds work around: ListOffsets(latest) answers
    base-of-last-batch + 1; the fetch response's high watermark is right."""

    async def go() -> tuple[int, int]:
        topic = f"hw-{id(broker)}"
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20)
        await p.start()
        for _ in range(3):
            for _ in range(50):
                await p.send(topic, b"x", partition=0)
            await p.flush()
        await p.stop()
        from aiokafka import AIOKafkaConsumer

        c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
        await c.start()
        tp = TopicPartition(topic, 0)
        reported = (await c.end_offsets([tp]))[tp]
        await c.stop()
        fixed = (await true_highwaters(broker.bootstrap, {tp: reported}))[tp]
        return reported, fixed

    reported, fixed = asyncio.run(go())
    assert fixed == 150
    assert reported <= fixed  # 101 on Tansu 0.6; equal on a correct broker


@pytest.mark.parametrize(
    ("how", "store"),
    [("graceful", "memory://"), ("kill", "memory://"), ("kill", "rocksdb://")],
)
def test_table_state_survives_worker_restart(market: Market, how: str, store: str) -> None:
    """A restarted worker rebuilds its tables from the changelog (memory store) or from its
    local RocksDB plus the changelog tail; the Tansu workarounds make both complete."""
    w1 = market.start_worker(store=store)
    market.open_accounts("seller1", "alice", "bob")

    async def first(c: MarketClient) -> Any:
        await c.register(reg("s"))
        for i in range(6):
            await c.publish("s", [1.0, 2.0, float(i)], value_id=f"v{i}")
        market.wait_ingested("s", 6)
        return await buy(c, "alice", "s", max_price_minor=1000, purchase_id="p1")

    b1 = market.run(first)
    assert isinstance(b1, PurchaseFulfilled) and b1.level_after == 0.25
    if how == "graceful":
        w1.stop()
    else:
        w1.kill()
    w2 = market.start_worker(store=store)

    async def second(c: MarketClient) -> tuple[Any, Any, Any]:
        again = await buy(c, "alice", "s", max_price_minor=1000, purchase_id="p1")
        step = await buy(c, "alice", "s", max_price_minor=1000, purchase_id="p2")
        other = await buy(c, "bob", "s", max_price_minor=1000, target_level=0.5)
        return again, step, other

    again, step, other = market.run(second)
    assert again.model_dump_json() == b1.model_dump_json()  # replayed, bit for bit
    assert (step.level_before, step.level_after, step.price_minor) == (0.25, 0.5, 25)
    # another buyer of that level after the restart gets the very same releases: one process
    assert other.price_minor == 50 and other.level_after == 0.5
    assert [r.values for r in other.releases] == [r.values for r in step.releases]
    led = market.ledger()["s"]
    assert led["holders"]["alice"]["paid_minor"] == 50
    assert led["revenue_minor"] == 100
    # values redelivered after the restart (uncommitted offsets) are recognised, never re-noised
    assert w2.metric("emarket_values_ingested_total", {"status": "accepted"}) == 0
    # the first purchase computed every step from the top down, and the restarted worker read
    # them back: the next step draws nothing
    assert w2.metric("emarket_noise_draws_total") == 0


def test_a_registration_is_on_its_own_changelog_once_and_read_back_on_restart(
    market: Market,
) -> None:
    """A stream's registration and catalog entry go to the ``registered`` changelog once; the
    ``streams`` changelog's record, written after each batch that changes the stream, carries
    neither. A worker killed, then started afresh from the changelogs, serves the stream: the
    buyer's next step, the seller's next value, the ledger (#32)."""
    w1 = market.start_worker()
    market.open_accounts("seller1", "alice")

    async def first(c: MarketClient) -> Any:
        await c.register(reg("s"))
        for i in range(4):
            await c.publish("s", [1.0, 2.0, float(i)], value_id=f"v{i}")
        market.wait_ingested("s", 4)
        return await buy(c, "alice", "s", max_price_minor=1000, purchase_id="p1")

    b1 = market.run(first)
    assert isinstance(b1, PurchaseFulfilled)
    w1.kill()

    def written(store: str) -> list[bytes]:
        records = market.run(lambda c: read_changelog(market, store))
        return [opened(store, r) or b"" for r in records if r.key == b"s" and r.value is not None]

    registered, streams = written("registered"), written("streams")
    assert len(registered) == 1
    signature = json.loads(registered[0])["registration"]["signature"].encode()
    assert len(streams) >= 2  # the registration's batch, then the values' and the purchase's
    for record in streams:
        assert signature not in record and b"registration" not in record
        assert len(record) < len(registered[0])
    market.start_worker()

    async def second(c: MarketClient) -> Any:
        step = await buy(c, "alice", "s", max_price_minor=1000, purchase_id="p2")
        await c.publish("s", [1.0, 2.0, 9.0], value_id="v9")  # still seller1's stream
        return step

    step = market.run(second)
    assert (step.level_before, step.level_after, step.price_minor) == (0.25, 0.5, 25)
    market.wait_ingested("s", 5)
    led = market.ledger()["s"]
    assert led["seller_id"] == "seller1" and led["revenue_minor"] == b1.price_minor + 25
    assert written("registered") == registered  # the restarted worker did not write it again


# two of the six fail points, one before the state is acknowledged and one after; the chaos test
# (test_chaos.py) crashes at all six, many times, with the same checks
@pytest.mark.parametrize("point", ["mid_state", "mid_output"])
def test_worker_killed_mid_purchase_then_restarted(market: Market, point: str) -> None:
    """A worker dies (fail point = SIGKILL-like exit) in the middle of a burst of purchases:
    after a restart and client resends, every purchase has exactly one outcome (duplicates are
    byte-identical), nobody pays twice, and no (value, level) was ever released with two
    different vectors."""
    w1 = market.start_worker()
    buyers = [f"b{i}" for i in range(8)]
    market.open_accounts("seller1", *buyers)
    levels = (0.25, 0.5, 1.0)

    async def setup(c: MarketClient) -> None:
        await c.register(reg("s", retain_last=10))
        for i in range(10):
            await c.publish("s", [0.0, 1.0, float(i)], value_id=f"v{i}")

    market.run(setup)
    market.wait_ingested("s", 10)
    w1.stop()
    faulty = market.start_worker_env({"EMARKET_FAULTS": f"{point}:1.0"})

    t0 = now_ms()

    def purchase(b: str, step: int) -> bytes:  # what a client sends (and resends, unchanged)
        return helpers.purchase(
            "s",
            b,
            f"{b}-{step}",
            max_price=1000,
            market=market.topics.prefix,
            target_level=levels[step],
            requested_at_ms=t0,
        )

    async def fire(c: MarketClient) -> None:
        for step in range(3):
            for b in buyers:
                await c.send(market.topics.purchases, "s", purchase(b, step))

    market.run(fire)
    assert faulty.proc is not None and faulty.proc.wait(60) == 137, "fail point not reached"
    market.start_worker()

    skipped: set[str] = set()

    async def settle(c: MarketClient) -> dict[str, list[Any]]:
        for step in range(3):  # the client resends by purchase id until an outcome arrives
            for b in buyers:
                out = await buy(
                    c,
                    b,
                    "s",
                    target_level=levels[step],
                    max_price_minor=1000,
                    purchase_id=f"{b}-{step}",
                    resend_every=5,
                    timeout=60,
                    requested_at_ms=t0,
                )
                if isinstance(out, Rejection):  # faust-streaming skipped it after the restart,
                    # its buyer's next step was fulfilled first: refused, the buyer holds more
                    assert out.reason == "already_held", out
                    assert out.details["held_level"] > levels[step]
                    skipped.add(f"{b}-{step}")
                else:
                    assert isinstance(out, PurchaseFulfilled), out

        async def inbox(b: str) -> list[Any]:  # read all eight inboxes at once, not in turn
            return [e async for e in tail(c, b, idle_timeout=2.0)]

        return dict(zip(buyers, await asyncio.gather(*(inbox(b) for b in buyers)), strict=True))

    events = market.run(settle)
    releases: dict[tuple[str, float], set[tuple[float, ...]]] = collections.defaultdict(set)
    outcomes: dict[str, set[str]] = collections.defaultdict(set)
    for evs in events.values():
        for e in evs:
            if e.type == "purchase_fulfilled":
                outcomes[e.purchase_id].add(e.model_dump_json())
                for r in e.releases:
                    releases[(r.value_id, r.level)].add(tuple(r.values))
            elif e.type == "value_released":
                for r in e.releases:
                    releases[(r.value_id, r.level)].add(tuple(r.values))
    assert len(outcomes) == len(buyers) * 3 - len(skipped)
    assert all(len(v) == 1 for v in outcomes.values()), "a purchase had two different outcomes"
    assert len(releases) == 10 * 3
    assert all(len(v) == 1 for v in releases.values()), "a (value, level) was re-noised"
    led = market.ledger()["s"]
    assert all(led["holders"][b]["paid_minor"] == 100 for b in buyers)  # P(1.0), once
    assert led["revenue_minor"] == 100 * len(buyers)
    assert led["privacy_spent"] == 1.0


def test_whole_topics_replayed_from_earliest(market: Market) -> None:
    """Re-publishing every event of the values and purchases topics (a full replay) re-emits
    the identical bytes, draws no noise and charges nobody again."""
    w = market.start_worker()
    market.open_accounts("seller1", "alice", "bob")

    async def first(c: MarketClient) -> None:
        await c.register(reg("s"))
        for i in range(5):
            await c.publish("s", [1.0, 2.0, float(i)], value_id=f"v{i}")
        market.wait_ingested("s", 5)
        for b in ("alice", "bob"):
            for k in range(3):
                await buy(c, b, "s", max_price_minor=1000, purchase_id=f"{b}{k}")
        await c.publish("s", [9.0, 9.0, 9.0], value_id="late")  # a subscription delivery

    market.run(first)
    market.wait_ingested("s", 6)
    ledger_before = market.ledger()["s"]
    draws_before = w.metric("emarket_noise_draws_total")

    async def replay(c: MarketClient) -> dict[str, list[bytes]]:
        for topic in (market.topics.values, market.topics.purchases):
            reader = TopicReader(c.bootstrap, topic)
            await reader.start()
            msgs = []
            while batch := await reader.poll(0.5):
                msgs += batch
            await reader.stop()
            for key, payload in msgs:
                await c._producer.send_and_wait(topic, payload, key=key)
        await asyncio.sleep(3)
        out = {}
        for b in ("alice", "bob"):
            reader = TopicReader(c.bootstrap, market.topics.inbox(b))
            await reader.start()
            msgs = []
            while batch := await reader.poll(0.5):
                msgs += [v for _, v in batch]
            await reader.stop()
            out[b] = msgs
        return out

    topics = market.run(replay)
    assert market.ledger()["s"] == ledger_before
    assert w.metric("emarket_noise_draws_total") == draws_before
    assert w.metric("emarket_purchases_total", {"outcome": "duplicate"}) == 6
    for msgs in topics.values():
        by_id: dict[str, set[bytes]] = collections.defaultdict(set)
        releases: dict[tuple[str, float], set[tuple[float, ...]]] = collections.defaultdict(set)
        for raw in msgs:
            ev = json.loads(raw)
            if ev["type"] == "purchase_fulfilled":
                by_id[ev["purchase_id"]].add(raw)
                for r in ev["releases"]:
                    releases[(r["value_id"], r["level"])].add(tuple(r["values"]))
            elif ev["type"] == "value_released":
                for r in ev["releases"]:
                    releases[(r["value_id"], r["level"])].add(tuple(r["values"]))
        assert len(by_id) == 3 and all(len(v) == 1 for v in by_id.values())
        # a replayed purchase whose outcome is in the inbox adds nothing to it
        assert b'"already_answered"' not in b"".join(msgs)
        sent = collections.Counter(
            json.loads(raw)["purchase_id"] for raw in msgs if b'"purchase_fulfilled"' in raw
        )
        assert {p: sent[p] for p in by_id} == dict.fromkeys(by_id, 1)
        assert all(len(v) == 1 for v in releases.values())


def test_a_batch_failing_outside_the_core_stops_the_worker_and_is_processed_again(
    market: Market,
) -> None:
    """A bug in the worker's own code (not the core's, which turns every error into a
    rejection) stops the worker instead of letting its agent go on with later records, which
    Faust could then commit past: the records are read again from the committed offset."""
    w1 = market.start_worker_env({"EMARKET_BREAK": "breaks-here"})
    market.open_accounts("seller1")

    async def setup(c: MarketClient) -> None:
        await c.register(reg("s"))
        await c.publish("s", [1.0, 2.0, 3.0], value_id="v0")
        await c.publish("s", [1.0, 2.0, 3.0], value_id="breaks-here", wait=False)

    market.run(setup)
    assert w1.proc is not None and w1.proc.wait(60) != 0, "the worker went on"
    market.start_worker()
    market.wait_ingested("s", 2)
    assert market.ledger()["s"]["values_ingested"] == 2
