"""Taking partitions on: the state recovered must be the market's, and the inputs resume where
that state proves they were processed, whatever the consumer group says.

Faust assigns partitions and recovers the tables from their changelogs; around that, for each
partition newly assigned to this worker:

1. **before recovery** (:meth:`Takeover.prepare`): read the partition's checkpoints from the
   progress changelog (:func:`~streams.worker.history.read_checkpoints`). Recovery then applies a
   record only if the newest checkpoint commits its version and it is newer than what the store
   holds for its key (:meth:`~streams.worker.tables.WriteBackTable.recovered`): a batch lost half
   way counts not at all, an old record appended again after newer ones is refused;
2. **after recovery** (:meth:`Takeover.resume`, run where Faust seeks the input partitions):
   *verify* that every store holds exactly what the checkpoint says (its count of keys and the
   sum of their keyed digests: a record deleted, truncated, rolled back or extra changes them),
   then *claim* the partition: a new epoch, greater than every one recovery saw, recorded in a
   checkpoint before any event is processed. Keys a lost batch left a record of are written
   again at the new epoch, so that record can never pass for the newest one later. A partition
   whose state does not verify is **not served**: its inputs stay paused, ``/health`` says so,
   ``emarket_partitions_unverified`` counts it (alert ``MarketStateUnverified``);
3. **positions**: every served partition's input topics are sought to the positions its
   checkpoint proves. A consumer-group offset ahead of them was committed by someone else (this
   worker checkpoints before it commits, :mod:`streams.worker.progress`): it is ignored,
   counted (``emarket_offsets_ahead_total``) and alerted (``MarketOffsetsAhead``), and the
   events in between are processed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .checkpoints import Checkpoint, StoreSum
from .faust_internals import (
    committed_offset,
    forget_partition,
    pause_inputs,
    seek_input,
    set_committed_offset,
)
from .history import read_checkpoints
from .metrics import Metrics
from .producer import Producer
from .progress import Progress
from .state_records import DIGEST_MODULUS, StateSeal
from .tables import Record, StateContext, WriteBackTable

__all__ = ["Takeover", "held_sums", "verify_partition"]

log = logging.getLogger("emarket.state")


def held_sums(
    tables: Iterable[WriteBackTable], partitions: set[int], seal: StateSeal
) -> dict[int, dict[str, StoreSum]]:
    """What the stores hold in ``partitions``: per partition and store, the count of keys and
    the sum of their digests (one pass over each store)."""
    sums: dict[int, dict[str, StoreSum]] = {p: {} for p in partitions}
    for tbl in tables:
        for p, key, version in tbl.partition_entries(partitions):
            s = sums[p].setdefault(tbl.name, StoreSum())
            s.count += 1
            s.digest = (s.digest + seal.digest(tbl.name, key, version)) % DIGEST_MODULUS
    return sums


def verify_partition(
    held: Mapping[str, StoreSum], cp: Checkpoint, stores: Iterable[str]
) -> str | None:
    """Why the sums ``held`` of ``cp.partition``'s stores are not what ``cp`` says, or None."""
    problems = []
    for name in stores:
        got, want = held.get(name) or StoreSum(), cp.stores.get(name) or StoreSum()
        if (got.count, got.digest) != (want.count, want.digest):
            problems.append(
                f"{name}: {got.count} keys held, {want.count} committed"
                + ("" if got.count != want.count else ", other versions")
            )
    return "; ".join(problems) or None


class Takeover:
    """What a worker does around Faust's recovery of the partitions it is given (module doc)."""

    def __init__(
        self,
        app: Any,
        tables: list[WriteBackTable],
        ctx: StateContext,
        progress: Progress,
        producer: Producer,
        metrics: Metrics,
        consumer_settings: dict[str, Any],
        inputs: tuple[str, ...],
    ) -> None:
        self.app = app
        self.tables = tables
        self.ctx = ctx
        self.progress = progress
        self.producer = producer
        self.metrics = metrics
        self.consumer_settings = consumer_settings
        self.inputs = inputs
        self._fresh: set[int] = set()

    async def prepare(self, assigned: set[Any], revoked: set[Any]) -> None:
        """Before recovery (``assigned``, ``revoked``: Faust's topic partitions): forget what is
        revoked, and read the checkpoints of every partition newly assigned here, its inputs or
        only its changelogs (recovery judges the changelogs' records by them). A partition is
        verified and claimed once its inputs are assigned here too."""
        changelogs = {tbl.table.changelog_topic.get_topic_name() for tbl in self.tables}
        inputs = {tp.partition for tp in assigned if tp.topic in self.inputs}
        state = {tp.partition for tp in assigned if tp.topic in changelogs}
        self.progress.drop({tp.partition for tp in revoked} - inputs)
        again = set(self.progress.unverified) & (inputs | state)
        for p in sorted(again):  # not trusted: read from the changelogs again, from the start
            for tbl in self.tables:
                forget_partition(self.app, tbl.table, p)
        self.progress.drop(again)
        fresh = (inputs | state) - set(self.progress.live)
        for p in fresh:
            for known in (
                self.ctx.book.latest,
                self.ctx.stale,
                self.ctx.epochs,
                self.ctx.unexplained,
                self.ctx.local,
            ):
                known.pop(p, None)
        await read_checkpoints(
            self.consumer_settings, self.progress.topic, sorted(fresh), self.ctx.book
        )
        self._trust_disk(fresh)
        self._fresh = (self._fresh | fresh) & inputs

    def _trust_disk(self, partitions: set[int]) -> None:
        """Where this worker's disk holds a newer checkpoint than the progress changelog's
        newest, judge by it: the changelog lost checkpoints (deleted, or older ones appended in
        place of the newest), and the claim will write the partition's history again."""
        local = self.progress.local
        if local is None:
            return
        for p in sorted(partitions):
            mine = local.load(p)
            if mine is None:
                continue
            self.ctx.local[p] = mine.version
            logged = self.ctx.book.get(p)
            if mine.version > logged.version:
                log.error(
                    "partition %d: the progress changelog's newest checkpoint is %s, but "
                    "this worker committed or read %s (its data directory keeps it): the "
                    "changelog lost checkpoints (deleted, or older ones appended in place "
                    "of the newest); recovery judges by the one on disk",
                    p,
                    tuple(logged.version),
                    tuple(mine.version),
                )
                self.ctx.book.latest[p] = mine

    async def recovered(self) -> None:
        """Recovery is complete: verify and claim the partitions it recovered."""
        for tbl in self.tables:
            tbl.recovery_done()
        sums = held_sums(self.tables, self._fresh, self.ctx.seal)
        for p in sorted(self._fresh):
            await self._take(p, sums[p])
        self._fresh.clear()
        self.metrics.partitions_unverified.labels("tables").set(len(self.progress.unverified))

    async def resume(self, consumer: Any) -> None:
        """Where Faust seeks the input partitions: seek each to the position its partition's
        checkpoint proves, or pause it if the partition is not served."""
        inputs = [tp for tp in consumer.assignment() if tp.topic in self.inputs]
        for tp in inputs:
            cp = self.progress.live.get(tp.partition)
            if cp is None:
                pause_inputs(consumer, [tp])
                continue
            await self._seek(consumer, tp, cp.positions.get(tp.topic, 0))

    async def _take(self, p: int, held: Mapping[str, StoreSum]) -> None:
        cp = self.ctx.book.get(p)
        why = verify_partition(held, cp, [t.name for t in self.tables])
        lost = self.ctx.unexplained.get(p)
        if lost is not None:
            why = (
                f"a {lost} is newer than the checkpoint and no lost batch explains it: the "
                "progress changelog lost checkpoints" + ("" if why is None else f"; {why}")
            )
        if why is not None:
            self.progress.refuse(p, why)
            log.critical(
                "partition %d: the state recovered is not what its checkpoint (version "
                "%s) commits: %s. Someone deleted, truncated or rewrote a changelog. The "
                "partition is not served (its events wait); docs/operations.md, "
                "'State that does not verify'",
                p,
                tuple(cp.version),
                why,
            )
            return
        async with self.progress.lock:
            claimed = await self._claim(p, cp)
        self.progress.serve(claimed)
        log.info(
            "partition %d taken on at epoch %x (state of version %s verified, %d keys of "
            "lost batches written again)",
            p,
            claimed.version.epoch,
            tuple(cp.version),
            len(self.ctx.stale.get(p, ())),
        )
        self.ctx.stale.pop(p, None)

    async def _claim(self, p: int, cp: Checkpoint) -> Checkpoint:
        """Write the claim: keys lost batches left records of, at the new epoch, then the
        checkpoint that starts it."""
        claimed = cp.claimed(self.ctx.epochs.get(p, 0), int(time.time() * 1000))
        by_name = {t.name: t for t in self.tables}
        records: list[Record] = []
        for store, key in sorted(self.ctx.stale.get(p, ())):
            tbl = by_name[store]
            record, old = tbl.rewrite(key, p, claimed.version)
            records.append(record)
            sums = claimed.stores.setdefault(store, StoreSum())
            if old is not None:
                sums.digest = (
                    sums.digest
                    - self.ctx.seal.digest(store, key, old)
                    + self.ctx.seal.digest(store, key, claimed.version)
                ) % DIGEST_MODULUS
        if records:
            await self.producer.send_all(records, dead_letter=False)
            for tbl in self.tables:
                end = tbl.ends().get(p)
                if end is not None:
                    sums = claimed.stores.setdefault(tbl.name, StoreSum())
                    sums.end = max(sums.end, end)
        record = self.progress.record(claimed)
        await self.producer.send_all([record], dead_letter=False)
        for tbl in self.tables:
            tbl.commit()
        self.progress.keep([record])
        return claimed

    async def _seek(self, consumer: Any, tp: Any, proven: int) -> None:
        committed = committed_offset(consumer, tp)
        if committed is not None and committed > proven:
            self.metrics.offsets_ahead.labels(tp.topic.rsplit(".", 1)[-1]).inc()
            log.error(
                "the consumer group's committed offset of %s[%d] is %d, ahead of the %d "
                "this worker's state proves: someone else committed it (a stranger in the "
                "consumer group?). Ignored: the events from %d on are processed",
                tp.topic,
                tp.partition,
                committed,
                proven,
                proven,
            )
        await seek_input(consumer, tp, proven)
        set_committed_offset(consumer, tp, proven)

    def observed(self, cp: Checkpoint) -> None:
        """A checkpoint read on the progress changelog (by the account replica): one of a
        partition this worker serves, newer than its own and of another epoch, means another
        worker took the partition over (a rebalance this worker missed, or a leader that gave it
        to two workers). This worker stops serving it at once — its writes would not count —
        and says so (``/health`` unverified, ``MarketStateUnverified``); a later rebalance or a
        restart takes it on again from the changelogs."""
        live = self.progress.live.get(cp.partition)
        if live is None or cp.version.epoch == live.version.epoch or cp.version <= live.version:
            return
        why = (
            f"another worker took it over (its checkpoint {tuple(cp.version)} after this "
            f"worker's {tuple(live.version)})"
        )
        self.progress.refuse(cp.partition, why)
        self.metrics.partitions_unverified.labels("tables").set(len(self.progress.unverified))
        log.critical("partition %d: %s; this worker stops serving it", cp.partition, why)

    async def commit_positions(self, offsets: Mapping[Any, int]) -> dict[Any, int]:
        """Before Faust commits ``offsets`` (TP → next offset): record them in the partitions'
        checkpoints; return the offsets that may be committed (those of served partitions)."""
        mine = {tp: o for tp, o in offsets.items() if tp.topic in self.inputs}
        allowed = {tp: o for tp, o in mine.items() if self.progress.serves(tp.partition)}
        if allowed:
            async with self.progress.lock:
                moved = self.progress.positions(
                    {(tp.topic, tp.partition): o for tp, o in allowed.items()}
                )
                if moved:
                    await self.producer.send_all([r for _, r in moved], dead_letter=False)
                    for cp, _ in moved:
                        if self.progress.serves(cp.partition):
                            self.progress.serve(cp)
                    self.progress.keep(r for _, r in moved)
        return {**{tp: o for tp, o in offsets.items() if tp not in mine}, **allowed}
