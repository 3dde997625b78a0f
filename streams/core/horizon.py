"""The dedup horizon: one rule, for values and purchases alike, that keeps memory bounded.

The market recognises a resent value (same stream and value id) or purchase (same buyer and
purchase id) by a stored record. Keeping every record forever would grow without bound, so each
stream carries two *watermarks*, the newest publication time of a value and the newest request
time of a purchase, and:

* an event older than its watermark minus the horizon is **refused** (``value_too_old``,
  ``request_too_old``): no record can be needed to recognise it;
* records older than the watermark minus the horizon are therefore **forgotten**;
* an event more than :data:`MAX_CLOCK_SKEW_MS` ahead of the market's clock is refused
  (``*_from_the_future``), or it could push the watermark forward and make the market forget
  records that honest resends still need.

A purchase is also refused when it is older than the market's *clock* minus the horizon and
the allowed clock skew (a worker behind on a backlog shorter than that refuses nothing). Its
refusal may be recorded where no watermark guards it — on a stream nobody has registered yet
(:data:`UNKNOWN_STREAM`, forgotten by the clock) — and without this rule the same signed bytes,
sent again once that record was gone, would be fulfilled: a purchase its buyer had been told
was refused, on a stream someone registered in the meantime, at the price it allowed (the red
team's replay). Such records are forgotten only another :data:`MAX_CLOCK_SKEW_MS` after that
(:data:`CLOCK_RECORD_MS`), so a worker whose clock is behind the one that forgot them still
refuses the copy. On a registered stream the clock's verdict is also kept in the data: the
purchase watermark starts at the registration time and is raised to the clock less the skew
on every purchase (:mod:`streams.core.purchases`), so a worker whose clock is behind refuses
by the watermark what another refused by its clock.

A purchase from the future is refused *and recorded*, so a copy sent once the clock has caught
up meets its refusal, not a fulfilment. Its record lives until the horizon has passed its
request time: for one dated more than the horizon ahead, longer than any other record, so each
buyer may hold at most :data:`MAX_FAR_FUTURE_RECORDS` of those on a partition
(:meth:`DedupHorizon.recordable`); beyond, a refusal cannot be kept, and says so.

Which records are due is found with an in-memory heap per stream and kind, rebuilt from the
stores by one scan after a restart or a rebalance (:meth:`DedupHorizon.invalidate`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from .outputs import Reject
from .state import EvictedValue, Stores

__all__ = [
    "CLOCK_RECORD_MS", "MAX_CLOCK_SKEW_MS", "UNKNOWN_STREAM", "DedupHorizon", "HorizonKind",
]

MAX_CLOCK_SKEW_MS = 3_600_000
CLOCK_REFUSE_MS = MAX_CLOCK_SKEW_MS
"""Beyond the horizon, how much older than the market's clock a purchase may be."""
CLOCK_RECORD_MS = CLOCK_REFUSE_MS + MAX_CLOCK_SKEW_MS
"""Beyond the horizon, how long a record kept by the clock outlives its request time: a skew
longer than a purchase is admitted, for a worker whose clock is behind."""
WATERMARK_STEP_MS = 60_000
"""The purchase watermark moves in steps of this much at most (a 64th of the horizon if that is
less): forward to a whole step, or a step past its floor. The stream record, which carries it,
is then written for it at most once a step, however many purchases are refused or replayed."""
MAX_FAR_FUTURE_RECORDS = 8
"""Refusals of purchases dated more than the horizon ahead one buyer may have on record on one
partition (each kept until the horizon passes its date: memory must bound them per buyer)."""
UNKNOWN_STREAM = "?"
"""Where records of events on streams the market does not know are indexed (one heap per input
partition, :meth:`DedupHorizon.unknown`): they have no stream watermark, so they expire by the
market's clock."""
HorizonKind = Literal["value", "purchase"]


@dataclass(frozen=True)
class _Words:
    """How refusals of one kind of event read, and whether the market's clock also bounds its
    age (for a kind whose records may be kept where no watermark guards them)."""

    noun: str
    stamped: str
    newest: str
    too_old: str
    future: str
    too_old_advice: str
    whose_clock: str
    aged_by_clock: bool


_WORDS: dict[HorizonKind, _Words] = {
    "value": _Words(
        "value", "was published at", "the newest value of stream", "value_too_old",
        "value_from_the_future", "the market no longer accepts or replays it", "seller's",
        False,
    ),
    "purchase": _Words(
        "purchase", "was requested at", "the newest purchase on stream", "request_too_old",
        "request_from_the_future", "resend it with a new purchase id and a current time",
        "buyer's", True,
    ),
}  # fmt: skip


class DedupHorizon:
    """Admits events by their timestamps and forgets records the horizon no longer needs."""

    def __init__(
        self,
        horizon_ms: int,
        clock: Callable[[], int],
        stores: Stores,
        partition_of: Callable[[str], int],
    ) -> None:
        self.horizon_ms = horizon_ms
        self.step_ms = max(1, min(WATERMARK_STEP_MS, horizon_ms // 64))
        self.clock = clock
        self._stores = stores
        self._partition_of = partition_of
        self._heaps: dict[HorizonKind, dict[str, list[tuple[int, str]]]] = {}
        # (buyer, input partition) → request times of its far-future refusals on record
        self._far: dict[tuple[str, int], list[int]] = {}

    def admit(
        self, kind: HorizonKind, ts: int, watermark: int | None, ident: str, stream_id: str
    ) -> None:
        """Raise :class:`Reject` if an event stamped ``ts`` must be refused: too old
        (:meth:`admit_age`) or from the future (:meth:`admit_time`).

        ``watermark`` is the stream's newest timestamp of this kind (``None`` for a stream the
        market does not know, whose events are only checked against the clock).
        """
        self.admit_age(kind, ts, watermark, ident, stream_id)
        self.admit_time(kind, ts, ident)

    def admit_age(
        self, kind: HorizonKind, ts: int, watermark: int | None, ident: str, stream_id: str
    ) -> None:
        """Raise ``*_too_old`` if no record can be needed to recognise an event stamped ``ts``:
        it is older than the horizon before its stream's watermark (or, for a purchase, before
        the market's clock)."""
        w = _WORDS[kind]
        if watermark is not None and ts < watermark - self.horizon_ms:
            raise Reject(
                w.too_old,
                f"{w.noun} {ident!r} {w.stamped} {ts} ms, more than the dedup horizon "
                f"({self.horizon_ms} ms) before {w.newest} {stream_id!r} ({watermark} ms); "
                f"{w.too_old_advice}",
            )
        now = self.clock()
        if w.aged_by_clock and ts < now - self.horizon_ms - CLOCK_REFUSE_MS:
            raise Reject(
                w.too_old,
                f"{w.noun} {ident!r} {w.stamped} {ts} ms, more than the dedup horizon "
                f"({self.horizon_ms} ms) and the allowed clock skew ({CLOCK_REFUSE_MS} ms) "
                f"before the market's clock ({now} ms); {w.too_old_advice}",
            )

    def admit_time(self, kind: HorizonKind, ts: int, ident: str) -> None:
        """Raise ``*_from_the_future`` if ``ts`` is more than :data:`MAX_CLOCK_SKEW_MS` ahead
        of the market's clock."""
        w = _WORDS[kind]
        if ts > self.clock() + MAX_CLOCK_SKEW_MS:
            raise Reject(
                w.future,
                f"{w.noun} {ident!r} claims a time of {ts} ms, more than {MAX_CLOCK_SKEW_MS} ms "
                f"ahead of the market's clock; check the {w.whose_clock} clock",
            )

    def recordable(self, ts: int, buyer: str, stream_id: str) -> bool:
        """Whether the refusal of ``buyer``'s purchase on ``stream_id`` stamped ``ts`` may be
        recorded: always within the horizon ahead of the clock; beyond it (its record outlives
        every other) while the buyer holds fewer than :data:`MAX_FAR_FUTURE_RECORDS` such
        records on the stream's input partition."""
        far = self.clock() + self.horizon_ms
        if ts <= far:
            return True
        if not self._heaps:
            self._index()
        slot = (buyer, self._partition_of(stream_id))
        held = [t for t in self._far.get(slot, []) if t > far]  # the others are near now
        if len(held) >= MAX_FAR_FUTURE_RECORDS:
            return False
        self._far[slot] = [*held, ts]
        return True

    def remember(self, kind: HorizonKind, stream_id: str, ts: int, key: str) -> None:
        """Note that the record ``key`` of ``stream_id`` expires with timestamp ``ts``."""
        heapq.heappush(self._heap(kind, stream_id), (ts, key))

    def forget(
        self, kind: HorizonKind, stream_id: str, watermark: int, store: MutableMapping[str, Any]
    ) -> None:
        """Drop from ``store`` the records of ``stream_id`` the horizon no longer protects."""
        heap = self._heap(kind, stream_id)
        low = watermark - self.horizon_ms
        while heap and heap[0][0] < low:
            _, key = heapq.heappop(heap)
            store.pop(key, None)

    def unknown(self, stream_id: str) -> str:
        """The heap of records of unknown streams on ``stream_id``'s input partition: forgotten
        only while an event of that partition is handled, so the tombstones reach the
        changelog partition that holds the records (one heap for all sent them to the
        partition of whatever event forgot them, and a restore brought them back: red team,
        fourth round). ``?`` is in no id, so no stream's heap is named so."""
        return f"{UNKNOWN_STREAM}{self._partition_of(stream_id)}"

    def invalidate(self) -> None:
        """Forget the heaps; the next use rebuilds them from the stores in one scan.

        Needed after every rebalance: the stores may then hold records another worker wrote.
        """
        self._heaps.clear()
        self._far.clear()

    def _heap(self, kind: HorizonKind, stream_id: str) -> list[tuple[int, str]]:
        if not self._heaps:
            self._index()
        return self._heaps[kind].setdefault(stream_id, [])

    def _index(self) -> None:
        """One pass over both stores builds the heaps of every stream at once."""
        values: dict[str, list[tuple[int, str]]] = {}
        for k, v in self._stores.releases.items():
            if isinstance(v, EvictedValue):
                values.setdefault(k.rsplit("/", 1)[0], []).append((v.published_at_ms, k))
        purchases: dict[str, list[tuple[int, str]]] = {}
        streams = self._stores.streams
        far = self.clock() + self.horizon_ms
        self._far = {}
        for k, r in self._stores.purchases.items():
            sid = r.stream_id if r.stream_id in streams else self.unknown(r.stream_id)
            purchases.setdefault(sid, []).append((r.requested_at_ms, k))
            if r.requested_at_ms > far:
                slot = (k.split("/", 1)[0], self._partition_of(r.stream_id))
                self._far.setdefault(slot, []).append(r.requested_at_ms)
        for heap in (*values.values(), *purchases.values()):
            heapq.heapify(heap)
        self._heaps = {"value": values, "purchase": purchases}
