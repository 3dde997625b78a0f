"""Noticing that a topic the market publishes to from its own state is gone.

The market writes answers to inboxes and entries to the catalog, topics that anyone may delete
on the embedded broker (it has no ACLs). What that broker does then (measured, Tansu 0.6;
docs/operations.md, "The embedded broker"):

* a produce to a deleted topic is **acknowledged**, and the record is stored where no reader
  finds it: the answer is lost without an error, a dead letter or a metric;
* the producer's next metadata refresh (every new inbox it learns, every 5 minutes) names the
  topic again and the broker **creates** it, with 4 partitions and none of its settings;
* a topic deleted under a reader gives it no error: the reader waits, and once the topic is made
  again it waits at its old position, past the new records.

So an error from a send cannot be relied on, and the worker looks itself, cheaply and naming only
the topics concerned (a request for every topic costs the broker more with every inbox):

* **before a batch's outputs are sent** (:meth:`TopicWatch.before_send`): one metadata request
  naming the inboxes and the catalog they go to (~0.4 ms for 10 names at 2,000 topics); a topic
  missing, or with another partition count than its spec, is handed to
  :meth:`Inboxes.forget <streams.worker.inboxes.Inboxes.forget>` and its outputs are held
  there until it is made again;
* **after**: every record acknowledged on such a topic is kept (:meth:`TopicWatch.acked`) until
  a check that began after its acknowledgement finds its topic whole; a topic found gone has its
  kept records sent again, first, once it is made again. That covers a deletion between the
  check and the send, and a send refused with ``UnknownTopicOrPartition`` (a broker that does
  not create topics, :meth:`TopicWatch.missing`);
* **every** :data:`CHECK_S` **seconds** (:meth:`TopicWatch.sweep`): the catalog, the topics with
  records kept, and the next :data:`SWEEP` inboxes of the accounts this worker holds, round
  robin; and the catalog's latest offset, which never moves back while the topic lives: lower
  than at the last look, the catalog was deleted and made again (by someone else) meanwhile and
  lost its entries, which are then published again (:mod:`streams.worker.catalog`).

A record is kept in memory only: a worker that dies while a topic it wrote to is gone loses
what it had kept for it (a buyer's resent purchase is answered again, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from ..wire.ids import ID_PATTERN
from ..wire.topics import Topics
from .faust_internals import latest_offsets, topic_leaders
from .inboxes import Inboxes
from .tables import Record

__all__ = ["CHECK_S", "KEPT_BYTES", "SWEEP", "TopicWatch"]

log = logging.getLogger("emarket.worker")

CHECK_S = 2.0
"""Seconds between two periodic checks (the broker probe's period)."""
SWEEP = 200
"""Inboxes of held accounts named per periodic check beside the others: 4,096 accounts are all
looked at within about 40 s, for ~2 ms of the broker's time per check."""
CHECK_TIMEOUT_S = 5.0
"""Longest a batch's outputs wait for the look before they are sent (a broker this slow is in
trouble the probes report; what is sent is kept, and looked at again at the next check)."""
CONFIRM_S = 1.0
"""Seconds before a topic missing from a metadata answer is asked about again (see
:meth:`TopicWatch._confirm_missing`)."""
NAMES_PER_REQUEST = 500
"""Most topics one metadata request names (~5 ms at 2,000 topics on the embedded broker)."""
KEPT_BYTES = 64 * 1024 * 1024
"""Bytes of acknowledged records kept past which a check is made at once (they are kept a
check period: ~2 s of outputs)."""
_ID = re.compile(ID_PATTERN)


class TopicWatch:
    """The checks above, over what :class:`~streams.worker.inboxes.Inboxes` knows.

    Parameters
    ----------
    app : faust.App
        Its producer's client asks the broker (:func:`~.faust_internals.topic_leaders`).
    topics : Topics
        Which topics are published from the market's state, and their specs.
    inboxes : Inboxes
        Knows which topics exist; forgets the lost ones and makes them again.
    accounts : MutableMapping
        The accounts this worker holds (its ``accounts`` store): whose inboxes are swept.
    remake_misfits : bool
        Whether a topic found with another partition count than its spec is deleted and made
        again (the embedded broker: only a topic deleted and made again by a producer's
        metadata request has one, and what it holds was written since, kept here). Elsewhere
        such a topic was made by someone on purpose and may hold a party's history: it is
        reported once and used as it is.
    """

    def __init__(
        self,
        app: Any,
        topics: Topics,
        inboxes: Inboxes,
        accounts: MutableMapping[str, Any],
        *,
        remake_misfits: bool = True,
    ) -> None:
        self.app = app
        self.remake_misfits = remake_misfits
        self._misfits: set[str] = set()
        self.topics = topics
        self.inboxes = inboxes
        self.accounts = accounts
        self.on_emptied: Callable[[], None] | None = None
        """Told when the catalog was found emptied (made again by someone else)."""
        self._kept: dict[str, list[tuple[int, Record]]] = {}
        self._kept_bytes = 0
        self._check = 0
        self._catalog_end: int | None = None
        self._sweep: list[str] = []
        self._wake = asyncio.Event()

    # -- the producer's side -------------------------------------------------------------------
    def acked(self, r: Record) -> None:
        """Keep ``r``, acknowledged, until its topic is next seen whole (or hold it again at
        once if its topic is already known to be gone: it went nowhere)."""
        if not self.topics.is_published(r.topic):
            return
        if self.inboxes.is_lost(r.topic):
            self.inboxes.requeue(r.topic, [r])
            return
        self._kept.setdefault(r.topic, []).append((self._check, r))
        self._kept_bytes += len(r.value or b"")
        if self._kept_bytes > KEPT_BYTES:
            self._wake.set()

    def missing(self, r: Record) -> bool:
        """Take ``r``, refused because its topic does not exist, to send once it is made again
        (False for a topic the broker refused to make too often: ``r`` is dead-lettered)."""
        if not self.topics.is_published(r.topic) or self.inboxes.gave_up(r.topic):
            return False
        if self.inboxes.is_lost(r.topic):  # known already: behind what was sent before it
            self.inboxes.requeue(r.topic, [r])
        else:
            self._lose(r.topic, "the broker says it does not exist", after=[r])
        return True

    # -- the checks ----------------------------------------------------------------------------
    async def before_send(self, records: list[Record]) -> None:
        """Look at the topics ``records`` go to that are known to exist (the others are held
        anyway); a lost one is forgotten, so they are held for it."""
        known, published = self.inboxes.known, self.topics.is_published
        names = {r.topic for r in records if r.topic in known and published(r.topic)}
        if names:
            await self.check(sorted(names))

    async def check(self, names: list[str]) -> dict[str, dict[int, int]]:
        """Ask the broker about ``names`` (a metadata request per :data:`NAMES_PER_REQUEST`
        that creates nothing): forget those gone or made with another partition count; let go
        of what was kept for the others until now. Returns what was found (partition → leader
        of each topic that exists); empty if the broker did not answer."""
        found: dict[str, dict[int, int]] = {}
        for i in range(0, len(names), NAMES_PER_REQUEST):
            chunk = names[i : i + NAMES_PER_REQUEST]
            self._check += 1
            began = self._check
            try:
                got = await asyncio.wait_for(topic_leaders(self.app, chunk), CHECK_TIMEOUT_S)
            except Exception as exc:  # an outage (the probes report it), or not started yet
                log.debug("checking %d topics failed: %r", len(chunk), exc)
                return found
            if got is None:
                return found
            got = await self._confirm_missing(chunk, got)
            found.update(got)
            self._judge(chunk, got, began)
        return found

    async def _confirm_missing(
        self, names: list[str], got: dict[str, dict[int, int]]
    ) -> dict[str, dict[int, int]]:
        """``got`` with the ``names`` it lacks asked about once more after
        :data:`CONFIRM_S`: the embedded broker's metadata answer can lack a topic that exists
        (seen under load, long after the topic was made), and a topic judged gone is made
        again and logged as an error. A topic missing from both answers is gone."""
        missing = [n for n in names if n not in got]
        if not missing:
            return got
        await asyncio.sleep(CONFIRM_S)
        try:
            again = await asyncio.wait_for(topic_leaders(self.app, missing), CHECK_TIMEOUT_S)
        except Exception as exc:  # an outage: judge on the first answer
            log.debug("asking again about %d topics failed: %r", len(missing), exc)
            return got
        return {**got, **(again or {})}

    def _judge(self, names: Iterable[str], found: dict[str, dict[int, int]], began: int) -> None:
        for name in names:
            spec = self.topics.published_spec(name)
            if spec is None or self.inboxes.is_lost(name):
                continue
            parts = found.get(name)
            if parts is None and self.inboxes.just_made(name):
                continue  # made a moment ago: the broker's metadata lags; looked at again later
            if parts is None:
                self._lose(name, "it does not exist")
            elif len(parts) != spec.partitions and self.remake_misfits:
                why = (
                    f"it has {len(parts)} partitions, not {spec.partitions} (made by someone "
                    "else, or by a producer's metadata request)"
                )
                self._lose(name, why, wrong=True)
            else:
                if len(parts) != spec.partitions and name not in self._misfits:
                    self._misfits.add(name)
                    log.error(
                        "topic %s has %d partitions, not %d: made by someone else; the "
                        "market writes to its partition 0 (readers read every one)",
                        name,
                        len(parts),
                        spec.partitions,
                    )
                self._settle(name, began)

    def _settle(self, name: str, began: int) -> None:
        """Let go of what was kept for ``name`` before the check numbered ``began``."""
        kept = self._kept.get(name)
        if not kept:
            return
        still = [(n, r) for n, r in kept if n >= began]
        self._kept_bytes -= sum(len(r.value or b"") for n, r in kept if n < began)
        if still:
            self._kept[name] = still
        else:
            del self._kept[name]

    def _lose(
        self, name: str, why: str, *, wrong: bool = False, after: Iterable[Record] = ()
    ) -> None:
        kept = [r for _, r in self._kept.pop(name, [])]
        self._kept_bytes -= sum(len(r.value or b"") for r in kept)
        log.error(
            "topic %s is gone (%s): holding what is sent to it, making it again, and "
            "sending again the %d records sent to it since it was last seen",
            name,
            why,
            len(kept),
        )
        if name == self.topics.catalog:
            self._catalog_end = None  # the catalog made again starts at offset 0
        self.inboxes.forget(name, [*kept, *after], wrong=wrong)

    # -- the periodic check --------------------------------------------------------------------
    async def run(self) -> None:
        """Check every :data:`CHECK_S` seconds (sooner when much is kept), until cancelled."""
        await self.inboxes.listed.wait()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), CHECK_S)
            self._wake.clear()
            try:
                await self.sweep()
            except Exception:  # a bug here must not end the checks
                log.exception("checking the published topics failed")

    async def sweep(self) -> None:
        """One periodic check: the catalog, the topics with records kept, the next inboxes of
        the held accounts; then whether the catalog was emptied."""
        catalog = self.topics.catalog
        names = {catalog, *self._kept, *self._next_inboxes()}
        names = {n for n in names if not self.inboxes.is_lost(n) and not self.inboxes.queued(n)}
        found = await self.check(sorted(names))
        if catalog in found and not self.inboxes.is_lost(catalog):
            await self._catalog_offsets(found[catalog])

    def _next_inboxes(self) -> list[str]:
        """The inboxes of the next :data:`SWEEP` accounts this worker holds (a snapshot of the
        store's ids is taken when the last one is used up); with v2 inboxes, ``<p>.inbox``."""
        if self.topics.inboxes == 2:  # one inbox topic for every account
            return [self.topics.shared_inbox]
        if not self._sweep:
            self._sweep = [a for a in list(self.accounts) if _ID.fullmatch(a)]
        take, self._sweep = self._sweep[-SWEEP:], self._sweep[:-SWEEP]
        return [self.topics.inbox(a) for a in take]

    async def _catalog_offsets(self, leaders: dict[int, int]) -> None:
        """Compare the catalog's latest offset with the last one seen: lower means it was
        deleted and made again since, without the entries it held."""
        catalog = self.topics.catalog
        try:
            ends = await latest_offsets(self.app, {(catalog, p): n for p, n in leaders.items()})
        except Exception as exc:  # looked at again at the next check
            log.debug("reading the catalog's offsets failed: %r", exc)
            return
        end = sum(ends.values()) if len(ends) == len(leaders) else None
        if end is None:
            return
        before, self._catalog_end = self._catalog_end, end
        if before is not None and end < before:
            log.error(
                "the catalog's latest offset went back from %d to %d: it was deleted and "
                "made again, without its entries; publishing them again",
                before,
                end,
            )
            self.inboxes.producer.metrics.topics_recreated.labels("catalog").inc()
            if self.on_emptied is not None:
                self.on_emptied()
