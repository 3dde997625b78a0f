"""An event is applied only on the input partition its id maps to; elsewhere it is moved there.

A producer may write to any partition it likes. Each worker holds only its partitions' table
entries, so an account or stream event on a foreign partition would land on a worker that does
not know the real entry and would write a second one — a second ``alice`` pinned to mallory's
key, which every worker's account replica may then read last. The core forwards such an event,
when its signature proves its sender, byte for byte to the partition of its id (where the owner
decides, once and on the record), and refuses it otherwise (``wrong_partition``). Two cores with
separate stores stand in for two workers here, as they do in a deployment: each sees only its
own writes.
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

from ..helpers import (
    MARKET,
    SIGNED_FOR,
    TEST_KEYS,
    account,
    party,
    purchase,
    quote,
    registration,
    value,
)

T = Topics(MARKET)


def _worker() -> MarketCore:
    return MarketCore(Stores(), TEST_KEYS, T, clock=lambda: 1_000)


def _other(key: str) -> int:
    return (T.partition_of(key) + 1) % T.partitions


def _rejection(out: Any) -> Rejection:
    return Rejection.model_validate_json(out.outputs[0].value)


def _stores(core: MarketCore) -> dict[str, dict[str, Any]]:
    return {name: dict(store.items()) for name, store in vars(core.stores).items()}


def _forwarded(out: Any, topic: str, raw: bytes, key: str) -> tuple[int, bytes]:
    """The one message a forwarded event produces: its bytes, unchanged, to its own partition."""
    assert (out.status, out.reason) == ("forwarded", None)
    [fwd] = out.outputs
    assert (fwd.topic, fwd.key, fwd.value) == (topic, key.encode(), raw)
    assert fwd.partition == T.partition_of(key)
    return fwd.partition, fwd.value


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
    raw = mallory_as_alice.open_account(SIGNED_FOR, opened_at_ms=1_000).model_dump_json().encode()
    out = foreign.handle(T.accounts, raw, partition=_other("alice"), offset=3)
    partition, fwd = _forwarded(out, T.accounts, raw, "alice")  # moved to alice's partition,
    assert len(foreign.stores.accounts) == 0  # nothing written where it was
    there = home.handle(T.accounts, fwd, partition=partition, offset=4)  # where alice is known
    assert (there.status, there.reason) == ("rejected", "account_exists")
    assert home.stores.accounts["alice"].signing_key == party("alice").public_key


def test_an_unproven_account_event_on_a_foreign_partition_is_refused_not_forwarded() -> None:
    core = _worker()
    assert core.handle(T.accounts, account("bob"), partition=T.partition_of("bob")).status == (
        "accepted"
    )
    forged = party("mallory").rotate_to(party("bob2"), SIGNED_FOR, 2, rotated_at_ms=2_000)
    raw = forged.model_dump_json().encode().replace(b'"mallory"', b'"bob"')
    out = core.handle(T.accounts, raw, partition=_other("bob"), offset=5)
    assert (out.status, out.reason) == ("rejected", "wrong_partition")
    # nobody proved who sent it: no inbox, only the operators' record and the public refusal
    assert [o.topic for o in out.outputs] == [T.rejections, T.refusals]
    rej = _rejection(out)
    assert rej.details["expected_partition"] == T.partition_of("bob")
    assert rej.claimed_id == "bob" and rej.sender_id is None
    assert core.stores.accounts["bob"].version == 1


def test_a_rotation_the_directory_cannot_prove_yet_waits_for_it_then_is_forwarded() -> None:
    """Second round: on a worker whose replica of the accounts lagged, bob's rotation on a
    foreign partition was refused unproven (no record anywhere), and a copy on his partition
    applied later. Now it is deferred like any event naming an account not read yet."""
    home = _worker()
    assert home.handle(T.accounts, account("bob"), partition=T.partition_of("bob")).status == (
        "accepted"
    )

    class Replica(dict[str, Any]):  # what the worker's replica of the accounts has read so far
        def owner_of_key(self, key_id: str) -> str | None:
            return next((a for a, st in self.items() if st.key_id == key_id), None)

    replica = Replica()
    lagging = MarketCore(Stores(), TEST_KEYS, T, clock=lambda: 1_000, replica=replica)
    raw = party("bob").rotate_to(party("bob2"), SIGNED_FOR, 2, rotated_at_ms=2_000)
    raw_bytes = raw.model_dump_json().encode()
    out = lagging.handle(T.accounts, raw_bytes, partition=_other("bob"), final=False)
    assert (out.status, out.waiting_for, out.outputs) == ("deferred", "bob", [])
    replica["bob"] = home.stores.accounts["bob"]  # the replica has caught up
    _forwarded(
        lagging.handle(T.accounts, raw_bytes, partition=_other("bob")), T.accounts, raw_bytes, "bob"
    )


def test_a_rotation_on_a_foreign_partition_is_forwarded_and_applied_at_home() -> None:
    core = _worker()
    home = T.partition_of("bob")
    assert core.handle(T.accounts, account("bob"), partition=home).status == "accepted"
    raw = party("bob").rotate_to(party("bob2"), SIGNED_FOR, 2, rotated_at_ms=2_000)
    raw_bytes = raw.model_dump_json().encode()
    out = core.handle(T.accounts, raw_bytes, partition=_other("bob"))
    partition, fwd = _forwarded(out, T.accounts, raw_bytes, "bob")
    assert core.stores.accounts["bob"].version == 1
    assert core.handle(T.accounts, fwd, partition=partition).status == "accepted"
    assert core.stores.accounts["bob"].version == 2


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
def test_stream_events_on_a_foreign_partition_are_forwarded_unchanged(
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
    before = _stores(core)
    raw = event()
    out = core.handle(topic, raw, partition=_other("s1"), offset=9)
    partition, fwd = _forwarded(out, topic, raw, "s1")
    assert out.stream_id == "s1"
    assert _stores(core) == before  # nothing read or written where it was
    # where it was moved to, it is applied like any event a client sent there
    there = core.handle(topic, fwd, partition=partition, offset=10)
    assert there.status in ("accepted", "fulfilled", "answered"), there.reason
    seller = T.inbox("seller1") if topic == T.purchases else T.catalog  # a sale's notice
    assert all(o.topic in (T.inbox(sender), T.catalog, seller) for o in there.outputs)


def test_an_unsigned_stream_event_on_a_foreign_partition_is_refused_not_forwarded() -> None:
    core = _opened("seller1", "buyer1")
    raw = purchase("s1", "buyer1", "p1", target_level=0.5).replace(b'"buyer1"', b'"seller1"', 1)
    out = core.handle(T.purchases, raw, partition=_other("s1"), offset=9)
    assert out.status == "rejected" and out.reason in ("bad_signature", "invalid_event")
    assert all(o.partition is None for o in out.outputs)


def test_a_purchase_forwarded_and_copied_has_one_fate() -> None:
    """The red team's replay: a purchase on the wrong partition used to be refused without a
    record, so the same signed bytes copied onto the right partition later — after the buyer
    had bought again under a new id — charged her twice. Forwarded, every copy is the one
    purchase."""
    core = _opened("seller1", "buyer1")
    home = T.partition_of("s1")
    core.handle(T.registrations, registration("s1"), partition=home)
    core.handle(T.values, value("s1", "v1", [1.0, 2.0, 3.0]), partition=home)
    raw = purchase("s1", "buyer1", "p1")  # the next step, no target
    partition, fwd = _forwarded(
        core.handle(T.purchases, raw, partition=_other("s1")), T.purchases, raw, "s1"
    )
    assert core.handle(T.purchases, fwd, partition=partition).status == "fulfilled"
    for copy in (raw, fwd):  # a stranger's copy, straight to the right partition
        assert core.handle(T.purchases, copy, partition=home).status == "duplicate"
    assert core.stores.streams["s1"].holders["buyer1"].purchases == 1


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
