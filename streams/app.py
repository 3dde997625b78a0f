"""The Faust worker: tables, one agent over the three input topics, web endpoints.

The agent is deliberately thin. For each batch taken from the input topics it

1. hands every event to :class:`streams.core.MarketCore` (with Faust's "current event" set to that
   event, so table writes go to the changelog partition of the event's stream);
2. **flushes the producer**, which waits until every table changelog write of the batch is
   acknowledged by the broker;
3. only then sends the batch's outputs (releases, receipts, rejections, catalog entries) and
   waits for their acknowledgements.

A worker that dies at any point therefore never leaves a visible release whose state is not
durable; the batch's offsets are committed by Faust only after step 3, so the batch is processed
again and the core's idempotency turns it into identical re-emissions (see ``streams/core.py``).

One agent (concurrency 1) consumes registrations, values and purchases together, so events of a
stream are applied strictly in order; the three topics are co-partitioned by ``stream_id`` and
Faust assigns the same partition numbers of all three to the same worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import faust
from faust.serializers import codecs
from faust.streams import current_event
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from market.codec import decode_state, encode_state
from market.ladder import ReleaseState

from .config import Settings
from .core import EvictedValue, MarketCore, Outcome, PurchaseRecord, Stores, StreamState
from .faults import FaultInjector
from .keys import MarketKeys, load_or_create_keys
from .metrics import Metrics, build_metrics
from .topics import Topics

__all__ = ["MarketWorker", "create_worker"]

log = logging.getLogger("emarket.worker")
PROFILE = bool(os.environ.get("EMARKET_PROFILE_BATCHES"))


class _Codec(codecs.Codec):
    def __init__(self, dumps: Any, loads: Any) -> None:
        super().__init__()
        self._d, self._l = dumps, loads

    def _dumps(self, obj: Any) -> bytes:
        return bytes(self._d(obj))

    def _loads(self, data: bytes) -> Any:
        return self._l(data)


_EVICTED = b"EVIC"


def _encode_ladder(obj: ReleaseState | EvictedValue) -> bytes:
    if isinstance(obj, EvictedValue):
        return _EVICTED + f"{obj.seq}:{obj.digest}:{obj.published_at_ms}".encode()
    return encode_state(obj)


def _decode_ladder(data: bytes) -> ReleaseState | EvictedValue:
    if data.startswith(_EVICTED):
        seq, digest, *published = data[len(_EVICTED) :].decode().split(":")
        return EvictedValue(int(seq), digest, int(published[0]) if published else 0)
    return decode_state(data)


@dataclass(frozen=True)
class Record:
    """One message to produce; ``table`` is set for changelog records."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    table: WriteBackTable | None = None


class WriteBackTable(MutableMapping[str, Any]):
    """A Faust table seen through a per-batch write-back cache.

    The core may update the same key many times in a batch (a stream's record on every value, a
    ladder on every purchase of the stream); only the last value of each key is written when the
    batch is flushed. :meth:`flush` writes the table's store and sends the changelog record
    directly with the producer, in the partition of the event that last touched the key, and
    returns the send futures: awaiting them is what makes the batch's state durable. (Faust's own
    ``table[key] = value`` routes every changelog record through a one-at-a-time buffer, which
    cost half of a busy worker's time; we keep its bookkeeping: the RocksDB persisted offsets and
    the memory store's key → partition map used to drop revoked partitions.)
    """

    _DELETED = object()

    def __init__(self, table: Any, dumps: Any) -> None:
        self.table = table
        self._dumps = dumps
        self._pending: dict[str, tuple[Any, Any]] = {}

    def __getitem__(self, key: str) -> Any:
        hit = self._pending.get(key)
        if hit is not None:
            if hit[1] is self._DELETED:
                raise KeyError(key)
            return hit[1]
        return self.table[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._pending[key] = (current_event(), value)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._pending[key] = (current_event(), self._DELETED)

    def __iter__(self) -> Iterator[str]:
        deleted = {k for k, (_, v) in self._pending.items() if v is self._DELETED}
        keys = set(self.table.keys()) | set(self._pending)
        return iter(keys - deleted)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def drain(self, stream: Any) -> list[Record]:
        """Apply the batch's writes to the store; return the changelog records to send."""
        store = self.table.data
        key_partition = getattr(store, "_key_partition", None)
        topic = self.table.changelog_topic.get_topic_name()
        records = []
        for key, (event, value) in self._pending.items():
            stream._set_current_event(event)  # the RocksDB store picks its partition from it
            partition = event.message.partition
            if value is self._DELETED:
                store.pop(key, None)
                payload = None
            else:
                store[key] = value
                payload = self._dumps(value)
            if key_partition is not None:  # the memory store drops revoked partitions by it
                if payload is None:
                    key_partition.pop(key, None)
                else:
                    key_partition[key] = partition
            records.append(Record(topic, key.encode(), payload, partition, self))
        self._pending.clear()
        return records

    def persisted(self, metadata: Any) -> None:
        """Record a changelog offset as persisted (RocksDB resumes recovery after it)."""
        self.table.data.set_persisted_offset(metadata.topic_partition, metadata.offset)


def _register_codecs() -> None:
    codecs.register("em_str", _Codec(lambda s: s.encode("utf-8"), lambda b: b.decode("utf-8")))
    codecs.register("em_ladder", _Codec(_encode_ladder, _decode_ladder))
    codecs.register(
        "em_stream",
        _Codec(lambda m: m.model_dump_json().encode(), StreamState.model_validate_json),
    )
    codecs.register(
        "em_purchase",
        _Codec(lambda m: m.model_dump_json().encode(), PurchaseRecord.model_validate_json),
    )


def _quiet_libraries(level: str) -> None:
    """aiokafka and Faust log every produce at DEBUG; formatting those records costs ~10% of a
    busy worker even when nothing is printed, so keep them at INFO unless debugging."""
    if level.lower() != "debug":
        for name in ("aiokafka", "faust", "mode"):
            logging.getLogger(name).setLevel(max(logging.INFO, logging.getLogger(name).level))


def _tune_fetch_wait(fetch_max_wait_ms: int) -> None:
    """Faust passes fetch_max_wait_ms=1500 to aiokafka unconditionally; override it."""
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread  # noqa: PLC0415

    original = AIOKafkaConsumerThread._create_worker_consumer
    if getattr(original, "_emarket_wait", None) == fetch_max_wait_ms:
        return
    base = getattr(original, "_emarket_original", original)

    def _create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = base(self, transport)
        consumer._fetch_max_wait_ms = fetch_max_wait_ms
        return consumer

    _create_worker_consumer._emarket_wait = fetch_max_wait_ms  # type: ignore[attr-defined]
    _create_worker_consumer._emarket_original = base  # type: ignore[attr-defined]
    AIOKafkaConsumerThread._create_worker_consumer = _create_worker_consumer  # type: ignore[method-assign]


class MarketWorker:
    """A Faust app wired to the market core, with metrics and web endpoints."""

    def __init__(self, settings: Settings, keys: MarketKeys | None = None) -> None:
        self.settings = settings
        if settings.tansu:
            from .compat import install_tansu_compat  # noqa: PLC0415

            install_tansu_compat()
        _tune_fetch_wait(settings.fetch_max_wait_ms)
        _register_codecs()
        self.topics = Topics(settings.prefix, settings.partitions)
        self.keys = keys or load_or_create_keys(settings.data_dir)
        self.metrics: Metrics = build_metrics()
        self.app = faust.App(
            settings.app_id,
            broker=settings.broker,
            store=settings.store,
            datadir=str(settings.data_dir / "faust"),
            topic_partitions=settings.partitions,
            topic_replication_factor=settings.replication,
            broker_session_timeout=settings.session_timeout,
            broker_heartbeat_interval=settings.heartbeat_interval,
            broker_request_timeout=max(30.0, settings.session_timeout * 3),
            broker_commit_interval=settings.commit_interval,
            broker_credentials=settings.faust_credentials(),
            consumer_auto_offset_reset="earliest",
            web_bind=settings.web_host,
            web_host=settings.web_host,
            web_port=settings.web_port,
            web_in_thread=False,
            table_standby_replicas=0,
            producer_max_request_size=16 * 1024 * 1024,
            consumer_max_fetch_size=16 * 1024 * 1024,
        )

        def table(name: str, codec: str) -> Any:
            tbl: Any = self.app.Table(name, partitions=settings.partitions)
            # Faust derives serializers from key/value *types*, ours are codecs by name. The
            # store is created lazily (after this), but registering the table already built a
            # JSON changelog topic, which recovery would decode with: rebuild it.
            tbl.key_serializer, tbl.value_serializer = "em_str", codec
            tbl.changelog_topic = tbl._new_changelog_topic()
            return tbl

        def dump_model(m: Any) -> bytes:
            return bytes(m.model_dump_json().encode())

        self._tables = {
            "streams": WriteBackTable(table("streams", "em_stream"), dump_model),
            "ladders": WriteBackTable(table("ladders", "em_ladder"), _encode_ladder),
            "purchases": WriteBackTable(table("purchases", "em_purchase"), dump_model),
        }
        self.stores = Stores(**self._tables)
        self.core = MarketCore(
            self.stores,
            self.keys,
            self.topics,
            require_encryption=settings.require_encryption,
            dedup_horizon_ms=int(settings.dedup_horizon * 1000),
        )
        self._known_topics: set[str] = set()
        self._started = time.time()
        self._probed = False
        self._faults = FaultInjector.from_env()
        self._wire()

    # -- faust wiring ---------------------------------------------------------------------
    def _wire(self) -> None:
        app, settings = self.app, self.settings
        inputs = app.topic(
            *self.topics.inputs(),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=settings.partitions,
        )
        worker = self

        @app.agent(inputs, name="market", concurrency=1)
        async def market(stream: Any) -> None:
            # Our own batching, not Stream.take_events: under load take_events pairs a value
            # with the wrong event object when its timeout fires while an event is being
            # buffered, so one event is processed twice and its neighbour never (seen here as a
            # duplicated offset and a lost one, and a committed offset stuck behind the gap).
            # Events are acknowledged by hand, after their batch's outputs are acknowledged.
            manual = stream.noack()
            batch: list[Any] = []
            async for event in manual.events():
                batch.append(event)
                if len(batch) >= settings.batch_max or manual.channel.empty():
                    await worker.process_batch(manual, batch)
                    for done in batch:
                        await manual.ack(done)
                    batch = []

        @app.page("/metrics")
        async def metrics_page(view: Any, request: Any) -> Any:
            worker.refresh_gauges()
            # aiohttp refuses a charset inside content_type; the exposition format is ASCII
            return view.bytes(
                generate_latest(worker.metrics.registry),
                content_type=CONTENT_TYPE_LATEST.split(";")[0] + "; version=0.0.4",
            )

        @app.page("/health")
        async def health_page(view: Any, request: Any) -> Any:
            body = worker.health()
            return view.json(body, status=200 if body["status"] == "ok" else 503)

        @app.page("/ledger")
        async def ledger_page(view: Any, request: Any) -> Any:
            return view.json(worker.ledger())

        @app.timer(5.0)  # type: ignore[untyped-decorator]
        async def refresh() -> None:
            worker.refresh_gauges()

        @app.task  # type: ignore[untyped-decorator]
        async def first_probe() -> None:
            _quiet_libraries(settings.log_level)
            await worker.probe_broker()

        @app.timer(2.0)  # type: ignore[untyped-decorator]
        async def probe() -> None:
            await worker.probe_broker()

        def rebalanced(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
            # the tables now hold what other workers wrote while they owned these partitions
            worker.core.invalidate_indexes()
            log.info("rebalance complete; expiry indexes will be rebuilt from the tables")

        app.on_rebalance_complete.connect(rebalanced)

        self._agent = market

    # -- the batch ----------------------------------------------------------------------------
    async def process_batch(self, stream: Any, events: list[Any]) -> None:
        m = self.metrics
        outputs = []
        purchase_times: list[float] = []
        t_start = time.perf_counter()
        self._faults.hit("before_state")
        with self.core.batch() as deliveries:
            for i, ev in enumerate(events):
                if i == len(events) // 2:
                    self._faults.hit("mid_batch")
                stream._set_current_event(ev)
                msg = ev.message
                outcome = self.core.handle(
                    msg.topic, ev.value, partition=msg.partition, offset=msg.offset
                )
                self._count(outcome)
                if outcome.status == "duplicate":
                    log.info("duplicate %s event at %s[%s]@%s: %.120r", outcome.kind, msg.topic,
                             msg.partition, msg.offset, ev.value)  # fmt: skip
                outputs.extend(outcome.outputs)
                if outcome.kind == "purchase" and msg.timestamp:
                    purchase_times.append(float(msg.timestamp))
        outputs.extend(deliveries)
        m.batch_size.observe(len(events))
        t_proc = time.perf_counter()
        # 1. state first: every changelog write of this batch acknowledged by the broker
        state = [r for tbl in self._tables.values() for r in tbl.drain(stream)]
        await self._produce(state)
        t_state = time.perf_counter()
        self._faults.hit("after_state")
        # 2. then the outputs
        for topic in {o.topic for o in outputs} - self._known_topics:
            await self._ensure_topic(topic)
        await self._produce(
            [Record(o.topic, o.key, o.value) for o in outputs], fail_point="mid_output"
        )
        t_out = time.perf_counter()
        if PROFILE:
            log.warning("batch %d events: process %.1f ms, state %.1f ms, outputs %.1f ms %s",
                        len(events), (t_proc - t_start) * 1e3, (t_state - t_proc) * 1e3,
                        (t_out - t_state) * 1e3,
                        [(e.message.partition, e.message.offset) for e in events])  # fmt: skip
        self._faults.hit("after_output")
        now = time.time()
        for ts in purchase_times:
            m.purchase_latency.observe(max(0.0, now - ts))
        m.last_batch.set(now)

    async def _produce(self, records: list[Record], fail_point: str | None = None) -> None:
        """Send every record and wait for the broker's acknowledgements, retrying until they
        are all acknowledged. During a broker outage this holds the batch (nothing new is
        processed, nothing is lost) while the gauge, /health and the log report the outage.
        Resending is safe: changelog records and outputs are idempotent."""
        pending = records
        delay = 0.2
        while pending:
            futures: list[Any] = []
            failed: list[Record] = []
            try:
                for i, r in enumerate(pending):
                    if fail_point and i == len(pending) // 2:
                        self._faults.hit(fail_point)
                    futures.append(
                        await self.app.producer.send(
                            r.topic, r.key, r.value, r.partition, None, None
                        )
                    )
            except Exception as exc:  # the producer refused the send itself
                log.error("cannot send to the broker (%r)", exc)
                failed = pending[len(futures) :]
            results = await asyncio.gather(*futures, return_exceptions=True)
            for r, res in zip(pending, results, strict=False):
                if isinstance(res, BaseException):
                    failed.append(r)
                elif r.table is not None:
                    r.table.persisted(res)
            if failed:
                self._broker_state(False)
                log.error(
                    "%d messages not acknowledged by the broker; resending in %.1fs",
                    len(failed),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            pending = failed

    def _count(self, o: Outcome) -> None:
        m = self.metrics
        if o.status == "rejected":
            m.rejections.labels(o.reason or "unknown").inc()
        mech = o.mechanism or "unknown"
        if o.kind == "value":
            m.values.labels(mech, o.status).inc()
            m.releases.labels("replay" if o.status == "duplicate" else "subscription").inc(
                o.releases
            )
        elif o.kind == "purchase":
            m.purchases.labels(o.status).inc()
            kind = "replay" if o.status == "duplicate" else "purchase"
            m.releases.labels(kind).inc(o.releases)
        elif o.kind == "quote":
            m.quotes.inc()
        elif o.kind == "registration":
            m.registrations.labels(o.status).inc()
        if o.new_noise:
            m.noise_draws.labels(mech).inc(o.new_noise)
        if o.stream_id and o.status in ("accepted", "fulfilled"):
            st = self.stores.streams.get(o.stream_id)
            if st is not None:
                m.privacy_spent.labels(o.stream_id).set(st.spent)
                m.privacy_cap.labels(o.stream_id).set(st.registration.cap)
                if o.price_minor:
                    m.revenue.labels(o.stream_id, st.registration.currency).inc(o.price_minor)

    async def _ensure_topic(self, topic: str) -> None:
        if topic.startswith(f"{self.topics.prefix}.buyer."):
            spec = self.topics.buyer_spec(topic.rsplit(".", 1)[-1])
            try:
                await self.app.producer.create_topic(
                    spec.name,
                    spec.partitions,
                    self.settings.replication,
                    config=spec.config,
                    timeout=30.0,
                )
            except Exception as exc:  # already exists, or auto-created by the broker
                log.debug("create_topic %s: %s", topic, exc)
        self._known_topics.add(topic)

    # -- broker health --------------------------------------------------------------------------
    async def probe_broker(self, timeout: float = 2.0) -> bool:
        """One metadata round trip; updates the broker_up gauge and logs transitions."""
        ok = False
        try:
            producer: Any = self.app.producer
            client = producer._producer.client
            ok = bool(await asyncio.wait_for(client.fetch_all_metadata(), timeout))
        except Exception as exc:  # timeouts, connection errors, producer not started
            log.debug("broker probe failed: %r", exc)
        self._broker_state(ok)
        return ok

    def _broker_state(self, ok: bool) -> None:
        """Set the broker_up gauge (read by /health) and log each transition once."""
        was = self.metrics.broker_up._value.get()
        self.metrics.broker_up.set(1 if ok else 0)
        if ok != bool(was) and self._probed:
            if ok:
                log.warning("broker %s reachable again", self.settings.broker)
            else:
                log.error("broker %s unreachable: processing is paused", self.settings.broker)
        self._probed = True

    # -- reporting ----------------------------------------------------------------------------
    def refresh_gauges(self) -> None:
        m = self.metrics
        stores = self.stores
        for name in ("streams", "ladders", "purchases"):
            m.state_entries.labels(name).set(len(getattr(stores, name)))
        m.state_bytes.set(
            sum(ld.nbytes for ld in stores.ladders.values() if isinstance(ld, ReleaseState))
        )
        try:
            consumer: Any = self.app.consumer
            lag: dict[str, int] = {}
            for tp in consumer.assignment():
                if tp.topic not in self.topics.inputs():
                    continue
                hw = consumer.highwater(tp)
                pos = consumer._committed_offset.get(tp)  # Faust's record of commits
                if hw is not None and pos is not None:
                    lag[tp.topic] = lag.get(tp.topic, 0) + max(0, int(hw) - int(pos))
            for topic in self.topics.inputs():
                m.consumer_lag.labels(topic).set(lag.get(topic, 0))
        except Exception:  # consumer not started yet
            pass

    def health(self) -> dict[str, Any]:
        last = self.metrics.last_batch._value.get()
        return {
            "status": "ok" if self.metrics.broker_up._value.get() else "degraded",
            "app_id": self.settings.app_id,
            "broker": self.settings.broker,
            "uptime_s": round(time.time() - self._started, 1),
            "last_batch_age_s": None if not last else round(time.time() - last, 3),
            "market_key_id": self.keys.key_id,
        }

    def ledger(self) -> dict[str, Any]:
        """Per-stream revenue and privacy spent, per-buyer holdings, for this worker's streams."""
        streams = {}
        for sid, st in self.stores.streams.items():
            reg = st.registration
            streams[sid] = {
                "seller_id": reg.seller_id,
                "mechanism": reg.mechanism,
                "currency": reg.currency,
                "cap": reg.cap,
                "privacy_spent": st.spent,
                "revenue_minor": st.revenue_minor,
                "values_ingested": st.values_ingested,
                "holders": {b: h.model_dump() for b, h in st.holders.items()},
            }
        return {"market_key_id": self.keys.key_id, "streams": streams}


def create_worker(settings: Settings | None = None) -> MarketWorker:
    return MarketWorker(settings or Settings.from_env())
