"""Vectors: each value is released as a vector of noisy numbers (the ``values`` product).

A value's state is its :class:`~market.chain.ChainState`: its exact numbers and the steps of its
release chain computed so far, or on a *sealed* stream only the steps below the cap, computed
when the value arrives (the market then holds its cap-level release and forgets the numbers).
"""

from __future__ import annotations

from typing import Any

from market import ChainState
from market.histogram_chain import HistogramValue

from ...wire.events import ReleasedValue, ValueItem
from ..context import Context
from ..delivery import Release
from ..state import record_key
from ..stream import Stream
from .base import Exact, Identity, numbers, store_state, value_identity
from .retained import Retained

__all__ = ["Vectors"]


class Vectors(Retained):
    """Values released as vectors, on one lossless chain per value."""

    name = "values"

    def exact(self, item: ValueItem) -> Exact:
        return numbers(self.terms, self.reg, item)

    def new_state(self, ctx: Context, stream: Stream[Any], identity: Identity,
                  exact: Exact) -> tuple[ChainState, int]:  # fmt: skip
        chain = self.terms.chain
        if not self.reg.sealed:
            return chain.open(exact.value), 0
        stream.ledger.record_held_by_market(stream.ledger.level(self.reg.cap))
        return chain.seal(exact.value, identity, ctx.noise), 1  # the cap-level release

    def releases(
        self, ctx: Context, state: ChainState | HistogramValue, identity: Identity,
        levels: set[float], released_before: float,
    ) -> tuple[dict[float, Release], int]:  # fmt: skip
        assert isinstance(state, ChainState)
        chain = self.terms.chain
        steps = {chain.step_of(lv) for lv in levels}
        if not steps:
            return {}, 0
        new_noise = chain.new_steps(state, min(steps))
        return {chain.levels[k]: chain.release([state], k, [identity], ctx.noise)[0]
                for k in sorted(steps)}, new_noise  # fmt: skip

    def release_window(
        self, ctx: Context, stream: Stream[Any], level: float
    ) -> tuple[list[ReleasedValue], int]:
        chain = self.terms.chain
        step = chain.step_of(level)
        states = [s for s in self.retained_states(ctx, stream) if isinstance(s, ChainState)]
        window = stream.state.window
        new_noise = sum(chain.new_steps(s, step) for s in states)
        identities = [value_identity(stream.id, e.value_id, e.digest) for e in window]
        vectors = chain.release(states, step, identities, ctx.noise)
        if new_noise:
            for e, s in zip(window, states, strict=True):
                store_state(ctx, record_key(stream.id, e.value_id), s)
        releases = [
            ReleasedValue.model_construct(value_id=e.value_id, seq=e.seq, level=level,
                                          values=v.tolist())
            for e, v in zip(window, vectors, strict=True)
        ]  # fmt: skip
        return releases, new_noise
