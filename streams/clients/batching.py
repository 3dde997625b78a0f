"""A seller's values gathered into batches: fewer, larger ``values`` events for the same values.

The market verifies one signature, opens one envelope and writes one answer per batch
(docs/protocol.md §4, §6.4), so a value costs it about a third as much CPU in a batch of 32 as
alone (measured in the core: ~0.31× at 32 values per batch, ~0.33× at 16, flat beyond; a batch
of 500 costs the same per value but holds the stream's partition ~16 times longer, which
purchases on it wait for). A :class:`ValueBatcher` gathers the values it is given into one
signed batch until it holds ``max_values`` or its first value has waited ``max_delay`` seconds,
whichever comes first, sends the batches in the order their values were added and keeps
several in flight, so a caller publishing value after value reaches that size without
waiting for each answer.

Each value still gets its own answer: :meth:`ValueBatcher.add` returns a future of the
value's line of the market's answer (``accepted``, ``duplicate``, or ``rejected`` with its
reason); a batch the market refuses whole gives each of its values a ``rejected`` line with
the batch's reason; a batch never answered fails each of its values' futures with
:class:`TimeoutError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING

from ..wire.events import MAX_BATCH, Rejection, ValueBatch, ValueOutcome, ValuesAccepted
from .batch_defaults import DEFAULT_MAX_DELAY, DEFAULT_MAX_VALUES

if TYPE_CHECKING:
    from .client import MarketClient, ValueData

__all__ = [
    "DEFAULT_MAX_DELAY",
    "DEFAULT_MAX_VALUES",
    "MAX_IN_FLIGHT",
    "Answered",
    "ValueBatcher",
]

MAX_IN_FLIGHT = 32
"""Batches sent and not yet answered at most; :meth:`ValueBatcher.add` waits for room."""

Answer = ValuesAccepted | Rejection | None
Answered = Callable[[ValueBatch, Answer], None]
"""Told of each batch (as signed, before sealing) and the market's answer to it (None when
not waited for): e.g. a command's progress line."""
Outcome = ValueOutcome | None


class ValueBatcher:
    """Values of one stream, published in batches of up to ``max_values`` values, each sent at
    most ``max_delay`` seconds after its first value was added.

    Use it as an async context manager (or call :meth:`close`): leaving it sends what is left
    and waits for every answer. ``wait`` False sends without waiting for answers (the futures
    then hold None once their batch is written). ``on_answer`` is told of each batch answered.

    Batches go out in the order of their values, one at a time, and up to
    :data:`MAX_IN_FLIGHT` wait for their answers at once. A batch the stream finds too large
    (``batch_too_large``: many holders) is sent again split as the market says, and later
    batches are no larger; only then can a later batch reach the market before some of the
    values of an earlier one.
    """

    def __init__(
        self,
        client: MarketClient,
        stream_id: str,
        *,
        max_values: int = DEFAULT_MAX_VALUES,
        max_delay: float = DEFAULT_MAX_DELAY,
        wait: bool = True,
        timeout: float = 60.0,
        on_answer: Answered | None = None,
    ) -> None:
        if not 1 <= max_values <= MAX_BATCH:
            raise ValueError(
                f"max_values must be 1 to {MAX_BATCH} (a batch's bound), got {max_values}"
            )
        if not max_delay >= 0:
            raise ValueError(f"max_delay must be 0 seconds or more, got {max_delay}")
        self.client, self.stream_id = client, stream_id
        self.max_values, self.max_delay = max_values, max_delay
        self.wait, self.timeout, self.on_answer = wait, timeout, on_answer
        self._rows: list[tuple[str | None, ValueData, int | None]] = []
        self._futures: list[asyncio.Future[Outcome]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._queue: asyncio.Queue[_Batch | None] = asyncio.Queue()
        self._room = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._tasks: set[asyncio.Task[None]] = set()
        self._sender: asyncio.Task[None] | None = None
        self._closed = False
        self._seq = 0
        """The place of the next batch in the batcher's order."""
        self._pending: dict[int, _Batch] = {}
        """Batches queued or sent and not over yet, by place."""
        self._waiting: dict[int, _Batch] = {}
        """Batches not counted in :attr:`answered` yet, by place."""
        self._first = 0
        self.answered = 0
        """Values answered in order: those of the first batches, every one of them answered
        (where a publish stopped midway may resume)."""

    async def __aenter__(self) -> ValueBatcher:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            self._abandon()  # stopped (a second Ctrl-C): what is in flight is not waited for
            return
        await self.close()

    async def add(
        self, values: ValueData, *, value_id: str | None = None, published_at_ms: int | None = None
    ) -> asyncio.Future[Outcome]:
        """Queue one value (its numbers, or on a histogram stream its counts by key); the
        future of its line of the market's answer. Waits only when it fills a batch while the
        batches sent and ready to go are more than twice :data:`MAX_IN_FLIGHT` (the caller is
        faster than the market).

        Raises
        ------
        RuntimeError
            The batcher is closed.
        """
        if self._closed:
            raise RuntimeError("this batcher is closed: values go to an open one")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        self._rows.append((value_id, values, published_at_ms))
        self._futures.append(future)
        if len(self._rows) >= self.max_values:
            await self._cut()
            while len(self._pending) > 2 * MAX_IN_FLIGHT:  # the caller is faster than the market
                await asyncio.sleep(0.01)
        elif len(self._rows) == 1:
            self._timer = loop.call_later(self.max_delay, self._cut_later)
        return future

    async def flush(self) -> None:
        """Send the values added so far and wait until every batch is answered (or failed)."""
        await self._cut()
        while self._pending or self._rows:
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """:meth:`flush`, then stop its sender; adding afterwards is an error."""
        if self._closed:
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            self._queue.put_nowait(None)
            if self._sender is not None:
                await self._sender

    def _abandon(self) -> None:
        """Close without sending what is left or waiting for answers: every value not answered
        yet has its future cancelled."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for task in (self._sender, *self._tasks):
            if task is not None:
                task.cancel()
        for future in (*self._futures, *(f for b in self._pending.values() for f in b.futures)):
            future.cancel()

    def _cut_later(self) -> None:
        self._spawn(self._cut())

    async def _cut(self) -> None:
        """Sign the values added so far as one batch and queue it for the sender."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._rows:
            return
        try:
            await self.client.signing_market()  # what batches are signed for (read once)
        except Exception as exc:  # e.g. no market key: each value learns why
            rows, self._rows, futures, self._futures = self._rows, [], self._futures, []
            _fail(futures, exc)
            return
        # taken and queued with no await between: batches queue in the order of their values
        rows, self._rows, futures, self._futures = self._rows, [], self._futures, []
        if not rows:
            return
        batch = _Batch(self._seq, self.client.value_batch(self.stream_id, rows), futures)
        self._seq += 1
        self._pending[batch.seq] = self._waiting[batch.seq] = batch
        self._queue.put_nowait(batch)
        if self._sender is None:
            self._sender = asyncio.ensure_future(self._send_all())

    async def _send_all(self) -> None:
        """The sender: each queued batch sealed and sent, in order, one at a time."""
        while (batch := await self._queue.get()) is not None:
            await self._room.acquire()
            try:
                await self._send(batch)
            except Exception as exc:  # the broker is gone, or the sealing key: each value learns
                self._done(batch, exc)

    async def _send(self, batch: _Batch) -> None:
        numbering, seq = self.client.numbering, batch.signed.batch_seq
        sealed = await self.client.sealed(batch.signed)
        if not self.wait:
            payload = sealed.model_dump_json().encode()
            await self.client.send(self.client.topics.values, self.stream_id, payload)
            numbering.settle(self.stream_id, seq, None)
            self._done(batch, None)
            return
        sent = await self.client.sent_values(wait=self.timeout)

        def answered(answer: ValuesAccepted | Rejection | Exception) -> None:
            got = None if isinstance(answer, Exception) else answer
            if numbering.settle(self.stream_id, seq, got):  # numbered anew
                self._spawn(self._again(batch))
            elif not isinstance(answer, Exception) and _too_large(answer, batch.signed):
                assert isinstance(answer, Rejection)
                self.max_values = min(self.max_values, int(answer.details["max_values"]))
                self._spawn(self._again(batch))
            else:
                self._done(batch, answer)

        await sent.send(sealed, answered, timeout=self.timeout)

    async def _again(self, batch: _Batch) -> None:
        """``batch``, which the market did not take, sent again out of the batcher's order (the
        batches after it may be in already): in the parts it takes if the stream found it too
        large, numbered as the market said if its number was too far ahead (or unnumbered, for a
        market that numbers none). Numbered anew in any case: its old number may be another
        batch's by now."""
        try:
            signed = await self.client.renumbered(batch.signed)
            answer = await self.client.publish_batch(signed, timeout=self.timeout)
        except Exception as exc:
            self._done(batch, exc)
        else:
            self._done(batch, answer)

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _done(self, batch: _Batch, answer: Answer | BaseException) -> None:
        """A batch is over: each of its values gets its line of ``answer``, or the error."""
        del self._pending[batch.seq]
        self._room.release()
        if isinstance(answer, BaseException):
            _fail(batch.futures, answer)
            return
        batch.answered = True
        while self._first in self._waiting and self._waiting[self._first].answered:
            self.answered += len(self._waiting.pop(self._first).signed.items)
            self._first += 1
        if self.on_answer is not None:
            try:
                self.on_answer(batch.signed, answer)
            except Exception as exc:
                _fail(batch.futures, exc)
                return
        for item, future in zip(batch.signed.items, batch.futures, strict=True):
            if not future.done():
                future.set_result(_line(item.value_id, answer))


class _Batch:
    """One batch of a batcher: its place in the batcher's order, the batch as signed (before
    sealing) and the futures of its values."""

    def __init__(
        self, seq: int, signed: ValueBatch, futures: list[asyncio.Future[Outcome]]
    ) -> None:
        self.seq, self.signed, self.futures = seq, signed, futures
        self.answered = False


def _line(value_id: str, answer: Answer) -> Outcome:
    """The line of ``answer`` for one value: the market's own, or, for a batch refused whole,
    a ``rejected`` line with the batch's reason; None when not waited for."""
    if isinstance(answer, Rejection):
        return ValueOutcome(
            value_id=value_id, status="rejected", reason=answer.reason, message=answer.message
        )
    if answer is None:
        return None
    return next(o for o in answer.outcomes if o.value_id == value_id)


def _fail(futures: list[asyncio.Future[Outcome]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)


def _too_large(answer: Answer, batch: ValueBatch) -> bool:
    """Whether the stream refused ``batch`` as too large for it now, naming a size it takes."""
    if not isinstance(answer, Rejection) or answer.reason != "batch_too_large":
        return False
    size = answer.details.get("max_values")
    return isinstance(size, int) and 0 < size < len(batch.items)
