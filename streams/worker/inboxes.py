"""Inbox topics (and the catalog), made off the event path: many per request, while batches go on.

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

**Made again.** The same holds for a topic the market published to and lost (anyone may delete a
topic on the embedded broker): :class:`~streams.worker.topic_watch.TopicWatch` hands it to
:meth:`Inboxes.forget` with the records sent to it since it was last seen whole, which go
first in what is held for it; the catalog is such a topic too. It is made again with its
spec (on the embedded broker deleted first if it exists with another partition count: only a
producer's metadata request makes one there) and what was held is sent, in order;
:attr:`Inboxes.remade` hears of it (the catalog is then published again,
:mod:`streams.worker.catalog`) and ``emarket_topics_recreated_total`` counts it.

**The embedded broker's ghosts.** Tansu 0.6 acknowledges a produce to a topic that does not
exist and stores the records where the topic's partition would be: unreadable, until a topic
of that name is made again, whose own offsets then start at 0 *under* them. Its first produces
fail (``UnknownError``: the object exists) and a later batch that overlaps one of them is
acknowledged but never readable (measured: docs/operations.md, "The embedded broker"). So on
that broker a topic made here afresh is checked before anything is sent to it: a latest offset
above 0 means such records are there, and the topic is deleted (which removes them) and made
again. Whatever they were, this market's outputs among them are held here, sent again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ..wire.topics import Topics, TopicSpec
from .config import Settings
from .faust_internals import latest_offsets, learn_topics, topic_leaders
from .producer import Producer
from .tables import Record

__all__ = ["LIST_WAIT_S", "Inboxes"]

log = logging.getLogger("emarket.worker")

_CREATED, _EXISTS = 0, 36  # created, TOPIC_ALREADY_EXISTS
_FINE = {_CREATED, _EXISTS}
LIST_WAIT_S = 30.0
MADE_GRACE_S = 5.0
"""Seconds after this worker made a topic during which a metadata answer without it is taken
for the broker's lag, not a deletion (the embedded broker can answer a metadata request made
just after CreateTopics without the new topic when its CPU is contended)."""
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


async def _no_check(records: list[Record]) -> None:
    return None


class Inboxes:
    """The worker's inbox topics and catalog: those known to exist, those queued (new, or lost
    and to be made again), and what waits for them.

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
        self._lost: set[str] = set()  # forgotten: made again, then counted and announced
        self._wrong: set[str] = set()  # exist with another partition count: deleted first
        self._front: dict[str, int] = {}  # records of a lost topic's held list sent before
        self._given_up: set[str] = set()
        self._made_at: dict[str, float] = {}  # made by this worker within MADE_GRACE_S
        self._size = max(1, settings.inbox_batch)
        self._wake = asyncio.Event()
        self.listed = asyncio.Event()
        """Set once the broker's inboxes are listed (or listing them failed): the agent waits
        for it (at most :data:`LIST_WAIT_S`), so a restarted worker holds nothing for inboxes
        that exist."""
        self.created = 0
        """Inboxes this worker's requests created or found existing (tests, diagnostics)."""
        self.confirm: Callable[[list[Record]], Awaitable[None]] = _no_check
        """Checks, before a batch's records are routed, that the topics they go to still
        exist (:meth:`~streams.worker.topic_watch.TopicWatch.before_send`): a lost one is
        forgotten, so its records are held."""
        self.remade: list[Callable[[list[str]], None]] = []
        """Told of topics made again after they were lost, once what was held is sent."""

    def pending(self) -> int:
        """Inboxes queued and not yet usable."""
        return len(self._queued)

    def queued(self, topic: str) -> bool:
        """Whether ``topic`` waits to be made (new, or lost)."""
        return topic in self._queued

    def is_lost(self, topic: str) -> bool:
        """Whether ``topic`` was lost and is not made again yet (what is sent to it now is
        sent to a topic that is not there)."""
        return topic in self._lost

    def gave_up(self, topic: str) -> bool:
        """Whether the broker refused to make ``topic`` too often (its records are then
        dead-lettered, not held)."""
        return topic in self._given_up

    def forget(self, topic: str, records: Iterable[Record] = (), *, wrong: bool = False) -> None:
        """``topic`` is gone (or exists with another partition count: ``wrong``): hold what is
        sent to it from now on, make it again, and send ``records`` first (sent to it since it
        was last seen whole, oldest first), before anything held later."""
        spec = self.topics.published_spec(topic)
        if spec is None:
            return
        self.known.discard(topic)
        self._given_up.discard(topic)
        self._lost.add(topic)
        if wrong:
            self._wrong.add(topic)
        self.requeue(topic, records)
        self._queued.setdefault(topic, spec)
        self._wake.set()
        self.producer.metrics.inboxes_waiting.set(len(self._queued))

    def requeue(self, topic: str, records: Iterable[Record]) -> None:
        """Hold ``records`` of the lost ``topic`` (sent to it while it was not there) after
        those requeued before and before anything held since it was lost."""
        held = self._held.setdefault(topic, [])
        front = self._front.get(topic, 0)
        items = list(records)
        held[front:front] = items
        self._front[topic] = front + len(items)

    def look(self, records: list[Record]) -> Awaitable[None]:
        """Start :attr:`confirm` on the topics of ``records`` now, to run beside the batch's
        state round trips (a look costs one of its own, ~0.4 ms); :meth:`admit` waits for it."""
        return asyncio.ensure_future(self.confirm(records))

    async def admit(
        self,
        specs: list[TopicSpec],
        records: list[Record],
        done: Callable[[], None],
        looked: Awaitable[None] | None = None,
    ) -> tuple[list[Record], bool]:
        """:meth:`hold`, once :attr:`confirm` has looked at the topics of ``records`` (the
        look :meth:`look` started, else one now)."""
        await (self.confirm(records) if looked is None else looked)
        return self.hold(specs, records, done)

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
            made = None if r.topic in self.known else self.topics.published_spec(r.topic)
            if made is None:
                now.append(r)
                continue
            self._queued.setdefault(r.topic, made)
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
            admin = AIOKafkaAdminClient(
                bootstrap_servers=self.settings.bootstrap,
                request_timeout_ms=60_000,
                **self.settings.aiokafka_auth(),
            )
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
            log.warning(
                "could not list the broker's topics (%r): inboxes will be checked as they are used",
                exc,
            )
            return
        self.known.update(n for n in names if self.topics.published_spec(n) is not None)

    async def _make(self, admin: AIOKafkaAdminClient, specs: list[TopicSpec]) -> None:
        """One CreateTopics request for ``specs``; release the inboxes that now exist (or that
        the broker refused too often); back off on an outage."""
        t0 = time.perf_counter()
        await self._delete(
            admin, [s.name for s in specs if s.name in self._wrong], "another partition count"
        )
        made = await self._create(admin, specs)
        self._resize(time.perf_counter() - t0, len(specs))
        if made is None:  # the broker did not answer: nothing changed, try again later
            await asyncio.sleep(1.0)
            return
        ready, fresh = made
        ready = await self._without_ghosts(admin, ready, fresh)
        if ready:
            try:
                await learn_topics(self.app, ready)
            except Exception as exc:  # the producer learns them on its first send instead
                log.debug("learning %d new topics failed: %r", len(ready), exc)
            await self._release(ready)
        took = time.perf_counter() - t0
        log.info(
            "inboxes: %d of %d ready in %.0f ms; %d queued",
            len(ready),
            len(specs),
            took * 1e3,
            len(self._queued),
        )
        await asyncio.sleep(max(took * (1 / DUTY - 1), 0.5 if len(ready) < len(specs) else 0))

    async def _create(
        self, admin: AIOKafkaAdminClient, specs: list[TopicSpec]
    ) -> tuple[list[str], list[str]] | None:
        """Names of ``specs`` that exist after one request (or are given up on), and those of
        them this request created; None if the broker did not answer."""
        try:
            response = await admin.create_topics(
                [
                    NewTopic(
                        s.name, s.partitions, self.settings.replication, topic_configs=s.config
                    )
                    for s in specs
                ]
            )
        except Exception as exc:  # an outage: the producer's probes report it
            log.warning("creating %d inboxes failed (%r); retrying", len(specs), exc)
            return None
        ready: list[str] = []
        fresh: list[str] = []
        for name, code, *rest in response.topic_errors:
            if code in _FINE:
                ready.append(name)
                if code == _CREATED:
                    fresh.append(name)
                continue
            n = self._failures[name] = self._failures.get(name, 0) + 1
            log.error(
                "the broker refused to create inbox %s (error %s %s), attempt %d",
                name,
                code,
                rest[0] if rest else "",
                n,
            )
            if n >= self.settings.permanent_retries:  # its outputs are dead-lettered
                ready.append(name)
                self._given_up.add(name)
        return ready, fresh

    async def _without_ghosts(
        self, admin: AIOKafkaAdminClient, ready: list[str], fresh: list[str]
    ) -> list[str]:
        """``ready`` less the topics just made on the embedded broker that already hold
        records written while no such topic existed (the module docstring): those are
        deleted, which removes the records, and stay queued to be made again."""
        if not self.settings.tansu or not fresh:
            return ready
        try:
            leaders = await topic_leaders(self.app, fresh) or {}
            ends = await latest_offsets(
                self.app,
                {(t, p): node for t, parts in leaders.items() for p, node in parts.items()},
            )
        except Exception as exc:  # then they are used as they are
            log.warning("could not check %d new topics for earlier records: %r", len(fresh), exc)
            return ready
        ghosted = sorted({t for (t, _), end in ends.items() if end > 0})
        if not ghosted:
            return ready
        wipe = [t for t in ghosted if self._failures.get(t, 0) < self.settings.permanent_retries]
        for t in wipe:
            self._failures[t] = self._failures.get(t, 0) + 1
        log.warning(
            "%d topics made again already held records written while they did not "
            "exist (the embedded broker keeps those): deleting and making them again: "
            "%s",
            len(wipe),
            wipe[:5],
        )
        await self._delete(admin, wipe, "records written while it did not exist")
        return [n for n in ready if n not in set(wipe)]

    async def _delete(self, admin: AIOKafkaAdminClient, names: list[str], why: str) -> None:
        """Delete ``names`` (topics of ours that are not as made), to make them again."""
        if not names:
            return
        self._wrong.difference_update(names)
        try:
            await admin.delete_topics(names)
        except Exception as exc:  # making them says whether they still exist
            log.warning("deleting %d topics (%s) failed: %r", len(names), why, exc)
        else:
            log.warning("deleted %d topics to make them again (%s): %s", len(names), why, names[:5])

    def just_made(self, topic: str) -> bool:
        """Whether this worker made ``topic`` less than :data:`MADE_GRACE_S` ago: a metadata
        answer without it is then the broker's lag (checked again at the next look)."""
        made = self._made_at.get(topic)
        return made is not None and time.monotonic() - made < MADE_GRACE_S

    async def _release(self, names: list[str]) -> None:
        """Send what is held for ``names`` (and what arrives meanwhile), then mark them known
        and give the acknowledgements that waited only for them; a topic lost again meanwhile
        stays queued."""
        remade = [n for n in names if n in self._lost]
        self._lost.difference_update(names)
        for n in names:
            self._front.pop(n, None)
        while batch := [r for n in names for r in self._held.pop(n, [])]:
            await self.producer.send_all(batch)
        done = {n for n in names if n not in self._lost}
        self.known |= done
        now = time.monotonic()
        self._made_at = {n: t for n, t in self._made_at.items() if now - t < MADE_GRACE_S}
        self._made_at.update(dict.fromkeys(done, now))
        self.created += len(done)
        for n in done:
            self._queued.pop(n, None)
            self._failures.pop(n, None)
        self.producer.metrics.inboxes_waiting.set(len(self._queued))
        self._wake_waiters(done)
        remade = [n for n in remade if n in done]
        if remade:
            self._announce(remade)

    def _wake_waiters(self, done: set[str]) -> None:
        still: list[_Waiter] = []
        for w in self._waiters:
            w.topics -= done
            if w.topics:
                still.append(w)
            else:
                w.done()
        self._waiters = still

    def _announce(self, remade: list[str]) -> None:
        """Count the topics made again and tell :attr:`remade`."""
        for n in remade:
            kind = "catalog" if n == self.topics.catalog else "inbox"
            self.producer.metrics.topics_recreated.labels(kind).inc()
        log.warning(
            "made %d lost topics again and sent what was held for them: %s", len(remade), remade[:5]
        )
        for hear in self.remade:
            try:
                hear(remade)
            except Exception:  # a listener must not keep outputs from being released
                log.exception("a listener of topics made again failed")
