"""Routing one event: read it once, prove its sender, place it, hand it to its handler.

:class:`MarketCore` is the market's business logic without Kafka: raw bytes from an input topic
in, an :class:`~streams.core.outputs.Outcome` (state changes made, messages to send) out. For
every event the router alone:

1. bounds it (``too_large``) and parses it as the event of its topic (``invalid_event``);
2. authenticates it: the account it names must have signed it (:mod:`.auth`), and from then on
   every refusal is shown to that account;
3. places it: an event on another partition than its stream's is forwarded there
   (:mod:`.placement`), before any state is read (an account event proves and places itself
   by the rules of accounts: an opening is signed by the key it pins);
4. opens a value batch's numbers, sealed to the market's key (:func:`~streams.wire.sealing.
   open_values`; ``bad_seal``), or refuses clear ones (``values_not_sealed``) unless the market
   accepts them, so no handler sees anything but plain numbers;
5. calls its handler with an :class:`~streams.core.incoming.Incoming`, inside one scope of
   :class:`~streams.core.stream_store.Streams`, which saves the streams the event changed.

It never raises for bad input: a refusal, an engine error, an invalid payload and even a bug each
become a ``Rejection`` of that one event, and the next event is processed as usual.

The event path, one module per step::

    router  ──► accounts       (open_account | rotate_keys → account, inbox topic)
            ──► registrations  (register_stream → stream, catalog entry)
            ──► values         (value batch → the product keeps and releases each value)
            ──► purchases      (purchase → recall, then fulfil or refuse, then keep)
            ──► quotes         (quote → what a purchase would cost)
            ──► reserving      (reserve → a purchase's terms and room, held for a while)
            ──► rejections     (anything refused, to the operators and the proven sender)

Replay safety lives in :mod:`streams.core.replay`; see also ``docs/architecture.md``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel, ValidationError

from market import MarketError
from market.envelope import EnvelopeError, Sealer

from ..wire.answers import REFUSAL_BYTES
from ..wire.events import (
    ACCOUNTS_EVENT,
    PURCHASES_EVENT,
    REFUSAL_CODES,
    OpenAccount,
    QuoteRequest,
    ReserveRequest,
    RotateKeys,
    StreamRegistration,
    ValueBatch,
)
from ..wire.sealing import open_values
from ..wire.topics import DEDUP_HORIZON_MS, Topics
from . import accounts, purchases, quotes, registrations, reserving, values
from .answering import dropped_outputs, sign_deliveries, sign_outcome
from .auth import acting_for, authenticate
from .context import Context, Limits
from .delivery import Deliveries
from .directory import Directory, DirectoryReplica
from .incoming import Incoming
from .keys import MarketKeys
from .outputs import Defer, Kind, Outcome, Output, Reject
from .placement import Misplaced, check_partition, forward
from .refusal_budget import RefusalBudget
from .rejections import Source, rejection
from .replay import Admission, Records
from .state import Stores
from .stream_store import Streams

__all__ = ["MarketCore", "now_ms"]

log = logging.getLogger("emarket.core")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


Handler = Callable[[Context, Streams, Incoming[Any]], Outcome]

#: what each signed event is, who it names as its sender, and what applies it
_ROUTES: dict[Kind, tuple[str, Handler]] = {
    "registration": ("seller_id", registrations.register),
    "value": ("seller_id", values.ingest),
    "purchase": ("buyer_id", purchases.purchase),
    "quote": ("buyer_id", quotes.quote),
    "reserve": ("buyer_id", reserving.reserve),
}


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
        accept_clear_values: bool = False,
        dedup_horizon_ms: int = DEDUP_HORIZON_MS,
        limits: Limits | None = None,
        replica: DirectoryReplica | None = None,
    ) -> None:
        directory = Directory(stores.accounts, replica)
        limits = limits or Limits()
        sealer = Sealer(keys.noise_secret)  # one sender key per buyer, for purchases and deliveries
        self.ctx = Context(
            stores=stores,
            keys=keys,
            topics=topics,
            clock=clock,
            records=Records(
                dedup_horizon_ms, clock, stores, topics.partition_of, limits.record_caps
            ),
            admission=Admission(dedup_horizon_ms, clock),
            deliveries=Deliveries(topics, sealer, directory, limits.max_message_bytes),
            sealer=sealer,
            directory=directory,
            limits=limits,
            require_encryption=require_encryption,
        )
        self.streams = Streams(
            stores, keys, limits.max_streams, lambda: self.ctx.records.epoch, clock=clock
        )
        self.refusals = RefusalBudget(limits.refusals, clock)
        self._batched = False
        self.accept_clear_values = accept_clear_values

    @property
    def stores(self) -> Stores:
        return self.ctx.stores

    @property
    def pending_output_bytes(self) -> int:
        """An upper bound on the deliveries and sale notices held in the current batch (not
        yet drained)."""
        return self.ctx.deliveries.pending_bytes + self.ctx.sold.pending_bytes

    def handle(
        self,
        topic: str,
        value: bytes | None,
        *,
        partition: int | None = None,
        offset: int | None = None,
        final: bool = True,
    ) -> Outcome:
        """Process one raw input event; never raises for bad input (it becomes a rejection).

        With ``final`` False an event naming an account the directory does not know yet is
        *deferred* (status ``"deferred"``, nothing changed): the worker lets its directory
        catch up and hands the event in again with ``final`` True. Every message of the outcome
        to an inbox is signed as the answer to these bytes, and a refusal is recorded for them
        (:mod:`.answering`).
        """
        raw = value or b""
        outcome = self._handle(topic, raw, partition, offset, final)
        outcome = sign_outcome(self.ctx, outcome, raw, topic, partition, offset)
        if not self._batched:
            outcome.outputs.extend(self.dropped_summaries())
        return outcome

    def dropped_summaries(self) -> list[Output]:
        """The summaries of the intervals ended with refusals not written (each once)."""
        return [o for d in self.refusals.due() for o in dropped_outputs(self.ctx, d)]

    def _handle(
        self, topic: str, raw: bytes, partition: int | None, offset: int | None, final: bool
    ) -> Outcome:
        if not self._batched:  # one event is its own batch: its outputs go before the next
            self.ctx.records.begin_batch()
        src: Source = (topic, partition, offset, raw)
        t, ctx = self.ctx.topics, self.ctx
        kind: Kind = {
            t.accounts: "account",
            t.registrations: "registration",
            t.values: "value",
            t.purchases: "purchase",
        }.get(topic, "unknown")  # type: ignore[assignment]
        if len(raw) > ctx.limits.max_message_bytes:
            return self._refuse(
                kind,
                src,
                Reject(
                    "too_large",
                    f"the event is {len(raw)} bytes; the market accepts at most "
                    f"{ctx.limits.max_message_bytes} (split value batches, shorten ids)",
                ),
            )
        if kind == "unknown":
            unknown = Reject("unknown_topic", f"the market does not consume {topic!r}")
            return self._refuse("unknown", src, unknown)
        return self._guard(kind, src, lambda: self._signed(kind, src, final))

    def _signed(self, kind: Kind, src: Source, final: bool) -> Outcome:
        """Parse a signed event of its topic; a quote is routed (and refused) as a quote, an
        account event proves itself by the rules of accounts."""
        event = _parse(kind, src[3])
        if isinstance(event, OpenAccount | RotateKeys):
            return accounts.handle_account(self.ctx, event, src, final=final)
        if isinstance(event, QuoteRequest):
            return self._guard("quote", src, lambda: self._apply("quote", event, src, final))
        if isinstance(event, ReserveRequest):
            return self._guard("reserve", src, lambda: self._apply("reserve", event, src, final))
        return self._apply(kind, event, src, final)

    def _apply(self, kind: Kind, event: Any, src: Source, final: bool) -> Outcome:
        """Authenticate, place, then apply ``event`` in one scope of the streams."""
        field, handler = _ROUTES[kind]
        sender: str = getattr(event, field)
        account = authenticate(self.ctx, event, sender, final=final)
        with acting_for(sender, event.stream_id):
            check_partition(self.ctx, src, event.stream_id)  # before any state is read
            if isinstance(event, ValueBatch):
                event = self._plain(event)
            with self.streams.event():
                return handler(self.ctx, self.streams, Incoming(event, account, src))

    def _plain(self, batch: ValueBatch) -> ValueBatch:
        """``batch`` with its numbers opened: the one place a seller's sealed numbers are."""
        if batch.sealed is None:
            if self.accept_clear_values:
                return batch
            raise Reject(
                "values_not_sealed",
                "this market accepts values only sealed to its key (market_sealing_key in the "
                "catalog; docs/protocol.md §4), so that nobody reading the values topic sees "
                "them: the client library and `epsilon-market publish` seal them",
            )
        try:
            return open_values(batch, self.ctx.topics.prefix, self.ctx.keys.opener)
        except EnvelopeError:
            raise Reject(
                "bad_seal",
                "the batch's sealed numbers do not open with this market's key for this "
                "market, stream, seller and these value ids: sealed for another market or "
                "stream, moved from another batch, or altered",
            ) from None
        except ValidationError:
            raise
        except ValueError as exc:  # its messages name entries, never numbers
            raise Reject("invalid_event", f"not a valid value event: {exc}") from None

    def _guard(self, kind: Kind, src: Source, fn: Callable[[], Outcome]) -> Outcome:
        try:
            return fn()
        except Defer as wait:
            return Outcome(kind, "deferred", waiting_for=wait.account_id)
        except Misplaced as where:  # a proven sender's event, moved to its own partition
            return forward(kind, src, where, None if kind == "account" else where.key)
        except Reject as rej:
            return self._refuse(kind, src, rej)
        except MarketError as exc:  # e.g. parameters the engine refuses
            return self._refuse(kind, src, Reject(exc.code, exc.message))
        except ValidationError as exc:  # no account proved: the refusal is built if written
            return self._refuse(
                kind, src, _invalid_code(exc), functools.partial(_invalid, kind, exc)
            )
        except Exception as exc:  # a bug must not stop the market: reject, log, carry on
            log.exception("internal error while processing a %s event", kind)
            return self._refuse(
                kind,
                src,
                Reject(
                    "internal_error",
                    "the market could not process this event; the operators have been alerted "
                    f"({type(exc).__name__})",
                ),
            )

    def _refuse(
        self, kind: Kind, src: Source, rej: Reject | str, build: Callable[[], Reject] | None = None
    ) -> Outcome:
        """The rejection of ``src`` for ``rej`` (or for the code ``rej``, the refusal made by
        ``build`` only if it is written); of an event no account was proven to send (no
        ``sender``: it is shown to the operators alone), within the bounds of
        :mod:`.refusal_budget`, else counted and not written."""
        if isinstance(rej, Reject) and rej.sender is not None:
            return rejection(self.ctx, kind, src, rej)
        topic, partition, offset, raw = src
        code = rej.reason if isinstance(rej, Reject) else rej
        cause = self.refusals.refuse(topic, partition, offset, raw, code)
        if cause is not None:
            return Outcome(
                kind,
                "rejected",
                reason=code,
                dropped=cause,
                stream_id=rej.stream if isinstance(rej, Reject) else None,
            )
        if not isinstance(rej, Reject):
            assert build is not None
            rej = build()
        outcome = rejection(self.ctx, kind, src, rej)
        size = sum(len(o.value) for o in outcome.outputs) + REFUSAL_BYTES
        self.refusals.answered(topic, partition, raw, size)
        return outcome

    def internal_error(
        self,
        topic: str,
        value: bytes | None,
        partition: int | None,
        offset: int | None,
        exc: BaseException,
    ) -> Outcome:
        """The rejection of an event whose processing failed outside the core's own guard."""
        kind: Kind = "unknown"
        raw = value or b""
        refused = rejection(
            self.ctx,
            kind,
            (topic, partition, offset, raw),
            Reject(
                "internal_error",
                "the market could not process this event; the operators have been alerted "
                f"({type(exc).__name__})",
            ),
        )
        return sign_outcome(self.ctx, refused, raw, topic, partition, offset)

    @contextlib.contextmanager
    def batch(self) -> Iterator[list[Output]]:
        """Collect the subscription deliveries of several events into one message per buyer,
        and their sales into one notice per seller.

        Inside the block, value events return no outputs for subscribers and purchases none
        for sellers; on exit the list yielded to the caller receives one ``value_released``
        event per (buyer, stream) holding every release of the batch, in arrival order, and
        one ``sales`` notice per seller (:mod:`.sales`). The caller sends the outputs of one
        block before it opens the next (what lets :meth:`Records.settle` drop the bytes of
        outcomes sent).
        """
        self.ctx.records.begin_batch()
        self._batched = True
        try:
            with self.ctx.deliveries.batch() as outputs, self.ctx.sold.batch() as sold:
                yield outputs
            outputs.extend(sold)
            sign_deliveries(self.ctx, outputs)
            outputs.extend(self.dropped_summaries())
        finally:
            self._batched = False

    def invalidate_indexes(self) -> None:
        """Forget in-memory indexes built from the stores (call after every rebalance)."""
        self.ctx.records.invalidate()
        self.ctx.census.invalidate()


def _parse(kind: Kind, raw: bytes) -> BaseModel:
    """The event of a signed topic (pydantic's ``ValidationError`` if it is not one)."""
    if kind == "registration":
        return StreamRegistration.model_validate_json(raw)
    if kind == "value":
        return ValueBatch.model_validate_json(raw)
    if kind == "account":
        account: BaseModel = ACCOUNTS_EVENT.validate_json(raw)
        return account
    parsed: BaseModel = PURCHASES_EVENT.validate_json(raw)
    return parsed


def _invalid_code(exc: ValidationError) -> str:
    """The code :func:`_invalid` gives ``exc``, without building its message."""
    for e in exc.errors(include_url=False, include_input=False, include_context=False):
        if e["type"] in REFUSAL_CODES:
            return e["type"]
    return "invalid_event"


def _invalid(kind: Kind, exc: ValidationError) -> Reject:
    """A readable rejection for a payload that is not a valid event of its topic."""
    # a rule of the wire's own (one meaning per signed text) comes first and names the refusal
    found = sorted(
        exc.errors(include_url=False, include_input=False),
        key=lambda e: e["type"] not in REFUSAL_CODES,
    )
    errors: list[dict[str, Any]] = [  # field names and messages may echo the input: bound them
        {"loc": ".".join(str(p) for p in e["loc"])[:200], "msg": e["msg"][:300]} for e in found[:10]
    ]
    first = errors[0] if errors else {"loc": "", "msg": str(exc)}
    msg = f"not a valid {kind} event: {first['loc'] or 'payload'}: {first['msg']}"
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more problems)"
    code = found[0]["type"] if found and found[0]["type"] in REFUSAL_CODES else "invalid_event"
    return Reject(code, msg, errors=errors)
