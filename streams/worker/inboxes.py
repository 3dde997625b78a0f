"""Inbox topics, made off the event path: many per request, while batches go on.

Creating a topic costs the broker more with every topic it holds, and a batch that waited for
the inboxes of the accounts it opened would hold every other event behind them (2,000 openings:
minutes). So a batch never waits for a topic:

* an output to an inbox this worker has not seen exist is **held** here, in order, and the
  inbox is queued for creation (whether it was just opened, here or on another worker, or
  existed before a restart: CreateTopics answers "already exists" and that is success);
* :meth:`Inboxes.run`, a task of its own, creates the queued inboxes up to
  ``Settings.inbox_batch`` per CreateTopics request, as many as take the broker about
  :data:`REQUEST_S` (busy at most half the time,
  :data:`DUTY`), has the producer learn them with one metadata request
  (:func:`~streams.worker.faust_internals.learn_topics`), sends what was held for them and
  only then treats them as existing: an inbox's outputs keep their order;
* the events whose outputs were held are acknowledged only once those outputs are (the batch
  hands :meth:`Inboxes.hold` their acknowledgement): a worker that dies first leaves them
  uncommitted, and the replay re-emits them and queues their inboxes again (an opening replayed
  is a duplicate whose confirmation names its inbox).

Held outputs never block anything else: the batch's other outputs are sent at once, the next
batches proceed, and an input partition's committed offset only waits behind the held events
(``Intake.ack`` keeps each partition's acknowledgements in order). An inbox the broker refuses
to create for good (``Settings.permanent_retries`` attempts) has its outputs sent anyway, to be
dead-lettered by the producer like any output to a missing topic; a broker outage is waited out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ..wire.topics import Topics, TopicSpec
from .config import Settings
from .faust_internals import learn_topics
from .producer import Producer
from .tables import Record

__all__ = ["LIST_WAIT_S", "Inboxes"]

log = logging.getLogger("emarket.worker")

_FINE = {0, 36}  # created, or TOPIC_ALREADY_EXISTS
LIST_WAIT_S = 30.0
"""Longest the agent waits for the broker's inboxes to be listed before its first batch."""
DUTY = 0.5
"""Most of the time the worker spends making inboxes back to back: after a request that took
t, it waits t·(1/DUTY − 1). Creating a topic costs the broker more with every topic it holds
(the embedded broker: ~1.4 ms at 2,000 topics, ~2.7 ms at 3,000), and requests back to back
left the event path's own requests (state, outputs, fetches, commits) waiting behind them."""
REQUEST_S = 0.1
"""How long one CreateTopics request should keep the broker busy. A request's inboxes are
sized from the last one's time per inbox (at most ``Settings.inbox_batch``): the embedded
broker answers other clients' requests late while it creates topics, and its time per topic
grows with the topics it holds (one request of 100 took 0.3 s at 2,000 topics and 1.8 s at
4,000), so a fixed count let a purchase wait behind a request ever longer as accounts grew."""


@dataclass
class _Waiter:
    """Acknowledgements to give once every inbox in ``topics`` has its held outputs sent."""

    topics: set[str]
    done: Callable[[], None]


class Inboxes:
    """The worker's inbox topics: those known to exist, those queued, and what waits for them.

    Parameters
    ----------
    app : faust.App
        Its producer sends the held outputs (through ``producer``) and learns the new topics.
    settings : Settings
        The broker, credentials, replication, ``inbox_batch`` and ``permanent_retries``.
    topics : Topics
        Which topics are inboxes, and how one is created.
    producer : Producer
        Acknowledged sends, with dead letters; its metrics show the inboxes waiting.
    """

    def __init__(self, app: Any, settings: Settings, topics: Topics, producer: Producer) -> None:
        self.app = app
        self.settings = settings
        self.topics = topics
        self.producer = producer
        self.known: set[str] = set()
        self._queued: dict[str, TopicSpec] = {}  # insertion order: oldest first
        self._held: dict[str, list[Record]] = {}
        self._waiters: list[_Waiter] = []
        self._failures: dict[str, int] = {}
        self._size = max(1, settings.inbox_batch)
        self._wake = asyncio.Event()
        self.listed = asyncio.Event()
        """Set once the broker's inboxes are listed (or listing them failed): the agent waits
        for it (at most :data:`LIST_WAIT_S`), so a restarted worker holds nothing for inboxes
        that exist."""
        self.created = 0
        """Inboxes this worker's requests created or found existing (tests, diagnostics)."""

    def pending(self) -> int:
        """Inboxes queued and not yet usable."""
        return len(self._queued)

    def hold(
        self, specs: list[TopicSpec], records: list[Record], done: Callable[[], None]
    ) -> tuple[list[Record], bool]:
        """Queue ``specs`` for creation; return the ``records`` that may be sent now, and
        whether any was held.

        The others (to inboxes not known to exist) are held until their inbox is made; ``done``
        is called once they are all acknowledged. If none was held, nothing refers to ``done``:
        the caller acknowledges once it has sent the records returned.
        """
        for spec in specs:
            if spec.name not in self.known:
                self._queued.setdefault(spec.name, spec)
        now: list[Record] = []
        waiting: set[str] = set()
        for r in records:
            if r.topic in self.known or not self.topics.is_inbox(r.topic):
                now.append(r)
                continue
            self._queued.setdefault(r.topic, self.topics.inbox_topic_spec(r.topic))
            self._held.setdefault(r.topic, []).append(r)
            waiting.add(r.topic)
        if waiting:
            self._waiters.append(_Waiter(waiting, done))
        if self._queued:
            self._wake.set()
            self.producer.metrics.inboxes_waiting.set(len(self._queued))
        return now, bool(waiting)

    async def run(self) -> None:
        """Create queued inboxes and release what waits for them, until cancelled."""
        admin = await self._admin()
        try:
            try:
                await self._learn_existing(admin)
            finally:
                self.listed.set()
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queued:
                    try:
                        await self._make(admin, list(self._queued.values())[: self._chunk()])
                    except Exception:  # a bug here must not leave held outputs for good
                        log.exception("making inboxes failed; trying again")
                        await asyncio.sleep(1.0)
        finally:
            await admin.close()

    async def _admin(self) -> AIOKafkaAdminClient:
        """A started admin client, waiting out a broker not yet (or no longer) reachable."""
        while True:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.bootstrap,
                                        request_timeout_ms=60_000,
                                        **self.settings.aiokafka_auth())  # fmt: skip
            try:
                await admin.start()
                return admin
            except Exception as exc:  # the producer's probes report the outage
                log.warning("inboxes: no admin connection yet (%r)", exc)
                await admin.close()
                await asyncio.sleep(1.0)

    def _chunk(self) -> int:
        """Inboxes in the next request (:data:`REQUEST_S`)."""
        return self._size

    def _resize(self, took: float, count: int) -> None:
        """Size the next request from this one: ``count`` inboxes in ``took`` seconds."""
        cap = max(1, self.settings.inbox_batch)
        per = took / max(count, 1)
        self._size = cap if per <= 0 else max(1, min(cap, int(REQUEST_S / per)))

    async def _learn_existing(self, admin: AIOKafkaAdminClient) -> None:
        """Start from the inboxes the broker has (one listing), so a restarted worker holds
        nothing for them; without it each would cost one "already exists" answer."""
        try:
            names = await admin.list_topics()
        except Exception as exc:  # a slow start: inboxes are then confirmed as they are used
            log.warning("could not list the broker's topics (%r): inboxes will be checked "
                        "as they are used", exc)  # fmt: skip
            return
        self.known.update(n for n in names if self.topics.is_inbox(n))

    async def _make(self, admin: AIOKafkaAdminClient, specs: list[TopicSpec]) -> None:
        """One CreateTopics request for ``specs``; release the inboxes that now exist (or that
        the broker refused too often); back off on an outage."""
        t0 = time.perf_counter()
        ready = await self._create(admin, specs)
        self._resize(time.perf_counter() - t0, len(specs))
        if ready is None:  # the broker did not answer: nothing changed, try again later
            await asyncio.sleep(1.0)
            return
        if ready:
            try:
                await learn_topics(self.app, ready)
            except Exception as exc:  # the producer learns them on its first send instead
                log.debug("learning %d new topics failed: %r", len(ready), exc)
            await self._release(ready)
        took = time.perf_counter() - t0
        log.info("inboxes: %d of %d ready in %.0f ms; %d queued", len(ready), len(specs),
                 took * 1e3, len(self._queued))  # fmt: skip
        await asyncio.sleep(max(took * (1 / DUTY - 1), 0.5 if len(ready) < len(specs) else 0))

    async def _create(self, admin: AIOKafkaAdminClient, specs: list[TopicSpec]) -> list[str] | None:
        """Names of ``specs`` that exist after one request (or are given up on), else None."""
        try:
            response = await admin.create_topics(
                [NewTopic(s.name, s.partitions, self.settings.replication, topic_configs=s.config)
                 for s in specs]
            )  # fmt: skip
        except Exception as exc:  # an outage: the producer's probes report it
            log.warning("creating %d inboxes failed (%r); retrying", len(specs), exc)
            return None
        ready: list[str] = []
        for name, code, *rest in response.topic_errors:
            if code in _FINE:
                ready.append(name)
                continue
            n = self._failures[name] = self._failures.get(name, 0) + 1
            log.error("the broker refused to create inbox %s (error %s %s), attempt %d",
                      name, code, rest[0] if rest else "", n)  # fmt: skip
            if n >= self.settings.permanent_retries:  # its outputs are dead-lettered
                ready.append(name)
        return ready

    async def _release(self, names: list[str]) -> None:
        """Send what is held for ``names`` (and what arrives meanwhile), then mark them known
        and give the acknowledgements that waited only for them."""
        while batch := [r for n in names for r in self._held.pop(n, [])]:
            await self.producer.send_all(batch)
        done = set(names)
        self.known |= done
        self.created += len(done)
        for n in names:
            self._queued.pop(n, None)
            self._failures.pop(n, None)
        self.producer.metrics.inboxes_waiting.set(len(self._queued))
        still: list[_Waiter] = []
        for w in self._waiters:
            w.topics -= done
            if w.topics:
                still.append(w)
            else:
                w.done()
        self._waiters = still
