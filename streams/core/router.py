"""Routing one event to its handler, and turning whatever goes wrong into a rejection.

:class:`MarketCore` is the market's business logic without Kafka: raw bytes from an input topic
in, an :class:`~streams.core.outputs.Outcome` (state changes made, messages to send) out. It never
raises for bad input: a refusal (:class:`~streams.core.outputs.Reject`), an engine error
(:class:`market.MarketError`), an invalid payload (pydantic's ``ValidationError``) and even a bug
each become a ``Rejection`` of that one event, and the next event is processed as usual.

The event path, one module per step::

    router  ──► accounts       (open_account | rotate_keys → account, inbox topic)
            ──► auth           (every other event: the named account's key signed it)
            ──► registrations  (register_stream → stream state, catalog entry)
            ──► values         (value batch → chain states, window, eviction) ──► delivery
            ──► purchases      (quote | purchase → plan, release, charge, receipt)
            ──► rejections     (anything refused, to the operators and the proven sender)

Replay safety: see ``docs/architecture.md``. Releases are state, state is durable before the
worker sends outputs, outcomes are idempotent, and new noise is keyed by the request identity.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import ValidationError

from market import MarketError
from market.envelope import Sealer

from ..wire.events import PURCHASES_EVENT, QuoteRequest
from ..wire.topics import DEDUP_HORIZON_MS, Topics
from . import accounts, purchases, registrations, values
from .context import Context, Limits
from .delivery import Deliveries
from .directory import Directory, DirectoryReplica
from .horizon import DedupHorizon
from .keys import MarketKeys
from .outputs import Defer, Kind, Outcome, Output, Reject
from .placement import Misplaced, forward
from .rejections import Source, rejection
from .state import Stores

__all__ = ["MarketCore", "now_ms"]

log = logging.getLogger("emarket.core")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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
            horizon=DedupHorizon(dedup_horizon_ms, clock, stores, topics.partition_of),
            deliveries=Deliveries(topics, sealer, directory, limits.max_message_bytes),
            sealer=sealer,
            directory=directory,
            limits=limits,
            require_encryption=require_encryption,
        )

    @property
    def stores(self) -> Stores:
        return self.ctx.stores

    @property
    def pending_output_bytes(self) -> int:
        """An upper bound on the deliveries queued in the current batch (not yet drained)."""
        return self.ctx.deliveries.pending_bytes

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
        catch up and hands the event in again with ``final`` True.
        """
        raw = value or b""
        src: Source = (topic, partition, offset, raw)
        t, ctx = self.ctx.topics, self.ctx
        kind: Kind = {t.accounts: "account", t.registrations: "registration", t.values: "value",
                      t.purchases: "purchase"}.get(topic, "unknown")  # type: ignore[assignment]
        if len(raw) > ctx.limits.max_message_bytes:
            return rejection(ctx, kind, src, Reject(
                "too_large",
                f"the event is {len(raw)} bytes; the market accepts at most "
                f"{ctx.limits.max_message_bytes} (split value batches, shorten ids)",
            ))  # fmt: skip
        handlers: dict[str, Callable[[], Outcome]] = {
            t.accounts: lambda: accounts.handle_account(ctx, src, final=final),
            t.registrations: lambda: registrations.register(ctx, src, final=final),
            t.values: lambda: values.ingest_batch(ctx, src, final=final),
            t.purchases: lambda: self._purchases(src, final),
        }
        if topic not in handlers:
            unknown = Reject("unknown_topic", f"the market does not consume {topic!r}")
            return rejection(ctx, "unknown", src, unknown)
        return self._guard(kind, src, handlers[topic])

    def _purchases(self, src: Source, final: bool) -> Outcome:
        req = PURCHASES_EVENT.validate_json(src[3])
        if isinstance(req, QuoteRequest):
            ctx = self.ctx
            return self._guard("quote", src, lambda: purchases.quote(ctx, req, src, final=final))
        return purchases.purchase(self.ctx, req, src, final=final)

    def _guard(self, kind: Kind, src: Source, fn: Callable[[], Outcome]) -> Outcome:
        try:
            return fn()
        except Defer as wait:
            return Outcome(kind, "deferred", waiting_for=wait.account_id)
        except Misplaced as where:  # a proven sender's event, moved to its own partition
            return forward(kind, src, where, None if kind == "account" else where.key)
        except Reject as rej:
            return rejection(self.ctx, kind, src, rej)
        except MarketError as exc:  # e.g. parameters the engine refuses
            return rejection(self.ctx, kind, src, Reject(exc.code, exc.message))
        except ValidationError as exc:
            return rejection(self.ctx, kind, src, _invalid(kind, exc))
        except Exception as exc:  # a bug must not stop the market: reject, log, carry on
            log.exception("internal error while processing a %s event", kind)
            return rejection(self.ctx, kind, src, Reject(
                "internal_error",
                "the market could not process this event; the operators have been alerted "
                f"({type(exc).__name__})",
            ))  # fmt: skip

    def internal_error(
        self, topic: str, value: bytes | None, partition: int | None, offset: int | None,
        exc: BaseException,
    ) -> Outcome:  # fmt: skip
        """The rejection of an event whose processing failed outside the core's own guard."""
        kind: Kind = "unknown"
        return rejection(self.ctx, kind, (topic, partition, offset, value or b""), Reject(
            "internal_error",
            "the market could not process this event; the operators have been alerted "
            f"({type(exc).__name__})",
        ))  # fmt: skip

    @contextlib.contextmanager
    def batch(self) -> Iterator[list[Output]]:
        """Collect the subscription deliveries of several events into one message per buyer.

        Inside the block, value events return no outputs for subscribers; on exit the list
        yielded to the caller receives one ``value_released`` event per (buyer, stream) holding
        every release of the batch, in arrival order.
        """
        with self.ctx.deliveries.batch(self.ctx.stores.streams) as outputs:
            yield outputs

    def invalidate_indexes(self) -> None:
        """Forget in-memory indexes built from the stores (call after every rebalance)."""
        self.ctx.horizon.invalidate()
        self.ctx.census.invalidate()


def _invalid(kind: Kind, exc: ValidationError) -> Reject:
    """A readable rejection for a payload that is not a valid event of its topic."""
    errors: list[dict[str, Any]] = [  # field names and messages may echo the input: bound them
        {"loc": ".".join(str(p) for p in e["loc"])[:200], "msg": e["msg"][:300]}
        for e in exc.errors(include_url=False, include_input=False)[:10]
    ]
    first = errors[0] if errors else {"loc": "", "msg": str(exc)}
    msg = f"not a valid {kind} event: {first['loc'] or 'payload'}: {first['msg']}"
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more problems)"
    return Reject("invalid_event", msg, errors=errors)
