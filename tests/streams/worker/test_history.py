"""The market's own state against a stranger on the log (#39), on the real broker.

* **A rollback undoes nothing.** Genuine older changelog records, each sealed by the market,
  appended again after newer ones: alice's account before she rotated her key, a stream's
  record before bob bought its privacy window full. After a restart (memory and RocksDB
  stores) the rotated-out key still buys nothing, a second value of the full window is
  withheld from bob (never a second level-1 release in a window whose cap is 1), bob pays for
  his level once, and the worker counts every record it refused as older.
* **A stranger in the consumer group loses no purchase.** A plain consumer joins the worker's
  group while the worker is away, commits the end offsets of every input partition and leaves;
  the worker comes back, starts from the positions its own checkpoints prove, answers every
  purchase, and counts the offsets it found ahead.
* **State the market lost is noticed.** A changelog topic deleted: the partitions whose state
  no longer matches their checkpoint are not served, ``/health`` says which and why, and the
  gauge the page alert watches moves.
* **State that reveals nothing.** Every record of every changelog, read as anyone on the broker
  reads it, holds none of the sellers' numbers, no encoding of them, and no digest of them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import time
import urllib.error
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from streams.clients.client import MarketClient, now_ms
from streams.clients.keys import Party
from streams.wire.events import (
    DeliveriesWithheld,
    LinearLevelSpec,
    PurchaseFulfilled,
    Rejection,
    ValueReleased,
)

from .. import helpers
from ..conftest import Market
from ..helpers import buy, inbox_until, party
from ..worker.test_forged_state import append, changelog, opened, read_changelog, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]

W = 600_000  # ten-minute privacy windows


def window_stream() -> dict[str, Any]:
    return {
        "stream_id": "w",
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 3,
        "steps": [0.5, 1.0],
        "cap": 1.0,
        "retain_last": 4,
        "pricing": LinearLevelSpec(rate_per_level=100.0),
        "privacy_unit": "window",
        "window": {"duration_ms": W, "cap": 1.0},
    }


def event_stream(sid: str = "e", **kw: Any) -> dict[str, Any]:
    return {
        "stream_id": sid,
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 3,
        "steps": [0.5, 1.0, 2.0],
        "cap": 4.0,
        "retain_last": 4,
        "pricing": LinearLevelSpec(rate_per_level=100.0),
        **kw,
    }


def refused(market: Market, reason: str, store: str | None = None) -> float:
    labels = {"reason": reason} | ({} if store is None else {"store": store})
    return market.metric("emarket_state_records_refused_total", **labels)


# -- a rollback ---------------------------------------------------------------------------------
@pytest.mark.parametrize("store", ["memory://", "rocksdb://"])
def test_genuine_old_records_appended_again_undo_nothing(market: Market, store: str) -> None:
    market.start_worker(store=store)
    market.open_accounts("seller1", "alice", "bob")
    rotated = Party("alice", party("alice-2").signing_key, key_version=2)

    base = now_ms() // W * W

    async def before(c: MarketClient) -> None:
        for fields in (window_stream(), event_stream()):
            assert not isinstance(await c.register(fields), Rejection)
        await c.publish("w", [1.0, 2.0, 3.0], value_id="v0", published_at_ms=base)
        await c.publish("e", [1.0, 2.0, 3.0], value_id="v0")

    market.run(before)
    market.wait_ingested("w", 1)
    market.wait_ingested("e", 1)
    stale = market.run(lambda c: read_changelog(market, "streams"))  # before bob bought
    old_w = [r for r in stale if r.key == b"w"][-1]

    async def then(c: MarketClient) -> Any:
        assert (await c.rotate_keys(rotated, 2, party=party("alice"))).type == "account"
        return await buy(c, "bob", "w", target_level=1.0, max_price_minor=1000, purchase_id="p1")

    first = market.run(then)
    assert isinstance(first, PurchaseFulfilled) and first.price_minor == 100
    accounts = market.run(lambda c: read_changelog(market, "accounts"))
    old_alice = next(r for r in accounts if r.key == b"alice")  # her first key's record
    assert (opened("accounts", old_alice) or b"").find(party("alice").public_key.encode()) > 0
    market.stop_workers()
    market.run(
        lambda c: append(
            market,
            "accounts",
            [(old_alice.key, old_alice.value, list(old_alice.headers), old_alice.partition)],
        )
    )
    market.run(
        lambda c: append(
            market, "streams", [(old_w.key, old_w.value, list(old_w.headers), old_w.partition)]
        )
    )
    market.start_worker(store=store)

    async def after(c: MarketClient) -> tuple[Any, Any, list[Any]]:
        again = await buy(c, "bob", "w", target_level=1.0, max_price_minor=1000, purchase_id="p2")
        await c.publish("w", [4.0, 5.0, 6.0], value_id="v1", published_at_ms=base + 1)
        new_key = await c.buy("e", party=rotated, max_price_minor=1000, purchase_id="a1")
        old_key = helpers.purchase(
            "e",
            "alice",
            "a0",
            max_price=1000,
            market=market.topics.prefix,
            requested_at_ms=now_ms(),
        )
        await c.send(c.topics.purchases, "e", old_key)
        told = await inbox_until(
            c,
            "bob",
            lambda evs: any(isinstance(e, DeliveriesWithheld | ValueReleased) for e in evs),
        )
        return again, new_key, told

    again, new_key, told = market.run(after)
    assert isinstance(again, Rejection) and again.reason == "already_held", again
    assert isinstance(new_key, PurchaseFulfilled)
    assert not [e for e in told if isinstance(e, ValueReleased)]  # v1 would be a second level 1
    assert [v for e in told if isinstance(e, DeliveriesWithheld) for v in e.value_ids] == ["v1"]
    wait_for(
        "the old key's purchase refused",
        lambda: market.metric("emarket_rejections_total", reason="key_rotated") >= 1,
    )
    led = market.ledger()
    assert led["w"]["holders"]["bob"]["paid_minor"] == 100 and led["w"]["revenue_minor"] == 100
    assert led["w"]["privacy_window"]["spent_by_window_start_ms"] == {str(base): 1.0}
    assert set(led["e"]["holders"]) == {"alice"}
    wait_for(
        "both rollbacks counted",
        lambda: (
            refused(market, "older", "streams") >= 1 and refused(market, "older", "accounts") >= 2
        ),
    )  # the table and the replica
    assert "(older: version" in market.logs()


# -- a stranger in the consumer group -----------------------------------------------------------
class AsFaust(RoundRobinPartitionAssignor):
    """A plain round-robin assignor under the protocol name Faust's workers use."""

    name = "faust"


async def join_commit_end_and_leave(market: Market) -> dict[TopicPartition, int]:
    """What the red team's stranger did: join the worker's group, take its partitions, commit
    their end offsets, leave."""
    topics = list(market.topics.inputs())
    rogue = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=market.broker.bootstrap,
        group_id=market.settings.app_id,
        enable_auto_commit=False,
        session_timeout_ms=3000,
        heartbeat_interval_ms=300,
        partition_assignment_strategy=(AsFaust,),
    )
    await rogue.start()
    try:
        deadline = time.monotonic() + 60
        while len(rogue.assignment()) < len(topics) * market.settings.partitions:
            assert time.monotonic() < deadline, "the stranger was given no partitions"
            await rogue.getmany(timeout_ms=200)
        ends = {}
        for tp in rogue.assignment():
            await rogue.seek_to_end(tp)
            ends[tp] = await rogue.position(tp)
        await rogue.commit(ends)
        return ends
    finally:
        await rogue.stop()


def test_a_stranger_committing_offsets_past_purchases_loses_none(market: Market) -> None:
    market.start_worker()
    buyers = [f"b{i}" for i in range(8)]
    market.open_accounts("seller1", *buyers)

    async def setup(c: MarketClient) -> None:
        assert not isinstance(await c.register(event_stream("s0")), Rejection)
        assert not isinstance(await c.register(event_stream("s1")), Rejection)
        for sid in ("s0", "s1"):
            await c.publish(sid, [1.0, 2.0, 3.0], value_id="v0")

    market.run(setup)
    for sid in ("s0", "s1"):
        market.wait_ingested(sid, 1)
    market.stop_workers()
    sent = [
        helpers.purchase(
            f"s{i % 2}",
            b,
            f"victim-{b}",
            max_price=1000,
            market=market.topics.prefix,
            requested_at_ms=now_ms(),
        )
        for i, b in enumerate(buyers)
    ]

    async def victims(c: MarketClient) -> None:
        for i, raw in enumerate(sent):
            await c.send(c.topics.purchases, f"s{i % 2}", raw)

    market.run(victims)
    committed = market.run(lambda c: join_commit_end_and_leave(market))
    assert any(offset > 0 for offset in committed.values())
    market.start_worker()

    async def answers(c: MarketClient) -> list[Any]:
        # the answers to the purchases sent while the worker was away, never sent again
        def answered(b: str) -> Any:
            return lambda evs: any(
                isinstance(e, PurchaseFulfilled) and e.purchase_id == f"victim-{b}" for e in evs
            )

        return [await inbox_until(c, b, answered(b), timeout=60) for b in buyers]

    got = market.run(answers)
    for b, events in zip(buyers, got, strict=True):
        assert any(
            isinstance(e, PurchaseFulfilled) and e.purchase_id == f"victim-{b}" for e in events
        ), f"{b}'s purchase was never answered"
    assert market.metric("emarket_purchases_total", outcome="fulfilled") == len(buyers)
    wait_for(
        "the offsets ahead counted",
        lambda: market.metric("emarket_offsets_ahead_total", input="purchases") >= 1,
    )
    assert "committed it (a stranger in the consumer group?)" in market.logs()


# -- state lost ---------------------------------------------------------------------------------
def test_a_deleted_changelog_leaves_its_partitions_unserved_and_says_so(market: Market) -> None:
    market.start_worker()
    market.open_accounts("seller1", "alice")

    async def setup(c: MarketClient) -> Any:
        assert not isinstance(await c.register(event_stream()), Rejection)
        await c.publish("e", [1.0, 2.0, 3.0], value_id="v0")
        market.wait_ingested("e", 1)
        return await buy(c, "alice", "e", max_price_minor=1000, purchase_id="p1")

    assert isinstance(market.run(setup), PurchaseFulfilled)
    market.stop_workers()

    async def delete() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=market.broker.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([changelog(market, "purchases")])
        finally:
            await admin.close()

    asyncio.run(delete())
    w = market.start_worker(healthy=False)
    partition = market.topics.partition_of("e")

    def health() -> dict[str, Any]:
        try:
            return dict(w.get("/health"))
        except urllib.error.HTTPError as exc:  # 503: the body says why
            return dict(json.loads(exc.read()))

    wait_for("health says unverified", lambda: health()["status"] == "unverified")
    why = health()["unverified"]
    assert why[f"partition {partition}"].startswith("purchases: 0 keys held, 1 committed"), why
    assert market.metric("emarket_partitions_unverified", reader="tables") >= 1
    assert "is not what its checkpoint" in market.logs()


# -- state that reveals nothing -----------------------------------------------------------------
SECRET_VECTOR = [123456.789, -98765.4321, 31415.9265]
SECRET_COUNTS = [52, 34]


def _encodings(numbers: list[float]) -> list[bytes]:
    """Every way a record could hold the numbers: as text, packed as doubles or 64-bit
    integers (either byte order), and their SHA-256 (raw and hex), as the market's digests of a
    value's numbers are computed (``digest_values``)."""
    out = [repr(x).encode() for x in numbers if abs(x) >= 1000]
    for fmt in ("<{}d", ">{}d", "<{}q", ">{}q"):
        if "q" in fmt and not all(float(x).is_integer() for x in numbers):
            continue
        vals = [int(x) if "q" in fmt else x for x in numbers]
        packed = struct.pack(fmt.format(len(vals)), *vals)
        digest = hashlib.sha256(packed)
        out += [packed, digest.digest(), digest.hexdigest().encode()]
        if abs(vals[0]) >= 1000:  # eight bytes of a large number: no accidental match
            out += [struct.pack(fmt.format(1), v) for v in vals]
    return out


def test_no_changelog_reveals_a_sellers_numbers(market: Market) -> None:
    market.start_worker()
    market.open_accounts("seller1", "alice")

    async def go(c: MarketClient) -> None:
        assert not isinstance(await c.register(event_stream("vec", retain_last=2)), Rejection)
        assert not isinstance(
            await c.register(
                {
                    "stream_id": "cnt",
                    "mechanism": "discrete_laplace",
                    "sensitivity": 1.0,
                    "dimension": 2,
                    "steps": [0.5, 1.0],
                    "cap": 2.0,
                    "retain_last": 2,
                    "pricing": LinearLevelSpec(rate_per_level=100.0),
                }
            ),
            Rejection,
        )
        await c.publish("vec", SECRET_VECTOR, value_id="v0")
        await c.publish("cnt", [float(x) for x in SECRET_COUNTS], value_id="c0")
        for sid in ("vec", "cnt"):
            market.wait_ingested(sid, 1)
            assert isinstance(await buy(c, "alice", sid, max_price_minor=1000), PurchaseFulfilled)
        for i in range(3):  # evicted from the window: its mark stays
            await c.publish("vec", [0.5, 0.25, float(i)], value_id=f"pad{i}")
        market.wait_ingested("vec", 4)

    market.run(go)
    seen = 0
    secrets_ = _encodings(SECRET_VECTOR) + _encodings([float(x) for x in SECRET_COUNTS])
    counts = {
        h
        for f in ("<2q", "<2d")
        for a in range(100)
        for b in range(100)
        for d in [hashlib.sha256(struct.pack(f, a, b))]
        for h in (d.digest()[:16], d.hexdigest().encode()[:16])
    }  # what brute force tries
    for store in (
        "registered",
        "streams",
        "releases",
        "purchases",
        "accounts",
        "holders",
        "progress",
    ):
        records = market.run(lambda c, s=store: read_changelog(market, s))
        for r in records:
            raw = b"".join([r.key or b"", r.value or b"", *(v for _, v in r.headers)])
            assert not any(s in raw for s in secrets_), (store, r.key)
            assert not any(d in raw for d in counts), (store, r.key)  # no digest of them
            seen += 1
    releases = market.run(lambda c: read_changelog(market, "releases"))
    v0 = [r for r in releases if r.key == b"vec/v0" and r.value is not None]
    assert v0 and struct.pack("<d", SECRET_VECTOR[0]) in (opened("releases", v0[0]) or b"")
    assert seen > 20  # the sealed records hold them: only the market's key opens them
