"""One batch of input events, in the order that makes replays harmless.

1. every event goes through :meth:`MarketCore.handle`, with Faust's "current event" set to it so
   table writes go to the changelog partition of the event's stream; an event naming an account
   the directory has not read yet waits for the directory (once per batch) and is handled again;
2. the batch's state (every changed table key, once, sealed and stamped with its partition's
   next version) is sent and **acknowledged** by the broker, then each partition's checkpoint
   (:mod:`streams.worker.progress`): the checkpoint is the batch's commit, so on recovery a
   batch counts wholly or not at all, whichever of its records a crash let through
   (:mod:`streams.worker.recovery`);
3. the outputs (releases, receipts, rejections, catalog entries) are sent and acknowledged —
   or dead-lettered if the broker refuses one for good — and the events are acknowledged
   afterwards (Faust commits them later, once their partition's checkpoint records the
   offsets). Outputs to an inbox not yet known to exist (an account just opened) are handed
   to :class:`~streams.worker.inboxes.Inboxes` instead, which creates such inboxes many at a
   time off the event path; the part's events are then acknowledged only once those outputs
   are, and the next batch does not wait.

A worker that dies at any point therefore never leaves a visible release whose state is not
committed; the batch is processed again and the core's idempotency (and its pure-function noise)
turns it into identical re-emissions. Whatever goes wrong with one event — even outside the
core — becomes a rejection of that event; the rest of the batch proceeds. Events of a partition
this worker does not serve (its state did not verify) are left alone, unacknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core import MarketCore, Outcome
from ..wire.topics import TopicSpec
from .directory import AccountReplica
from .faults import FaultInjector
from .faust_internals import set_current_event
from .inboxes import Inboxes
from .intake import InputEvent
from .metrics import Metrics
from .producer import Producer
from .progress import Progress
from .tables import Record, WriteBackTable

__all__ = ["BatchProcessor"]


@dataclass
class _Part:
    """What applying part of a batch produced, and the events it left for the next part."""

    outputs: list[Record] = field(default_factory=list)
    topics: list[TopicSpec] = field(default_factory=list)
    purchase_times: list[float] = field(default_factory=list)
    rest: list[InputEvent] = field(default_factory=list)


log = logging.getLogger("emarket.worker")


def _waited_ms(events: list[InputEvent]) -> float:
    """How long the oldest of ``events`` has waited since its producer stamped it (broker,
    fetch and the framework's dispatch): the batch profile's first column."""
    stamps = [ev.message.timestamp for ev in events if ev.message.timestamp]
    return (time.time() - min(stamps)) * 1e3 if stamps else 0.0


class BatchProcessor:
    """Applies batches of events to the core and makes their effects durable, then visible."""

    def __init__(
        self,
        core: MarketCore,
        tables: list[WriteBackTable],
        producer: Producer,
        metrics: Metrics,
        faults: FaultInjector,
        inboxes: Inboxes,
        ack: Callable[[list[InputEvent]], None],
        progress: Progress,
        replica: AccountReplica | None = None,
        *,
        profile: bool = False,
    ) -> None:
        self.core = core
        self.tables = tables
        self.progress = progress
        self.producer = producer
        self.metrics = metrics
        self.faults = faults
        self.inboxes = inboxes
        self.ack = ack
        self.replica = replica
        self.profile = profile
        self.idle = asyncio.Event()
        """Set while no batch is being processed: a rebalance waits for it before giving the
        partitions up, so their next owner never recovers a state this worker is still
        writing (:meth:`streams.worker.app.MarketWorker`)."""
        self.idle.set()

    async def process(self, events: list[InputEvent]) -> None:
        """Process ``events`` (records of the input topics); return once outputs are acked,
        except those waiting for their inbox (the events are acknowledged as their outputs are).

        A batch whose outputs would pass :attr:`Limits.max_event_output_bytes` is cut into
        parts, each applied, persisted and sent in turn, so a worker's memory is bounded by
        two events' outputs whatever the batch holds.
        """
        started = time.monotonic()
        self.metrics.batch_started()
        self.faults.hit("before_state")
        rest = [ev for ev in events if self.progress.serves(ev.message.partition)]
        self.idle.clear()
        try:
            while rest:
                rest = await self._part(rest, started)
        finally:
            self.idle.set()
        self.metrics.batch_size.observe(len(events))
        self.metrics.batch_done(time.time())

    async def _part(self, events: list[InputEvent], started: float) -> list[InputEvent]:
        """Apply, persist, then send a prefix of ``events``; return the events left over."""
        t_start = time.perf_counter()
        waited = _waited_ms(events) if self.profile else 0.0
        part = await self._apply(events, started)
        self.faults.broken([ev.value for ev in events])
        try:
            self.metrics.flush()  # counted before anything of the part is visible
        except Exception:  # a metric must never cost the batch its outcomes
            log.exception("could not count a batch's outcomes")
        t_proc = time.perf_counter()
        looked = self.inboxes.look(part.outputs)  # are their topics there? beside the state
        await self._commit()
        t_state = time.perf_counter()
        self.faults.hit("after_state")
        done = events[: len(events) - len(part.rest)]
        ready, held = await self.inboxes.admit(
            part.topics, part.outputs, lambda: self.ack(done), looked
        )
        await self.producer.send_all(ready, fail_point="mid_output")
        t_out = time.perf_counter()
        if self.profile:
            log.warning(
                "batch %d events: waited %.1f ms, process %.1f ms, state %.1f ms, "
                "outputs %.1f ms %s",
                len(done),
                waited,
                (t_proc - t_start) * 1e3,
                (t_state - t_proc) * 1e3,
                (t_out - t_state) * 1e3,
                [(e.message.partition, e.message.offset) for e in done],
            )
        self.faults.hit("after_output")
        if not held:
            self.ack(done)
        now = time.time()
        for ts in part.purchase_times:
            self.metrics.purchase_latency.observe(max(0.0, now - ts))
        return part.rest

    async def _commit(self) -> None:
        """Send the part's state records, then (all acknowledged) its partitions' checkpoints;
        then write the stores. Under the progress lock: no other checkpoint (an offset commit's)
        is written in between."""
        async with self.progress.lock:
            checkpoints: list[Record] = []
            try:
                records = [r for tbl in self.tables for r in tbl.drain()]
                if records:
                    await self.producer.send_all(records, dead_letter=False)
                    self.faults.hit("mid_state")
                    for tbl in self.tables:
                        for p, end in tbl.ends().items():
                            self.progress.written(p, tbl.name, end)
                    checkpoints = self.progress.batch_checkpoints()
                    await self.producer.send_all(checkpoints, dead_letter=False)
                self.progress.commit_batch()
            finally:
                self.progress.abandon_batch()
            for tbl in self.tables:
                tbl.commit()
            self.progress.keep(checkpoints)

    async def _apply(self, events: list[InputEvent], started: float) -> _Part:
        """Run events through the core until the outputs reach the budget; return the part."""
        part = _Part()
        synced = self.replica is None
        budget = self.core.ctx.limits.max_event_output_bytes
        size = 0
        with self.core.batch() as deliveries:
            for i, ev in enumerate(events):
                if i == len(events) // 2:
                    self.faults.hit("mid_batch")
                set_current_event(ev)
                await self.faults.hang(ev.value)
                outcome = self._handle(ev, final=synced)
                if outcome.status == "deferred":
                    assert self.replica is not None
                    await self.replica.caught_up_after(started)
                    synced = True
                    outcome = self._handle(ev, final=True)
                part.outputs.extend(
                    Record(o.topic, o.key, o.value, o.partition, headers=list(o.headers) or None)
                    for o in outcome.outputs
                )
                part.topics.extend(outcome.create_topics)
                if (
                    outcome.kind == "purchase"
                    and outcome.status != "forwarded"
                    and (ev.message.timestamp)
                    and outcome.dropped is None
                ):  # a forwarded one is timed where it is decided
                    part.purchase_times.append(float(ev.message.timestamp))
                size += sum(len(o.value or b"") for o in outcome.outputs)
                if size + self.core.pending_output_bytes >= budget:
                    part.rest = events[i + 1 :]
                    break
        part.outputs.extend(
            Record(o.topic, o.key, o.value, o.partition, headers=list(o.headers) or None)
            for o in deliveries
        )
        return part

    def _handle(self, ev: InputEvent, *, final: bool) -> Outcome:
        """One event through the core, its outcome counted; nothing here may stop the batch."""
        msg = ev.message
        try:
            self.faults.poison(ev.value)
            outcome = self.core.handle(
                msg.topic, ev.value, partition=msg.partition, offset=msg.offset, final=final
            )
        except Exception as exc:  # the core never raises for bad input: this is a bug
            log.exception(
                "internal error outside the core's guard at %s[%s]@%s",
                msg.topic,
                msg.partition,
                msg.offset,
            )
            outcome = self.core.internal_error(msg.topic, ev.value, msg.partition, msg.offset, exc)
        if outcome.status == "deferred":
            return outcome
        try:
            self.metrics.record(outcome)
        except Exception:  # a metric must never cost an event its outcome
            log.exception(
                "could not count the outcome of %s[%s]@%s", msg.topic, msg.partition, msg.offset
            )
        if outcome.status == "duplicate":
            log.info(
                "duplicate %s event at %s[%s]@%s: %.120r",
                outcome.kind,
                msg.topic,
                msg.partition,
                msg.offset,
                ev.value,
            )
        return outcome
