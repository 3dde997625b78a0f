"""The Faust worker: the app, its tables, the one agent, and the routes of its web pages.

One agent (concurrency 1) consumes registrations, values and purchases together, so the events
of a stream are applied strictly in order; the three topics are co-partitioned by ``stream_id``
and Faust assigns the same partition numbers of all three to the same worker. The consumer
hands the agent whole fetched batches (:mod:`streams.worker.intake`); the agent gives each to
:class:`~streams.worker.batch.BatchProcessor`, then acknowledges its records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import faust

from ..core import MarketCore, MarketKeys, Stores
from ..wire.topics import Topics
from . import web
from .batch import BatchProcessor
from .catalog import CatalogRebuild
from .config import Settings
from .deadline import STOP_DEADLINE_S, exit_after
from .directory import AccountReplica
from .faults import FaultInjector
from .faust_internals import (
    attach_intake,
    install_batched_intake,
    install_tansu_compat,
    quiet_libraries,
    skip_table_settle,
    tune_fetch_wait,
)
from .inboxes import LIST_WAIT_S, Inboxes
from .intake import POLL_RECORDS, Intake
from .metrics import Metrics, build_metrics
from .producer import Producer
from .secrets import load_or_create_keys, state_mac_key
from .state_mac import StateGuard, StateMac
from .tables import WriteBackTable, register_codecs
from .topic_watch import TopicWatch

__all__ = ["MarketWorker", "create_worker"]

log = logging.getLogger("emarket.worker")


class MarketWorker:
    """A Faust app wired to the market core, with metrics and web endpoints."""

    def __init__(self, settings: Settings, keys: MarketKeys | None = None) -> None:
        self.settings = settings
        self.on_forced_exit: Callable[[], None] | None = None  # before a forced exit (runner)
        if settings.tansu:
            install_tansu_compat()
        tune_fetch_wait(settings.fetch_max_wait_ms)
        skip_table_settle()
        install_batched_intake()
        register_codecs()
        self.topics = Topics(settings.prefix, settings.partitions)
        self.keys = keys or load_or_create_keys(settings.data_dir)
        self.metrics: Metrics = build_metrics()
        self.app = self._app()
        self.intake = Intake(self.app, set(self.topics.inputs()))
        attach_intake(self.app, self.intake)
        self.state_guard, self.tables, self.replica = self._state()
        self.stores = Stores(**self.tables)
        self.core = MarketCore(
            self.stores,
            self.keys,
            self.topics,
            require_encryption=settings.require_encryption,
            accept_clear_values=settings.accept_clear_values,
            dedup_horizon_ms=int(settings.dedup_horizon * 1000),
            limits=settings.limits(),
            replica=self.replica,
        )
        self.producer = Producer(
            self.app, settings, self.topics, self.metrics, FaultInjector.from_env()
        )
        self.inboxes = Inboxes(self.app, settings, self.topics, self.producer)
        self.watch, self.catalog = self._rebuilding()
        self.batches = BatchProcessor(
            self.core,
            list(self.tables.values()),
            self.producer,
            self.metrics,
            self.producer.faults,
            self.inboxes,
            self.intake.ack,
            self.replica,
            profile=settings.profile_batches,
        )
        self.started_at = time.time()
        self._vectors = web.VectorBytes()
        self._wire()

    def _rebuilding(self) -> tuple[TopicWatch, CatalogRebuild]:
        """What notices a lost inbox or catalog and what publishes the catalog again, wired to
        the producer (every acknowledged output, every send to a missing topic) and to the
        inboxes (the check before a batch's outputs; the topics made again)."""
        watch = TopicWatch(self.app, self.topics, self.inboxes, self.stores.accounts,
                           remake_misfits=self.settings.tansu)  # fmt: skip
        catalog = CatalogRebuild(self.core, self.stores, self.inboxes, self.producer,
                                 self.metrics)  # fmt: skip
        self.producer.on_acked = watch.acked
        self.producer.on_missing = watch.missing
        self.inboxes.confirm = watch.before_send
        self.inboxes.remade.append(catalog.remade)
        watch.on_emptied = catalog.start
        return watch, catalog

    def _state(self) -> tuple[StateGuard, dict[str, WriteBackTable], AccountReplica]:
        """The tables and the account replica, sharing one guard: every changelog record is
        written with the market's authenticator and read back only through it."""
        s = self.settings
        guard = StateGuard(
            StateMac(state_mac_key(self.keys.noise_secret)), self.metrics.state_refused
        )
        tables = {
            name: WriteBackTable.create(self.app, name, s.partitions, guard)
            for name in Stores.NAMES
        }
        replica = AccountReplica(
            s.bootstrap,
            tables["accounts"].table.changelog_topic.get_topic_name(),
            guard,
            fetch_wait_ms=min(s.fetch_max_wait_ms, 100),
            **s.aiokafka_auth(),
        )
        return guard, tables, replica

    def _app(self) -> faust.App:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # keys may come from the env
        return faust.App(
            s.app_id,
            broker=s.broker,
            store=s.store,
            datadir=str(s.data_dir / "faust"),
            topic_partitions=s.partitions,
            topic_replication_factor=s.replication,
            broker_session_timeout=s.session_timeout,
            broker_heartbeat_interval=s.heartbeat_interval,
            broker_request_timeout=max(30.0, s.session_timeout * 3),
            broker_commit_interval=s.commit_interval,
            broker_credentials=s.faust_credentials(),
            consumer_auto_offset_reset="earliest",
            web_bind=s.web_host,
            web_host=s.web_host,
            web_port=s.web_port,
            web_in_thread=False,
            table_standby_replicas=0,
            # no output may exceed the broker's message size: a larger one fails at once and is
            # dead-lettered instead of being resent forever
            producer_max_request_size=s.max_message_bytes,
            consumer_max_fetch_size=max(16 * 1024 * 1024, 4 * s.max_message_bytes),
            # stop at once on SIGTERM: never wait for a stream to drain
            stream_wait_empty=False,
            # a fetched batch is handed to the intake whole: bound it (Faust's default is the
            # whole fetch, up to 50 MB)
            broker_max_poll_records=POLL_RECORDS,
        )

    def _wire(self) -> None:
        app, settings, worker = self.app, self.settings, self
        inputs = app.topic(
            *self.topics.inputs(),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=settings.partitions,
        )

        @app.agent(inputs, name="market", concurrency=1)
        async def market(stream: Any) -> None:
            # The agent subscribes the input topics (the group assigns their partitions and
            # the tables' with them), but its records come a fetched batch at a time through
            # the intake, not event by event through the stream (streams/worker/intake.py).
            # Subscribing is what iterating the stream would have done first.
            app.topics.add(stream.channel.clone(is_iterator=True))
            intake = worker.intake
            with contextlib.suppress(TimeoutError):  # then inboxes are confirmed as used
                await asyncio.wait_for(worker.inboxes.listed.wait(), LIST_WAIT_S)
            while True:
                events = await intake.take(settings.batch_max)
                try:
                    await worker.batches.process(events)
                except Exception as exc:  # a bug outside the core's guard (it never raises)
                    # Not restarted: a restarted agent would go on with later records, and
                    # Faust could then commit past these. The worker stops; its partitions'
                    # records are read again from the committed offsets.
                    log.critical("a batch failed outside the core; stopping the worker so "
                                 "that it is processed again", exc_info=exc)  # fmt: skip
                    exit_after(STOP_DEADLINE_S, worker.on_forced_exit)
                    await app.crash(exc)
                    return
                # the batch acknowledged its events as their outputs were acknowledged

        self._agent = market
        self._pages()
        self._timers()

    def _pages(self) -> None:
        app, settings, worker = self.app, self.settings, self

        @app.page("/metrics")
        async def metrics_page(view: Any, request: Any) -> Any:
            worker.refresh_gauges()
            return view.bytes(
                web.metrics_text(worker.metrics), content_type=web.METRICS_CONTENT_TYPE
            )

        @app.page("/health")
        async def health_page(view: Any, request: Any) -> Any:
            pending = sum(web.input_lag(worker.consumer(), worker.topics).values())
            body = web.health(worker.metrics, settings, worker.keys, worker.started_at, pending)
            return view.json(body, status=200 if body["status"] == "ok" else 503)

        @app.page("/ledger")
        async def ledger_page(view: Any, request: Any) -> Any:
            access = web.ledger_access(request.headers.get("Authorization"), worker.keys)
            if access is None:
                return view.json({"error": "not the operators' token"}, status=401)
            return view.json(web.ledger(worker.stores, worker.keys, per_buyer=access))

    def _timers(self) -> None:
        app, settings, worker = self.app, self.settings, self

        @app.timer(5.0)  # type: ignore[untyped-decorator]
        async def refresh() -> None:
            worker.refresh_gauges()

        @app.task  # type: ignore[untyped-decorator]
        async def first_probe() -> None:
            quiet_libraries(settings.log_level)
            await worker.producer.probe()
            await worker.replica.start(settings.partitions)

        @app.task  # type: ignore[untyped-decorator]
        async def make_inboxes() -> None:
            await worker.inboxes.run()

        @app.task  # type: ignore[untyped-decorator]
        async def watch_topics() -> None:
            await worker.watch.run()

        @app.task  # type: ignore[untyped-decorator]
        async def publish_catalog() -> None:
            await worker.catalog.run()

        async def stop_replica(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
            await worker.replica.stop()

        app.on_before_shutdown.connect(stop_replica)

        @app.timer(2.0)  # type: ignore[untyped-decorator]
        async def probe() -> None:
            await worker.producer.probe()

        def rebalanced(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
            # the tables now hold what other workers wrote while they owned these partitions
            worker.core.invalidate_indexes()
            worker.catalog.ready.set()  # the streams store now holds this worker's streams
            log.info("rebalance complete; expiry indexes will be rebuilt from the tables")

        app.on_rebalance_complete.connect(rebalanced)

    def refresh_gauges(self) -> None:
        web.refresh_gauges(self.metrics, self.stores, self.consumer(), self.topics,
                           self.settings.stall_seconds, self.started_at, self._vectors)  # fmt: skip

    def consumer(self) -> Any:
        """Faust's consumer of the app, or None before the app has built it."""
        try:
            return self.app.consumer
        except Exception:  # not started yet
            return None


def create_worker(settings: Settings | None = None) -> MarketWorker:
    return MarketWorker(settings or Settings.from_env())

