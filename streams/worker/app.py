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

from market.chain import noise_step

from ..core import MarketCore, MarketKeys, Stores
from . import web
from .batch import BatchProcessor
from .catalog import CatalogRebuild
from .config import Settings
from .deadline import STOP_DEADLINE_S, exit_after
from .directory import AccountReplica
from .faults import FaultInjector
from .faust_internals import (
    attach_intake,
    attach_takeover,
    install_batched_intake,
    install_takeover,
    install_tansu_compat,
    proving_assignor,
    quiet_libraries,
    skip_table_settle,
    tune_fetch_wait,
)
from .group_watch import DESCRIBE_EVERY_S, GroupWatch
from .history import CheckpointBook, StateReader
from .inboxes import LIST_WAIT_S, Inboxes
from .intake import POLL_RECORDS, Intake
from .local_checkpoints import LocalCheckpoints
from .membership import SKEW_MS, Membership
from .metrics import Metrics, build_metrics
from .page_cache import PageCache
from .producer import Producer
from .progress import Progress, progress_topic
from .progress_watch import ProgressWatch
from .recovery import Takeover
from .secrets import load_or_create_keys, membership_key, state_keys
from .state_records import StateSeal
from .tables import StateContext, WriteBackTable, register_codecs
from .topic_watch import TopicWatch

__all__ = ["MarketWorker", "create_worker"]

log = logging.getLogger("emarket.worker")

REBALANCE_TIMEOUT_S = 60.0
"""Faust's ``broker_rebalance_timeout`` (its default), set explicitly: a membership proof may be
this old when the leader judges it, plus the clocks' skew (:mod:`streams.worker.membership`)."""


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
        install_takeover()
        register_codecs()
        self.topics = settings.topics()
        self.keys = keys or load_or_create_keys(settings.data_dir)
        self.metrics: Metrics = build_metrics()
        self.group = self._group_watch()
        self.app = self._app()
        self.intake = Intake(self.app, set(self.topics.inputs()))
        attach_intake(self.app, self.intake)
        self.progress, self.tables, self.replica = self._state()
        self.stores = Stores(**self.tables)
        self.core = self._core()
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
            self.progress,
            self.replica,
            profile=settings.profile_batches,
        )
        self.takeover = self._takeover()
        self.replica.on_checkpoint = self.takeover.observed
        self.progress_watch = ProgressWatch(
            self.app, settings, self.progress, self.producer, self.metrics
        )
        self.started_at = time.time()
        self._vectors = web.VectorBytes()
        self._wire()

    def _core(self) -> MarketCore:
        """The event logic over this worker's tables, with the limits its settings give."""
        settings = self.settings
        return MarketCore(
            self.stores,
            self.keys,
            self.topics,
            require_encryption=settings.require_encryption,
            accept_clear_values=settings.accept_clear_values,
            dedup_horizon_ms=int(settings.dedup_horizon * 1000),
            limits=settings.limits,
            replica=self.replica,
        )

    def _takeover(self) -> Takeover:
        """What fences a partition taken over (a new epoch), attached to the app's rebalances."""
        takeover = Takeover(
            self.app,
            list(self.tables.values()),
            self.state,
            self.progress,
            self.producer,
            self.metrics,
            self._consumer_settings(),
            self.topics.inputs(),
        )
        attach_takeover(self.app, takeover)
        return takeover

    def _rebuilding(self) -> tuple[TopicWatch, CatalogRebuild]:
        """What notices a lost inbox or catalog and what publishes the catalog again, wired to
        the producer (every acknowledged output, every send to a missing topic) and to the
        inboxes (the check before a batch's outputs; the topics made again)."""
        watch = TopicWatch(
            self.app,
            self.topics,
            self.inboxes,
            self.stores.accounts,
            remake_misfits=self.settings.tansu,
        )
        catalog = CatalogRebuild(self.core, self.stores, self.inboxes, self.producer, self.metrics)
        self.producer.on_acked = watch.acked
        self.producer.on_missing = watch.missing
        self.inboxes.confirm = watch.before_send
        self.inboxes.remade.append(catalog.remade)
        self.inboxes.remade.append(self._inboxes_remade)
        watch.on_emptied = catalog.start
        return watch, catalog

    def _inboxes_remade(self, topics: list[str]) -> None:
        """Tell the replay records which inboxes lost what they held: with v2 inboxes, a lost
        ``<p>.inbox`` is every account's (each named by its v1 inbox, as the records know
        them), so a resend is answered in full again (docs/protocol.md §8.1)."""
        names = list(topics)
        if self.topics.inboxes == 2 and self.topics.shared_inbox in names:
            names += [self.topics.inbox(a) for a in list(self.stores.accounts)]
        self.core.ctx.records.inboxes_remade(names)

    def _state(self) -> tuple[Progress, dict[str, WriteBackTable], AccountReplica]:
        """The tables, their checkpoints and the account replica: every changelog record is
        sealed by the market and read back only through one reader, which refuses and counts
        what is not the market's committed, newest state (:mod:`streams.worker.history`)."""
        s, m = self.settings, self.metrics
        seal = StateSeal(*state_keys(self.keys.noise_secret))
        reader = StateReader(seal, m.state_refused, m.state_copies, m.state_uncommitted)
        local = LocalCheckpoints(s.data_dir / f"{s.app_id}.checkpoints", seal)
        progress = Progress(seal, progress_topic(s.app_id), local=local)
        self.state = StateContext(
            seal,
            reader,
            CheckpointBook(reader),
            self.topics.inputs(),
            progress.version_for,
            progress.account,
            progress.live.get,
        )
        tables = {
            name: WriteBackTable.create(self.app, name, s.partitions, self.state)
            for name in Stores.NAMES
        }
        replica = AccountReplica(
            self._consumer_settings(),
            tables["accounts"].table.changelog_topic.get_topic_name(),
            progress.topic,
            reader,
        )
        return progress, tables, replica

    def _consumer_settings(self) -> dict[str, Any]:
        """How the worker's own readers of the changelogs connect (no consumer group)."""
        s = self.settings
        return {
            "bootstrap_servers": s.bootstrap,
            "fetch_max_wait_ms": min(s.fetch_max_wait_ms, 100),
            **s.aiokafka_auth(),
        }

    def _group_watch(self) -> GroupWatch:
        """The proofs this worker gives and checks in its consumer group (the app id)."""
        s = self.settings
        membership = Membership(
            membership_key(self.keys.noise_secret),
            s.app_id,
            window_ms=int(REBALANCE_TIMEOUT_S * 1000) + SKEW_MS,
        )
        inputs = frozenset((t, p) for t in self.topics.inputs() for p in range(s.partitions))
        admin = {
            "bootstrap_servers": s.bootstrap,
            "request_timeout_ms": 10_000,
            **s.aiokafka_auth(),
        }
        return GroupWatch(membership, inputs, self.metrics, admin)

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
            producer_max_request_size=s.limits.max_message_bytes,
            consumer_max_fetch_size=max(16 * 1024 * 1024, 4 * s.limits.max_message_bytes),
            # stop at once on SIGTERM: never wait for a stream to drain
            stream_wait_empty=False,
            # a fetched batch is handed to the intake whole: bound it (Faust's default is the
            # whole fetch, up to 50 MB)
            broker_max_poll_records=POLL_RECORDS,
            # workers prove their membership to each other; a stranger is given nothing
            PartitionAssignor=proving_assignor(self.group),
            broker_rebalance_timeout=REBALANCE_TIMEOUT_S,
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
                    log.critical(
                        "a batch failed outside the core; stopping the worker so "
                        "that it is processed again",
                        exc_info=exc,
                    )
                    exit_after(STOP_DEADLINE_S, worker.on_forced_exit)
                    await app.crash(exc)
                    return
                # the batch acknowledged its events as their outputs were acknowledged

        self._agent = market
        self._pages()
        self._timers()

    def _pages(self) -> None:
        app, settings, worker = self.app, self.settings, self
        ledger, metrics = self._page_caches()

        @app.page("/metrics")
        async def metrics_page(view: Any, request: Any) -> Any:
            body = await metrics.get()
            return view.bytes(body, content_type=web.METRICS_CONTENT_TYPE)

        @app.page("/health")
        async def health_page(view: Any, request: Any) -> Any:
            pending = sum(web.input_lag(worker.consumer(), worker.topics).values())
            body = web.health(
                worker.metrics,
                settings,
                worker.keys,
                worker.started_at,
                pending,
                worker.unverified(),
                worker.group.health(),
                worker.openings(),
            )
            return view.json(body, status=200 if body["status"] == "ok" else 503)

        @app.page("/ledger")
        async def ledger_page(view: Any, request: Any) -> Any:
            if not web.ledger_access(request.headers.get("Authorization"), worker.keys):
                return view.json(
                    {
                        "error": "the ledger needs the operators' token: send "
                        "'Authorization: Bearer <token>' with the operator_token of the "
                        "worker's data directory"
                    },
                    status=401,
                )
            return view.bytes(await ledger.get(), content_type="application/json")

    def _page_caches(self) -> tuple[PageCache, PageCache]:
        """``/ledger`` and ``/metrics`` as served: each from its newest build, rebuilt at most
        once per ``EMARKET_LEDGER_EVERY`` / ``EMARKET_METRICS_EVERY`` seconds and answered at
        most ``EMARKET_PAGES_PER_SECOND`` times a second (:mod:`streams.worker.page_cache`),
        each build counted."""
        worker, builds = self, self.metrics.page_builds

        async def ledger() -> bytes:
            builds.labels("ledger").inc()
            return await web.ledger_page(worker.stores, worker.keys)

        async def metrics() -> bytes:
            builds.labels("metrics").inc()
            worker.refresh_gauges()
            return await web.metrics_page(worker.metrics)

        s = self.settings
        return (
            PageCache(
                ledger,
                s.ledger_every,
                setting="EMARKET_LEDGER_EVERY",
                per_second=s.pages_per_second,
            ),
            PageCache(
                metrics,
                s.metrics_every,
                setting="EMARKET_METRICS_EVERY",
                per_second=s.pages_per_second,
            ),
        )

    def _timers(self) -> None:
        app, settings, worker = self.app, self.settings, self

        @app.timer(5.0)  # type: ignore[untyped-decorator]
        async def refresh() -> None:
            worker.refresh_gauges()

        @app.task  # type: ignore[untyped-decorator]
        async def first_probe() -> None:
            quiet_libraries(settings.log_level)
            compiled, line = noise_step()
            log.log(logging.INFO if compiled else logging.WARNING, "%s", line)
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

        @app.task  # type: ignore[untyped-decorator]
        async def watch_progress() -> None:
            await worker.progress_watch.run()

        @app.timer(DESCRIBE_EVERY_S)  # type: ignore[untyped-decorator]
        async def describe_group() -> None:
            await worker.group.poll()

        async def stop_replica(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
            await worker.replica.stop()
            await worker.group.close()

        app.on_before_shutdown.connect(stop_replica)

        @app.timer(2.0)  # type: ignore[untyped-decorator]
        async def probe() -> None:
            await worker.producer.probe()

        self._rebalance_hooks()

    def _rebalance_hooks(self) -> None:
        app, settings, worker = self.app, self.settings, self

        async def revoked(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
            # the partitions' next owner recovers them from the changelogs: let the batch in
            # flight commit first (it cannot be made to stop half way: its checkpoint decides)
            try:
                await asyncio.wait_for(worker.batches.idle.wait(), settings.session_timeout / 2)
            except TimeoutError:
                log.warning(
                    "partitions revoked while a batch is still being written: what it "
                    "writes after the next owner's claim will not count there"
                )

        app.on_partitions_revoked.connect(revoked)

        def rebalanced(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
            # the tables now hold what other workers wrote while they owned these partitions
            worker.core.invalidate_indexes()
            worker.catalog.ready.set()  # the streams store now holds this worker's streams
            log.info("rebalance complete; expiry indexes will be rebuilt from the tables")

        app.on_rebalance_complete.connect(rebalanced)

    def refresh_gauges(self) -> None:
        web.refresh_gauges(
            self.metrics,
            self.stores,
            self.consumer(),
            self.topics,
            self.settings.stall_seconds,
            self.started_at,
            self._vectors,
        )
        self.metrics.openings_behind.set(1 if self.openings()["behind"] else 0)
        self.metrics.partitions_unverified.labels("tables").set(len(self.progress.unverified))
        self.metrics.partitions_unverified.labels("replica").set(len(self.replica.unverified))
        self.metrics.replica_accounts.set(len(self.replica))

    def openings(self) -> dict[str, Any]:
        """How account openings fare on this worker (``/health``)."""
        return web.openings_health(self.settings, self.core.ctx.allowance, self.inboxes.pending())

    def unverified(self) -> dict[str, str]:
        """What state this worker holds that is not what its checkpoint commits, and why:
        partitions it does not serve, and partitions whose accounts its replica does not use."""
        return {
            **{f"partition {p}": why for p, why in sorted(self.progress.unverified.items())},
            **{
                f"accounts of partition {p}": why
                for p, why in sorted(self.replica.unverified.items())
            },
        }

    def consumer(self) -> Any:
        """Faust's consumer of the app, or None before the app has built it."""
        try:
            return self.app.consumer
        except Exception:  # not started yet
            return None


def create_worker(settings: Settings | None = None) -> MarketWorker:
    return MarketWorker(settings or Settings.from_env())
