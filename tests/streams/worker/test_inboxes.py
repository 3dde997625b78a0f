"""Inbox topics are made off the event path, and opening accounts cannot stall trading (#29).

The red team sent 2,000 signed openings in 0.1 s: each inbox was created inside its batch, one
request and one metadata round trip naming every known topic per account, and a purchase on
another stream waited 4-6 minutes. Now a batch holds the outputs to inboxes not yet made and
goes on; :class:`~streams.worker.inboxes.Inboxes` creates them many per request, sends what was
held, and only then lets the events be acknowledged.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.clients.client import MarketClient
from streams.clients.keys import Party
from streams.wire.events import LinearPrecisionSpec
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.inboxes import REQUEST_S, Inboxes
from streams.worker.tables import Record

from .. import helpers
from ..conftest import Market

T = Topics("t")


class _Producer:
    def __init__(self) -> None:
        self.sent: list[Record] = []
        self.metrics = SimpleNamespace(inboxes_waiting=SimpleNamespace(set=lambda n: None))

    async def send_all(self, records: list[Record]) -> None:
        self.sent.extend(records)


class _Admin:
    """Answers CreateTopics with the codes of ``refuse`` (default: created)."""

    def __init__(self, refuse: dict[str, int] | None = None) -> None:
        self.requests: list[list[str]] = []
        self.refuse = refuse or {}

    async def create_topics(self, topics: list[NewTopic]) -> Any:
        self.requests.append([t.name for t in topics])
        return SimpleNamespace(
            topic_errors=[(t.name, self.refuse.get(t.name, 0), None) for t in topics]
        )


def _inboxes(**settings: Any) -> tuple[Inboxes, _Producer]:
    producer = _Producer()
    inboxes = Inboxes(SimpleNamespace(), Settings(**settings), T, producer)  # type: ignore[arg-type]
    inboxes.known.add(T.catalog)  # listed at start; a catalog not known is held like an inbox
    return inboxes, producer


async def _drain(inboxes: Inboxes, admin: _Admin) -> None:
    while inboxes.pending():
        await inboxes._make(admin, list(inboxes._queued.values())[: inboxes._chunk()])


def test_outputs_to_new_inboxes_are_held_in_order_and_acknowledged_once_sent() -> None:
    async def go() -> None:
        inboxes, producer = _inboxes(inbox_batch=2)
        acks: list[str] = []
        a, b, c = (T.inbox(x) for x in "abc")
        first = [Record(a, b"k", b"a1"), Record(T.catalog, b"k", b"cat"), Record(b, b"k", b"b1")]
        now, held = inboxes.hold(
            [T.inbox_spec("a"), T.inbox_spec("b")], first, lambda: acks.append("first")
        )
        assert held and [r.value for r in now] == [b"cat"]  # the rest of the batch goes on
        now, held = inboxes.hold([], [Record(a, b"k", b"a2")], lambda: acks.append("second"))
        assert held and now == []  # behind a1, in order
        now, held = inboxes.hold(
            [T.inbox_spec("c")], [Record(T.rejections, None, b"r")], lambda: acks.append("never")
        )
        assert not held and [r.value for r in now] == [b"r"]  # the caller acknowledges
        assert inboxes.pending() == 3 and acks == []
        admin = _Admin()
        await _drain(inboxes, admin)
        assert admin.requests == [[a, b], [c]]  # many inboxes per request
        assert [r.value for r in producer.sent] == [b"a1", b"a2", b"b1"]
        assert acks == ["first", "second"] and inboxes.known == {a, b, c, T.catalog}
        now, held = inboxes.hold([], [Record(a, b"k", b"a3")], lambda: acks.append("late"))
        assert not held and [r.value for r in now] == [b"a3"]  # known now: sent at once

    asyncio.run(go())


def test_a_request_holds_as_many_inboxes_as_take_the_broker_about_REQUEST_S() -> None:
    """The broker's time per topic grows with its topics: the request shrinks with it, so no
    request keeps the event path's own requests waiting much longer than REQUEST_S."""
    inboxes, _ = _inboxes(inbox_batch=100)
    sizes = [inboxes._chunk()]
    for took, count in [(0.02, 100), (0.3, 100), (0.9, 30), (0.001, 3), (5.0, 1)]:
        inboxes._resize(took, count)
        sizes.append(inboxes._chunk())
    assert sizes == [100, 100, int(REQUEST_S / 0.003), int(REQUEST_S / 0.03), 100, 1]


def test_an_inbox_the_broker_refuses_has_its_outputs_sent_to_be_dead_lettered() -> None:
    async def go() -> None:
        inboxes, producer = _inboxes(permanent_retries=2)
        acks: list[int] = []
        x = T.inbox("x")
        inboxes.hold([], [Record(x, None, b"v")], lambda: acks.append(1))
        admin = _Admin({x: 29})  # TOPIC_AUTHORIZATION_FAILED
        await inboxes._make(admin, list(inboxes._queued.values()))
        assert acks == [] and producer.sent == [] and inboxes.pending() == 1  # tried again
        await inboxes._make(admin, list(inboxes._queued.values()))
        assert acks == [1] and [r.value for r in producer.sent] == [b"v"]

    asyncio.run(go())


def _accepted(market: Market) -> float:
    return market.metric("emarket_account_events_total", outcome="accepted")


async def _buy(c: MarketClient, stream: str) -> float:
    t0 = time.perf_counter()
    out = await c.buy(stream, max_price_minor=0, timeout=120, party=helpers.party("buyer1"))
    assert out.type == "purchase_fulfilled", out
    return time.perf_counter() - t0


async def _flood(c: MarketClient, market: Market, parties: list[Party]) -> None:
    prod = AIOKafkaProducer(bootstrap_servers=market.broker.bootstrap, linger_ms=5)
    await prod.start()
    signed_for = await c.signing_market()
    try:
        futs = [
            await prod.send(
                market.topics.accounts,
                p.open_account(signed_for).model_dump_json().encode(),
                key=p.account_id.encode(),
            )
            for p in parties
        ]
        await asyncio.gather(*futs)
    finally:
        await prod.stop()


async def _inboxes_exist(market: Market, parties: list[Party], timeout: float) -> float:
    names = {market.topics.inbox(p.account_id) for p in parties}
    admin = AIOKafkaAdminClient(bootstrap_servers=market.broker.bootstrap)
    await admin.start()
    t0 = time.perf_counter()
    try:
        while not names <= set(await admin.list_topics()):
            assert time.perf_counter() - t0 < timeout, "inboxes not created"
            await asyncio.sleep(0.25)
    finally:
        await admin.close()
    return time.perf_counter() - t0


@pytest.mark.broker
def test_opening_many_accounts_does_not_stall_a_purchase_on_another_stream(
    market: Market,
) -> None:
    """400 signed openings at once, then purchases on other streams: each is answered within
    the same bound as before the flood (a generous multiple of this run's baseline), while the
    inboxes are made beside them; every opened account's inbox then exists and confirms it.

    Before inboxes were made off the event path, the batch holding the openings created 200
    topics in turn (seconds on the embedded broker) and the purchase waited behind it."""
    n = 400
    market.start_worker_env({"EMARKET_MAX_OPENINGS_PER_MINUTE": str(100 * n)})
    market.open_accounts("seller1", "buyer1")
    parties = [Party.generate(f"crowd{i}", sealing=False) for i in range(n)]

    async def go(c: MarketClient) -> tuple[list[float], list[float], float]:
        for i in range(6):
            entry = await c.register(
                dict(
                    stream_id=f"s{i}",
                    mechanism="laplace",
                    sensitivity=1.0,
                    dimension=2,
                    steps=[1.0],
                    cap=1.0,
                    retain_last=1,
                    pricing=LinearPrecisionSpec(rate_per_precision=0.0),
                )
            )
            assert entry.type == "catalog_entry", entry
            await c.publish(f"s{i}", [1.0, 2.0], value_id="v0")
        baseline = [await _buy(c, "s0"), await _buy(c, "s1")]
        await _flood(c, market, parties)
        during = [await _buy(c, f"s{i}") for i in range(2, 6)]
        ready = await _inboxes_exist(market, parties, timeout=300)
        return baseline, during, ready

    baseline, during, ready = market.run(go)
    bound = max(2.5, 10 * max(baseline))
    assert max(during) < bound, (baseline, during, ready)
    deadline = time.monotonic() + 60
    while _accepted(market) < n + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _accepted(market) == n + 2
    assert market.metric("emarket_inboxes_waiting") == 0

    async def confirm(c: MarketClient) -> list[str]:  # a resent opening: confirmed in its inbox
        return [(await c.open_account(p, timeout=60)).type for p in parties[:: n // 4]]

    assert market.run(confirm) == ["account"] * 4
