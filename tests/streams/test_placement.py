"""An event is applied only on the input partition its id maps to (``wrong_partition``).

A producer may write to any partition it likes. Each worker holds only its partitions' table
entries, so an account or stream event on a foreign partition would land on a worker that does
not know the real entry and would write a second one — a second ``alice`` pinned to mallory's
key, which every worker's account replica may then read last. Two cores with separate stores
stand in for two workers here, as they do in a deployment: each sees only its own writes.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from streams.broker.admin import PartitionCountError, check_input_partitions, ensure_topics
from streams.clients.keys import Party
from streams.core import MarketCore, Stores
from streams.wire.events import Rejection
from streams.wire.topics import Topics, murmur2

from .helpers import MARKET, TEST_KEYS, account, party, purchase, quote, registration, value

T = Topics(MARKET)


def _worker() -> MarketCore:
    return MarketCore(Stores(), TEST_KEYS, T, clock=lambda: 1_000)


def _other(key: str) -> int:
    return (T.partition_of(key) + 1) % T.partitions


def _rejection(out: Any) -> Rejection:
    return Rejection.model_validate_json(out.outputs[0].value)


def test_the_partition_is_kafkas_default_partitioner() -> None:
    # aiokafka's partitioner is Java's (Utils.murmur2, toPositive, mod): ours must agree on every
    # length, including the 1-3 byte tails
    for n in range(40):
        for _ in range(20):
            data = os.urandom(n)
            assert murmur2(data) == aiokafka_murmur2(data)
    parts = list(range(T.partitions))
    for key in ("alice", "s1", "a" * 64, "stream-000123", "-_-"):
        assert T.partition_of(key) == DefaultPartitioner()(key.encode(), parts, parts)


def test_an_account_opened_on_a_foreign_partition_cannot_take_an_id() -> None:
    home, foreign = _worker(), _worker()  # alice's partition's worker, and another one
    alice = T.partition_of("alice")
    assert home.handle(T.accounts, account("alice"), partition=alice).status == "accepted"
    # mallory signs an open_account for "alice" with her own key, to a partition the other
    # worker owns: that worker has no "alice" and would have pinned mallory's key to it
    mallory_as_alice = Party("alice", party("mallory").signing_key)
    raw = mallory_as_alice.open_account(MARKET, opened_at_ms=1_000).model_dump_json().encode()
    out = foreign.handle(T.accounts, raw, partition=_other("alice"), offset=3)
    assert (out.status, out.reason) == ("rejected", "wrong_partition")
    assert len(foreign.stores.accounts) == 0
    rej = _rejection(out)
    assert rej.details["expected_partition"] == alice and "partition" in rej.message
    assert [o.topic for o in out.outputs] == [T.rejections]  # nobody proved who sent it


def test_a_rotation_on_a_foreign_partition_is_refused_and_shown_to_its_owner() -> None:
    core = _worker()
    assert core.handle(T.accounts, account("bob"), partition=T.partition_of("bob")).status == (
        "accepted"
    )
    rot = party("bob").rotate_to(party("bob2"), MARKET, 2, rotated_at_ms=2_000)
    out = core.handle(T.accounts, rot.model_dump_json().encode(), partition=_other("bob"))
    assert (out.status, out.reason) == ("rejected", "wrong_partition")
    assert core.stores.accounts["bob"].version == 1
    assert T.inbox("bob") in [o.topic for o in out.outputs]  # bob's key signed it: he sees why


def _opened(*names: str) -> MarketCore:
    core = _worker()
    for name in names:
        out = core.handle(T.accounts, account(name), partition=T.partition_of(name))
        assert out.status == "accepted", out.reason
    return core


@pytest.mark.parametrize(
    ("topic", "event", "sender"),
    [
        (T.registrations, lambda: registration("s1"), "seller1"),
        (T.values, lambda: value("s1", "v1", [1.0, 2.0, 3.0]), "seller1"),
        (T.purchases, lambda: purchase("s1", "buyer1", "p1", target_level=0.5), "buyer1"),
        (T.purchases, lambda: quote("s1", "buyer1", "q1"), "buyer1"),
    ],
    ids=["registration", "value", "purchase", "quote"],
)
def test_stream_events_on_a_foreign_partition_change_nothing(
    topic: str, event: Any, sender: str
) -> None:
    core = _opened("seller1", "buyer1")
    home = T.partition_of("s1")
    if topic != T.registrations:
        assert core.handle(T.registrations, registration("s1"), partition=home).status == (
            "accepted"
        )
    if topic == T.purchases:
        assert core.handle(T.values, value("s1", "v1", [1.0, 2.0, 3.0]), partition=home).status == (
            "accepted"
        )
    before = {name: dict(store.items()) for name, store in vars(core.stores).items()}
    out = core.handle(topic, event(), partition=_other("s1"), offset=9)
    assert (out.status, out.reason) == ("rejected", "wrong_partition")
    assert {name: dict(store.items()) for name, store in vars(core.stores).items()} == before
    assert sorted(o.topic for o in out.outputs) == sorted([T.rejections, T.inbox(sender)])
    rej = _rejection(out)
    assert (rej.sender_id, rej.stream_id, rej.source_partition) == (sender, "s1", _other("s1"))
    # the same event where a client's default partitioner puts it is applied
    again = core.handle(topic, event(), partition=home, offset=10)
    assert again.status in ("accepted", "fulfilled", "answered"), again.reason


@pytest.mark.broker
def test_a_worker_refuses_input_topics_with_another_partition_count(broker: Any) -> None:
    prefix = f"pc{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        await ensure_topics(broker.bootstrap, Topics(prefix, 2))
        with pytest.raises(PartitionCountError, match=r"configured with 4 .*accounts has 2"):
            await check_input_partitions(broker.bootstrap, Topics(prefix, 4))
        await check_input_partitions(broker.bootstrap, Topics(prefix, 2))  # agrees: no error
        await check_input_partitions(broker.bootstrap, Topics(f"{prefix}x", 4))  # none yet

    asyncio.run(go())
