"""Every change this project makes to Faust, aiokafka or process-wide library state, in one place.

* :func:`tune_fetch_wait` — Faust hard-codes ``fetch_max_wait_ms=1500``; we make it a setting
  (any broker).
* :func:`quiet_libraries` — aiokafka and Faust log every produce at DEBUG; formatting those
  records costs ~10% of a busy worker even when nothing is printed.
* :func:`skip_table_settle` — Faust's table manager sleeps 1 s at start so that tables
  declared late can register; ours are all declared with the app, so the sleep only delays
  every start (any broker).
* :func:`install_batched_intake` — the consumer hands the input topics' records to the
  market's :class:`~streams.worker.intake.Intake` a fetched batch at a time instead of one by
  one through Faust's channels and streams (any broker); :func:`set_current_event` sets the
  "current event" Faust's table stores read, which a stream would have set.
* :func:`install_tansu_compat` — workarounds for the embedded Tansu broker, installed only when
  the worker runs against it:

Two Tansu 0.6 behaviours break Faust; both are patched here and nowhere else, so production on
Apache Kafka runs unmodified Faust/aiokafka code paths:

1. **ListOffsets(latest) is wrong**: Tansu answers "base offset of the newest batch + 1" instead
   of the high watermark (150 records in 3 batches → 101). Faust's changelog recovery reads up to
   that answer and stops early, silently losing table updates. The high watermark carried by a
   *fetch* response is right, so :func:`true_highwaters` seeks just below the reported offset,
   fetches once and reads the watermark from the response. We patch Faust's
   ``AIOKafkaConsumerThread._highwaters`` (used by recovery and lag accounting) to use it.
2. **Generations start at 0**: aiokafka only sends LeaveGroup when ``generation > 0``, so the
   first member of a group never leaves cleanly and its successor waits ~1.5 session timeouts.
   We let ``_maybe_leave_group`` send LeaveGroup for generation 0 too.

Tansu also never wakes a waiting fetch, which is why the fetch wait is short there.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

__all__ = [
    "install_batched_intake",
    "install_tansu_compat",
    "quiet_libraries",
    "set_current_event",
    "skip_table_settle",
    "true_highwaters",
    "tune_fetch_wait",
]

log = logging.getLogger(__name__)
_installed = False


async def true_highwaters(
    bootstrap: Any, reported: Mapping[TopicPartition, int], *, timeout: float = 60.0
) -> dict[TopicPartition, int]:
    """High watermarks read from fetch responses, starting at the (wrong) reported offsets.

    Never falls back to the reported offsets: recovering a table up to a too-low watermark
    silently loses its newest records (purchases fulfilled again, holdings forgotten). If no
    fetch answers within ``timeout`` the worker stops with an error instead.
    """
    tps = list(reported)
    if not tps:
        return {}
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=20,
        max_partition_fetch_bytes=1,  # one batch is enough to learn the watermark
    )
    await consumer.start()
    try:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, max(reported[tp] - 1, 0))
        result: dict[TopicPartition, int] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(result) < len(tps) and loop.time() < deadline:
            await consumer.getmany(*[tp for tp in tps if tp not in result], timeout_ms=100)
            for tp in tps:
                hw = consumer.highwater(tp)
                if hw is not None and tp not in result:
                    result[tp] = max(int(hw), reported[tp])
        missing = [tp for tp in tps if tp not in result]
        if missing:
            raise RuntimeError(
                f"no fetch response for {missing} within {timeout}s: cannot learn the true high "
                "watermarks, and recovering tables up to Tansu's reported offsets would lose "
                "their newest records"
            )
        return result
    finally:
        await consumer.stop()


def install_tansu_compat() -> None:
    """Patch Faust/aiokafka for Tansu (idempotent; process-wide)."""
    global _installed  # noqa: PLW0603 - one process-wide switch, by design
    if _installed:
        return
    from aiokafka.consumer.group_coordinator import GroupCoordinator  # noqa: PLC0415
    from aiokafka.protocol.group import LeaveGroupRequest  # noqa: PLC0415
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread  # noqa: PLC0415

    async def _highwaters(self: Any, partitions: Iterable[TopicPartition]) -> Mapping[Any, int]:
        consumer = self._ensure_consumer()
        tps = list(partitions)
        reported = await consumer.end_offsets(tps)
        fixed = await true_highwaters(consumer._client._bootstrap_servers, reported)
        if fixed != reported:
            log.debug("tansu compat: corrected high watermarks %s -> %s", reported, fixed)
        return fixed

    async def _maybe_leave_group(self: Any) -> None:
        if self.generation >= 0 and self._group_instance_id is None and self.member_id:
            try:
                await self._send_req(LeaveGroupRequest(self.group_id, self.member_id))
            except Exception as err:  # best effort, as in aiokafka
                log.warning("LeaveGroup request failed: %s", err)
        self.reset_generation()

    AIOKafkaConsumerThread._highwaters = _highwaters  # type: ignore[method-assign]
    GroupCoordinator._maybe_leave_group = _maybe_leave_group
    _installed = True


def quiet_libraries(level: str) -> None:
    """Keep aiokafka, Faust and mode at INFO or above unless the worker logs at DEBUG."""
    if level.lower() != "debug":
        for name in ("aiokafka", "faust", "mode"):
            logging.getLogger(name).setLevel(max(logging.INFO, logging.getLogger(name).level))


def prefetch_backoff(fetch_max_wait_ms: int) -> float:
    """Seconds aiokafka lets one partition's unconsumed records hold back the fetches of every
    other partition on the same broker: twice the fetch wait, at most aiokafka's 0.1 s.

    aiokafka sends no fetch to a broker while any of its partitions still has fetched records
    the application has not taken, for up to ``prefetch_backoff`` (0.1 s, not a consumer
    option). While a worker works through one partition's records, new records of the others
    are not even fetched: at 320 purchases/s on the embedded broker (one broker, fetch wait
    10 ms) every p99 was 120 ms, of which 110 ms waiting before the batch; with 20 ms, 30-70 ms
    (four runs each, seen here). Against Kafka (fetch wait 1.5 s) it stays 0.1 s. The same
    backoff delays the retry of a partition whose fetch failed.
    """
    return min(0.1, 2 * fetch_max_wait_ms / 1000)


def tune_fetch_wait(fetch_max_wait_ms: int) -> None:
    """Faust passes ``fetch_max_wait_ms=1500`` to aiokafka unconditionally; override it, and
    scale the fetcher's prefetch backoff with it (:func:`prefetch_backoff`)."""
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread  # noqa: PLC0415

    original = AIOKafkaConsumerThread._create_worker_consumer
    if getattr(original, "_emarket_wait", None) == fetch_max_wait_ms:
        return
    base = getattr(original, "_emarket_original", original)
    backoff = prefetch_backoff(fetch_max_wait_ms)

    def _create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = base(self, transport)
        consumer._fetch_max_wait_ms = fetch_max_wait_ms
        start = consumer.start

        async def start_with_backoff() -> None:
            await start()  # builds the fetcher, which reads the backoff when records arrive
            consumer._fetcher._prefetch_backoff = backoff

        consumer.start = start_with_backoff
        return consumer

    _create_worker_consumer._emarket_wait = fetch_max_wait_ms  # type: ignore[attr-defined]
    _create_worker_consumer._emarket_original = base  # type: ignore[attr-defined]
    AIOKafkaConsumerThread._create_worker_consumer = _create_worker_consumer  # type: ignore[method-assign]


def skip_table_settle() -> None:
    """Start Faust's table manager without its fixed 1 s settling sleep (idempotent).

    ``TableManager.on_start`` sleeps one second before wiring the tables' channels, so that
    tables created after the app starts can still register; every table of the market is
    declared when the app is built (:class:`streams.worker.app.MarketWorker`), so the wait
    buys nothing and costs a second on every start and restart.
    """
    from faust.tables.manager import TableManager  # noqa: PLC0415

    if getattr(TableManager.on_start, "_emarket", False):
        return

    async def on_start(self: Any) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()

    on_start._emarket = True  # type: ignore[attr-defined]
    TableManager.on_start = on_start  # type: ignore[method-assign]


def set_current_event(event: Any) -> None:
    """Make ``event`` Faust's "current event" (what a stream sets for each event it yields):
    the RocksDB store picks the partition of a table write from it."""
    from faust.streams import _current_event  # noqa: PLC0415

    _current_event.set(None if event is None else weakref.ref(event))


def install_batched_intake() -> None:
    """Let a Faust consumer deliver its app's intake topics a fetched batch at a time.

    Replaces ``Consumer._drain_messages`` (the loop that takes each ``getmany`` result and
    delivers it record by record) with :func:`_drain_batches` for an app that has an
    ``emarket_intake`` (:class:`streams.worker.intake.Intake`); any other app keeps Faust's
    loop. Idempotent, process-wide.
    """
    from faust.transport.consumer import Consumer  # noqa: PLC0415

    if getattr(Consumer._drain_messages, "_emarket", False):
        return
    original = Consumer._drain_messages

    async def _drain_messages(self: Any, fetcher: Any) -> None:
        intake = getattr(self.app, "emarket_intake", None)
        if intake is None:
            await original(self, fetcher)
        else:
            await _drain_batches(self, fetcher, intake)

    _drain_messages._emarket = True  # type: ignore[attr-defined]
    Consumer._drain_messages = _drain_messages  # type: ignore[method-assign]


async def _drain_batches(consumer: Any, fetcher: Any, intake: Any) -> None:
    """Faust's ``Consumer._drain_messages`` (faust-streaming 0.15.3), one list per fetch.

    Kept from it, line for line in effect: the wait for the flow to resume, the active
    partitions, the generation check, the read offsets and the gaps they reveal (so commits
    pass records a compacted topic no longer has), the commit every ``commit_every`` acks, the
    seek back to the committed offsets when a fetch returns while the flow is suspended, and
    the delivery raced against the flow's suspension. Changed: the records of the intake's
    topics are gathered and put into the intake once per fetch; other topics' records are
    delivered one by one as before.
    """
    from faust.transport.consumer import CONSUMER_FETCHING  # noqa: PLC0415

    consumer_should_stop = consumer._stopped.is_set
    fetcher_should_stop = fetcher._stopped.is_set
    try:
        while not (consumer_should_stop() or fetcher_should_stop()):
            consumer.diag.set_flag(CONSUMER_FETCHING)
            records, active = await consumer._wait_next_records(1.0)
            await consumer.sleep(0)
            if records is not None and not consumer.should_stop:
                if consumer.flow_active:
                    await _deliver(consumer, records, active, intake)
                else:
                    try:
                        await consumer.perform_seek()
                    except Exception as exc:  # as Faust: logged, the next fetch tries again
                        log.warning("exception performing seek when flow not active %r", exc)
            consumer.diag.unset_flag(CONSUMER_FETCHING)
    except consumer.consumer_stopped_errors:
        if consumer.transport.app.should_stop:
            return
        raise
    except asyncio.CancelledError:
        if consumer.transport.app.should_stop:
            return
        raise
    finally:
        consumer.diag.unset_flag(CONSUMER_FETCHING)


async def _deliver(consumer: Any, records: Mapping[Any, Any], active: Any, intake: Any) -> None:
    """One fetch's records: the intake's as one list, the others one by one.

    The intake's records carry the consumer generation of the fetch (not the one current when
    each was converted: a commit or a gap awaited in between may span a rebalance), the batch
    is put only if that generation is still current and the flow active, and their read offsets
    move only once the batch is queued (:meth:`Intake.put` calls back, with no await between).
    """
    app = consumer.app
    generation = app.consumer_generation_id
    read_offset = consumer._read_offset
    acks_enabled_for = app.topics.acks_enabled_for
    commit_every = consumer._commit_every
    to_message = consumer._to_message
    batch: list[Any] = []
    last: dict[Any, int] = {}  # the intake's read offsets, once the batch is queued
    for tp, tp_records in records.items():
        if not consumer.flow_active or app.consumer_generation_id != generation:
            break
        if active is not None and tp not in active and tp not in consumer._buffered_partitions:
            continue
        app.monitor.track_tp_end_offset(tp, consumer.highwater(tp))
        mine = tp.topic in intake.topics
        for record in tp_records:
            offset = record.offset
            r_offset = last.get(tp, read_offset[tp])
            if r_offset is not None and offset < r_offset:
                continue  # read before (Faust drops it the same way)
            if r_offset and offset - r_offset > 1 and acks_enabled_for(tp.topic):
                await consumer._add_gap(tp, r_offset + 1, offset)
            if commit_every is not None and consumer._n_acked >= commit_every:
                consumer._n_acked = 0
                await consumer.commit()
            message = to_message(tp, record)
            if mine:
                message.generation_id = generation
                batch.append(message)
                last[tp] = offset
            else:
                await consumer.wait_first(consumer.callback(message),
                                          consumer.suspend_flow.wait())  # fmt: skip
                read_offset[tp] = offset
    if not batch or not consumer.flow_active or app.consumer_generation_id != generation:
        return  # overtaken by a rebalance: the next owner reads these from the committed offset

    def queued() -> None:
        if app.consumer_generation_id == generation:
            read_offset.update(last)

    await consumer.wait_first(intake.put(batch, queued), consumer.suspend_flow.wait())

