"""The intake: fetched batches in order, stale records dropped unacknowledged, acks to Faust.

A real Faust app (not started: no broker is needed for its consumer's bookkeeping and its flow
control) and real consumer messages; the broker tests run the intake under a live worker
(tests/streams/worker/test_recovery.py, test_chaos.py, test_scale.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import faust
import pytest
from aiokafka.structs import ConsumerRecord
from faust.transport.drivers.aiokafka import ConsumerMessage
from faust.types import TP

from streams.worker.faust_internals import _deliver, install_batched_intake, intake_of
from streams.worker.intake import MAX_LISTS, Intake

TOPIC = "t.values"


_APPS: list[Any] = []


def _app() -> Any:
    app = faust.App("test-intake", broker="kafka://127.0.0.1:9", web_enabled=False)
    app.flow_control.resume()
    _APPS.append(app)
    return app


@pytest.fixture(autouse=True)
def _close_consumer_loops() -> Iterator[None]:
    """A Faust consumer builds its thread's event loop when created: close what was built."""
    yield
    while _APPS:
        thread = getattr(_APPS.pop()._consumer, "_thread", None)
        if thread is not None:
            thread.thread_loop.close()


def _messages(app: Any, offsets: range, partition: int = 0) -> list[Any]:
    tp = TP(TOPIC, partition)
    gen = app.consumer_generation_id
    fields = (0.0, 0, None, b"k", b"v", None, 1, 1, tp)
    return [ConsumerMessage(TOPIC, partition, o, *fields, generation_id=gen) for o in offsets]


async def _fill(app: Any, intake: Intake) -> None:
    """Queue as many one-record batches as the intake holds."""
    for i in range(MAX_LISTS):
        await intake.put(_messages(app, range(i, i + 1)))


def test_batches_come_out_in_order_up_to_the_limit() -> None:
    async def run() -> list[list[int]]:
        app = _app()
        intake = Intake(app, {TOPIC})
        await intake.put(_messages(app, range(0, 5)))
        await intake.put(_messages(app, range(5, 12)))
        taken = []
        while intake.pending():
            taken.append([ev.message.offset for ev in await intake.take(4)])
        return taken

    assert asyncio.run(run()) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_records_a_rebalance_overtook_are_dropped_unacknowledged() -> None:
    async def run() -> tuple[list[int], int]:
        app = _app()
        intake = Intake(app, {TOPIC})
        stale = _messages(app, range(0, 3))
        await intake.put(stale)
        app.consumer_generation_id += 1  # the group moved on: these belong to the last one
        await intake.put(_messages(app, range(3, 5)))
        got = await intake.take(10)
        assert all(m not in app.consumer._unacked_messages for m in stale)
        return [ev.message.offset for ev in got], intake.dropped

    assert asyncio.run(run()) == ([3, 4], 3)


def _assign(app: Any, *partitions: int) -> None:
    """What the (not started) consumer reports as assigned to this worker."""
    app.consumer.assignment = lambda: {TP(TOPIC, p) for p in partitions}


def test_a_resume_drops_only_the_records_of_partitions_no_longer_assigned() -> None:
    """Faust resumes the input partitions and seeks them before it resumes the flow: a fetch
    landing in between has moved the consumer past its records, so clearing them on the resume
    (as Faust does with its channels) would lose them while the partition stays here."""

    async def run() -> tuple[int, list[int], int]:
        app = _app()
        intake = Intake(app, {TOPIC})
        await intake.put(_messages(app, range(0, 3)) + _messages(app, range(5, 7), partition=1))
        app.flow_control.suspend()  # a rebalance starts: partition 1 goes to another worker
        _assign(app, 0)
        app.flow_control.resume()
        pending = intake.pending()
        got = [ev.message.offset for ev in await intake.take(10)]
        return pending, got, intake.dropped

    assert asyncio.run(run()) == (3, [0, 1, 2], 2)


def test_nothing_is_taken_while_the_flow_is_suspended() -> None:
    async def run() -> tuple[bool, list[int]]:
        app = _app()
        _assign(app, 0)
        intake = Intake(app, {TOPIC})
        await intake.put(_messages(app, range(0, 3)))
        app.flow_control.suspend()
        waiting = asyncio.ensure_future(intake.take(10))
        await asyncio.sleep(0.05)
        blocked = not waiting.done()
        app.flow_control.resume()
        return blocked, [ev.message.offset for ev in await waiting]

    assert asyncio.run(run()) == (True, [0, 1, 2])


def test_a_full_intake_holds_the_consumer_back() -> None:
    async def run() -> bool:
        app = _app()
        intake = Intake(app, {TOPIC})
        await _fill(app, intake)
        try:
            await asyncio.wait_for(intake.put(_messages(app, range(9, 10))), 0.05)
        except TimeoutError:
            return True
        return False

    assert asyncio.run(run()), "a full intake took another batch"


def test_acknowledged_records_are_what_faust_commits() -> None:
    async def run() -> None:
        app = _app()
        intake = Intake(app, {TOPIC})
        app.topics.acking_topics.add(TOPIC)
        await intake.put(_messages(app, range(0, 4)))
        events = await intake.take(10)
        assert len(app.consumer._unacked_messages) == 4
        intake.ack(events)
        assert sorted(app.consumer._acked[TP(TOPIC, 0)]) == [0, 1, 2, 3]
        assert not app.consumer._unacked_messages

    asyncio.run(run())


def test_the_drain_patch_is_installed_once_and_leaves_other_apps_alone() -> None:
    from faust.transport.consumer import Consumer

    install_batched_intake()
    patched = Consumer._drain_messages
    install_batched_intake()
    assert Consumer._drain_messages is patched and getattr(patched, "_emarket", False)

    async def plain() -> Any:
        return intake_of(_app())

    assert asyncio.run(plain()) is None  # an app without an intake keeps Faust's own loop


@pytest.mark.parametrize("limit", [1, 3])
def test_a_small_limit_carries_the_rest_of_a_batch(limit: int) -> None:
    async def run() -> list[int]:
        app = _app()
        intake = Intake(app, {TOPIC})
        await intake.put(_messages(app, range(0, 5)))
        out: list[int] = []
        while len(out) < 5:
            out += [ev.message.offset for ev in await intake.take(limit)]
        return out

    assert asyncio.run(run()) == [0, 1, 2, 3, 4]


def test_carried_records_of_a_partition_still_assigned_survive_a_resume() -> None:
    async def run() -> tuple[list[int], list[int], int]:
        app = _app()
        _assign(app, 0)
        intake = Intake(app, {TOPIC})
        await intake.put(_messages(app, range(0, 10)) + _messages(app, range(0, 4), partition=1))
        first = [ev.message.offset for ev in await intake.take(3)]  # 11 carried
        app.flow_control.suspend()  # a rebalance, the generation unchanged (as Tansu's can)
        app.flow_control.resume()
        rest = [ev.message.offset for ev in await intake.take(100)]
        return first, rest, intake.dropped

    assert asyncio.run(run()) == ([0, 1, 2], [3, 4, 5, 6, 7, 8, 9], 4)


def test_a_put_cancelled_by_a_rebalance_leaves_nothing_tracked_and_moves_no_offset() -> None:
    async def run() -> None:
        app = _app()
        intake = Intake(app, {TOPIC})
        await _fill(app, intake)
        moved: list[bool] = []
        late = _messages(app, range(9, 10))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(intake.put(late, lambda: moved.append(True)), 0.05)
        assert not moved and late[0] not in app.consumer._unacked_messages
        taken = await intake.take(100)
        assert app.monitor.stream_inbound_time[taken[0].message.tp] > 0  # Faust's stall check

    asyncio.run(run())


def _records(offsets: list[int]) -> dict[Any, list[ConsumerRecord[bytes, bytes]]]:
    return {
        TP(TOPIC, 0): [
            ConsumerRecord(TOPIC, 0, o, 0, 0, b"k", b"v", None, 1, 1, []) for o in offsets
        ]
    }


def test_a_fetch_is_queued_whole_with_its_generation_and_its_read_offsets() -> None:
    async def run() -> tuple[list[int], Any]:
        app = _app()
        intake = Intake(app, {TOPIC})
        consumer = app.consumer
        consumer.flow_active = True
        consumer.highwater = lambda tp: 0  # monitoring only; the consumer is not started
        await _deliver(consumer, _records([0, 1, 2, 3]), None, intake)
        await _deliver(consumer, _records([2, 3, 4]), None, intake)  # 2 and 3 were read: skipped
        got = [ev.message.offset for ev in await intake.take(100)]
        return got, consumer._read_offset[TP(TOPIC, 0)]

    assert asyncio.run(run()) == ([0, 1, 2, 3, 3, 4], 4)  # Faust's rule: the last read again


def test_a_fetch_a_rebalance_overtook_is_not_queued_and_moves_no_read_offset() -> None:
    async def run() -> tuple[int, Any]:
        app = _app()
        intake = Intake(app, {TOPIC})
        consumer = app.consumer
        consumer.flow_active = True
        consumer.highwater = lambda tp: 0
        app.topics.acking_topics.add(TOPIC)  # gaps are recorded for acknowledged topics
        await _deliver(consumer, _records([5]), None, intake)
        assert len(await intake.take(10)) == 1
        gap = consumer._add_gap

        async def rebalance_meanwhile(tp: Any, start: int, end: int) -> None:
            await gap(tp, start, end)
            app.consumer_generation_id += 1  # the group moved on while the gap was recorded

        consumer._add_gap = rebalance_meanwhile
        await _deliver(consumer, _records([8, 9]), None, intake)  # 6-7 missing: a gap
        return intake.pending(), consumer._read_offset[TP(TOPIC, 0)]

    assert asyncio.run(run()) == (0, 5)
