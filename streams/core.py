"""The market's business logic, independent of Faust: one event in, state changes and outputs out.

:class:`MarketCore` turns each input event (registration, value, purchase, quote) into writes on
four dict-like stores and a list of :class:`Output` messages. The Faust layer (:mod:`streams.app`)
supplies Faust tables as the stores and sends the outputs; tests supply plain dicts.

Replay safety — why a redelivered or duplicated event can never draw fresh noise for a level that
was already released, nor charge twice:

1. **Releases are state.** Every released vector is stored in the value's
   :class:`~market.ladder.ReleaseState`; asking for a stored level returns it bit for bit.
2. **State is durable before output.** The Faust layer flushes the table changelog (and waits for
   the broker's acknowledgement) before it sends any output of a batch. A release a buyer can see
   is therefore always in durable state; a crash before the flush loses the outputs too, and the
   event is reprocessed because its offset was not committed.
3. **Outcomes are idempotent.** A purchase is keyed by ``(buyer_id, purchase_id)``; its outcome
   (fulfilment or rejection) is stored with the exact bytes sent, and a duplicate re-emits those
   bytes without charging. A value is keyed by ``(stream_id, value_id)`` with a digest of its
   numbers; a duplicate re-emits stored releases only, a conflicting resend is rejected, and a
   resend after eviction from the window is recognised (ids are remembered) and never re-noised.
4. **Noise is a function of the request.** New levels are sampled with
   :func:`market.rng.keyed_rng` (via its faster twin ``KeyedRngFactory``) keyed by
   ``(stream, value, level)``, so even a release whose state
   write was lost would be recomputed identically from the same stored neighbours.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from market import MarketError, Mechanism, ReleaseState, mechanism
from market.envelope import ciphertext_digest, seal
from market.errors import InvalidLevelError
from market.levels import canonical_level
from market.pricing import PriceSchedule, schedule_from_spec
from market.receipts import Receipt, release_digest, sign_receipt
from market.rng import KeyedRngFactory

from .events import (
    PURCHASES_EVENT,
    CatalogEntry,
    PriceLevel,
    PurchaseRequest,
    QuoteAnswer,
    QuoteRequest,
    Rejection,
    StreamRegistration,
    ValueEvent,
)
from .keys import MarketKeys
from .topics import Topics

__all__ = [
    "EvictedValue",
    "Holder",
    "MarketCore",
    "Outcome",
    "Output",
    "PurchaseRecord",
    "StreamState",
    "ValueEntry",
]

log = logging.getLogger("emarket.core")
DEFAULT_DEDUP_HORIZON_MS = 7 * 86_400_000  # the values topic's retention
MAX_CLOCK_SKEW_MS = 3_600_000
EPSILON_DELTA = 1e-6  # δ at which catalog entries state ε for Gaussian and Poisson streams


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ----------------------------------------------------------------------------- state
class ValueEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value_id: str
    seq: int
    digest: str
    received_at_ms: int
    published_at_ms: int = 0


class Holder(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: float
    paid_minor: int = 0
    purchases: int = 0
    public_key: str | None = None  # X25519 key releases to this holder are sealed for


class StreamState(BaseModel):
    """Everything the market keeps about one stream besides the per-value ladders."""

    model_config = ConfigDict(extra="forbid")
    registration: StreamRegistration
    accepted_at_ms: int
    catalog_payload: str
    window: list[ValueEntry] = []
    next_seq: int = 0
    holders: dict[str, Holder] = {}
    revenue_minor: int = 0
    spent: float = 0.0
    values_ingested: int = 0
    #: newest publication time accepted on the stream; values older than this minus the dedup
    #: horizon are refused, which is what allows forgetting their eviction markers
    watermark_ms: int = 0
    #: the same for purchases: outcomes older than it minus the horizon are forgotten
    purchase_watermark_ms: int = 0


class PurchaseRecord(BaseModel):
    """The stored outcome of one purchase: replayed verbatim for duplicates."""

    model_config = ConfigDict(extra="forbid")
    fingerprint: str
    status: Literal["fulfilled", "rejected"]
    stream_id: str
    price_minor: int = 0
    payload: str
    requested_at_ms: int = 0


@dataclass(frozen=True)
class EvictedValue:
    """What remains of a value that left its stream's window: enough to recognise a resend,
    until the value is older than the dedup horizon (then any resend is refused as too old)."""

    seq: int
    digest: str
    published_at_ms: int = 0


Ladder = ReleaseState | EvictedValue


class Stores:
    """The three stores the core writes. Any MutableMapping works (dicts in tests, Faust tables in
    the service); values are always re-assigned after a change so a table sends its changelog.

    ``ladders`` maps ``stream/value`` to the value's :class:`ReleaseState` while it is in the
    stream's window and to an :class:`EvictedValue` marker afterwards (one changelog message per
    value at ingestion and one at eviction)."""

    def __init__(
        self,
        streams: MutableMapping[str, StreamState] | None = None,
        ladders: MutableMapping[str, Ladder] | None = None,
        purchases: MutableMapping[str, PurchaseRecord] | None = None,
    ) -> None:
        self.streams: MutableMapping[str, StreamState] = {} if streams is None else streams
        self.ladders: MutableMapping[str, Ladder] = {} if ladders is None else ladders
        self.purchases: MutableMapping[str, PurchaseRecord] = {} if purchases is None else purchases


# ---------------------------------------------------------------------------- outputs
@dataclass(frozen=True)
class Output:
    topic: str
    key: bytes | None
    value: bytes


@dataclass
class Outcome:
    """What happened to one input event; the streaming layer turns it into metrics."""

    kind: Literal["registration", "value", "purchase", "quote", "unknown"]
    status: Literal["accepted", "fulfilled", "rejected", "duplicate", "answered"]
    outputs: list[Output] = field(default_factory=list)
    reason: str | None = None
    stream_id: str | None = None
    mechanism: str | None = None
    releases: int = 0
    new_noise: int = 0
    price_minor: int = 0
    buyer_topic: str | None = None


class _Reject(Exception):
    def __init__(self, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.reason, self.message, self.details = reason, message, details


def _key(*parts: str) -> str:
    return "/".join(parts)


def _dump(model: BaseModel) -> bytes:
    return model.model_dump_json().encode("utf-8")


def _digest_values(arr: np.ndarray[Any, Any]) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


# ------------------------------------------------------------------------------- core
class MarketCore:
    """Applies events to the market state. Not thread-safe; one instance per worker."""

    def __init__(
        self,
        stores: Stores,
        keys: MarketKeys,
        topics: Topics,
        *,
        clock: Callable[[], int] = now_ms,
        require_encryption: bool = False,
        dedup_horizon_ms: int = DEFAULT_DEDUP_HORIZON_MS,
    ) -> None:
        self.require_encryption = require_encryption
        self.dedup_horizon_ms = dedup_horizon_ms
        self._expiry: dict[str, list[tuple[int, str]]] = {}
        self._purchase_expiry: dict[str, list[tuple[int, str]]] = {}
        self._indexed = False
        self.stores = stores
        self.keys = keys
        self.topics = topics
        self.clock = clock
        self._mech_cache: dict[str, tuple[Mechanism, PriceSchedule]] = {}
        self._deliveries: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._keyed = KeyedRngFactory(keys.noise_secret)
        self._batching = False

    # -- dispatch -------------------------------------------------------------------------
    def handle(
        self,
        topic: str,
        value: bytes | None,
        *,
        partition: int | None = None,
        offset: int | None = None,
    ) -> Outcome:
        """Process one raw input event; never raises for bad input (it becomes a rejection)."""
        raw = value or b""
        src = (topic, partition, offset, raw)
        if topic == self.topics.registrations:
            return self._guard("registration", src, lambda: self._register(raw))
        if topic == self.topics.values:
            return self._guard("value", src, lambda: self._value(raw))
        if topic == self.topics.purchases:
            return self._guard("purchase", src, lambda: self._purchases(raw, src))
        return self._rejected(
            "unknown", src, _Reject("unknown_topic", f"the market does not consume {topic!r}")
        )

    def _guard(
        self, kind: Any, src: tuple[str, int | None, int | None, bytes], fn: Callable[[], Outcome]
    ) -> Outcome:
        try:
            return fn()
        except _Reject as rej:
            return self._rejected(kind, src, rej)
        except MarketError as exc:  # e.g. parameters the engine refuses
            return self._rejected(kind, src, _Reject(exc.code, exc.message))
        except ValidationError as exc:
            errors = [
                {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"]}
                for e in exc.errors(include_url=False, include_input=False)[:10]
            ]
            first = errors[0] if errors else {"loc": "", "msg": str(exc)}
            msg = f"not a valid {kind} event: {first['loc'] or 'payload'}: {first['msg']}"
            if len(errors) > 1:
                msg += f" (and {len(errors) - 1} more problems)"
            return self._rejected(kind, src, _Reject("invalid_event", msg, errors=errors))
        except Exception as exc:  # a bug must not stop the market: reject, log, carry on
            log.exception("internal error while processing a %s event", kind)
            return self._rejected(
                kind,
                src,
                _Reject(
                    "internal_error",
                    "the market could not process this event; the operators have been alerted "
                    f"({type(exc).__name__})",
                ),
            )

    def _rejected(
        self, kind: Any, src: tuple[str, int | None, int | None, bytes], rej: _Reject
    ) -> Outcome:
        topic, partition, offset, raw = src
        ids = _best_effort_ids(raw)
        try:
            payload, encoding = raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            import base64  # noqa: PLC0415 - rare path

            payload, encoding = base64.b64encode(raw).decode("ascii"), "base64"
        event = Rejection(
            reason=rej.reason,
            message=rej.message,
            source_topic=topic,
            source_partition=partition,
            source_offset=offset,
            request_id=ids.get("request_id"),
            buyer_id=ids.get("buyer_id"),
            stream_id=ids.get("stream_id"),
            payload=payload,
            payload_encoding=encoding,
            details=rej.details,
        )
        body = _dump(event)
        key = (ids.get("stream_id") or "").encode() or None
        outputs = [Output(self.topics.rejections, key, body)]
        buyer_topic = None
        if ids.get("buyer_id"):
            buyer_topic = self.topics.buyer(ids["buyer_id"])
            outputs.append(Output(buyer_topic, (ids.get("request_id") or "").encode(), body))
        return Outcome(
            kind=kind,
            status="rejected",
            outputs=outputs,
            reason=rej.reason,
            stream_id=ids.get("stream_id"),
            buyer_topic=buyer_topic,
        )

    # -- helpers ----------------------------------------------------------------------------
    def _stream(self, stream_id: str) -> StreamState:
        state = self.stores.streams.get(stream_id)
        if state is None:
            raise _Reject(
                "unknown_stream",
                f"stream {stream_id!r} is not registered; check the catalog for available streams",
            )
        return state

    def _mechanism(self, reg: StreamRegistration) -> tuple[Mechanism, PriceSchedule]:
        cached = self._mech_cache.get(reg.stream_id)
        if cached is None:
            cached = (
                mechanism(reg.mechanism, reg.sensitivity),
                schedule_from_spec(reg.pricing.model_dump()),
            )
            self._mech_cache[reg.stream_id] = cached
        return cached

    def _rng(self, stream_id: str, value_id: str, level: float) -> np.random.Generator:
        return self._keyed(stream_id, value_id, level)

    # -- registrations -------------------------------------------------------------------------
    def _register(self, raw: bytes) -> Outcome:
        reg = StreamRegistration.model_validate_json(raw)
        existing = self.stores.streams.get(reg.stream_id)
        if existing is not None:
            if existing.registration == reg:
                return Outcome(
                    "registration",
                    "duplicate",
                    [
                        Output(
                            self.topics.catalog,
                            reg.stream_id.encode(),
                            existing.catalog_payload.encode(),
                        )
                    ],
                    stream_id=reg.stream_id,
                    mechanism=reg.mechanism,
                )
            raise _Reject(
                "stream_exists",
                f"stream {reg.stream_id!r} is already registered by "
                f"{existing.registration.seller_id!r} with different parameters; register a new "
                "stream id instead",
            )
        try:
            mech = mechanism(reg.mechanism, reg.sensitivity)
            sched = schedule_from_spec(reg.pricing.model_dump())
            sched.validate(mech, list(reg.ladder), reg.cap)
        except MarketError as exc:
            raise _Reject(exc.code, exc.message) from None
        prices = []
        for lv in sorted({*reg.ladder, reg.cap}):
            try:
                eps = mech.epsilon(lv, EPSILON_DELTA)
            except MarketError:
                eps = math.inf
            prices.append(
                PriceLevel(
                    level=lv,
                    price_minor=sched.price(mech, lv),
                    epsilon=eps if math.isfinite(eps) else None,
                )
            )
        now = self.clock()
        entry = CatalogEntry(
            registration=reg,
            accepted_at_ms=now,
            market_key_id=self.keys.key_id,
            market_public_key=self.keys.public_key_b64,
            prices=prices,
        )
        payload = _dump(entry)
        self._mech_cache.pop(reg.stream_id, None)
        self.stores.streams[reg.stream_id] = StreamState(
            registration=reg, accepted_at_ms=now, catalog_payload=payload.decode()
        )
        return Outcome(
            "registration",
            "accepted",
            [Output(self.topics.catalog, reg.stream_id.encode(), payload)],
            stream_id=reg.stream_id,
            mechanism=reg.mechanism,
        )

    # -- values ------------------------------------------------------------------------------
    def _value(self, raw: bytes) -> Outcome:
        ev = ValueEvent.model_validate_json(raw)
        st = self._stream(ev.stream_id)
        reg = st.registration
        mech, _ = self._mechanism(reg)
        try:
            exact = mech.validate_value(ev.values, dimension=reg.dimension)
        except MarketError as exc:
            raise _Reject(exc.code, exc.message) from None
        digest = _digest_values(exact)
        ts = ev.published_at_ms
        if ts < st.watermark_ms - self.dedup_horizon_ms:
            raise _Reject(
                "value_too_old",
                f"value {ev.value_id!r} was published at {ts} ms, more than the dedup horizon "
                f"({self.dedup_horizon_ms} ms) before the newest value of stream "
                f"{ev.stream_id!r} ({st.watermark_ms} ms); the market no longer accepts or "
                "replays it",
            )
        if ts > self.clock() + MAX_CLOCK_SKEW_MS:
            raise _Reject(
                "value_from_the_future",
                f"value {ev.value_id!r} claims publication at {ts} ms, more than "
                f"{MAX_CLOCK_SKEW_MS} ms ahead of the market's clock; check the seller's clock",
            )
        ladder_key = _key(ev.stream_id, ev.value_id)
        known = self.stores.ladders.get(ladder_key)
        if known is not None:
            if isinstance(known, EvictedValue):
                seq, old_digest = known.seq, known.digest
            else:
                entry = next(e for e in st.window if e.value_id == ev.value_id)
                seq, old_digest = entry.seq, entry.digest
            if old_digest != digest:
                raise _Reject(
                    "conflicting_value",
                    f"value id {ev.value_id!r} was already published on stream {ev.stream_id!r} "
                    "with different numbers; value ids must be unique, use a new id",
                )
            return self._redeliver_value(st, ev.value_id, seq, known)
        levels = sorted({h.level for h in st.holders.values()})
        if reg.sealed:
            ladder = ReleaseState.sealed(
                mech, exact, cap=reg.cap, rng=self._rng(ev.stream_id, ev.value_id, reg.cap)
            )
            new_noise = 1
        else:
            ladder = ReleaseState(mech, exact, cap=reg.cap)
            new_noise = 0
        for lv in levels:
            if lv not in ladder:
                new_noise += 1
            ladder.release(lv, rng=self._rng(ev.stream_id, ev.value_id, lv))
        seq = st.next_seq
        now = self.clock()
        st.window.append(
            ValueEntry(
                value_id=ev.value_id,
                seq=seq,
                digest=digest,
                received_at_ms=now,
                published_at_ms=ts,
            )
        )
        st.next_seq += 1
        st.values_ingested += 1
        st.spent = max(st.spent, ladder.spent)
        st.watermark_ms = max(st.watermark_ms, ts)
        expiry = self._expiry_index(ev.stream_id)
        while len(st.window) > reg.retain_last:
            old = st.window.pop(0)
            okey = _key(ev.stream_id, old.value_id)
            self.stores.ladders[okey] = EvictedValue(old.seq, old.digest, old.published_at_ms)
            heapq.heappush(expiry, (old.published_at_ms, okey))
        # forget markers the horizon now protects (any resend of them is refused as too old)
        low = st.watermark_ms - self.dedup_horizon_ms
        while expiry and expiry[0][0] < low:
            _, okey = heapq.heappop(expiry)
            self.stores.ladders.pop(okey, None)
        self.stores.ladders[ladder_key] = ladder
        self.stores.streams[ev.stream_id] = st
        released = self._deliver(st, ev.value_id, seq, ladder)
        return Outcome(
            "value",
            "accepted",
            self._drain_unless_batching(),
            stream_id=ev.stream_id,
            mechanism=reg.mechanism,
            releases=released,
            new_noise=new_noise,
        )

    def invalidate_indexes(self) -> None:
        """Forget the in-memory expiry heaps; the next event rebuilds them from the tables.

        Called after a restart (implicitly: a new core starts empty) and after every rebalance,
        when the tables may hold entries another worker wrote while it owned the partitions.
        """
        self._expiry.clear()
        self._purchase_expiry.clear()
        self._indexed = False

    def _build_indexes(self) -> None:
        """One pass over both tables builds the heaps of every stream at once.

        Streams not seen in the pass get empty heaps, so a restart costs one scan of the state,
        not one scan per stream.
        """
        expiry: dict[str, list[tuple[int, str]]] = {}
        for k, v in self.stores.ladders.items():
            if isinstance(v, EvictedValue):
                expiry.setdefault(k.rsplit("/", 1)[0], []).append((v.published_at_ms, k))
        purchases: dict[str, list[tuple[int, str]]] = {}
        for k, r in self.stores.purchases.items():
            purchases.setdefault(r.stream_id, []).append((r.requested_at_ms, k))
        for heap in (*expiry.values(), *purchases.values()):
            heapq.heapify(heap)
        self._expiry, self._purchase_expiry = expiry, purchases
        self._indexed = True

    def _expiry_index(self, stream_id: str) -> list[tuple[int, str]]:
        """Heap of (published_at, key) of the stream's eviction markers.

        Kept in memory only and rebuilt from the ladders table after a restart or rebalance, so
        expiry never depends on state that could be lost.
        """
        if not self._indexed:
            self._build_indexes()
        return self._expiry.setdefault(stream_id, [])

    def _deliver(self, st: StreamState, value_id: str, seq: int, ladder: ReleaseState) -> int:
        """Queue the value's release at each holder's level for that holder's topic."""
        sid = st.registration.stream_id
        n = 0
        for buyer, holder in st.holders.items():
            values = ladder.get(holder.level)
            if values is None:  # cannot happen: every held level is released on arrival
                continue
            release = {"value_id": value_id, "seq": seq, "level": holder.level,
                       "values": values.tolist()}  # fmt: skip
            self._deliveries.setdefault((buyer, sid), []).append(release)
            n += 1
        return n

    def _redeliver_value(self, st: StreamState, value_id: str, seq: int, known: Ladder) -> Outcome:
        """A resent value: re-emit what is stored (nothing once evicted), never draw noise."""
        released = 0
        if isinstance(known, ReleaseState):
            released = self._deliver(st, value_id, seq, known)
        return Outcome(
            "value",
            "duplicate",
            self._drain_unless_batching(),
            stream_id=st.registration.stream_id,
            mechanism=st.registration.mechanism,
            releases=released,
        )

    # -- batching of subscription deliveries ------------------------------------------------------
    @contextlib.contextmanager
    def batch(self) -> Iterator[list[Output]]:
        """Collect subscription deliveries of several events into one message per buyer.

        Inside the block, value events return no outputs for subscribers; on exit the list
        yielded to the caller receives one ``value_released`` event per (buyer, stream) holding
        every release of the batch, in arrival order.
        """
        outputs: list[Output] = []
        self._batching = True
        try:
            yield outputs
        finally:
            self._batching = False
            outputs.extend(self.drain_deliveries())

    def _drain_unless_batching(self) -> list[Output]:
        return [] if self._batching else self.drain_deliveries()

    def drain_deliveries(self) -> list[Output]:
        outputs = []
        for (buyer, sid), releases in self._deliveries.items():
            event: dict[str, Any] = {"schema_version": 1, "type": "value_released",
                                     "buyer_id": buyer, "stream_id": sid}  # fmt: skip
            holder = self.stores.streams[sid].holders.get(buyer)
            if holder is not None and holder.public_key:
                event["releases"] = []
                event["sealed"] = seal(
                    holder.public_key, _json(releases), aad=f"{sid}/{buyer}".encode()
                )
            else:
                event["releases"] = releases
            body = _json(event)
            key = releases[-1]["value_id"].encode()
            outputs.append(Output(self.topics.buyer(buyer), key, body))
        self._deliveries.clear()
        return outputs

    # -- purchases and quotes ----------------------------------------------------------------------
    def _purchases(self, raw: bytes, src: tuple[str, int | None, int | None, bytes]) -> Outcome:
        req = PURCHASES_EVENT.validate_json(raw)
        if isinstance(req, QuoteRequest):
            return self._guard("quote", src, lambda: self._quote(req))
        return self._purchase(req, src)

    def _plan(
        self, st: StreamState, buyer_id: str, target: float | None
    ) -> tuple[float, float, int, Mechanism]:
        """(held, target, price) for a buyer on a stream, or a _Reject explaining why not."""
        reg = st.registration
        mech, sched = self._mechanism(reg)
        holder = st.holders.get(buyer_id)
        held = holder.level if holder else 0.0
        if target is None:
            above = [lv for lv in reg.ladder if lv > held]
            if not above:
                raise _Reject(
                    "no_higher_step",
                    f"you already hold level {held:g}, the top of this stream's ladder; "
                    f"name an explicit target_level up to the cap {reg.cap:g}",
                )
            lvl = canonical_level(above[0])
        else:
            lvl = canonical_level(target)
        if lvl > reg.cap:
            raise _Reject(
                "level_above_cap",
                f"level {lvl:g} exceeds the cap {reg.cap:g} the seller set for stream "
                f"{reg.stream_id!r}; the most accurate level for sale is {reg.cap:g}",
            )
        if lvl > held:
            try:
                sched.check_level(lvl)
            except InvalidLevelError as exc:
                raise _Reject("level_not_for_sale", exc.message) from None
        return held, lvl, sched.step_price(mech, held, lvl), mech

    def _quote(self, req: QuoteRequest) -> Outcome:
        st = self._stream(req.stream_id)
        held, lvl, price, _ = self._plan(st, req.buyer_id, req.target_level)
        answer = QuoteAnswer(
            quote_id=req.quote_id,
            buyer_id=req.buyer_id,
            stream_id=req.stream_id,
            level_before=held,
            level_after=max(held, lvl),
            price_minor=price,
            currency=st.registration.currency,
        )
        topic = self.topics.buyer(req.buyer_id)
        return Outcome(
            "quote",
            "answered",
            [Output(topic, req.quote_id.encode(), _dump(answer))],
            stream_id=req.stream_id,
            price_minor=price,
            buyer_topic=topic,
        )

    def _purchase(
        self, req: PurchaseRequest, src: tuple[str, int | None, int | None, bytes]
    ) -> Outcome:
        rec_key = _key(req.buyer_id, req.purchase_id)
        fingerprint = _fingerprint(req)
        topic = self.topics.buyer(req.buyer_id)
        ts = req.requested_at_ms
        st = self.stores.streams.get(req.stream_id)
        if st is not None and ts < st.purchase_watermark_ms - self.dedup_horizon_ms:
            return self._rejected("purchase", src, _Reject(
                "request_too_old",
                f"purchase {req.purchase_id!r} was requested at {ts} ms, more than the dedup "
                f"horizon ({self.dedup_horizon_ms} ms) before the newest purchase on stream "
                f"{req.stream_id!r}; resend it with a new purchase id and a current time",
            ))  # fmt: skip
        if ts > self.clock() + MAX_CLOCK_SKEW_MS:
            return self._rejected("purchase", src, _Reject(
                "request_from_the_future",
                f"purchase {req.purchase_id!r} claims a request time {ts} ms more than "
                f"{MAX_CLOCK_SKEW_MS} ms ahead of the market's clock; check the buyer's clock",
            ))  # fmt: skip
        record = self.stores.purchases.get(rec_key)
        if record is not None:
            if record.fingerprint != fingerprint:
                return self._rejected(
                    "purchase",
                    src,
                    _Reject(
                        "idempotency_key_reused",
                        f"purchase id {req.purchase_id!r} was already used by buyer "
                        f"{req.buyer_id!r} for a different request; use a new purchase id",
                    ),
                )
            outputs = [Output(topic, req.purchase_id.encode(), record.payload.encode())]
            if record.status == "rejected":
                outputs.append(
                    Output(self.topics.rejections, req.stream_id.encode(), record.payload.encode())
                )
            return Outcome(
                "purchase",
                "duplicate",
                outputs,
                stream_id=record.stream_id,
                buyer_topic=topic,
            )
        try:
            outcome = self._fulfil(req, fingerprint, topic)
        except _Reject as rej:
            outcome = self._rejected("purchase", src, rej)
            self.stores.purchases[rec_key] = PurchaseRecord(
                fingerprint=fingerprint,
                status="rejected",
                stream_id=req.stream_id,
                payload=outcome.outputs[0].value.decode(),
                requested_at_ms=ts,
            )
        self._expire_purchases(req.stream_id, ts, rec_key)
        return outcome

    def _expire_purchases(self, stream_id: str, ts: int, rec_key: str) -> None:
        """Advance the stream's purchase watermark and forget outcomes beyond the horizon."""
        st = self.stores.streams.get(stream_id)
        if st is None:  # purchases of unknown streams are rare and kept
            return
        if not self._indexed:
            self._build_indexes()
        heap = self._purchase_expiry.setdefault(stream_id, [])
        heapq.heappush(heap, (ts, rec_key))  # a second entry, if the scan saw it, is harmless
        if ts > st.purchase_watermark_ms:
            st.purchase_watermark_ms = ts
            self.stores.streams[stream_id] = st
        low = st.purchase_watermark_ms - self.dedup_horizon_ms
        while heap and heap[0][0] < low:
            _, key = heapq.heappop(heap)
            self.stores.purchases.pop(key, None)

    def _fulfil(self, req: PurchaseRequest, fingerprint: str, topic: str) -> Outcome:
        st = self._stream(req.stream_id)
        reg = st.registration
        if self.require_encryption and not req.buyer_public_key:
            raise _Reject(
                "encryption_required",
                "this market only delivers sealed releases: send buyer_public_key (an X25519 "
                "public key, base64) with the purchase; `epsilon-market buy --key-file` does it",
            )
        if req.currency != reg.currency:
            raise _Reject(
                "currency_mismatch",
                f"stream {reg.stream_id!r} is priced in {reg.currency}, not {req.currency}",
            )
        held, lvl, price, mech = self._plan(st, req.buyer_id, req.target_level)
        if price > req.max_price_minor:
            raise _Reject(
                "price_too_high",
                f"moving from level {held:g} to {lvl:g} costs {price} {reg.currency} minor "
                f"units; you offered at most {req.max_price_minor}",
                quoted_price_minor=price,
            )
        level_after = max(held, lvl)
        keys = [_key(reg.stream_id, e.value_id) for e in st.window]
        ladders: list[ReleaseState] = []
        for lkey in keys:
            ladder = self.stores.ladders[lkey]
            assert isinstance(ladder, ReleaseState)  # window entries are never evicted
            ladders.append(ladder)
        new_noise = sum(level_after not in ld for ld in ladders)
        window = st.window
        vectors = ReleaseState.release_across(
            ladders,
            level_after,
            lambda i: self._rng(reg.stream_id, window[i].value_id, level_after),
        )
        for lkey, ladder in zip(keys, ladders, strict=True):
            self.stores.ladders[lkey] = ladder
        releases = [
            (e.value_id, e.seq, level_after, v) for e, v in zip(window, vectors, strict=True)
        ]
        holder = st.holders.get(req.buyer_id)
        if holder is None:
            holder = Holder(level=level_after)
        if req.buyer_public_key:
            holder.public_key = req.buyer_public_key
        holder.level = level_after
        holder.paid_minor += price
        holder.purchases += 1
        st.holders[req.buyer_id] = holder
        st.revenue_minor += price
        if level_after > st.spent and st.window:
            st.spent = level_after
        self.stores.streams[reg.stream_id] = st
        plain = [
            {"value_id": v, "seq": q, "level": lv, "values": vals.tolist()}
            for v, q, lv, vals in releases
        ]
        sealed = None
        if holder.public_key:
            sealed = seal(holder.public_key, _json(plain), aad=req.purchase_id.encode())
        receipt = Receipt(
            purchase_id=req.purchase_id,
            buyer_id=req.buyer_id,
            stream_id=reg.stream_id,
            seller_id=reg.seller_id,
            mechanism=mech.name,
            value_ids=tuple(r[0] for r in releases),
            level_before=held,
            level_after=level_after,
            price_minor=price,
            currency=reg.currency,
            release_digest=release_digest((r[0], r[2], r[3]) for r in releases),
            issued_at_ms=self.clock(),
            market_key_id=self.keys.key_id,
            ciphertext_digest="" if sealed is None else ciphertext_digest(sealed),
        )
        signature = sign_receipt(receipt, self.keys.signing_key)
        # Built as plain dicts (the PurchaseFulfilled layout) rather than through pydantic: this
        # is the hot path of a purchase, and the field order is fixed by the schema.
        event = {
            "schema_version": 1,
            "type": "purchase_fulfilled",
            "purchase_id": req.purchase_id,
            "buyer_id": req.buyer_id,
            "stream_id": reg.stream_id,
            "level_before": held,
            "level_after": level_after,
            "price_minor": price,
            "currency": reg.currency,
            "releases": plain if sealed is None else [],
            "sealed": sealed,
            "receipt": {**receipt.to_dict(), "signature": signature},
        }
        payload = _json(event)
        self.stores.purchases[_key(req.buyer_id, req.purchase_id)] = PurchaseRecord(
            fingerprint=fingerprint,
            status="fulfilled",
            stream_id=reg.stream_id,
            price_minor=price,
            payload=payload.decode(),
            requested_at_ms=req.requested_at_ms,
        )
        return Outcome(
            "purchase",
            "fulfilled",
            [Output(topic, req.purchase_id.encode(), payload)],
            stream_id=reg.stream_id,
            mechanism=reg.mechanism,
            releases=len(releases),
            new_noise=new_noise,
            price_minor=price,
            buyer_topic=topic,
        )


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


def _fingerprint(req: PurchaseRequest) -> str:
    """What makes two purchases with one id the same request (the send time does not)."""
    fields = (req.stream_id, req.target_level, req.max_price_minor, req.currency,
              req.buyer_public_key)  # fmt: skip
    return hashlib.sha256(repr(fields).encode()).hexdigest()


_ID_FIELDS = {
    "purchase_id": "request_id",
    "quote_id": "request_id",
    "value_id": "request_id",
    "buyer_id": "buyer_id",
    "stream_id": "stream_id",
}


def _best_effort_ids(raw: bytes) -> dict[str, str]:
    """Ids that can be read from a (possibly invalid) event, to route its rejection."""
    import re  # noqa: PLC0415

    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    out: dict[str, str] = {}
    for name, slot in _ID_FIELDS.items():
        v = data.get(name)
        if isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", v):
            out.setdefault(slot, v)
    return out
