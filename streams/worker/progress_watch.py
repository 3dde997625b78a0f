"""The progress changelog, watched while the worker runs: lost, it is written again.

The checkpoints are the root of the market's history on the broker (:mod:`.checkpoints`), and
on a broker without ACLs anyone may delete their topic while the workers run. Until it is
noticed, every checkpoint written is lost (the embedded broker acknowledges a write to a
deleted topic and keeps it where no reader finds it), every account replica stops seeing
commits (an account's key rotation would wait for its checkpoint for ever), and a restart would
find no checkpoint at all. So every :data:`CHECK_S` seconds each worker looks at the topic with
one metadata request and one ListOffsets (naming that topic only, never creating it): missing,
with another partition count than the market's, or with a partition whose latest offset went
back (deleted and made again by someone), it is made again and the newest checkpoint of every
partition this worker serves is written to it again, under the progress lock (no batch's
checkpoint comes in between). The account replicas read it from the start again when they see
its end below their position (:mod:`.directory`).

On the embedded broker a topic made again may already hold records written while it did not
exist, which no reader finds; such a topic is deleted and made again until it starts empty.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from .config import Settings
from .faust_internals import latest_offsets, topic_leaders
from .metrics import Metrics
from .producer import Producer
from .progress import Progress, progress_spec

__all__ = ["CHECK_S", "ProgressWatch"]

log = logging.getLogger("emarket.state")

CHECK_S = 2.0
"""Seconds between two looks at the progress changelog."""
_TRIES = 3


class ProgressWatch:
    """Looks at the progress changelog and writes it again when it is lost (module docstring)."""

    def __init__(
        self, app: Any, settings: Settings, progress: Progress, producer: Producer, metrics: Metrics
    ) -> None:
        self.app = app
        self.settings = settings
        self.progress = progress
        self.producer = producer
        self.metrics = metrics
        self.spec = progress_spec(settings.app_id, settings.partitions)
        self._ends: dict[int, int] = {}

    async def run(self) -> None:
        """Look every :data:`CHECK_S` seconds, until cancelled."""
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                await self.look()
            except Exception:  # a bug here must not end the watch
                log.exception("looking at the progress changelog failed")

    async def look(self) -> str | None:
        """One look; if the topic is lost, write it again. Returns why it was lost, or None."""
        why = await self._lost()
        if why is None:
            return None
        misfit = why.startswith("it has")
        if misfit and not self.settings.tansu:
            log.critical(
                "the progress changelog %s %s: made by someone else; checkpoints cannot "
                "be written to it (docs/operations.md, 'State that does not verify')",
                self.spec.name,
                why,
            )
            return why
        log.error(
            "the progress changelog %s is lost (%s): making it again and writing the newest "
            "checkpoint of every partition this worker serves to it",
            self.spec.name,
            why,
        )
        self.metrics.topics_recreated.labels("progress").inc()
        async with self.progress.lock:
            await self._remake(delete_first=misfit)
            live = list(self.progress.live.values())
            records = [self.progress.record(cp) for cp in live]
            await self.producer.send_all(records, dead_letter=False)
            self.progress.keep(records)
        self._ends.clear()
        return why

    async def _lost(self) -> str | None:
        name = self.spec.name
        found = await topic_leaders(self.app, [name])
        if found is None:  # no broker known yet
            return None
        parts = found.get(name)
        if parts is None:
            return "it does not exist"
        if len(parts) != self.spec.partitions:
            return f"it has {len(parts)} partitions, not {self.spec.partitions}"
        ends = await latest_offsets(self.app, {(name, p): node for p, node in parts.items()})
        went_back = [
            p
            for p, end in ((p, ends.get((name, p))) for p in parts)
            if end is not None and end < self._ends.get(p, 0)
        ]
        self._ends.update({p: end for (_, p), end in ends.items()})
        if went_back:
            return f"the latest offset of partitions {went_back} went back: made again by someone"
        return None

    async def _remake(self, *, delete_first: bool = False) -> None:
        """Make the topic again with its spec if it does not exist. One this worker has just
        made on the embedded broker that already holds records (written while it did not
        exist: no reader finds them) is deleted and made again, until it starts empty; one that
        exists already (another worker made it again first) is left as it is."""
        s = self.settings
        admin = AIOKafkaAdminClient(
            bootstrap_servers=s.bootstrap, request_timeout_ms=10000, **s.aiokafka_auth()
        )
        await admin.start()
        try:
            if delete_first:  # made by someone else with another partition count
                await admin.delete_topics([self.spec.name])
            for _ in range(_TRIES):
                new = NewTopic(
                    self.spec.name,
                    self.spec.partitions,
                    s.replication,
                    topic_configs=self.spec.config,
                )
                response = await admin.create_topics([new])
                made = any(code == 0 for _, code, *_ in response.topic_errors)
                if not (made and s.tansu) or await self._empty():
                    return
                log.warning(
                    "the progress changelog made again holds records written while it "
                    "did not exist: deleting and making it again"
                )
                await admin.delete_topics([self.spec.name])
        finally:
            await admin.close()

    async def _empty(self) -> bool:
        name = self.spec.name
        parts = (await topic_leaders(self.app, [name]) or {}).get(name, {})
        ends = await latest_offsets(self.app, {(name, p): node for p, node in parts.items()})
        return not any(ends.values())
