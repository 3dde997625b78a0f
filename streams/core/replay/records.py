"""Replay records: recall, keep, forget. The one writer of purchase records and value marks.

A purchase's decision is kept under its buyer, stream and id (:class:`~.state.PurchaseRecord`:
levels, price, the values covered, a digest of the outcome), so a resend is never charged twice
and its outcome can be recomputed. It is written once, without the outcome's bytes: state is
durable before outputs are sent, so a worker that dies in between leaves a record whose
outcome may never have gone, and its replay recomputes that outcome from the decision
(:meth:`Records.unsent` tells it to). A replay sees the state the whole batch left, so when a
later event of the same batch evicts a value the decision covered (:meth:`Records.evicted`),
the outcome could no longer be recomputed: only then is the record written with its bytes
(the batch writes each key once, so still one record), and :meth:`Records.settle` drops them in
a later batch, once the batch that wrote them has sent its outputs. A value
that left its stream's window keeps a mark (:class:`~streams.core.state.EvictedValue`: its
arrival number and digest) so a resend is recognised.

Keeping either for ever would grow without bound, so each stream's records are forgotten once
they are older than the dedup horizon before its watermark (:mod:`.watermarks`); events that old
are refused (:mod:`.admission`), so no record can be needed by then. Each stream also keeps at
most a number of each (:class:`Caps`): past it the oldest are forgotten and the watermark moves
past them, so the memory the records take is bounded in bytes whatever the horizon, and a
resend of what was forgotten is refused as too old, never applied again. Refusals of purchases
on a stream nobody has registered have no watermark: they are forgotten by the clock,
:data:`CLOCK_RECORD_MS` late, on their input partition, and that partition keeps at most
:attr:`Caps.unknown` of them (beyond that a refusal cannot be kept, and says so).

A copy of a purchase's first request whose outcome was surely sent adds nothing to the buyer's
inbox, which holds the outcome (:meth:`Records.in_inbox`): anyone can write the buyer's signed
bytes again. A resend signed anew (another request time: only the buyer can make one, e.g. a new
process of its client), or a copy whose outcome may not have been sent or whose inbox was lost
and made again, is answered once (:meth:`Records.resend_due`: a copy of that resend adds
nothing either), and the outcome is sent again at most once per :data:`ANSWER_INTERVAL_MS`
(:meth:`Records.answer_due`); in between a resend gets a short notice, so resending one purchase
cannot make the market send its outcome again and again.

A refusal of a purchase dated more than the horizon ahead outlives every other record, so one
buyer may have at most :data:`MAX_FAR_FUTURE_RECORDS` of them on a partition
(:meth:`Records.recordable`); beyond that a refusal cannot be kept, and says so.

Which records are due is found with an in-memory heap per stream and kind, rebuilt from the
stores by one scan after a restart or a rebalance (:meth:`Records.invalidate`).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from ..state import EvictedValue, PurchaseRecord, Stores, ValueState, record_key
from .admission import CLOCK_REFUSE_MS, MAX_CLOCK_SKEW_MS, HorizonKind

__all__ = [
    "ANSWER_INTERVAL_MS",
    "CLOCK_RECORD_MS",
    "MAX_FAR_FUTURE_RECORDS",
    "STRANDED_MS",
    "TAKEOVER_SKEW_MS",
    "UNKNOWN_STREAM",
    "WATERMARK_STEP_MS",
    "Caps",
    "Records",
    "purchase_key",
]

CLOCK_RECORD_MS = CLOCK_REFUSE_MS + MAX_CLOCK_SKEW_MS
"""Beyond the horizon, how long a record kept by the clock outlives its request time: a skew
longer than a purchase is admitted, for a worker whose clock is behind."""
WATERMARK_STEP_MS = 60_000
"""The purchase watermark moves in steps of this much at most (a 64th of the horizon if that is
less), so the stream record that carries it is written for it at most once a step."""
MAX_FAR_FUTURE_RECORDS = 8
"""Refusals of purchases dated more than the horizon ahead one buyer may have on record on one
partition."""
UNKNOWN_STREAM = "?"
REFUSED = "!"
"""Prefix of the heap of a known stream's refused purchases (:meth:`Records.refused`)."""
"""Where records of purchases on streams the market does not know are indexed (one heap per
input partition): ``?`` is in no id, so no stream's heap is named so."""


ANSWER_INTERVAL_MS = 10_000
"""A resent purchase is answered (its outcome sent again) at most once this often; clients
resend every 15 s by default, so one that waits for its outcome always gets it again."""
MAX_ANSWERED = 65_536
"""Purchases whose last answer time a worker remembers (least recently answered forgotten: a
forgotten one is answered in full once more)."""
STRANDED_MS = 15 * 60_000
"""How long a record found with its outcome's bytes after a restart or a rebalance keeps them:
the events after the last commit are replayed within this, and each replay of the purchase
finds its bytes."""
TAKEOVER_SKEW_MS = 10_000
"""How far ahead of this worker's clock the worker that decided a purchase before it took the
partition on may have been: such a record may still be one whose outputs were lost (this
worker's own decisions are told apart by its memory of what it answered)."""


@dataclass(frozen=True)
class Caps:
    """How many records one stream (or input partition) keeps at most, whatever the horizon.

    With the codecs' bounds (:data:`~streams.core.state.PURCHASE_RECORD_BYTES`,
    :data:`~streams.core.state.VALUE_MARK_BYTES`) the records of one stream take at most
    ``(purchases + refusals) · 256 + marks · 64`` bytes in the store (1.25 MiB by default).
    """

    #: records of fulfilled purchases per stream (each paid for; a buyer has at most one per
    #: step of the stream's ladder): past it the oldest go, and the watermark with them
    purchases: int = 2_048
    #: records of refused purchases per stream (free to cause): past it a refusal is not
    #: recorded, and says so; they never push out another record nor move the watermark
    refusals: int = 1_024
    #: eviction marks per stream
    marks: int = 8_192
    #: refusals kept of purchases on streams the market does not know, per input partition
    unknown: int = 4_096


def purchase_key(buyer_id: str, stream_id: str, purchase_id: str) -> str:
    """Where a purchase's outcome is kept: under its buyer, stream and id (the record lives in
    the stream's changelog partition, so the key names the stream)."""
    return record_key(buyer_id, stream_id, purchase_id)


class Records:
    """The purchase outcomes and value marks of this worker's partitions, and when each may go.

    Parameters
    ----------
    horizon_ms : int
        The dedup horizon.
    clock : callable
        The market's clock (Unix ms).
    stores : Stores
        Where the records live (``purchases``; marks in ``releases``).
    partition_of : callable
        The input partition of a stream id.
    caps : Caps, optional
        The records one stream keeps at most.
    """

    def __init__(
        self,
        horizon_ms: int,
        clock: Callable[[], int],
        stores: Stores,
        partition_of: Callable[[str], int],
        caps: Caps | None = None,
    ) -> None:
        self.horizon_ms = horizon_ms
        self.caps = caps or Caps()
        #: the batch being applied: outputs of every earlier one have been sent
        self.epoch = 0
        # stream → (epoch, clock ms, key) of records that still carry their outcome's bytes,
        # which may be dropped once the epoch is later and the clock is past the time
        self._young: dict[str, list[tuple[int, int, str]]] = {}
        # stream → (key, outcome bytes) of the records this batch decided, written without them
        self._unsent: dict[str, list[tuple[str, bytes]]] = {}
        self._answered: OrderedDict[str, int] = OrderedDict()
        self._remade: OrderedDict[str, int] = OrderedDict()  # inbox topic -> when made again
        # resend (key, request time) -> when answered, and whether with its outcome
        self._resends: OrderedDict[tuple[str, int], tuple[int, bool]] = OrderedDict()
        self._taken_ms = clock()  # when this worker last took its partitions on
        self.step_ms = max(1, min(WATERMARK_STEP_MS, horizon_ms // 64))
        self.clock = clock
        self._stores = stores
        self._partition_of = partition_of
        self._heaps: dict[HorizonKind, dict[str, list[tuple[int, str]]]] = {}
        # (buyer, input partition) → request times of its far-future refusals on record
        self._far: dict[tuple[str, int], list[int]] = {}

    # -- purchases ------------------------------------------------------------------------------
    def purchase(self, key: str) -> PurchaseRecord | None:
        """The outcome kept under ``key``, if any."""
        return self._stores.purchases.get(key)

    def keep_purchase(
        self, key: str, record: PurchaseRecord, heap: str, outcome: bytes | None = None
    ) -> None:
        """Keep a purchase's record until the horizon passes its request time (``heap``: its
        stream, or :meth:`unknown` of it). ``outcome``, a fulfilment's bytes, is held in memory
        until the batch is over, in case the batch evicts a value it covered (:meth:`evicted`)."""
        self._stores.purchases[key] = record
        self._remember("purchase", heap, record.requested_at_ms, key)
        self._answered_now(key)
        if record.payload is not None:
            self.resent(key, record)
        elif outcome is not None:
            self._unsent.setdefault(record.stream_id, []).append((key, outcome))

    def evicted(self, stream_id: str, last_seq: int) -> None:
        """Values of ``stream_id`` up to arrival number ``last_seq`` left its window (called in
        an event of the stream). A decision of this batch that covered one could not be
        recomputed by a replay of the batch: its record takes its outcome's bytes, until a
        later batch has sent them (:meth:`settle`)."""
        kept = []
        for key, outcome in self._unsent.get(stream_id, ()):
            rec = self._stores.purchases.get(key)
            if rec is None or rec.payload is not None:
                continue
            if rec.count == 0 or rec.first_seq > last_seq:
                kept.append((key, outcome))
                continue
            rec = dataclasses.replace(rec, payload=outcome.decode())
            self._stores.purchases[key] = rec
            self.resent(key, rec)
        self._unsent[stream_id] = kept

    def unsent(self, key: str, record: PurchaseRecord) -> bool:
        """Whether the outcome of ``record`` (kept under ``key``) may never have been sent: it
        still carries the bytes, or it was decided shortly before this worker took its
        partition on and this worker has not answered it since (its batch may have been
        committed without its outputs: see :data:`STRANDED_MS`). A replay then answers it in
        full, with what else the decision sent (a fulfilment's sale notice)."""
        if record.payload is not None:
            return True
        at = record.decided_at_ms
        stranded = self._taken_ms - STRANDED_MS <= at <= self._taken_ms + TAKEOVER_SKEW_MS
        return stranded and key not in self._answered

    def resent(self, key: str, record: PurchaseRecord) -> None:
        """``record``'s outcome bytes are sent in this batch: keep them until it is over."""
        if record.payload is not None:
            self._young.setdefault(record.stream_id, []).append((self.epoch, 0, key))

    def settle(self, stream_id: str) -> None:
        """Drop the outcome bytes of ``stream_id``'s records that earlier batches have sent
        (called in an event of the stream: the rewrite reaches the record's own partition)."""
        young = self._young.get(stream_id)
        if not young:
            return
        now = self.clock()
        keep = [y for y in young if y[0] >= self.epoch or y[1] > now]
        for _, _, key in (y for y in young if y[0] < self.epoch and y[1] <= now):
            rec = self._stores.purchases.get(key)
            if rec is not None and rec.payload is not None:
                self._stores.purchases[key] = dataclasses.replace(rec, payload=None)
        self._young[stream_id] = keep

    def begin_batch(self) -> None:
        """A new batch begins: the outputs of every earlier one have been sent."""
        self.epoch += 1
        self._unsent.clear()

    def inboxes_remade(self, topics: list[str]) -> None:
        """Told (by the worker) that ``topics`` were lost and made again now: what was answered
        in them before is gone, so a resend is answered in full once more (:meth:`in_inbox`)."""
        now = self.clock()
        for topic in topics:
            self._remade[topic] = now
            self._remade.move_to_end(topic)
            if len(self._remade) > MAX_ANSWERED:
                self._remade.popitem(last=False)

    def in_inbox(self, inbox: str, key: str, record: PurchaseRecord) -> bool:
        """Whether ``record``'s outcome was surely sent to ``inbox`` and is still there: it is
        not :meth:`unsent`, and this worker has not seen the inbox made again since the
        purchase was decided. A resend of such a purchase adds nothing to
        the inbox: the buyer's client reads its inbox from the beginning and finds the answer
        there, and a copy written by anyone else must not add to a mailbox kept for a year."""
        remade = self._remade.get(inbox)
        if remade is not None and remade >= record.decided_at_ms:
            return False
        return not self.unsent(key, record)

    def resend_due(self, key: str, requested_at_ms: int, inbox: str) -> bool:
        """Whether the resend of the purchase under ``key`` stamped ``requested_at_ms`` is to
        be answered: not if it had its answer since ``inbox`` was last made, nor if it was told
        to ask again less than :data:`ANSWER_INTERVAL_MS` ago. So each signed resend is
        answered once, and a copy of it written again adds nothing (least recently answered
        forgotten past :data:`MAX_ANSWERED`, and all on a restart: one more answer each)."""
        seen = self._resends.get((key, requested_at_ms))
        if seen is None:
            return True
        at, final = seen
        remade = self._remade.get(inbox)
        if remade is not None and remade > at:
            return True
        return not final and self.clock() - at >= ANSWER_INTERVAL_MS

    def resend_answered(self, key: str, requested_at_ms: int, *, final: bool) -> None:
        """Note that this resend was answered now: with its outcome (``final``), or told to ask
        again after the interval."""
        seen = (key, requested_at_ms)
        self._resends[seen] = (self.clock(), final)
        self._resends.move_to_end(seen)
        if len(self._resends) > MAX_ANSWERED:
            self._resends.popitem(last=False)

    def answer_due(self, key: str) -> int | None:
        """``None`` if a resend of the purchase under ``key`` is to be answered in full now
        (then noted as answered), else when it last was (Unix ms)."""
        last = self._answered.get(key)
        if last is not None and self.clock() - last < ANSWER_INTERVAL_MS:
            return last
        self._answered_now(key)
        return None

    def _answered_now(self, key: str) -> None:
        self._answered[key] = self.clock()
        self._answered.move_to_end(key)
        if len(self._answered) > MAX_ANSWERED:
            self._answered.popitem(last=False)

    def over_cap_purchases(self, heap: str) -> int | None:
        """Forget ``heap``'s oldest records beyond :attr:`Caps.purchases`; return the newest
        request time forgotten (the watermark must then refuse it), ``None`` if none."""
        return self._cap("purchase", heap, self.caps.purchases, self._stores.purchases)

    def over_cap_values(self, stream_id: str) -> int | None:
        """Forget ``stream_id``'s oldest marks beyond :attr:`Caps.marks`; return the newest
        publication time forgotten, ``None`` if none."""
        return self._cap("value", stream_id, self.caps.marks, self._stores.releases)

    def has_room(self, heap: str) -> bool:
        """Whether the refusals kept in ``heap`` (:meth:`unknown`, :meth:`refused`) may take one
        more: a refusal is free to cause, so it never pushes out another record."""
        cap = self.caps.refusals if heap.startswith(REFUSED) else self.caps.unknown
        return len(self._heap("purchase", heap)) < cap

    def forget_purchases(self, heap: str, watermark: int) -> None:
        """Forget the outcomes of ``heap`` (a stream's: its refusals too) older than
        ``watermark`` minus the horizon."""
        self._forget("purchase", heap, watermark, self._stores.purchases)
        if not heap.startswith(UNKNOWN_STREAM):
            self._forget("purchase", self.refused(heap), watermark, self._stores.purchases)

    @staticmethod
    def refused(stream_id: str) -> str:
        """The heap of the refused purchases of a stream the market knows."""
        return f"{REFUSED}{stream_id}"

    def unknown(self, stream_id: str) -> str:
        """The heap of records of unknown streams on ``stream_id``'s input partition: they are
        forgotten only while an event of that partition is handled, so the tombstones reach
        the changelog partition that holds the records."""
        return f"{UNKNOWN_STREAM}{self._partition_of(stream_id)}"

    def recordable(self, ts: int, buyer: str, stream_id: str) -> bool:
        """Whether the refusal of ``buyer``'s purchase on ``stream_id`` stamped ``ts`` may be
        kept: always within the horizon ahead of the clock; beyond it while the buyer holds
        fewer than :data:`MAX_FAR_FUTURE_RECORDS` such records on the stream's partition."""
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

    # -- values ---------------------------------------------------------------------------------
    def value(self, key: str) -> ValueState | None:
        """What is stored under a value's key: its state, or its mark once evicted."""
        return self._stores.releases.get(key)

    def mark_value(self, stream_id: str, key: str, mark: EvictedValue, *, expires: bool) -> None:
        """Leave ``mark`` for a value (``expires``: forgotten with the horizon; a running
        total's increments are marked on arrival and expire once evicted)."""
        self._stores.releases[key] = mark
        if expires:
            self._remember("value", stream_id, mark.published_at_ms, key)

    def forget_values(self, stream_id: str, watermark: int) -> None:
        """Forget the marks of ``stream_id`` older than ``watermark`` minus the horizon."""
        self._forget("value", stream_id, watermark, self._stores.releases)

    # -- the heaps ------------------------------------------------------------------------------
    def invalidate(self) -> None:
        """Forget the heaps; the next use rebuilds them from the stores in one scan (needed
        after every rebalance: the stores may then hold records another worker wrote)."""
        self._heaps.clear()
        self._far.clear()
        self._young.clear()
        self._unsent.clear()
        self._taken_ms = self.clock()

    def _cap(
        self, kind: HorizonKind, heap_id: str, cap: int, store: MutableMapping[str, Any]
    ) -> int | None:
        """Pop the oldest of ``heap_id`` beyond ``cap``, and every other record as old."""
        heap = self._heap(kind, heap_id)
        if len(heap) <= cap:
            return None
        newest = heap[0][0]
        while heap and (len(heap) > cap or heap[0][0] <= newest):
            newest, key = heapq.heappop(heap)
            store.pop(key, None)
        return newest

    def _remember(self, kind: HorizonKind, heap: str, ts: int, key: str) -> None:
        heapq.heappush(self._heap(kind, heap), (ts, key))

    def _forget(
        self, kind: HorizonKind, heap_id: str, watermark: int, store: MutableMapping[str, Any]
    ) -> None:
        heap = self._heap(kind, heap_id)
        low = watermark - self.horizon_ms
        while heap and heap[0][0] < low:
            _, key = heapq.heappop(heap)
            store.pop(key, None)

    def _heap(self, kind: HorizonKind, heap: str) -> list[tuple[int, str]]:
        if not self._heaps:
            self._index()
        return self._heaps[kind].setdefault(heap, [])

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
        stranded = self.clock() + STRANDED_MS
        for k, r in self._stores.purchases.items():
            if r.stream_id not in streams:
                sid = self.unknown(r.stream_id)
            else:
                sid = r.stream_id if r.status == "fulfilled" else self.refused(r.stream_id)
            purchases.setdefault(sid, []).append((r.requested_at_ms, k))
            if r.payload is not None:
                self._young.setdefault(r.stream_id, []).append((self.epoch, stranded, k))
            if r.requested_at_ms > far:
                slot = (k.split("/", 1)[0], self._partition_of(r.stream_id))
                self._far.setdefault(slot, []).append(r.requested_at_ms)
        for heap in (*values.values(), *purchases.values()):
            heapq.heapify(heap)
        self._heaps = {"value": values, "purchase": purchases}
