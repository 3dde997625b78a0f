"""How much the market says in answer to events nobody proved they sent (docs/protocol.md §9).

An event whose signature proves no account — unparsable bytes, an unknown account, a bad
signature — costs its sender one produce, and costs the market a rejection on
``<p>.rejections`` and a signed refusal record on ``<p>.refusals`` (about a kilobyte together).
Answered one by one, a stranger writing garbage as fast as the broker takes it makes the market
write (and the broker keep) far more than he did. So such answers are bounded here, per input
partition and interval:

* the same bytes on the same partition are answered once while their keyed digest is among the
  :attr:`RefusalBounds.recent` last answered (a keyed digest: nobody can make other bytes
  collide with a sender's to have its refusal skipped);
* at most :attr:`RefusalBounds.per_interval` answers and :attr:`RefusalBounds.bytes_per_interval`
  bytes of them per partition and :attr:`RefusalBounds.interval_ms`; beyond that events are
  counted, not answered.

What was not answered is told once per partition and interval, in one summary
(:class:`Dropped`, written by :mod:`.answering`), and counted in the worker's metrics. A refusal
shown to a proven sender (in its inbox) is never dropped here: that sender pays for it with its
own allowances.

The budget is a worker's, in memory: a partition that moves to another worker (a rebalance, a
restart) starts its interval and its recent digests afresh there, so a rebalance can let one
more interval's answers through.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DROP_CAUSES", "Dropped", "RefusalBounds", "RefusalBudget"]

DROP_CAUSES = ("repeated", "over_bound")
"""Why an answer was not written: the same bytes were answered already, or the partition's
answers of the interval were at their bound."""


@dataclass(frozen=True)
class RefusalBounds:
    """The bounds on answers to events no account was proven to send (per input partition)."""

    #: length of an interval
    interval_ms: int = 10_000
    #: answers written per input partition and interval
    per_interval: int = 20
    #: bytes of answers (rejection and refusal record) per input partition and interval
    bytes_per_interval: int = 64 * 1024
    #: digests of answered bytes remembered (8 bytes each, about 100 bytes of memory with
    #: the dict's own), the oldest forgotten first
    recent: int = 65_536

    def records_bound(self, partitions: int, duration_ms: int) -> int:
        """The most records (answers and summaries, on both topics) the market writes for the
        unproven events of ``partitions`` input partitions over ``duration_ms``: every
        interval the span touches, each with its answers (two records each) and a summary
        (two records)."""
        intervals = duration_ms // self.interval_ms + 2
        return partitions * intervals * 2 * (self.per_interval + 1)


@dataclass
class Dropped:
    """What was not answered on one input partition during one interval."""

    topic: str
    partition: int | None
    start_ms: int
    interval_ms: int
    repeated: int = 0
    over_bound: int = 0
    #: refusal code → events not answered with it
    reasons: dict[str, int] = field(default_factory=dict)
    first_offset: int | None = None
    last_offset: int | None = None

    @property
    def total(self) -> int:
        return self.repeated + self.over_bound


@dataclass
class _Window:
    start_ms: int
    answered: int = 0
    bytes: int = 0
    dropped: Dropped | None = None


class RefusalBudget:
    """Decides, event by event, whether an unproven event's refusal is written (one per
    worker: its memory is the digests of :attr:`RefusalBounds.recent` answers and one window
    per input partition)."""

    def __init__(self, bounds: RefusalBounds, clock: Callable[[], int]) -> None:
        self.bounds = bounds
        self._clock = clock
        self._key = secrets.token_bytes(16)  # this worker's: digests are never shown
        self._recent: dict[bytes, None] = {}
        self._hashers: dict[tuple[str, int | None], Any] = {}  # keyed, per partition
        self._windows: dict[tuple[str, int | None], _Window] = {}
        self._closed: list[Dropped] = []

    def refuse(
        self, topic: str, partition: int | None, offset: int | None, raw: bytes, reason: str
    ) -> str | None:
        """None if the refusal of ``raw``, read from ``topic`` at ``partition`` and ``offset``
        for ``reason``, is to be written (then call :meth:`answered` with its size); else the
        cause (:data:`DROP_CAUSES`) it is not, counted for the interval's summary. Asked before
        the refusal is built: a dropped one costs a digest, not a rejection."""
        window = self._window(topic, partition)
        if self._digest(topic, partition, raw) in self._recent:
            cause = "repeated"
        elif (
            window.answered >= self.bounds.per_interval
            or window.bytes >= self.bounds.bytes_per_interval
        ):
            cause = "over_bound"
        else:
            return None
        d = window.dropped
        if d is None:
            d = window.dropped = Dropped(
                topic, partition, window.start_ms, self.bounds.interval_ms, first_offset=offset
            )
        if cause == "repeated":
            d.repeated += 1
        else:
            d.over_bound += 1
        d.reasons[reason] = d.reasons.get(reason, 0) + 1
        d.last_offset = offset
        return cause

    def answered(self, topic: str, partition: int | None, raw: bytes, size: int) -> None:
        """Count the refusal of ``raw`` (``size`` bytes of records) written: a partition's
        answers pass :attr:`RefusalBounds.bytes_per_interval` by one answer at most."""
        window = self._window(topic, partition)
        window.answered += 1
        window.bytes += size
        self._recent[self._digest(topic, partition, raw)] = None
        if len(self._recent) > self.bounds.recent:
            del self._recent[next(iter(self._recent))]

    def _digest(self, topic: str, partition: int | None, raw: bytes) -> bytes:
        base = self._hashers.get((topic, partition))
        if base is None:  # the bytes on one partition: a copy elsewhere is answered there
            base = hashlib.blake2b(f"{topic}\0{partition}\0".encode(), digest_size=8, key=self._key)
            self._hashers[(topic, partition)] = base
        h = base.copy()
        h.update(raw)
        return h.digest()

    def due(self) -> list[Dropped]:
        """The summaries of intervals that have ended with something not answered (each
        returned once)."""
        now = self._clock()
        for where, window in list(self._windows.items()):
            if now >= window.start_ms + self.bounds.interval_ms:
                del self._windows[where]
                if window.dropped is not None:
                    self._closed.append(window.dropped)
        closed, self._closed = self._closed, []
        return closed

    def _window(self, topic: str, partition: int | None) -> _Window:
        now = self._clock()
        window = self._windows.get((topic, partition))
        if window is None or now >= window.start_ms + self.bounds.interval_ms:
            if window is not None and window.dropped is not None:
                self._closed.append(window.dropped)
            start = now - now % self.bounds.interval_ms
            window = self._windows[(topic, partition)] = _Window(start)
        return window
