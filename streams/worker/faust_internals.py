"""Everything the worker does with the insides of Faust, mode and aiokafka, in one module.

The worker keeps faust-streaming for group membership, partition assignment, offsets and
commits, flow control, table recovery and the web server, but replaces some of its insides.
Every patch, every override of a private method and every read or write of a private name of
faust, mode or aiokafka the worker makes is here (the clients' and the broker tools' are in
:mod:`streams.broker.kafka_internals`); the rest of the worker calls the named functions below.
What is replaced, copied or relied upon is listed in :data:`UPSTREAM`, and
``tests/test_faust_boundary.py`` fails when the source of any of it differs from the one
reviewed for the pinned versions (:data:`PINNED`), or when a private name of a library is
touched anywhere else.

**Changed on every broker** (production on Apache Kafka included):

* :func:`install_batched_intake` — ``Consumer._drain_messages`` is replaced, for an app with an
  intake (:func:`attach_intake`), by a copy that puts each fetch's records of the input topics
  into :class:`~streams.worker.intake.Intake` as one list (:func:`_drain_batches`);
  :func:`track_unacked` and :func:`untrack_unacked` keep Faust's set of records in flight.
* :func:`tune_fetch_wait` — ``AIOKafkaConsumerThread._create_worker_consumer`` is wrapped:
  Faust hard-codes ``fetch_max_wait_ms=1500``; we set the consumer's fetch wait and the
  fetcher's prefetch backoff (:func:`prefetch_backoff`), both private aiokafka attributes.
* :func:`skip_table_settle` — ``TableManager.on_start`` is replaced without its 1 s sleep.
* :func:`worker_class` — Faust's ``Worker`` with mode's private signal handlers and sentinel
  overridden (the stop deadline; no 1 s sleep before the loop closes).
* The table write path is bypassed (:mod:`streams.worker.tables`): :func:`store_put`,
  :func:`store_get` and their kin read and write a table's store (objects in memory, sealed
  records in RocksDB) with the bookkeeping Faust's own paths keep, :func:`set_current_event`
  sets the "current event" Faust's stores read, :func:`rebuild_changelog_topic` remakes a
  table's changelog topic reading raw bytes, and :func:`verify_changelog` has recovery apply only
  the events the table admits (:mod:`streams.worker.history`: sealed by the market, committed,
  newest), decoded by us (:func:`register_codec`: Faust's codec extension point is its private
  ``_dumps``/``_loads``).
* :func:`install_takeover` — the rebalance, the end of recovery, the seek of the input
  partitions and the offset commit are wrapped, so that a worker reads its partitions'
  checkpoints before recovery, verifies and claims them after, seeks the inputs to the positions
  its state proves, and checkpoints the offsets it commits (:mod:`streams.worker.recovery`).
* Private reads and writes: :func:`committed_offset` (consumer lag) and
  :func:`set_committed_offset`, :func:`producer_client` (broker probes; :func:`topic_leaders`
  and :func:`latest_offsets`, the checks of the topics the market publishes to,
  :mod:`streams.worker.topic_watch`).
* :func:`quiet_libraries` — process-wide logger levels of aiokafka, Faust and mode.
* :func:`proving_assignor` — Faust's ``PartitionAssignor`` subclassed (Faust's own setting
  installs it): each worker's JoinGroup metadata carries its membership proof, a leader gives a
  member without one nothing and seals the assignment, and each worker checks the seal of its
  own (:mod:`streams.worker.group_watch`); :func:`group_member` reads the coordinator's member
  id and generation.

**Changed only on the embedded Tansu broker** (:func:`install_tansu_compat`, ``--tansu``):

1. **ListOffsets(latest) is wrong**: Tansu answers "base offset of the newest batch + 1" instead
   of the high watermark (150 records in 3 batches → 101). Faust's changelog recovery reads up to
   that answer and stops early, silently losing table updates. The high watermark carried by a
   *fetch* response is right, so :func:`true_highwaters` seeks just below the reported offset,
   fetches once and reads the watermark from the response; ``AIOKafkaConsumerThread._highwaters``
   (used by recovery and lag accounting) is replaced to use it.
2. **Generations start at 0**: aiokafka only sends LeaveGroup when ``generation > 0``, so the
   first member of a group never leaves cleanly and its successor waits ~1.5 session timeouts.
   ``GroupCoordinator._maybe_leave_group`` is replaced to send LeaveGroup for generation 0 too.

Tansu also never wakes a waiting fetch, which is why the fetch wait is short there (a setting,
applied through :func:`tune_fetch_wait` like on any broker).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import weakref
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.offset import OffsetRequest
from faust.serializers import codecs

from ..broker.upstream import PINNED, Upstream, source_sha256

__all__ = [
    "PINNED",
    "UPSTREAM",
    "YIELD_EVERY",
    "RecoveredEvent",
    "Upstream",
    "attach_intake",
    "attach_takeover",
    "committed_offset",
    "forget_partition",
    "install_batched_intake",
    "install_takeover",
    "install_tansu_compat",
    "intake_of",
    "latest_offsets",
    "learn_topics",
    "partition_items",
    "pause_inputs",
    "persisted_offset",
    "prefetch_backoff",
    "probe_broker",
    "producer_client",
    "quiet_libraries",
    "rebuild_changelog_topic",
    "register_codec",
    "seek_input",
    "set_committed_offset",
    "set_current_event",
    "set_persisted_offset",
    "skip_table_settle",
    "source_sha256",
    "store_get",
    "store_is_serialized",
    "store_keys",
    "store_put",
    "store_size",
    "topic_leaders",
    "track_unacked",
    "true_highwaters",
    "tune_fetch_wait",
    "untrack_unacked",
    "verify_changelog",
    "worker_class",
]

log = logging.getLogger(__name__)
_tansu_installed = False

YIELD_EVERY = 100
"""Records the drain loop handles between two yields to the event loop (Faust's
``yield_every``): a fetch of a thousand records must not hold up health checks and timers."""


def _u(dist: str, module: str, names: str, use: str, by: str) -> list[Upstream]:
    return [Upstream(dist, module, n, use, by) for n in names.split()]


_CONSUMER = "faust.transport.consumer"
_DRIVER = "faust.transport.drivers.aiokafka"
_ASSIGNOR = "faust.assignor.partition_assignor"
_GROUPS = "aiokafka.consumer.group_coordinator"
_MEMBERSHIP: tuple[Upstream, ...] = (
    *_u(
        "faust-streaming",
        _ASSIGNOR,
        "PartitionAssignor.metadata PartitionAssignor.assign PartitionAssignor.on_assignment",
        "overridden",
        "proving_assignor",
    ),
    *_u(
        "faust-streaming",
        _ASSIGNOR,
        "PartitionAssignor._perform_assignment "
        "PartitionAssignor._protocol_assignments PartitionAssignor._compress "
        "PartitionAssignor._decompress",
        "relied on",
        "proving_assignor",
    ),
    *_u(
        "faust-streaming",
        _DRIVER,
        "AIOKafkaConsumerThread._ensure_consumer ConsumerRebalanceListener.on_partitions_assigned",
        "relied on",
        "group_member",
    ),
    *_u(
        "aiokafka",
        _GROUPS,
        "CoordinatorGroupRebalance.perform_group_join "
        "CoordinatorGroupRebalance._on_join_leader GroupCoordinator._perform_assignment "
        "GroupCoordinator._on_join_complete",
        "relied on",
        "proving_assignor",
    ),
)
"""What the membership proofs rely on: Faust's assignor (its metadata is JSON, its assignment
zlib-compressed JSON, and it assigns exactly the members it is given), and aiokafka computing a
member's metadata once per join, with the coordinator's member id, before JoinGroup (and its
KIP-394 retry), and calling ``assign`` and ``on_assignment`` with the generation set."""
UPSTREAM: tuple[Upstream, ...] = (
    *_u("faust-streaming", _CONSUMER, "Consumer._drain_messages", "copied", "_drain_batches"),
    *_u("faust-streaming", _CONSUMER, "Consumer.getmany", "copied", "_deliver"),
    *_u("faust-streaming", _CONSUMER, "Consumer.track_message", "copied", "track_unacked"),
    *_u(
        "faust-streaming",
        _CONSUMER,
        "Consumer._wait_next_records Consumer._add_gap "
        "Consumer._new_offset Consumer._commit_offsets Consumer.ack",
        "relied on",
        "_deliver",
    ),
    *_u("faust-streaming", _DRIVER, "Consumer._to_message", "relied on", "_deliver"),
    *_u(
        "faust-streaming",
        _DRIVER,
        "AIOKafkaConsumerThread._create_worker_consumer",
        "wrapped",
        "tune_fetch_wait",
    ),
    *_u(
        "faust-streaming",
        _DRIVER,
        "AIOKafkaConsumerThread._highwaters",
        "replaced",
        "install_tansu_compat",
    ),
    *_u("faust-streaming", _DRIVER, "Producer.on_start", "relied on", "producer_client"),
    *_u(
        "aiokafka",
        "aiokafka.client",
        "AIOKafkaClient.add_topic AIOKafkaClient.force_metadata_update",
        "relied on",
        "learn_topics",
    ),
    *_u(
        "aiokafka",
        "aiokafka.client",
        "AIOKafkaClient.get_random_node AIOKafkaClient.send",
        "relied on",
        "probe_broker, topic_leaders, latest_offsets",
    ),
    *_u(
        "faust-streaming",
        "faust.tables.manager",
        "TableManager.on_start",
        "replaced",
        "skip_table_settle",
    ),
    *_u(
        "faust-streaming",
        "faust.tables.table",
        "Table.on_key_set Table.on_key_del",
        "bypassed",
        "WriteBackTable",
    ),
    *_u(
        "faust-streaming",
        "faust.tables.base",
        "Collection._on_changelog_sent",
        "bypassed",
        "WriteBackTable.persisted",
    ),
    *_u(
        "faust-streaming",
        "faust.tables.manager",
        "TableManager.on_rebalance",
        "wrapped",
        "install_takeover",
    ),
    *_u(
        "faust-streaming",
        "faust.tables.recovery",
        "Recovery.on_recovery_completed Recovery._resume_streams",
        "wrapped",
        "install_takeover",
    ),
    *_u(
        "faust-streaming",
        _CONSUMER,
        "Consumer.perform_seek Consumer._commit_offsets",
        "wrapped",
        "install_takeover",
    ),
    *_u(
        "faust-streaming",
        _CONSUMER,
        "Consumer.seek Consumer.pause_partitions",
        "relied on",
        "seek_input",
    ),
    *_u(
        "faust-streaming",
        "faust.stores.rocksdb",
        "Store._db_for_partition Store._get "
        "Store._iterkeys Store._visible_items Store.set_persisted_offset",
        "relied on",
        "store_get",
    ),
    *_u(
        "faust-streaming",
        "faust.stores.rocksdb",
        "Store.partition_path Store.revoke_partitions",
        "relied on",
        "forget_partition",
    ),
    *_u(
        "faust-streaming",
        "faust.tables.recovery",
        "Recovery.on_rebalance",
        "relied on",
        "forget_partition",
    ),
    *_u(
        "faust-streaming",
        "faust.tables.base",
        "Collection._new_changelog_topic",
        "relied on",
        "rebuild_changelog_topic",
    ),
    *_u(
        "faust-streaming",
        "faust.stores.memory",
        "Store._create_batch_iterator",
        "copied",
        "store_put",
    ),
    *_u(
        "faust-streaming",
        "faust.tables.base",
        "Collection.apply_changelog_batch",
        "wrapped",
        "verify_changelog",
    ),
    *_u(
        "faust-streaming",
        "faust.stores.memory",
        "Store.apply_changelog_batch",
        "relied on",
        "verify_changelog",
    ),
    *_u(
        "faust-streaming",
        "faust.stores.rocksdb",
        "Store.apply_changelog_batch",
        "relied on",
        "verify_changelog",
    ),
    *_u(
        "faust-streaming",
        "faust.tables.recovery",
        "Recovery._restart_recovery.fun Recovery.flush_buffers",
        "relied on",
        "verify_changelog",
    ),
    *_u(
        "faust-streaming",
        "faust.stores.memory",
        "Store.on_recovery_completed",
        "relied on",
        "store_put",
    ),
    *_u("faust-streaming", "faust.streams", "current_event", "relied on", "set_current_event"),
    *_u(
        "faust-streaming",
        "faust.serializers.codecs",
        "Codec._dumps Codec._loads",
        "overridden",
        "register_codec",
    ),
    *_u(
        "faust-streaming",
        "faust.serializers.codecs",
        "Codec.dumps Codec.loads",
        "relied on",
        "register_codec",
    ),
    *_u(
        "faust-streaming",
        "faust.worker",
        "Worker._on_sigterm Worker._on_sigint",
        "overridden",
        "worker_class",
    ),
    *_u(
        "mode-streaming",
        "mode.worker",
        "Worker._on_sigterm Worker._on_sigint Worker._sentinel_task",
        "overridden",
        "worker_class",
    ),
    *_u(
        "mode-streaming",
        "mode.utils.queues",
        "FlowControlEvent.resume FlowControlEvent.clear",
        "relied on",
        "Intake",
    ),
    *_u(
        "faust-streaming",
        "faust.tables.recovery",
        "Recovery._resume_streams",
        "relied on",
        "Intake",
    ),
    *_u(
        "aiokafka",
        "aiokafka.consumer.group_coordinator",
        "GroupCoordinator._maybe_leave_group",
        "replaced",
        "install_tansu_compat",
    ),
    *_u(
        "aiokafka",
        "aiokafka.consumer.consumer",
        "AIOKafkaConsumer.start",
        "relied on",
        "tune_fetch_wait",
    ),
    *_u(
        "aiokafka", "aiokafka.consumer.fetcher", "Fetcher.__init__", "relied on", "tune_fetch_wait"
    ),
    *_MEMBERSHIP,
)
"""Every upstream function behind this module, with what we do with it."""


# --- the batched intake ---------------------------------------------------------------------

_INTAKES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def attach_intake(app: Any, intake: Any) -> None:
    """Have ``app``'s consumer deliver its intake topics' records to ``intake``, a fetched batch
    at a time (once :func:`install_batched_intake` has patched the drain loop)."""
    _INTAKES[app] = intake


def intake_of(app: Any) -> Any:
    """The intake attached to ``app``, or None: such an app keeps Faust's own drain loop."""
    return _INTAKES.get(app)


def track_unacked(consumer: Any, messages: Iterable[Any]) -> None:
    """Mark records as in flight, as ``Consumer.track_message`` does without its sensors:
    Faust waits for them on a graceful stop and counts them as unacknowledged."""
    unacked = consumer._unacked_messages
    for m in messages:
        m.tracked = True
        unacked.add(m)


def untrack_unacked(consumer: Any, messages: Iterable[Any]) -> None:
    """Forget records dropped unacknowledged (a rebalance overtook them)."""
    unacked = consumer._unacked_messages
    for m in messages:
        unacked.discard(m)


def install_batched_intake() -> None:
    """Let a Faust consumer deliver its app's intake topics a fetched batch at a time.

    Replaces ``Consumer._drain_messages`` (the loop that takes each ``getmany`` result and
    delivers it record by record) with :func:`_drain_batches` for an app with an intake
    (:func:`attach_intake`); any other app keeps Faust's loop. Idempotent, process-wide.
    """
    from faust.transport.consumer import Consumer  # noqa: PLC0415

    if getattr(Consumer._drain_messages, "_emarket", False):
        return
    original = Consumer._drain_messages

    async def _drain_messages(self: Any, fetcher: Any) -> None:
        intake = _INTAKES.get(self.app)
        if intake is None:
            await original(self, fetcher)
        else:
            await _drain_batches(self, fetcher, intake)

    _drain_messages._emarket = True  # type: ignore[attr-defined]
    _drain_messages.__wrapped__ = original  # type: ignore[attr-defined]
    Consumer._drain_messages = _drain_messages  # type: ignore[method-assign]


async def _drain_batches(consumer: Any, fetcher: Any, intake: Any) -> None:
    """Faust's ``Consumer._drain_messages`` and ``getmany`` (0.15.3), one list per fetch.

    Kept from them: the wait for the flow to resume, the active partitions, the generation
    check, the round robin over topics and partitions (Faust's scheduler: one partition's
    thousand records do not go ahead of every other's), the yield to the event loop every
    :data:`YIELD_EVERY` records, the read offsets and the gaps they reveal (so commits pass
    records a compacted topic no longer has), the commit every ``commit_every`` acks, the seek
    back to the committed offsets when a fetch returns while the flow is suspended, the delivery
    raced against the flow's suspension, and the log of anything else that ends the loop.
    Changed: the records of the intake's topics are put into the intake once per fetch; other
    topics' records are delivered one by one as before.
    """
    from faust.transport.consumer import CONSUMER_FETCHING  # noqa: PLC0415

    consumer_should_stop = consumer._stopped.is_set
    fetcher_should_stop = fetcher._stopped.is_set
    since_yield = 0
    try:
        while not (consumer_should_stop() or fetcher_should_stop()):
            consumer.diag.set_flag(CONSUMER_FETCHING)
            records, active = await consumer._wait_next_records(1.0)
            await consumer.sleep(0)
            if records is not None and not consumer.should_stop:
                if consumer.flow_active:
                    since_yield = await _deliver(consumer, records, active, intake, since_yield)
                else:
                    try:
                        await consumer.perform_seek()
                    except Exception as exc:  # as Faust: logged, the next fetch tries again
                        log.warning("exception performing seek when flow not active %r", exc)
            consumer.diag.unset_flag(CONSUMER_FETCHING)
    except consumer.consumer_stopped_errors:
        if consumer.transport.app.should_stop:
            consumer.log.info("Broker stopped consumer, shutting down...")
            return
        raise
    except asyncio.CancelledError:
        if consumer.transport.app.should_stop:
            consumer.log.info("Consumer shutting down for user cancel.")
            return
        raise
    except Exception as exc:  # as Faust: whatever ends the loop is logged where it happened
        consumer.log.exception("Drain messages raised: %r", exc)
        raise
    finally:
        consumer.diag.unset_flag(CONSUMER_FETCHING)


async def _deliver(
    consumer: Any, records: Mapping[Any, Any], active: Any, intake: Any, since_yield: int = 0
) -> int:
    """One fetch's records, round robin: the intake's as one list, the others one by one.

    The intake's records carry the consumer generation of the fetch (not the one current when
    each was converted: a commit, a gap or a yield awaited in between may span a rebalance),
    the batch is put only if that generation is still current and the flow active, and their
    read offsets move only once the batch is queued (:meth:`Intake.put` calls back, with no
    await between). Returns the records handled since the last yield to the event loop.
    """
    app = consumer.app
    generation = app.consumer_generation_id
    read_offset = consumer._read_offset
    acks_enabled_for = app.topics.acks_enabled_for
    commit_every = consumer._commit_every
    to_message = consumer._to_message
    mine = intake.topics
    batch: list[Any] = []
    last: dict[Any, int] = {}  # the intake's read offsets, once the batch is queued
    tracked: set[Any] = set()  # partitions whose end offset this fetch has reported
    for tp, record in consumer.scheduler.iterate(records):
        if not consumer.flow_active or app.consumer_generation_id != generation:
            break
        if active is not None and tp not in active and tp not in consumer._buffered_partitions:
            continue
        if tp not in tracked:
            tracked.add(tp)
            app.monitor.track_tp_end_offset(tp, consumer.highwater(tp))
        since_yield += 1
        if since_yield > YIELD_EVERY:
            await asyncio.sleep(0)
            since_yield = 0
        offset = record.offset
        r_offset = last.get(tp, read_offset[tp])
        if r_offset is not None and offset < r_offset:
            consumer.log.dev("DROPPED MESSAGE ROFF %r: k=%r v=%r", offset, record.key, record.value)
            continue  # read before (Faust drops it the same way)
        if r_offset and offset - r_offset > 1 and acks_enabled_for(tp.topic):
            await consumer._add_gap(tp, r_offset + 1, offset)
        if commit_every is not None and consumer._n_acked >= commit_every:
            consumer._n_acked = 0
            await consumer.commit()
        message = to_message(tp, record)
        if tp.topic in mine:
            message.generation_id = generation
            batch.append(message)
            last[tp] = offset
        else:
            await consumer.wait_first(consumer.callback(message), consumer.suspend_flow.wait())
            read_offset[tp] = offset
    await _queue(consumer, intake, batch, last, generation)
    return since_yield


async def _queue(
    consumer: Any, intake: Any, batch: list[Any], last: dict[Any, int], generation: int
) -> None:
    """Put one fetch's intake records into the intake, unless a rebalance overtook them (the
    next owner of their partitions reads them from the committed offsets)."""
    app = consumer.app
    if not batch or not consumer.flow_active or app.consumer_generation_id != generation:
        return
    read_offset = consumer._read_offset

    def queued() -> None:
        if app.consumer_generation_id == generation:
            read_offset.update(last)

    await consumer.wait_first(intake.put(batch, queued), consumer.suspend_flow.wait())


# --- consumer settings ----------------------------------------------------------------------


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
    base = inspect.unwrap(original)
    backoff = prefetch_backoff(fetch_max_wait_ms)

    def _create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = base(self, transport)
        consumer._fetch_max_wait_ms = fetch_max_wait_ms  # read when start() builds the fetcher
        start = consumer.start

        async def start_with_backoff() -> None:
            await start()  # builds the fetcher, which reads the backoff when records arrive
            consumer._fetcher._prefetch_backoff = backoff

        consumer.start = start_with_backoff
        return consumer

    _create_worker_consumer._emarket_wait = fetch_max_wait_ms  # type: ignore[attr-defined]
    _create_worker_consumer.__wrapped__ = base  # type: ignore[attr-defined]
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
    original = TableManager.on_start

    async def on_start(self: Any) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()

    on_start._emarket = True  # type: ignore[attr-defined]
    on_start.__wrapped__ = original  # type: ignore[attr-defined]
    TableManager.on_start = on_start  # type: ignore[method-assign]


def quiet_libraries(level: str) -> None:
    """Keep aiokafka, Faust and mode at INFO or above unless the worker logs at DEBUG: they log
    every produce at DEBUG, and formatting those records costs ~10% of a busy worker even when
    nothing is printed."""
    if level.lower() != "debug":
        for name in ("aiokafka", "faust", "mode"):
            logging.getLogger(name).setLevel(max(logging.INFO, logging.getLogger(name).level))


def worker_class(on_stop_signal: Callable[[], None]) -> type[Any]:
    """Faust's ``Worker``, calling ``on_stop_signal`` first on SIGTERM and SIGINT.

    The worker's graceful stop can hang (a consumer waiting for a batch that will never be
    acknowledged); ``on_stop_signal`` arms the deadline that ends the process anyway. mode's
    loop sentinel sleeps a second before the loop closes, a second added to every stop; ours
    only yields. Without a terminal the spinner is off (it writes escapes into log files).
    """
    import faust  # noqa: PLC0415

    class MarketFaustWorker(faust.Worker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if not self.stdout.isatty():
                self.spinner = None

        def _on_sigterm(self) -> None:
            on_stop_signal()
            super()._on_sigterm()

        def _on_sigint(self) -> None:
            on_stop_signal()
            super()._on_sigint()

        async def _sentinel_task(self) -> None:
            await asyncio.sleep(0)

    return MarketFaustWorker


# --- tables ---------------------------------------------------------------------------------


def set_current_event(event: Any) -> None:
    """Make ``event`` Faust's "current event" (what a stream sets for each event it yields):
    the RocksDB store picks the partition of a table write from it."""
    from faust.streams import _current_event  # noqa: PLC0415

    _current_event.set(None if event is None else weakref.ref(event))


class _Codec(codecs.Codec):
    """A Faust codec made of two functions (the worker's bytes, Faust's names for them)."""

    def __init__(self, dumps: Callable[[Any], bytes], loads: Callable[[bytes], Any]) -> None:
        super().__init__()
        self._d, self._l = dumps, loads

    def _dumps(self, obj: Any) -> bytes:
        return bytes(self._d(obj))

    def _loads(self, data: bytes) -> Any:
        return self._l(data)


def register_codec(name: str, dumps: Callable[[Any], bytes], loads: Callable[[bytes], Any]) -> None:
    """Register a codec with Faust under ``name``, the serializer a topic or table names."""
    codecs.register(name, _Codec(dumps, loads))


def rebuild_changelog_topic(table: Any) -> None:
    """Remake ``table``'s changelog topic, reading raw bytes (keys and values).

    Faust builds the changelog topic when the table is registered, from the serializers its
    key and value *types* imply; recovery decodes every record with the topic's serializers
    before the table sees it. Ours reads the bytes as they are: :func:`verify_changelog`
    checks each record's authenticator and decodes only those it admits, so nothing a stranger
    appended is parsed, and a record that would not decode never becomes an error inside
    Faust's recovery loop (which logs it and goes on without counting it anywhere).
    """
    codecs_of_table = table.key_serializer, table.value_serializer
    table.key_serializer, table.value_serializer = "raw", "raw"
    try:
        table.changelog_topic = table._new_changelog_topic()
    finally:
        table.key_serializer, table.value_serializer = codecs_of_table


@dataclass(frozen=True)
class _RawMessage:
    """A changelog message with another value: what RocksDB's recovery writes for a record
    (its stamp, then its sealed value), with the fields its ``apply_changelog_batch`` reads."""

    key: bytes
    value: bytes | None
    partition: int
    offset: int
    tp: Any


@dataclass(frozen=True)
class RecoveredEvent:
    """What Faust's stores read of a changelog event in ``apply_changelog_batch``: the
    decoded key and value (memory store) and the message (its raw key, value, partition and
    offset: the RocksDB store writes those). ``raw``, when given, replaces the message's value
    for the RocksDB store."""

    key: Any
    value: Any
    original: Any
    raw: bytes | None = None

    @property
    def message(self) -> Any:
        m = self.original
        if self.raw is None:
            return m
        return _RawMessage(m.key, self.raw, m.partition, m.offset, m.tp)


def verify_changelog(table: Any, admit: Callable[[list[Any]], list[RecoveredEvent]]) -> None:
    """Have Faust's recovery apply to ``table`` only the changelog events ``admit`` returns.

    ``admit`` receives the messages of a buffered batch in order (raw key, value, headers,
    topic, partition, offset) and returns the events to apply (:class:`RecoveredEvent`).
    Recovery calls ``table.apply_changelog_batch`` with its buffered events (after it has
    counted their offsets, so refusing one never stalls recovery); the table's store then
    reads ``event.key``, ``event.value`` and ``event.message``.
    """
    apply = table.apply_changelog_batch

    def apply_changelog_batch(batch: Iterable[Any]) -> None:
        apply(admit([event.message for event in batch]))

    apply_changelog_batch.__wrapped__ = apply  # type: ignore[attr-defined]
    table.apply_changelog_batch = apply_changelog_batch


def store_is_serialized(table: Any) -> bool:
    """Whether ``table``'s store keeps bytes (RocksDB) rather than objects (memory)."""
    return hasattr(table.data, "_db_for_partition")


def store_get(table: Any, key: str, partition: int | None = None) -> Any:
    """What ``table``'s store holds for ``key`` (None if nothing): the object in memory, the
    bytes in RocksDB (looked up in ``partition``'s database when given, else where Faust's
    key index or the current event says)."""
    store = table.data
    if not store_is_serialized(table):
        return store.data.get(key)
    raw = key.encode("utf-8")
    if partition is not None:
        return store._db_for_partition(partition).get(raw)
    return store._get(raw)


def store_put(table: Any, key: str, partition: int, stored: Any) -> None:
    """Write (``stored``) or delete (None) ``key`` of ``partition`` in ``table``'s store, with
    the bookkeeping Faust's own paths keep: the memory store's key → partition map (by which it
    drops revoked partitions' keys) and RocksDB's key index."""
    store = table.data
    if not store_is_serialized(table):
        if stored is None:
            store.data.pop(key, None)
            store._key_partition.pop(key, None)
        else:
            store.data[key] = stored
            store._key_partition[key] = partition
        return
    raw = key.encode("utf-8")
    db = store._db_for_partition(partition)
    if stored is None:
        db.delete(raw)
        store._key_index.pop(raw, None)
    else:
        db.put(raw, stored)
        store._key_index[raw] = partition


def store_keys(table: Any) -> Iterable[str]:
    """Every key ``table``'s store holds (its assigned partitions')."""
    store = table.data
    if not store_is_serialized(table):
        keys: Iterable[str] = store.data.keys()
        return keys
    return (k.decode("utf-8") for k in store._iterkeys())


def store_size(table: Any) -> int:
    """How many keys ``table``'s store holds."""
    store = table.data
    return len(store.data) if not store_is_serialized(table) else sum(1 for _ in store._iterkeys())


def partition_items(table: Any, partitions: set[int]) -> Iterable[tuple[int, str, Any]]:
    """Every (partition, key, stored) of ``partitions`` in ``table``'s store: one pass over the
    memory store's keys whatever the number of partitions, one database each in RocksDB."""
    store = table.data
    if not store_is_serialized(table):
        data = store.data
        return [(p, k, data[k]) for k, p in store._key_partition.items() if p in partitions]
    return (
        (p, k.decode("utf-8"), v)
        for p in sorted(partitions)
        for k, v in store._visible_items(store._db_for_partition(p))
    )


def forget_partition(app: Any, table: Any, partition: int) -> None:
    """Drop what ``table`` holds of ``partition`` — its keys (memory store), or its database
    (RocksDB: closed and deleted, its persisted offset with it) — and where Faust's recovery
    had read its changelog to, so that the next recovery reads the partition from the start.

    For a partition this worker keeps across a rebalance but whose state it no longer trusts
    (another worker took it over meanwhile, or it did not verify): Faust would otherwise only
    read what was written since."""
    import gc  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    from faust.types import TP  # noqa: PLC0415

    store = table.data
    if store_is_serialized(table):
        store._dbs.pop(partition, None)
        for key in [k for k, p in store._key_index.items() if p == partition]:
            del store._key_index[key]
        gc.collect()  # rocksdict closes a database when it is collected
        shutil.rmtree(store.partition_path(partition), ignore_errors=True)
    else:
        for key in [k for k, p in store._key_partition.items() if p == partition]:
            store.data.pop(key, None)
            del store._key_partition[key]
    tp = TP(table.changelog_topic.get_topic_name(), partition)
    recovery = app.tables.recovery
    recovery.active_offsets.pop(tp, None)
    recovery.active_highwaters.pop(tp, None)


def persisted_offset(table: Any, topic: str, partition: int) -> int | None:
    """The last offset of ``topic``'s ``partition`` that ``table``'s RocksDB store has applied
    (its recovery resumes after it); None in memory, or before the store applied any."""
    from faust.types import TP  # noqa: PLC0415

    if not store_is_serialized(table):
        return None
    offset = table.data.persisted_offset(TP(topic, partition))
    return None if offset is None else int(offset)


def set_persisted_offset(table: Any, topic: str, partition: int, offset: int) -> None:
    """Record ``offset`` of ``topic``'s ``partition`` as the last one ``table``'s RocksDB store
    has applied (recovery resumes after it)."""
    from faust.types import TP  # noqa: PLC0415

    table.data.set_persisted_offset(TP(topic, partition), offset)


# --- taking partitions on -------------------------------------------------------------------

_TAKEOVERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def attach_takeover(app: Any, takeover: Any) -> None:
    """Have ``app``'s rebalances, seeks and commits go through ``takeover``
    (:class:`streams.worker.recovery.Takeover`), once :func:`install_takeover` has patched
    Faust."""
    _TAKEOVERS[app] = takeover


def install_takeover() -> None:
    """Patch Faust (process-wide, idempotent; apps without a takeover are unchanged) so that

    * ``TableManager.on_rebalance`` first awaits ``takeover.prepare(assigned, revoked)`` (the
      checkpoints of the partitions newly assigned, read before table recovery starts);
    * ``Recovery.on_recovery_completed`` and ``Recovery._resume_streams`` (the two ways a
      rebalance ends: after recovering tables, or with nothing to recover) first await
      ``takeover.recovered()``, which verifies and claims the partitions just recovered;
    * ``Consumer.perform_seek`` (Faust seeks the input partitions to the group's committed
      offsets there: when a rebalance ends, and when a fetch returns while the flow is
      stopped) then awaits ``takeover.resume(consumer)``, which seeks them to the positions
      the state proves;
    * ``Consumer._commit_offsets`` first awaits ``takeover.commit_positions(offsets)``, which
      checkpoints the offsets and returns those that may be committed.
    """
    from faust.tables.manager import TableManager  # noqa: PLC0415
    from faust.tables.recovery import Recovery  # noqa: PLC0415
    from faust.transport.consumer import Consumer  # noqa: PLC0415

    if getattr(Consumer.perform_seek, "_emarket", False):
        return
    _patch(TableManager, "on_rebalance", _before_rebalance)
    _patch(Recovery, "on_recovery_completed", _after_recovery)
    _patch(Recovery, "_resume_streams", _after_recovery)
    _patch(Consumer, "perform_seek", _after_seek)
    _patch(Consumer, "_commit_offsets", _before_commit)


def _patch(cls: Any, name: str, make: Callable[[Any], Any]) -> None:
    """Replace ``cls.name`` by ``make(original)``, marked as ours."""
    original = getattr(cls, name)
    fn = make(original)
    fn._emarket = True
    fn.__wrapped__ = original
    setattr(cls, name, fn)


def _before_rebalance(on_rebalance: Any) -> Any:
    async def patched(
        self: Any, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0
    ) -> None:
        takeover = _TAKEOVERS.get(self.app)
        if takeover is not None:
            await takeover.prepare(set(assigned), set(revoked))
        await on_rebalance(self, assigned, revoked, newly_assigned, generation_id)

    return patched


def _after_recovery(original: Any) -> Any:
    async def patched(self: Any, generation_id: int = 0) -> None:
        takeover = _TAKEOVERS.get(self.app)
        if takeover is not None:
            await takeover.recovered()
        await original(self, generation_id)

    return patched


def _after_seek(perform_seek: Any) -> Any:
    async def patched(self: Any) -> None:
        await perform_seek(self)
        takeover = _TAKEOVERS.get(self.app)
        if takeover is not None:
            await takeover.resume(self)

    return patched


def _before_commit(commit_offsets: Any) -> Any:
    async def patched(self: Any, offsets: Any, start_new_transaction: bool = True) -> bool:
        takeover = _TAKEOVERS.get(self.app)
        if takeover is not None:
            offsets = await takeover.commit_positions(offsets)
            if not offsets:
                return False
        done: bool = await commit_offsets(
            self, offsets, start_new_transaction=start_new_transaction
        )
        return done

    return patched


async def seek_input(consumer: Any, tp: Any, offset: int) -> None:
    """Seek an input partition of Faust's consumer to ``offset`` (its read offset follows)."""
    await consumer.seek(tp, offset)


def set_committed_offset(consumer: Any, tp: Any, offset: int) -> None:
    """What Faust believes is committed for ``tp`` (it commits only offsets past it, and the
    worker's lag is measured from it): the proven position, not someone else's commit."""
    consumer._committed_offset[tp] = offset


def pause_inputs(consumer: Any, tps: Iterable[Any]) -> None:
    """Stop fetching ``tps`` (a partition this worker does not serve)."""
    consumer.pause_partitions(tps)


# --- reads ----------------------------------------------------------------------------------


def committed_offset(consumer: Any, tp: Any) -> int | None:
    """The offset Faust last committed for ``tp`` (None before its first commit)."""
    offset = consumer._committed_offset.get(tp)
    return None if offset is None else int(offset)


def producer_client(app: Any) -> Any:
    """The aiokafka client of ``app``'s producer (raises while the producer is not started)."""
    return app.producer._producer.client


async def probe_broker(app: Any, topic: str) -> bool:
    """One metadata round trip of ``app``'s producer naming ``topic`` only; False if no broker
    is known yet.

    A request for every topic (``fetch_all_metadata``) costs the broker more with every inbox:
    ~260 ms at 4,500 topics on the embedded broker, every two seconds, per worker.
    """
    client = producer_client(app)
    node = client.get_random_node()
    if node is None:
        return False
    await client.send(node, MetadataRequest([topic], allow_auto_topic_creation=False))
    return True


async def learn_topics(app: Any, names: Iterable[str]) -> None:
    """Have ``app``'s producer know the partitions of the topics ``names`` (just created).

    aiokafka's producer learns a topic it has not seen with one metadata request *per topic*,
    each naming every topic it knows: sending to n new inboxes in turn would cost n requests of
    a size that grows with the inboxes already there. Tracked together here, they cost one.
    """
    client = producer_client(app)
    waits = [client.add_topic(name) for name in names]
    if waits:
        await asyncio.gather(*waits)


async def topic_leaders(app: Any, names: Iterable[str]) -> dict[str, dict[int, int]] | None:
    """Each of the topics ``names`` that exists: partition → leader's node id, from one
    metadata request of ``app``'s producer naming those topics only, which never creates one
    (a missing topic is absent from the answer); None if no broker is known yet.

    aiokafka's own metadata requests allow the broker to create what they name, and the
    embedded broker then makes a topic with 4 partitions and none of its settings: a check
    must not make what it checks for.
    """
    wanted = list(names)
    client = producer_client(app)
    node = client.get_random_node()
    if node is None:
        return None
    response = await client.send(node, MetadataRequest(wanted, allow_auto_topic_creation=False))
    found: dict[str, dict[int, int]] = {}
    for code, name, _internal, partitions, *_ in response.topics:
        if code == 0 and partitions:
            found[name] = {p[1]: p[2] for p in partitions}
    return found


async def latest_offsets(
    app: Any, leaders: Mapping[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    """The latest offset the broker reports (ListOffsets) of each (topic, partition) in
    ``leaders``, asked of its leader; a partition that answers with an error is left out.

    On the embedded broker this is the base offset of the newest batch + 1, not the high
    watermark (the module docstring): still an offset that never moves back while the topic
    lives, which is all the checks compare.
    """
    by_node: dict[int, dict[str, list[tuple[int, int]]]] = {}
    for (topic, partition), node in leaders.items():
        by_node.setdefault(node, {}).setdefault(topic, []).append((partition, -1))
    client = producer_client(app)
    out: dict[tuple[str, int], int] = {}
    for node, topics in by_node.items():
        response = await client.send(node, OffsetRequest(-1, 0, list(topics.items())))
        for topic, partitions in response.topics:
            for partition, code, *info in partitions:
                if code == 0 and info:
                    out[(topic, partition)] = int(info[1] if len(info) > 1 else info[0][0])
    return out


# --- Tansu ----------------------------------------------------------------------------------


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
    """Patch Faust/aiokafka for Tansu (idempotent; process-wide; see the module docstring)."""
    global _tansu_installed  # noqa: PLW0603 - one process-wide switch, by design
    if _tansu_installed:
        return
    from aiokafka.consumer.group_coordinator import GroupCoordinator  # noqa: PLC0415
    from aiokafka.protocol.group import LeaveGroupRequest  # noqa: PLC0415
    from faust.transport.drivers.aiokafka import (  # noqa: PLC0415
        AIOKafkaConsumerThread,
        server_list,
    )

    async def _highwaters(self: Any, partitions: Iterable[TopicPartition]) -> Mapping[Any, int]:
        consumer = self._ensure_consumer()
        tps = list(partitions)
        reported = await consumer.end_offsets(tps)
        bootstrap = server_list(self.transport.url, self.transport.default_port)
        fixed = await true_highwaters(bootstrap, reported)
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

    _highwaters.__wrapped__ = AIOKafkaConsumerThread._highwaters  # type: ignore[attr-defined]
    _maybe_leave_group.__wrapped__ = GroupCoordinator._maybe_leave_group  # type: ignore[attr-defined]
    AIOKafkaConsumerThread._highwaters = _highwaters  # type: ignore[method-assign]
    GroupCoordinator._maybe_leave_group = _maybe_leave_group
    _tansu_installed = True


# --- group membership (issue #39) -------------------------------------------------------------
# Kept apart from the rest of the boundary: Faust's assignor, wrapped by a subclass (installed
# through Faust's public ``PartitionAssignor`` setting), and the coordinator's member id and
# generation, read where Faust itself reads them.

__all__ += ["group_member", "proving_assignor"]


def group_member(app: Any) -> tuple[str, int]:
    """This worker's member id in its consumer group ("" before the broker gave it one) and
    the group's generation, as aiokafka's coordinator holds them (Faust reads the generation
    the same way, ``ConsumerRebalanceListener.on_partitions_assigned``). Call it on the
    consumer's thread."""
    coordinator = app.consumer._thread._ensure_consumer()._coordinator
    return coordinator.member_id or "", int(coordinator.generation)


def _pairs(assignment: Iterable[tuple[str, Iterable[int]]]) -> list[tuple[str, int]]:
    """(topic, partition) pairs of a Kafka protocol assignment."""
    return [(t, int(p)) for t, ps in assignment for p in ps]


def _assignment_object(assignor: Any, user_data: bytes) -> dict[str, Any] | None:
    """The JSON object of a Faust assignment's user data (Faust compresses it), or None."""
    try:
        obj = json.loads(assignor._decompress(user_data))
    except (ValueError, zlib.error, UnicodeDecodeError, TypeError):
        return None
    return obj if isinstance(obj, dict) else None


def _nothing(assignor: Any, metadata: Any) -> Any:
    """An empty assignment a Faust worker accepts: its own URL, no partitions."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment  # noqa: PLC0415
    from faust.assignor.client_assignment import ClientAssignment, ClientMetadata  # noqa: PLC0415

    try:
        url = str(ClientMetadata.loads(metadata.user_data).url)
    except Exception:  # a stranger's metadata: it gets an empty URL
        url = ""
    empty = ClientMetadata(
        assignment=ClientAssignment(actives={}, standbys={}),
        url=url,
        changelog_distribution={},
        external_topic_distribution={},
        topic_groups={},
    )
    return ConsumerProtocolMemberAssignment(assignor.version, [], assignor._compress(empty.dumps()))


def _sealed(assignor: Any, assignment: Any, seal: dict[str, Any]) -> Any:
    """``assignment`` with ``seal`` in its user data's JSON (Faust keeps keys it does not know)."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment  # noqa: PLC0415

    from .assignment_seal import SEAL_FIELD  # noqa: PLC0415

    obj = _assignment_object(assignor, assignment.user_data) or {}
    obj[SEAL_FIELD] = seal
    data = assignor._compress(json.dumps(obj, separators=(",", ":")).encode())
    return ConsumerProtocolMemberAssignment(assignment.version, assignment.assignment, data)


def proving_assignor(watch: Any) -> type[Any]:
    """Faust's ``PartitionAssignor`` with the market's membership proofs (``watch``: a
    :class:`streams.worker.group_watch.GroupWatch`).

    * ``metadata``: Faust's JoinGroup metadata, with this worker's proof in its JSON
      (``watch.metadata``), bound to its member id once it has one;
    * ``assign`` (on the leader): Faust assigns the members whose proofs stand; every other
      member gets an empty assignment in Faust's form (it still answers the protocol), and
      every assignment carries the leader's seal of the whole (``watch.seal``);
    * ``on_assignment``: the seal of this worker's assignment goes to ``watch.assigned``
      before Faust reads the assignment (which may raise on a stranger's bytes).
    """
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata  # noqa: PLC0415
    from faust.assignor import PartitionAssignor  # noqa: PLC0415

    from .assignment_seal import SEAL_FIELD  # noqa: PLC0415

    class ProvingAssignor(PartitionAssignor):
        def metadata(self, topics: Any) -> Any:
            meta = super().metadata(topics)
            member_id, _ = group_member(self.app)
            return ConsumerProtocolMemberMetadata(
                meta.version, meta.subscription, watch.metadata(meta.user_data, member_id)
            )

        def assign(self, cluster: Any, member_metadata: Any) -> Any:
            leader, generation = group_member(self.app)
            refused = watch.judge({m: md.user_data for m, md in member_metadata.items()}, leader)
            proven = {m: md for m, md in member_metadata.items() if m not in refused}
            result = dict(super().assign(cluster, proven)) if proven else {}
            result.update({m: _nothing(self, member_metadata[m]) for m in refused})
            given = {m: _pairs(a.assignment) for m, a in result.items() if m not in refused}
            seal = watch.seal(generation, leader, given, refused)
            return {m: _sealed(self, a, seal) for m, a in result.items()}

        def on_assignment(self, assignment: Any) -> None:
            member_id, generation = group_member(self.app)
            obj = _assignment_object(self, assignment.user_data)
            seal = None if obj is None else obj.get(SEAL_FIELD)
            watch.assigned(generation, member_id, _pairs(assignment.assignment), seal)
            super().on_assignment(assignment)

    return ProvingAssignor
