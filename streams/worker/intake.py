"""The input topics' records, a fetched batch at a time, from Faust's consumer to the agent.

Faust hands a consumer's records to an agent one by one: for each record a message object,
two tasks raced (the delivery against the flow-control suspension), an event, a channel
queue, a stream step with its sensors, and an acknowledgement. A Faust agent that only
forwards its records spends ~270 µs of worker CPU on each; aiokafka's own batched
``getmany`` and ``send`` forward the same records for ~20 µs each (both measured here, 2026-11-26,
``bench/service.py``'s pass-through against a raw aiokafka loop). The market works in batches
anyway (:mod:`streams.worker.batch`), so it takes the records where Faust's consumer fetched
them: :func:`streams.worker.faust_internals.install_batched_intake` lets the consumer put each
fetched batch of the input topics into an :class:`Intake` as one list, and the agent takes lists
from it. Everything else stays Faust's: group membership and partition assignment, the
read-offset and gap bookkeeping, acknowledgements and offset commits, table recovery, flow
control.

Guarantees kept from Faust's stream:

* a partition's records stay in offset order (a fetched batch keeps each partition's order,
  and the agent takes the lists in the order they were fetched);
* records of a partition this worker no longer owns are never applied: nothing is taken while
  the flow is suspended; when it resumes after a rebalance, the queued records of partitions
  not in the new assignment are dropped; and a record whose consumer generation is not the
  current one is dropped unacknowledged when taken (the partition's next owner, or the seek of
  the new generation, reads it again from the committed offset);
* a record fetched is never lost while its partition stays here: Faust's recovery resumes the
  input partitions, seeks them to the committed offsets and only then resumes the flow, and a
  fetch that lands in between has already moved the consumer's positions past its records.
  Faust clears every flow-controlled queue on that resume, so those records would be gone
  until the next rebalance (and Faust could commit past them once later records are
  acknowledged). The intake keeps them instead; the seek may fetch them a second time, which
  the core's idempotency absorbs (at least once, never lost);
* a record is acknowledged only by :meth:`Intake.ack`, after its batch's outputs are
  acknowledged by the broker; Faust commits the acknowledged offsets on its interval;
* Faust never commits past a record taken but not yet acknowledged: :meth:`Intake.ack` hands
  Faust each partition's acknowledgements in the order its records were taken, holding back
  any that overtake an earlier record. Faust's commit rule (``Consumer._new_offset``, 0.15.3)
  commits the first consecutive run of acknowledged offsets and so, when acknowledgements come
  out of order, can commit past a record still in flight (faust-streaming issue #606,
  concurrency > 1); the market's agent is sequential, and this keeps the guarantee whoever
  acknowledges (``tests/test_faust_boundary.py``);
* memory is bounded: the queue holds at most :data:`MAX_LISTS` fetched batches, each at most
  the consumer's ``max_poll_records`` records (:data:`POLL_RECORDS`, set on the app; Faust's
  default is the whole fetch, up to 50 MB), plus the records carried from the last one taken;
  while it is full the consumer waits and aiokafka fetches ahead only its own buffer.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from mode.utils.queues import FlowControlQueue

from .faust_internals import track_unacked, untrack_unacked

__all__ = ["MAX_LISTS", "POLL_RECORDS", "InputEvent", "Intake"]

MAX_LISTS = 4
"""Fetched batches the intake holds before the consumer waits (backpressure)."""

POLL_RECORDS = 1000
"""Records one fetched batch holds at most (Faust's ``broker_max_poll_records``): with
:data:`MAX_LISTS`, at most ~5,000 records wait in a worker, about what Faust's own stream
buffer held (4,096 events)."""


class _Queue(FlowControlQueue[list[Any]]):
    """The fetched batches. When the flow resumes after a rebalance (Faust "clears" every
    flow-controlled queue then) only the records of partitions no longer assigned here are
    dropped, from the queue and from the records carried (see the module docstring)."""

    def __init__(
        self,
        maxsize: int,
        *,
        carry: collections.deque[Any],
        keep: Callable[[list[Any]], list[Any]],
        **kwargs: Any,
    ) -> None:
        super().__init__(maxsize, clear_on_resume=True, **kwargs)
        self._carry = carry
        self._keep = keep
        self.records = 0
        """Records in the queued batches (:meth:`Intake.pending`)."""

    def clear(self) -> None:
        batches = []
        while not self.empty():
            batches.append(self.get_nowait())
        kept = [b for b in map(self._keep, batches) if b]
        for b in kept:  # as many lists as were there: room for each
            self.put_nowait(b)
        self.records = sum(map(len, kept))
        carried = self._keep(list(self._carry))
        self._carry.clear()
        self._carry.extend(carried)


class InputEvent:
    """One input record as the batch processor sees it: Faust's message and its value.

    Faust's table stores find the partition of a write from the "current event"
    (:func:`streams.worker.faust_internals.set_current_event`), which must be weakly
    referenceable.
    """

    __slots__ = ("__weakref__", "acked", "message", "value")

    def __init__(self, message: Any) -> None:
        self.message = message
        self.value: bytes = message.value
        self.acked = False


class Intake:
    """Fetched batches of the input topics, waiting for the agent (see the module docstring).

    Parameters
    ----------
    app : faust.App
        The worker's app: its flow control clears the queue after a rebalance, its consumer
        acknowledges what was processed.
    topics : set of str
        The topics whose records come here; every other topic's records go through Faust's
        channels as usual (the tables' changelogs during recovery).
    """

    def __init__(self, app: Any, topics: set[str]) -> None:
        self.app = app
        self.topics = frozenset(topics)
        self._carry: collections.deque[Any] = collections.deque()
        self._queue = _Queue(
            MAX_LISTS, flow_control=app.flow_control, carry=self._carry, keep=self._still_assigned
        )
        self.dropped = 0
        """Records dropped because a rebalance overtook them (their next owner reads them)."""
        self._taken: dict[Any, collections.deque[InputEvent]] = {}
        """Each partition's records taken and not yet acknowledged to Faust, in taken order."""

    async def put(self, messages: list[Any], queued: Callable[[], None] | None = None) -> None:
        """Queue one fetched batch (the consumer's drain loop calls this; waits while full).

        ``queued`` is called as soon as the batch is in the queue, before anything else can run
        (the drain loop moves the read offsets there). Cancelled while waiting for room (a
        rebalance), nothing of the batch is queued or tracked.
        """
        await self._queue.put(messages)
        self._queue.records += len(messages)
        track_unacked(self.app.consumer, messages)  # until Intake.ack (or dropped)
        if queued is not None:
            queued()

    async def take(self, limit: int) -> list[InputEvent]:
        """Wait for records, then return every queued one up to ``limit``, oldest first.

        Nothing is taken while a rebalance is under way (the flow suspended): the records wait,
        and the resume keeps those of partitions still assigned here. Records a rebalance
        overtook are dropped here, unacknowledged: they belong to a generation of the group
        that is over (Faust's stream skips them the same way).
        """
        flow = self.app.flow_control
        while True:
            await flow.acquire()
            if not self._carry:
                self._carry.extend(self._counted(await self._queue.get()))
            while len(self._carry) < limit and not self._queue.empty():
                self._carry.extend(self._counted(self._queue.get_nowait()))
            if not flow.is_active():  # suspended while waiting: the resume sorts them
                continue
            n = min(limit, len(self._carry))
            taken = [self._carry.popleft() for _ in range(n)]
            live = self._current(taken)
            if live:
                events = [InputEvent(m) for m in live]
                for ev in events:
                    self._taken.setdefault(ev.message.tp, collections.deque()).append(ev)
                return events

    def _still_assigned(self, messages: list[Any]) -> list[Any]:
        """The ``messages`` of partitions assigned to this worker now; the others are dropped
        unacknowledged (all of them if the assignment cannot be read)."""
        try:
            assigned = self.app.consumer.assignment()
        except Exception:  # a consumer not started: nothing is assigned
            assigned = set()
        kept = [m for m in messages if m.tp in assigned]
        if len(kept) < len(messages):
            stale = [m for m in messages if m.tp not in assigned]
            untrack_unacked(self.app.consumer, stale)
            self.dropped += len(stale)
        return kept

    def _counted(self, batch: list[Any]) -> list[Any]:
        self._queue.records -= len(batch)
        return batch

    def _current(self, messages: list[Any]) -> list[Any]:
        app = self.app
        generation = app.consumer_generation_id
        live = [m for m in messages if m.generation_id == generation]
        if len(live) < len(messages):
            stale = [m for m in messages if m.generation_id != generation]
            untrack_unacked(app.consumer, stale)
            self.dropped += len(stale)
        if live:  # what Faust's stream sensor records: its stall check reads it
            inbound = app.monitor.stream_inbound_time
            now = time.monotonic()
            for tp in {m.tp for m in live}:
                inbound[tp] = now
        return live

    def ack(self, events: list[InputEvent]) -> None:
        """Acknowledge processed records: Faust commits their offsets on its interval.

        Each partition's records reach Faust's ``ack`` in the order they were taken: a record
        acknowledged before an earlier one of its partition is held back until that one is
        acknowledged too, so the offset Faust commits never passes a record still in flight
        (see the module docstring, faust-streaming #606).
        """
        partitions: set[Any] = set()
        for ev in events:
            ev.acked = True
            partitions.add(ev.message.tp)
        ack = self.app.consumer.ack
        for tp in partitions:
            taken = self._taken.get(tp)
            while taken and taken[0].acked:
                ack(taken.popleft().message)
            if not taken:
                self._taken.pop(tp, None)

    def pending(self) -> int:
        """Records queued or carried, not yet taken (tests, diagnostics)."""
        return len(self._carry) + self._queue.records
