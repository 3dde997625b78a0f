"""Products whose values each keep a state while they are retained: vectors and histograms.

A new value gets its state (a chain state, or a histogram's exact counts) and is released at
once at every level its stream's holders hold and its privacy window has room for; the
deliveries then send those releases. The stream keeps the newest ``retain_last`` values; an
older one leaves a mark so a resend is recognised. A purchase releases every retained value at
the level bought. Every release is a pure function of the market's noise secret, the stream's
chain, the value's identity (stream, id, digest of its numbers) and the step, so a resend gets
the very same releases, never fresh noise.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from market import ChainState
from market.histogram_chain import HistogramValue

from ...wire.events import ValueItem
from ..context import Context
from ..delivery import Release
from ..ledger import Level, Made
from ..replay.watermarks import saw_value
from ..state import EvictedValue, ValueEntry, ValueState, record_key
from ..stream import Stream
from .base import Exact, Identity, Product, deliver, retire, store_state, value_identity

__all__ = ["Retained"]

State = ChainState | HistogramValue
Releases = dict[float, Release]


class Retained(Product):
    """A product whose values keep a state while in their stream's window."""

    @abstractmethod
    def new_state(
        self, ctx: Context, stream: Stream[Any], identity: Identity, exact: Exact
    ) -> tuple[State, int]:
        """A new value's state, and the chain steps computed to make it."""

    @abstractmethod
    def releases(
        self,
        ctx: Context,
        state: State,
        identity: Identity,
        levels: set[float],
        released_before: float,
    ) -> tuple[dict[float, Release], int]:
        """The value released at each of ``levels`` (one walk of its chain), and the new steps
        computed (levels above ``released_before``, the most accurate released of it so far,
        count as new)."""

    def ingest(
        self, ctx: Context, stream: Stream[Any], item: ValueItem, exact: Exact
    ) -> tuple[int, int]:
        ident = value_identity(stream.id, item.value_id, exact.digest)
        state, drawn = self.new_state(ctx, stream, ident, exact)
        held = stream.held_levels()

        def release(fits: frozenset[Level]) -> Made[tuple[ValueEntry, Releases, int]]:
            by_level, new_noise = self.releases(ctx, state, ident, {lv.value for lv in fits}, 0.0)
            entry = stream.append(item, exact.digest, ctx.clock())
            saw_value(stream, item.published_at_ms)
            return Made(entry, by_level, (entry, by_level, new_noise))

        ledger = stream.ledger
        entry, by_level, new_noise = ledger.deliver(
            item.published_at_ms, ledger.level(0.0), held, release, new=True
        )
        retire(ctx, stream)
        store_state(ctx, record_key(stream.id, item.value_id), state)
        return deliver(ctx, stream, entry, by_level, held), new_noise + drawn

    def resend(
        self, ctx: Context, stream: Stream[Any], value_id: str, known: ValueState
    ) -> tuple[int, int]:
        entry = stream.entry(value_id)
        if isinstance(known, EvictedValue) or entry is None:  # evicted: nothing to re-release
            return 0, 0
        ident = value_identity(stream.id, value_id, entry.digest)
        held = stream.held_levels()
        before = entry.level

        def release(fits: frozenset[Level]) -> Made[tuple[Releases, int]]:
            made = self.releases(ctx, known, ident, {lv.value for lv in fits}, before)
            return Made(entry, made[0], made)

        ledger = stream.ledger
        by_level, new_noise = ledger.deliver(
            entry.published_at_ms, ledger.level(before), held, release
        )
        return deliver(ctx, stream, entry, by_level, held), new_noise

    def retained_states(self, ctx: Context, stream: Stream[Any]) -> list[State]:
        """The states of the values in the window."""
        states: list[State] = []
        for e in stream.state.window:
            state = ctx.records.value(record_key(stream.id, e.value_id))
            assert isinstance(state, ChainState | HistogramValue)  # retained: never a mark
            states.append(state)
        return states
