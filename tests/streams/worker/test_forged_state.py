"""Records a stranger appends to the changelogs change nothing, after a restart or live (#29, #39).

The embedded broker lets anyone write any topic. A stranger (mallory) appends, to each of the
five changelogs, records the market never sealed: alice's account mapped to mallory's keys
(without a stamp, with a made-up stamp and garbage), bob's genuine record moved under alice's id
or to another partition, a forged deletion of seller1's account, a made-up stream record, a
registration rewritten, forged deletions of alice's purchase record, and release states moved to
another value. The worker is restarted and rebuilds its tables and its account replica from
those changelogs: alice still buys, her purchase replayed is not charged again, mallory's
purchase signed as alice is refused, and the refusals are counted by store and reason and logged
with topic, partition and offset.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from streams.clients.client import MarketClient, now_ms
from streams.wire.events import LinearLevelSpec, PurchaseFulfilled
from streams.wire.signing import key_id_of
from streams.worker.secrets import state_keys
from streams.worker.state_records import StateSeal

from .. import helpers
from ..conftest import Market
from ..helpers import buy, party
from ..wire.test_counts import TEST_KEYS

pytestmark = [pytest.mark.broker, pytest.mark.slow]

Forgery = tuple[bytes, bytes | None, list[tuple[str, bytes]], int]
"""A record to append: key, value (None: a deletion), headers, partition."""


def changelog(market: Market, store: str) -> str:
    return f"{market.settings.app_id}-{store}-changelog"


async def read_changelog(market: Market, store: str) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of a store's changelog, all partitions, as anyone on the broker reads it."""
    topic = changelog(market, store)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=market.broker.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(market.settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[ConsumerRecord[bytes, bytes]] = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for recs in (await consumer.getmany(timeout_ms=500)).values():
                out += recs
        return out
    finally:
        await consumer.stop()


def opened(store: str, rec: ConsumerRecord[bytes, bytes]) -> bytes | None:
    """A changelog record's plaintext, opened with the test market's noise secret (what only
    the market, or an auditor holding its secret, can do; None for a deletion)."""
    got = StateSeal(*state_keys(TEST_KEYS.noise_secret)).open(
        store, rec.key, rec.value, rec.headers
    )
    assert not isinstance(got, str), got
    return got.plaintext


def latest(records: list[ConsumerRecord[bytes, bytes]], key: Callable[[bytes], bool]) -> Any:
    found = [r for r in records if r.key is not None and key(r.key) and r.value is not None]
    assert found, "no such record on the changelog"
    return found[-1]


def mallory_as_alice() -> bytes:
    mallory = party("mallory")
    return json.dumps(
        {
            "account_id": "alice",
            "version": 2,
            "signing_key": mallory.public_key,
            "key_id": key_id_of(mallory.public_key),
            "opened_at_ms": 1,
            "updated_at_ms": 2,
        }
    ).encode()


def made_up_stamp(partition: int, seal: bool = False) -> list[tuple[str, bytes]]:
    stamp = b"\x02" + partition.to_bytes(4, "big") + os.urandom(21)
    return [("emarket-state", stamp + (os.urandom(40) if seal else b""))]


async def forgeries(market: Market) -> dict[str, list[Forgery]]:
    """What mallory appends, by store (read from the changelogs as he would)."""
    accounts = await read_changelog(market, "accounts")
    alice = latest(accounts, lambda k: k == b"alice")
    bob = latest(accounts, lambda k: k == b"bob")
    seller = latest(accounts, lambda k: k == b"seller1")
    stream = latest(await read_changelog(market, "streams"), lambda k: k == b"s")
    registered = latest(await read_changelog(market, "registered"), lambda k: k == b"s")
    purchases = await read_changelog(market, "purchases")
    bought = latest(purchases, lambda k: k.startswith(b"alice/") and k.endswith(b"/p1"))
    releases = await read_changelog(market, "releases")
    v1 = latest(releases, lambda k: k == b"s/v1")
    other = (bob.partition + 1) % market.settings.partitions
    garbage = os.urandom(64)
    return {
        "accounts": [
            (b"alice", mallory_as_alice(), [], alice.partition),  # no stamp
            (b"alice", garbage, made_up_stamp(alice.partition), alice.partition),
            (b"alice", bob.value, list(bob.headers), alice.partition),  # moved to another key
            (b"bob", bob.value, list(bob.headers), other),  # moved to another partition
            (b"seller1", None, [], seller.partition),  # a deletion
            (b"seller1", None, made_up_stamp(seller.partition, seal=True), seller.partition),
        ],
        "streams": [
            (b"s", garbage, made_up_stamp(stream.partition), stream.partition),
            (b"s", registered.value, list(registered.headers), stream.partition),  # a store moved
        ],
        "registered": [
            (b"s", garbage, [], registered.partition),
            (b"s", stream.value, list(stream.headers), registered.partition),
        ],
        "purchases": [
            (bought.key, None, [], bought.partition),
            (bought.key, None, made_up_stamp(bought.partition, seal=True), bought.partition),
        ],
        "releases": [
            (b"s/v0", v1.value, list(v1.headers), v1.partition),  # moved to another value
            (b"s/v2", b"\x00garbage", [], v1.partition),
        ],
    }


async def append(market: Market, store: str, records: list[Forgery]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=market.broker.bootstrap)
    await producer.start()
    try:
        for key, value, headers, partition in records:
            await producer.send_and_wait(
                changelog(market, store), value, key=key, partition=partition, headers=headers
            )
    finally:
        await producer.stop()


def refused(market: Market, store: str) -> float:
    return market.metric("emarket_state_records_refused_total", store=store)


def wait_for(what: str, ok: Callable[[], bool], timeout: float = 60.0) -> None:
    async def poll() -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not ok():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.2)

    asyncio.run(poll())


def mallory_buys_as_alice(market: Market, pid: str) -> None:
    forged = helpers.purchase(
        "s",
        "alice",
        pid,
        max_price=10**6,
        market=market.topics.prefix,
        signer="mallory",
        requested_at_ms=now_ms(),
    )
    market.run(lambda c: c.send(c.topics.purchases, "s", forged))


@pytest.mark.parametrize("store", ["memory://", "rocksdb://"])
def test_forged_changelog_records_change_nothing_after_a_restart(
    market: Market, store: str
) -> None:
    w1 = market.start_worker(store=store)
    market.open_accounts("seller1", "alice", "bob")

    async def first(c: MarketClient) -> Any:
        await c.register(
            {
                "stream_id": "s",
                "mechanism": "laplace",
                "sensitivity": 1.0,
                "dimension": 3,
                "steps": [0.25, 0.5, 1.0],
                "cap": 4.0,
                "retain_last": 6,
                "pricing": LinearLevelSpec(rate_per_level=100.0),
            }
        )
        for i in range(4):
            await c.publish("s", [1.0, 2.0, float(i)], value_id=f"v{i}")
        market.wait_ingested("s", 4)
        return await buy(c, "alice", "s", max_price_minor=1000, purchase_id="p1")

    b1 = market.run(first)
    assert isinstance(b1, PurchaseFulfilled) and b1.level_after == 0.25
    w1.stop()
    forged = market.run(lambda c: forgeries(market))
    for name, records in forged.items():
        market.run(lambda c, n=name, r=records: append(market, n, r))
    market.start_worker(store=store)

    async def second(c: MarketClient) -> tuple[Any, Any]:
        again = await buy(c, "alice", "s", max_price_minor=1000, purchase_id="p1")
        step = await buy(c, "alice", "s", max_price_minor=1000, purchase_id="p2")
        await c.publish("s", [1.0, 2.0, 9.0], value_id="v9")  # seller1 still exists, and sells s
        return again, step

    again, step = market.run(second)
    assert again.model_dump_json() == b1.model_dump_json()  # replayed: the record was not deleted
    assert isinstance(step, PurchaseFulfilled)
    assert (step.level_before, step.level_after, step.price_minor) == (0.25, 0.5, 25)
    market.wait_ingested("s", 5)
    mallory_buys_as_alice(market, "m1")
    wait_for(
        "mallory's purchase refused",
        lambda: market.metric("emarket_rejections_total", reason="bad_signature") == 1,
    )
    ledger = market.ledger()["s"]
    assert set(ledger["holders"]) == {"alice"}
    assert ledger["holders"]["alice"]["paid_minor"] == b1.price_minor + 25
    assert ledger["revenue_minor"] == b1.price_minor + 25
    # every forged record counted: accounts by the table and by the account replica
    expected = {n: len(r) * (2 if n == "accounts" else 1) for n, r in forged.items()}
    wait_for(
        "the refusals counted", lambda: all(refused(market, n) >= k for n, k in expected.items())
    )
    logs = market.logs()
    assert f"accounts store (forged: no stamp) at {changelog(market, 'accounts')}[" in logs
    assert "accounts store (moved: stamped for partition" in logs

    # live: the replica refuses a forged account record as it arrives
    before = refused(market, "accounts")
    alice = latest(
        market.run(lambda c: read_changelog(market, "accounts")), lambda k: k == b"alice"
    )
    market.run(
        lambda c: append(market, "accounts", [(b"alice", mallory_as_alice(), [], alice.partition)])
    )
    wait_for("the live forgery counted", lambda: refused(market, "accounts") >= before + 1)
    mallory_buys_as_alice(market, "m2")
    wait_for(
        "mallory's second purchase refused",
        lambda: market.metric("emarket_rejections_total", reason="bad_signature") == 2,
    )
    assert set(market.ledger()["s"]["holders"]) == {"alice"}
