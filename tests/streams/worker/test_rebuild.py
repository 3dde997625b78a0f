"""State the market can rebuild: a deleted inbox or catalog is made again, nothing paid for is lost
(issue #39, part 5), on the real embedded broker.

On the embedded broker anyone may delete a topic. Before, an answer written to a deleted inbox
was acknowledged by the broker and lost (no dead letter, no metric), the producer's next
metadata refresh made the topic again with 4 partitions and none of its settings, and a deleted
catalog lost the entry of every stream registered before, for good. Now the worker notices
(before sending, and every few seconds), makes the topic again with its spec, sends what it
held for it in order, and publishes the catalog entries of its streams again
(:mod:`streams.worker.topic_watch`, :mod:`streams.worker.catalog`).

The tests delete topics with aiokafka's admin client while the market runs, as anyone on the
broker may, and check them through a metadata request that creates nothing, so a test never
makes what it checks for. They use the market only as a client would (each fails on the
market before #39: the topics are never made again with their settings, and what was sent
while they were gone never arrives).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.protocol.metadata import MetadataRequest

from streams.clients.client import MarketClient, now_ms
from streams.wire.events import LinearPrecisionSpec, PurchaseFulfilled, ValueReleased
from streams.wire.events import PurchaseRequest as Purchase

from .. import helpers
from ..conftest import Market

DEADLINE = 120.0
"""Seconds any step may take on a busy 2-core machine (each normally takes a few)."""


async def _partitions(bootstrap: str, names: list[str]) -> dict[str, int]:
    """Each of ``names`` that exists → its partition count (a request that creates nothing)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        client = admin._client
        request = MetadataRequest(names, allow_auto_topic_creation=False)
        response = await client.send(client.get_random_node(), request)
    finally:
        await admin.close()
    return {t[1]: len(t[3]) for t in response.topics if t[0] == 0 and t[3]}


async def _admin(bootstrap: str, act: Callable[[AIOKafkaAdminClient], Awaitable[Any]]) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await act(admin)
    finally:
        await admin.close()


async def _delete(bootstrap: str, names: list[str]) -> None:
    async def go(admin: AIOKafkaAdminClient) -> None:
        codes = (await admin.delete_topics(names)).topic_error_codes
        assert all(code == 0 for _, code in codes), codes

    await _admin(bootstrap, go)  # (the market may make them again at once: not asserted)


async def _until(what: str, check: Callable[[], Awaitable[Any]], timeout: float = DEADLINE) -> Any:
    """Poll ``check`` until it returns something true; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.5)


async def _register(c: MarketClient, n: int) -> list[str]:
    ids = [f"s{i}" for i in range(n)]
    for sid in ids:
        entry = await c.register(
            dict(
                stream_id=sid,
                mechanism="laplace",
                sensitivity=1.0,
                dimension=2,
                steps=[1.0, 2.0],
                cap=2.0,
                retain_last=4,
                pricing=LinearPrecisionSpec(rate_per_precision=0.0),
            )
        )
        assert entry.type == "catalog_entry", entry
        await c.publish(sid, [1.0, 2.0], value_id="v0")
    return ids


async def _inbox(c: MarketClient, buyer: str) -> list[Any]:
    return [ev async for ev in helpers.tail(c, buyer, idle_timeout=1.0)]


async def _entries(c: MarketClient) -> set[str]:
    try:
        return set(await c.catalog())
    except LookupError:  # the catalog does not exist (yet)
        return set()


@pytest.mark.broker
@pytest.mark.slow
def test_a_deleted_inbox_and_catalog_are_made_again_and_nothing_paid_for_is_lost(
    market: Market,
) -> None:
    """The buyer's inbox and the catalog are deleted while the market runs. A value released
    to the buyer (a holder) and the answer to a purchase it sent meanwhile reach its inbox once
    the market has made it again (one partition, as specified); the purchase whose answer the
    deletion took is answered again when resent; every served stream's catalog entry is back."""
    market.start_worker()
    market.open_accounts("seller1", "buyer1")
    bs, topics = market.broker.bootstrap, market.topics
    inbox = topics.inbox("buyer1")
    buyer = helpers.party("buyer1")

    async def go(c: MarketClient) -> None:
        streams = await _register(c, 12)
        first = await c.buy("s0", max_price_minor=0, purchase_id="p1", party=buyer, timeout=60)
        assert isinstance(first, PurchaseFulfilled), first
        # a later answer: the market looked at the inbox before sending it, so it no longer
        # keeps p1's answer to send again (it keeps what it sent since it last saw the inbox)
        later = await c.buy("s2", max_price_minor=0, purchase_id="p0", party=buyer, timeout=60)
        assert isinstance(later, PurchaseFulfilled), later
        await _delete(bs, [inbox, topics.catalog])
        # made while the inbox is missing: a release to a holder, and an answer to a purchase
        # sent as raw bytes (a client would make the inbox itself before sending)
        await c.publish("s0", [3.0, 4.0], value_id="v1")
        raw = buyer.sign(
            Purchase,
            c.market,
            purchase_id="p2",
            buyer_id="buyer1",
            stream_id="s1",
            max_price_minor=0,
            requested_at_ms=now_ms(),
        )
        await c.send(topics.purchases, "s1", raw.model_dump_json().encode())
        made = await _until(
            "the inbox and the catalog made again with one partition",
            lambda: _made(bs, [inbox, topics.catalog]),
        )
        assert made == {inbox: 1, topics.catalog: 1}
        events = await _until("the held answers in the inbox", lambda: _answers(c))
        assert [e.type for e in events] == ["value_released", "purchase_fulfilled"], events
        assert "p1" not in {getattr(e, "purchase_id", None) for e in await _inbox(c, "buyer1")}
        assert await _until("every stream's catalog entry", lambda: _all(c, streams))
        # the answer the deletion took: the resent purchase is answered again (a first resend
        # within 10 s of the answer gets `already_answered`; the client resends)
        again = await c.buy(
            "s0",
            max_price_minor=0,
            purchase_id="p1",
            party=buyer,
            timeout=DEADLINE,
            resend_every=5.0,
        )
        assert again == first

    async def _answers(c: MarketClient) -> list[Any]:
        got: dict[str, Any] = {}
        for e in await _inbox(c, "buyer1"):
            if (isinstance(e, ValueReleased) and e.releases[0].value_id == "v1") or (
                isinstance(e, PurchaseFulfilled) and e.purchase_id == "p2"
            ):
                got.setdefault(e.type, e)  # the first of each, in the inbox's order
        return list(got.values()) if len(got) == 2 else []

    async def _all(c: MarketClient, streams: list[str]) -> bool:
        return set(streams) <= await _entries(c)

    market.run(go)
    assert set(market.ledger()) <= asyncio.run(_catalog_ids(market))
    assert market.metric("emarket_topics_recreated_total", kind="inbox") >= 1
    assert market.metric("emarket_topics_recreated_total", kind="catalog") >= 1
    assert market.metric("emarket_catalog_entries_republished_total") >= 12
    assert market.metric("emarket_dead_letters_total") == 0


async def _made(bootstrap: str, names: list[str]) -> dict[str, int]:
    found = await _partitions(bootstrap, names)
    return found if set(found) == set(names) else {}


async def _catalog_ids(market: Market) -> set[str]:
    async with market.client() as c:
        return await _entries(c)


@pytest.mark.broker
@pytest.mark.slow
def test_a_catalog_deleted_and_made_again_empty_gets_every_workers_entries_back(
    market: Market,
) -> None:
    """Two workers, their streams on both: the catalog is deleted and at once made again, empty
    and with its settings (as ``init-topics`` or a stranger would), so a worker may never see it
    missing; each sees its latest offset go back and publishes its own streams' entries again."""
    market.start_worker()
    market.start_worker()
    market.open_accounts("seller1")
    bs, topics = market.broker.bootstrap, market.topics

    async def go(c: MarketClient) -> set[str]:
        streams = set(await _register(c, 16))
        await _delete(bs, [topics.catalog])

        async def create(admin: AIOKafkaAdminClient) -> None:  # as `init-topics` makes it
            compact = {"cleanup.policy": "compact"}
            await admin.create_topics([NewTopic(topics.catalog, 1, 1, topic_configs=compact)])

        await _admin(bs, create)  # a worker may look before or after: both must end well
        return await _until("every stream's catalog entry", lambda: _every(c, streams))

    async def _every(c: MarketClient, streams: set[str]) -> set[str]:
        got = await _entries(c)
        return got if streams <= got else set()

    published = market.run(go)
    served = market.ledger()
    assert len(served) == 16 and set(served) <= published
    assert market.metric("emarket_catalog_entries_republished_total") >= 16
    assert all(w.alive() for w in market.workers)
    assert asyncio.run(_partitions(bs, [topics.catalog])) == {topics.catalog: 1}


@pytest.mark.broker
@pytest.mark.slow
def test_an_inbox_made_again_over_records_written_while_it_was_gone_delivers_every_answer(
    market: Market,
) -> None:
    """What a stranger can do to an inbox on the embedded broker: delete it, write records to
    it while it does not exist (the broker acknowledges them and keeps them where the next
    topic of that name will be: its own records then start *under* them, and a batch that
    overlaps one is never readable), and have the broker make it again with 4 partitions (a
    producer naming it in a metadata request). The market makes each inbox again with one
    partition and no such records, and every answer after reaches the buyer."""
    market.start_worker()
    market.open_accounts("seller1", "buyer1", "buyer2")
    bs, topics = market.broker.bootstrap, market.topics
    made_by_broker, ghosts_only = topics.inbox("buyer1"), topics.inbox("buyer2")

    async def go(c: MarketClient) -> None:
        await _register(c, 2)
        for name in ("buyer1", "buyer2"):
            got = await helpers.buy(c, name, "s0", max_price_minor=0, timeout=60)
            assert isinstance(got, PurchaseFulfilled), got
        await _stranger(bs, [made_by_broker, ghosts_only], remake=[made_by_broker])
        await c.publish("s0", [3.0, 4.0], value_id="v1")  # released to both buyers
        made = await _until(
            "both inboxes made again with one partition",
            lambda: _made(bs, [made_by_broker, ghosts_only]),
        )
        assert made == {made_by_broker: 1, ghosts_only: 1}
        for name in ("buyer1", "buyer2"):
            await _until(f"v1 released to {name}", lambda n=name: _released(c, n, "v1"))  # type: ignore[misc]
            got = await helpers.buy(c, name, "s1", max_price_minor=0, timeout=DEADLINE)
            assert isinstance(got, PurchaseFulfilled), got
        await c.publish("s0", [5.0, 6.0], value_id="v2")
        for name in ("buyer1", "buyer2"):
            await _until(f"v2 released to {name}", lambda n=name: _released(c, n, "v2"))  # type: ignore[misc]

    market.run(go)
    assert market.metric("emarket_topics_recreated_total", kind="inbox") >= 2
    assert market.metric("emarket_dead_letters_total") == 0


async def _released(c: MarketClient, buyer: str, value_id: str) -> bool:
    return any(
        isinstance(e, ValueReleased) and e.releases[0].value_id == value_id
        for e in await _inbox(c, buyer)
    )


async def _stranger(bootstrap: str, inboxes: list[str], *, remake: list[str]) -> None:
    """Delete ``inboxes``, write three records to each in one batch while it does not exist,
    then have the broker make those in ``remake`` again (a metadata request naming them)."""
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await prod.start()
    try:
        for name in inboxes:
            await prod.partitions_for(name)  # known to the producer: it will write blindly
        await _delete(bootstrap, inboxes)
        sent = [
            await prod.send(name, b"junk %d" % i, key=b"k", partition=0)
            for name in inboxes
            for i in range(3)
        ]
        await asyncio.gather(*sent)  # acknowledged, though the topics do not exist
        for name in remake:
            prod.client.add_topic(name)
        await prod.client.force_metadata_update()
    finally:
        await prod.stop()
