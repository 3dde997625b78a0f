"""Publishing the catalog again from the market's state, when the catalog was lost.

Each stream's catalog entry is written once, when the stream is registered; the catalog is the
only place buyers find a stream's terms and prices, and sellers the key they seal their values
to. A catalog deleted (anyone may, on the embedded broker) or emptied would otherwise lose the
entry of every stream registered before, for good. The bytes of each entry are kept with the
stream's registration (``Registered.catalog_payload``, the ``registered`` store), so when
:class:`~streams.worker.topic_watch.TopicWatch` finds the catalog gone (and
:class:`~streams.worker.inboxes.Inboxes` has made it again) or emptied, each worker publishes
again the entries of the streams it holds — its own partitions' streams, those of its
``streams`` store — signed for the catalog (:func:`streams.core.registrations.entry_again`).

Bounded work per step: :data:`CHUNK` entries are signed and sent, then the loop pauses
:data:`PAUSE` seconds, so thousands of streams never hold the event loop (a chunk is ~10 ms of
CPU) and purchases go on between chunks. A catalog lost again while it runs starts it over.
"""

from __future__ import annotations

import asyncio
import logging

from ..core import MarketCore, Stores
from ..core.registrations import entry_again
from ..core.state import InconsistentStream, registered_of
from .inboxes import Inboxes
from .metrics import Metrics
from .producer import Producer
from .tables import Record

__all__ = ["CHUNK", "PAUSE", "CatalogRebuild"]

log = logging.getLogger("emarket.worker")

CHUNK = 100
"""Entries signed and sent per step (~0.1 ms of CPU each: an Ed25519 signature)."""
PAUSE = 0.05
"""Seconds between two steps: at most ~2,000 entries a second, 4,096 streams in ~3 s."""


def _nothing() -> None:
    return None


class CatalogRebuild:
    """Publishes again the catalog entries of this worker's streams, when told to.

    Parameters
    ----------
    core : MarketCore
        Signs the entries (its context: the market's keys and topics).
    stores : Stores
        This worker's ``streams`` (which streams it holds) and ``registered`` (their entries).
    inboxes : Inboxes
        Holds the entries while the catalog is not made yet.
    producer, metrics
        Acknowledged sends; ``emarket_catalog_entries_republished_total``.
    """

    def __init__(
        self,
        core: MarketCore,
        stores: Stores,
        inboxes: Inboxes,
        producer: Producer,
        metrics: Metrics,
    ) -> None:
        self.core = core
        self.stores = stores
        self.inboxes = inboxes
        self.producer = producer
        self.metrics = metrics
        self._due = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once the tables are recovered (the first rebalance completed): before, the
        ``streams`` store does not hold this worker's streams yet."""
        self.published = 0
        """Entries published again since the worker started (tests, diagnostics)."""

    def start(self) -> None:
        """Publish every entry again (from the first, if a pass is under way)."""
        self._due.set()

    def remade(self, names: list[str]) -> None:
        """:attr:`Inboxes.remade`'s listener: the catalog made again is empty."""
        if self.core.ctx.topics.catalog in names:
            self.start()

    async def run(self) -> None:
        """Publish the entries again each time :meth:`start` is called, until cancelled."""
        while True:
            await self._due.wait()
            await self.ready.wait()
            self._due.clear()
            try:
                await self._publish()
            except Exception:  # a bug here must not end the task; the next loss tries again
                log.exception("publishing the catalog again failed")

    async def _publish(self) -> None:
        ids = sorted(self.stores.streams)  # this worker's streams, now
        sent = 0
        for i in range(0, len(ids), CHUNK):
            if self._due.is_set():  # lost again: start over
                log.warning("the catalog was lost again after %d of %d entries", sent, len(ids))
                return
            records = self._entries(ids[i : i + CHUNK])
            ready, _ = await self.inboxes.admit([], records, _nothing)
            await self.producer.send_all(ready)
            sent += len(records)
            self.published += len(records)
            self.metrics.catalog_republished.inc(len(records))
            await asyncio.sleep(PAUSE)
        log.warning("published the catalog entries of %d streams again", sent)

    def _entries(self, ids: list[str]) -> list[Record]:
        """The catalog entries of the streams ``ids`` still served (a stream gone meanwhile,
        or whose record and registration do not belong together, has none)."""
        ctx = self.core.ctx
        out: list[Record] = []
        for sid in ids:
            stored = self.stores.streams.get(sid)
            if stored is None:
                continue
            try:
                registered = registered_of(self.stores, sid, stored)
            except InconsistentStream:  # not served: nothing to publish
                continue
            entry = entry_again(ctx, registered)
            out.append(Record(entry.topic, entry.key, entry.value, headers=list(entry.headers)))
        return out
