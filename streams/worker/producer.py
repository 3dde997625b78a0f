"""Sending a batch's records and waiting until the broker has acknowledged every one.

Two kinds of failure, treated differently:

* **transient** — the broker is unreachable, a leader moves, a request times out: the batch is
  held and what was not acknowledged is resent until it is (nothing new is processed, nothing
  is lost), while ``emarket_broker_up``, ``/health`` and the log report the outage;
* **permanent** — the message is too large, the worker may not write the topic, the topic does
  not exist: resending cannot help. After ``permanent_retries`` attempts the record is
  *dead-lettered* (its topic, key, size, SHA-256, a prefix and the reason go to
  ``<p>.deadletters``, and ``emarket_dead_letters_total`` counts it) and the batch goes on.
  One bad message can no longer stop the market.

A record to a topic the market publishes to from its own state (an inbox, the catalog) is
followed further (:mod:`streams.worker.topic_watch`): :attr:`Producer.on_acked` hears of each
one acknowledged, and :attr:`Producer.on_missing` may take one whose topic the broker says does
not exist, to hold it until the topic is made again, instead of dead-lettering it.

Resending is safe: changelog records and outputs are idempotent.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka import errors as kerr

from ..wire.events import DeadLetter
from ..wire.topics import Topics
from .config import Settings
from .faults import FaultInjector
from .faust_internals import probe_broker
from .metrics import Metrics, dead_letter_kind
from .tables import Record

__all__ = ["PERMANENT", "Producer"]

log = logging.getLogger("emarket.worker")

PERMANENT: tuple[type[BaseException], ...] = (
    kerr.MessageSizeTooLargeError,
    kerr.RecordTooLargeError,
    kerr.TopicAuthorizationFailedError,
    kerr.ClusterAuthorizationFailedError,
    kerr.InvalidTopicError,
    kerr.UnknownTopicOrPartitionError,
    kerr.CorruptRecordException,
    kerr.UnsupportedForMessageFormatError,
)
"""Errors resending cannot cure (``UnknownTopicOrPartition`` gets its retries first: a topic
just created may take a moment to be known)."""


class Producer:
    """The worker's side of the broker: acknowledged sends and health probes."""

    def __init__(
        self, app: Any, settings: Settings, topics: Topics, metrics: Metrics, faults: FaultInjector
    ) -> None:
        self.app = app
        self.settings = settings
        self.topics = topics
        self.metrics = metrics
        self.faults = faults
        self._probed = False
        self.on_acked: Callable[[Record], None] | None = None
        """Told of every record acknowledged that is not a changelog record."""
        self.on_missing: Callable[[Record], bool] | None = None
        """Asked about a record refused because its topic does not exist: True if it took
        the record (held until the topic is made again), so it is not dead-lettered."""

    async def send_all(
        self, records: list[Record], fail_point: str | None = None, *, dead_letter: bool = True
    ) -> None:
        """Send every record; return once each is acknowledged or dead-lettered.

        State records are sent with ``dead_letter=False``: a changelog record the broker
        refuses for good is retried forever (logged; /health turns "stalled") rather than
        skipped, because the batch's outputs must never be sent before its state is durable.
        The core keeps every state record well under the message limit, so this means a
        misconfigured broker, for an operator to fix.
        """
        pending = records
        delay = 0.2
        attempts: dict[int, int] = {}
        while pending:
            failed = await self._attempt(pending, fail_point)
            retry: list[Record] = []
            for r, exc in failed:
                if isinstance(exc, kerr.UnknownTopicOrPartitionError) and self._taken(r):
                    continue
                if dead_letter and isinstance(exc, PERMANENT):
                    n = attempts[id(r)] = attempts.get(id(r), 0) + 1
                    if n >= self.settings.permanent_retries:
                        await self._dead_letter(r, exc)
                        continue
                retry.append(r)
            if retry:
                transient = any(not isinstance(e, PERMANENT) for _, e in failed)
                if transient:
                    self.broker_state(False)
                log.error(
                    "%d messages not acknowledged (%r); resending in %.1fs",
                    len(retry),
                    failed[0][1],
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            pending = retry

    def _partition(self, r: Record) -> int | None:
        """``r``'s partition: an inbox's or the catalog's is 0, the one its spec has, whatever
        the producer last learnt of the topic (one made again under it by someone else may
        have had more)."""
        if r.partition is None and self.topics.is_published(r.topic):
            return 0
        return r.partition

    def _taken(self, r: Record) -> bool:
        return self.on_missing is not None and self.on_missing(r)

    async def _attempt(
        self, pending: list[Record], fail_point: str | None
    ) -> list[tuple[Record, BaseException]]:
        futures: list[tuple[Record, Any]] = []
        failed: list[tuple[Record, BaseException]] = []
        for i, r in enumerate(pending):
            if fail_point and i == len(pending) // 2:
                self.faults.hit(fail_point)
            try:
                fut = await self.app.producer.send(
                    r.topic, r.key, r.value, self._partition(r), None, r.headers
                )
                futures.append((r, fut))
            except Exception as exc:  # refused before sending (size, closed producer)
                failed.append((r, exc))
        results = await asyncio.gather(*(f for _, f in futures), return_exceptions=True)
        for (r, _), res in zip(futures, results, strict=True):
            if isinstance(res, BaseException):
                failed.append((r, res))
            elif r.table is not None:
                r.table.persisted(res)
            elif self.on_acked is not None:
                self.on_acked(r)
        return failed

    async def _dead_letter(self, r: Record, exc: BaseException) -> None:
        value = r.value or b""
        reason = type(exc).__name__
        letter = DeadLetter(
            topic=r.topic,
            key=None if r.key is None else r.key.decode("utf-8", "replace")[:200],
            reason=reason,
            error=str(exc)[:500],
            value_bytes=len(value),
            value_sha256=hashlib.sha256(value).hexdigest(),
            value_prefix=value[:1024].decode("utf-8", "replace"),
            failed_at_ms=time.time_ns() // 1_000_000,
        )
        self.metrics.dead_letters.labels(dead_letter_kind(exc)).inc()
        log.error("dead-lettered a %d-byte message to %s: %s", len(value), r.topic, reason)
        if r.topic != self.topics.deadletters:
            await self.send_all(
                [Record(self.topics.deadletters, r.key, letter.model_dump_json().encode())]
            )

    async def probe(self, timeout: float = 2.0) -> bool:
        """One metadata round trip; updates the broker_up gauge and logs transitions."""
        ok = False
        try:
            ok = await asyncio.wait_for(probe_broker(self.app, self.topics.catalog), timeout)
        except Exception as exc:  # timeouts, connection errors, producer not started
            log.debug("broker probe failed: %r", exc)
        self.broker_state(ok)
        return ok

    def broker_state(self, ok: bool) -> None:
        """Record whether the broker answers, logging each transition once."""
        changed = self.metrics.set_broker_up(ok)
        if changed and self._probed:
            if ok:
                log.warning("broker %s reachable again", self.settings.broker)
            else:
                log.error("broker %s unreachable: processing is paused", self.settings.broker)
        self._probed = True
