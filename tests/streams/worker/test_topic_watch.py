"""The checks that notice a lost inbox or catalog, how a lost topic is made again, the catalog
published again, and a reader that follows a topic made again (issue #39, part 5), without a
broker: its answers are given here (tests/streams/worker/test_rebuild.py runs the real one).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic

from streams.clients.client import TopicReader
from streams.wire.answers import verify_answer
from streams.wire.topics import Topics
from streams.worker import catalog, inboxes, topic_watch
from streams.worker.catalog import CatalogRebuild
from streams.worker.config import Settings
from streams.worker.inboxes import Inboxes
from streams.worker.metrics import build_metrics
from streams.worker.tables import Record
from streams.worker.topic_watch import SWEEP, TopicWatch

from .. import helpers

T = Topics("t")
A, B = T.inbox("a"), T.inbox("b")


class _Producer:
    def __init__(self) -> None:
        self.sent: list[Record] = []
        self.sends: list[int] = []
        self.metrics = build_metrics()

    async def send_all(self, records: list[Record]) -> None:
        self.sent.extend(records)
        self.sends.append(len(records))


class _Admin:
    """Creates every topic asked for; records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    async def create_topics(self, topics: list[NewTopic]) -> Any:
        self.calls.append(("create", [t.name for t in topics]))
        return SimpleNamespace(topic_errors=[(t.name, 0, None) for t in topics])

    async def delete_topics(self, names: list[str]) -> Any:
        self.calls.append(("delete", list(names)))


class _Broker:
    """What the checks are told: ``topics`` (name → partition count) and the catalog's latest
    offset; the names each metadata request asked about."""

    def __init__(self, **topics: int) -> None:
        self.topics = dict(topics)
        self.asked: list[list[str]] = []
        self.catalog_end = 0

    async def leaders(self, app: Any, names: list[str]) -> dict[str, dict[int, int]]:
        self.asked.append(list(names))
        return {n: dict.fromkeys(range(self.topics[n]), 1) for n in names if n in self.topics}

    async def offsets(self, app: Any, wanted: dict[tuple[str, int], int]) -> dict[Any, int]:
        return {tp: self.catalog_end for tp in wanted}


def _watch(
    monkeypatch: pytest.MonkeyPatch, broker: _Broker, accounts: Any = None, **settings: Any
) -> tuple[TopicWatch, Inboxes, _Producer]:
    producer = _Producer()
    boxes = Inboxes(SimpleNamespace(), Settings(**settings), T, producer)  # type: ignore[arg-type]
    boxes.known |= {A, B, T.catalog}
    watch = TopicWatch(
        SimpleNamespace(), T, boxes, accounts or {}, remake_misfits=settings.get("tansu", True)
    )
    boxes.confirm = watch.before_send
    monkeypatch.setattr(topic_watch, "topic_leaders", broker.leaders)
    monkeypatch.setattr(topic_watch, "latest_offsets", broker.offsets)
    return watch, boxes, producer


async def _drain(boxes: Inboxes, admin: _Admin) -> None:
    while boxes.pending():
        await boxes._make(admin, list(boxes._queued.values()))  # type: ignore[arg-type]


def _values(records: list[Record]) -> list[bytes]:
    return [r.value or b"" for r in records]


def test_what_was_sent_to_a_topic_since_it_was_last_seen_goes_first_once_it_is_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A topic found gone: the records acknowledged on it since the last check that saw it
    whole are sent again first, then one acknowledged while it was known to be gone, then what
    batches held for it; the batch's events are acknowledged once those are sent, the topic is
    counted as made again and its listeners told."""

    async def go() -> None:
        broker = _Broker(**{A: 1, B: 1, T.catalog: 1})
        watch, boxes, producer = _watch(monkeypatch, broker)
        remade: list[list[str]] = []
        boxes.remade.append(remade.append)
        watch.acked(Record(A, b"k", b"a1"))
        await watch.check([A])  # seen whole: a1 is let go
        watch.acked(Record(A, b"k", b"a2"))
        watch.acked(Record(A, b"k", b"a3"))
        watch.acked(Record(B, b"k", b"b1"))
        del broker.topics[A]
        acks: list[str] = []
        ready, held = await boxes.admit(
            [], [Record(A, b"k", b"a5"), Record(B, b"k", b"b2")], lambda: acks.append("batch")
        )
        assert held and _values(ready) == [b"b2"]  # the other inbox is still there
        watch.acked(Record(A, b"k", b"a4"))  # was in flight when the check found A gone
        assert not boxes.known & {A} and boxes.is_lost(A)
        broker.topics[A] = 1
        await _drain(boxes, _Admin())
        assert _values(producer.sent) == [b"a2", b"a3", b"a4", b"a5"]
        assert acks == ["batch"] and remade == [[A]] and A in boxes.known
        kinds = {
            k: producer.metrics.topics_recreated.labels(k)._value.get()
            for k in ("inbox", "catalog")
        }
        assert kinds == {"inbox": 1, "catalog": 0}

    asyncio.run(go())


def test_records_acknowledged_during_a_check_wait_for_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def go() -> None:
        broker = _Broker(**{A: 1})
        watch, _, _ = _watch(monkeypatch, broker)
        asked = broker.leaders

        async def slow(app: Any, names: list[str]) -> dict[str, dict[int, int]]:
            watch.acked(Record(A, b"k", b"during"))  # acknowledged after the check began
            return await asked(app, names)

        monkeypatch.setattr(topic_watch, "topic_leaders", slow)
        watch.acked(Record(A, b"k", b"before"))
        await watch.check([A])
        assert [_values([r]) for _, r in watch._kept[A]] == [[b"during"]]

    asyncio.run(go())


def test_an_inbox_with_another_partition_count_is_deleted_then_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the embedded broker makes when a producer names a deleted topic: 4 partitions,
    none of the settings."""

    async def go() -> None:
        watch, boxes, _ = _watch(monkeypatch, _Broker(**{A: 4}))
        await watch.check([A])
        admin = _Admin()
        await _drain(boxes, admin)
        assert admin.calls == [("delete", [A]), ("create", [A])]

    asyncio.run(go())


def test_elsewhere_an_inbox_with_another_partition_count_is_used_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a broker where only someone's choice makes such a topic (Kafka), it may hold a
    party's history: never deleted, reported once, what was kept for it let go of."""

    async def go() -> None:
        watch, boxes, _ = _watch(monkeypatch, _Broker(**{A: 3}), tansu=False)
        watch.acked(Record(A, b"k", b"v"))
        await watch.check([A])
        await watch.check([A])
        assert A in boxes.known and boxes.pending() == 0 and A not in watch._kept
        assert watch._misfits == {A}

    asyncio.run(go())


def test_a_send_refused_for_a_missing_topic_is_held_not_dead_lettered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch, boxes, _ = _watch(monkeypatch, _Broker(), permanent_retries=1)
    r, r2 = Record(A, b"k", b"v"), Record(A, b"k", b"v2")
    assert watch.missing(r) and boxes.is_lost(A) and boxes._held[A] == [r]
    assert watch.missing(r2) and boxes._held[A] == [r, r2]
    assert not watch.missing(Record(T.rejections, None, b"r"))  # not the market's to remake
    boxes._given_up.add(B)
    assert not watch.missing(Record(B, None, b"v"))  # the broker refused to make it: dead letter


def test_on_the_embedded_broker_a_topic_made_afresh_over_earlier_records_is_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tansu keeps the records produced to a topic that did not exist under the next topic of
    that name (and a batch overlapping them is never readable): such a topic is deleted, which
    removes them, and made again before anything is sent to it."""

    async def go() -> None:
        broker = _Broker()
        _, boxes, producer = _watch(monkeypatch, broker, tansu=True)
        broker.catalog_end = 3
        monkeypatch.setattr(inboxes, "topic_leaders", broker.leaders)
        monkeypatch.setattr(inboxes, "latest_offsets", broker.offsets)
        broker.topics[A] = 1
        boxes.forget(A, [Record(A, b"k", b"a1")])
        admin = _Admin()
        await boxes._make(admin, list(boxes._queued.values()))  # type: ignore[arg-type]
        assert admin.calls == [("create", [A]), ("delete", [A])] and producer.sent == []
        broker.catalog_end = 0  # the next one is empty
        await _drain(boxes, admin)
        assert admin.calls[2:] == [("create", [A])] and _values(producer.sent) == [b"a1"]

    asyncio.run(go())


def test_a_catalog_whose_latest_offset_went_back_was_emptied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def go() -> None:
        broker = _Broker(**{T.catalog: 1})
        watch, _, producer = _watch(monkeypatch, broker)
        emptied: list[int] = []
        watch.on_emptied = lambda: emptied.append(1)
        for end in (5, 9, 9, 2, 3):
            broker.catalog_end = end
            await watch.sweep()
        assert emptied == [1]
        assert producer.metrics.topics_recreated.labels("catalog")._value.get() == 1

    asyncio.run(go())


def test_the_sweep_names_the_catalog_the_kept_topics_and_the_accounts_inboxes_in_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Never a request for every topic: each check names the catalog, the topics with records
    kept and the next :data:`SWEEP` inboxes of the accounts this worker holds."""

    async def go() -> None:
        accounts = {f"acc{i}": None for i in range(SWEEP + 50)} | {"not an id": None}
        broker = _Broker(**{T.catalog: 1, A: 1})
        watch, boxes, _ = _watch(monkeypatch, broker, accounts)
        watch.acked(Record(A, b"k", b"v"))
        monkeypatch.setattr(topic_watch, "CONFIRM_S", 0.0)
        await watch.sweep()
        await watch.sweep()
        # each look asks again, once, about what the broker did not name (its metadata lags)
        first, again1, second, again2 = (set(a) for a in broker.asked)
        assert again1 == first - {T.catalog, A} and again2 == second - {T.catalog}
        assert {T.catalog, A} <= first and A not in second  # let go of after the first
        swept = (first | second) - {T.catalog, A}
        assert swept == {T.inbox(a) for a in accounts if a != "not an id"}
        assert len(first) == SWEEP + 2 and len(second) == 50 + 1
        # missing inboxes of held accounts are made again
        assert boxes.pending() == SWEEP + 50

    asyncio.run(go())


def test_the_catalog_is_published_again_from_the_registered_store_in_bounded_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def go() -> None:
        core = helpers.market_core("seller1")
        first = {}
        for i in range(7):
            out = core.handle(T.registrations, helpers.registration(f"s{i}"))
            assert out.status == "accepted", out.reason
            first[f"s{i}"] = out.outputs[0].value
        producer = _Producer()
        boxes = SimpleNamespace(admit=_admit)
        rebuild = CatalogRebuild(
            core,
            core.ctx.stores,
            boxes,
            producer,  # type: ignore[arg-type]
            producer.metrics,
        )
        monkeypatch.setattr(catalog, "CHUNK", 3)
        monkeypatch.setattr(catalog, "PAUSE", 0)
        await rebuild._publish()
        assert producer.sends == [3, 3, 1]
        key = helpers.TEST_KEYS.signing_key.public_key()
        for r in producer.sent:
            assert r.topic == T.catalog and r.value == first[r.key.decode()]  # type: ignore[union-attr]
            assert verify_answer(key, "t", T.catalog, r.value or b"", r.headers) is None
        assert rebuild.published == 7

    asyncio.run(go())


async def _admit(specs: Any, records: list[Record], done: Any) -> tuple[list[Record], bool]:
    return records, False


def test_a_reader_follows_a_topic_made_again_under_it() -> None:
    """A reader past the high watermark of a topic deleted and made again reads it again from
    its beginning (the embedded broker answers such a fetch with nothing, for ever)."""

    class _Consumer:
        def __init__(self) -> None:
            self.batches: list[dict[Any, list[Any]]] = []
            self.high = 0
            self.seeks: list[int] = []

        async def getmany(self, timeout_ms: int) -> dict[Any, list[Any]]:
            return self.batches.pop(0) if self.batches else {}

        def highwater(self, tp: Any) -> int:
            return self.high

        def seek(self, tp: Any, offset: int) -> None:
            self.seeks.append(offset)

    async def go() -> None:
        reader = TopicReader.__new__(TopicReader)  # no consumer of its own: the fake
        fake = _Consumer()
        reader._consumer, reader._next = fake, {}  # type: ignore[assignment]
        tp = TopicPartition(A, 0)
        rec = SimpleNamespace(offset=2, key=b"k", value=b"v", headers=[])
        fake.batches = [{tp: [rec]}]
        fake.high = 3
        assert await reader.poll(0) == [(b"k", b"v")] and fake.seeks == []
        fake.high = 1  # made again: one record so far
        assert await reader.poll(0) == [] and fake.seeks == [0]
        assert await reader.poll(0) == [] and fake.seeks == [0]  # once

    asyncio.run(go())


def test_a_topic_missing_from_one_metadata_answer_only_is_not_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The embedded broker's metadata answer can lack a topic that exists (the soak logged a
    false 'inbox gone' under load): it is asked about again before being judged gone."""

    class Lagging(_Broker):
        async def leaders(self, app: Any, names: list[str]) -> dict[str, dict[int, int]]:
            got = await super().leaders(app, names)
            if len(self.asked) == 1:
                got.pop(A, None)  # the first answer lacks A
            return got

    async def go() -> None:
        monkeypatch.setattr(topic_watch, "CONFIRM_S", 0.0)
        broker = Lagging(**{A: 1, B: 1, T.catalog: 1})
        watch, boxes, _ = _watch(monkeypatch, broker)
        watch.acked(Record(A, b"k", b"a1"))
        await watch.check([A, B])
        assert broker.asked == [[A, B], [A]]
        assert not boxes.is_lost(A) and A in boxes.known and not boxes.pending()

    asyncio.run(go())
