"""The partitions this worker serves, and the one place their checkpoints are written.

For each partition it serves, :class:`Progress` holds the newest checkpoint committed
(:mod:`streams.worker.checkpoints`). Three things write a new one, always under :attr:`lock`
and always with a greater version:

* a **batch** (:meth:`begin_batch` … :meth:`batch_checkpoints`, :meth:`commit_batch`): the
  batch's records carry the version of their partition's next checkpoint, each store's count
  and digest sum follow every key it writes (:meth:`account`), and the checkpoint is written
  once the broker has acknowledged every record (``streams/worker/batch.py``);
* an **offset commit** (:meth:`positions`): before Faust commits input offsets to the consumer
  group, the partition's checkpoint records them as its input positions, so that the group's
  committed offset is never ahead of a position this worker proved (one that is, was
  committed by someone else: :mod:`streams.worker.recovery`);
* a **claim** (:mod:`streams.worker.recovery`): a worker that takes a partition on starts a new
  epoch.

A partition that is not served (not assigned here, or whose state did not verify) has no
checkpoint here, and nothing may be written for it (:class:`NotServed`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from ..wire.topics import TopicSpec
from .checkpoints import Checkpoint, StoreSum
from .history import PROGRESS
from .local_checkpoints import LocalCheckpoints
from .state_records import DIGEST_MODULUS, Stamp, StateSeal, Version
from .tables import Record

__all__ = ["NotServed", "Progress", "progress_spec", "progress_topic"]


def progress_topic(app_id: str) -> str:
    """The progress changelog of the worker app ``app_id`` (named like Faust's changelogs)."""
    return f"{app_id}-progress-changelog"


def progress_spec(app_id: str, partitions: int) -> TopicSpec:
    """How the progress changelog is made: one partition per input partition, compacted (a
    partition's newest checkpoint is all that matters)."""
    return TopicSpec(progress_topic(app_id), partitions, {"cleanup.policy": "compact"})


class NotServed(RuntimeError):
    """State was about to be written for a partition this worker does not serve."""


class Progress:
    """Checkpoints of the partitions this worker serves (see the module docstring).

    Parameters
    ----------
    seal : StateSeal
        Seals checkpoints, and digests entries (the sums a checkpoint carries).
    topic : str
        The progress changelog.
    clock : callable
        Seconds since the epoch (checkpoints say when they were written).
    """

    def __init__(
        self,
        seal: StateSeal,
        topic: str,
        clock: Callable[[], float] = time.time,
        local: LocalCheckpoints | None = None,
    ) -> None:
        self.seal = seal
        self.topic = topic
        self.clock = clock
        self.local = local
        self.live: dict[int, Checkpoint] = {}
        self.unverified: dict[int, str] = {}
        """Partitions assigned here whose state did not verify, and why (not served)."""
        self.lock = asyncio.Lock()
        self._batch: dict[int, Checkpoint] = {}

    # -- what is served ----------------------------------------------------------------------
    def serves(self, partition: int) -> bool:
        return partition in self.live

    def serve(self, cp: Checkpoint) -> None:
        """Serve ``cp.partition`` from ``cp`` on (a claim, once written)."""
        self.live[cp.partition] = cp
        self.unverified.pop(cp.partition, None)

    def refuse(self, partition: int, why: str) -> None:
        """Do not serve ``partition``: its state did not verify (``why``)."""
        self.live.pop(partition, None)
        self.unverified[partition] = why

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget partitions no longer assigned here."""
        for p in partitions:
            self.live.pop(p, None)
            self.unverified.pop(p, None)

    # -- a batch ---------------------------------------------------------------------------------
    def version_for(self, partition: int) -> Version:
        """The version the batch being written gives its records of ``partition``."""
        cp = self._batch.get(partition)
        if cp is None:
            live = self.live.get(partition)
            if live is None:
                raise NotServed(f"partition {partition} is not served by this worker")
            cp = self._batch[partition] = live.successor(self._now_ms())
        return cp.version

    def account(
        self, partition: int, store: str, key: str, old: Version | None, new: Version | None
    ) -> None:
        """Follow one key of ``store`` from version ``old`` to ``new`` (None: absent) in the
        batch's sums of ``partition``."""
        sums = self._batch[partition].stores.setdefault(store, StoreSum())
        if old is not None:
            sums.count -= 1
            sums.digest = (sums.digest - self.seal.digest(store, key, old)) % DIGEST_MODULUS
        if new is not None:
            sums.count += 1
            sums.digest = (sums.digest + self.seal.digest(store, key, new)) % DIGEST_MODULUS

    def written(self, partition: int, store: str, end: int) -> None:
        """A record of ``store`` of the batch was acknowledged; ``end`` is its offset + 1."""
        cp = self._batch.get(partition)
        if cp is not None:
            sums = cp.stores.setdefault(store, StoreSum())
            sums.end = max(sums.end, end)

    def batch_checkpoints(self) -> list[Record]:
        """The checkpoint records of the batch (to send once its records are acknowledged)."""
        now = self._now_ms()
        return [self.record(replace(cp, written_at_ms=now)) for cp in self._batch.values()]

    def keep(self, records: Iterable[Record]) -> None:
        """Checkpoint records acknowledged, and the stores written: keep them on this worker's
        disk too (:mod:`streams.worker.local_checkpoints`)."""
        if self.local is None:
            return
        for r in records:
            if r.partition is not None and r.value is not None and r.headers:
                self.local.save(r.partition, r.headers, r.value)

    def commit_batch(self) -> None:
        """The batch's checkpoints are acknowledged: they are the partitions' state now."""
        for p, cp in self._batch.items():
            if p in self.live:  # revoked meanwhile: not served any more
                self.live[p] = cp
        self._batch = {}

    def abandon_batch(self) -> None:
        """Forget the batch's checkpoints (nothing was written, or the worker stops)."""
        self._batch = {}

    # -- input positions ------------------------------------------------------------------------
    def positions(self, offsets: Mapping[tuple[str, int], int]) -> list[tuple[Checkpoint, Record]]:
        """Checkpoints recording ``offsets`` (``(topic, partition)`` → next offset) as input
        positions, one per served partition whose positions they move forward; apply each
        with :meth:`serve` once acknowledged."""
        moved: dict[int, dict[str, int]] = {}
        for (topic, p), offset in offsets.items():
            cp = self.live.get(p)
            if cp is not None and offset > cp.positions.get(topic, 0):
                moved.setdefault(p, dict(cp.positions))[topic] = offset
        out = []
        now = self._now_ms()
        for p, positions in moved.items():
            live = self.live[p]
            cp = replace(live.successor(now), positions=positions, written_at_ms=now)
            out.append((cp, self.record(cp)))
        return out

    # -- records ---------------------------------------------------------------------------------
    def record(self, cp: Checkpoint) -> Record:
        """``cp`` as a sealed record of the progress changelog."""
        key = str(cp.partition).encode()
        stamp = Stamp(cp.partition, cp.version)
        headers, value = self.seal.seal(PROGRESS, key, cp.to_bytes(), stamp)
        return Record(self.topic, key, value, cp.partition, headers=headers)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)
