"""Sending a batch's records and waiting until the broker has acknowledged every one.

During a broker outage :meth:`Producer.send_all` holds the batch (nothing new is processed,
nothing is lost) and resends what was not acknowledged, while ``emarket_broker_up``, ``/health``
and the log report the outage. Resending is safe: changelog records and outputs are idempotent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from ..wire.topics import Topics
from .config import Settings
from .faults import FaultInjector
from .metrics import Metrics
from .tables import Record

__all__ = ["Producer"]

log = logging.getLogger("emarket.worker")


class Producer:
    """The worker's side of the broker: sends with acknowledgements, topics, health probes."""

    def __init__(
        self, app: Any, settings: Settings, topics: Topics, metrics: Metrics, faults: FaultInjector
    ) -> None:
        self.app = app
        self.settings = settings
        self.topics = topics
        self.metrics = metrics
        self.faults = faults
        self._known_topics: set[str] = set()
        self._probed = False

    async def send_all(self, records: list[Record], fail_point: str | None = None) -> None:
        """Send every record; return once the broker has acknowledged them all."""
        pending = records
        delay = 0.2
        while pending:
            futures: list[Any] = []
            failed: list[Record] = []
            try:
                for i, r in enumerate(pending):
                    if fail_point and i == len(pending) // 2:
                        self.faults.hit(fail_point)
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
                self.broker_state(False)
                log.error(
                    "%d messages not acknowledged by the broker; resending in %.1fs",
                    len(failed),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            pending = failed

    async def ensure_topics(self, names: Iterable[str]) -> None:
        """Create the buyer topics among ``names`` that this worker has not seen yet."""
        for topic in set(names) - self._known_topics:
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

    async def probe(self, timeout: float = 2.0) -> bool:
        """One metadata round trip; updates the broker_up gauge and logs transitions."""
        ok = False
        try:
            producer: Any = self.app.producer
            client = producer._producer.client
            ok = bool(await asyncio.wait_for(client.fetch_all_metadata(), timeout))
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
