"""Vectors: each value is released as a vector of noisy numbers (the ``values`` product).

A value's state is its :class:`~market.chain.ChainState`: its exact numbers and the steps of its
release chain computed so far, or on a *sealed* stream only the steps below the cap, computed
when the value arrives (the market then holds its cap-level release and forgets the numbers).

A batch of new values on a stream without privacy windows is released at the levels held, the
same for each value: :meth:`Vectors.prepare` computes the steps of all of them in one call of
the chain (one vectorised noise kernel for the batch, each value reading exactly the words it
reads alone), and each value then finds its steps computed. The releases, the stored states and
the count of new steps are those of the values one by one (``tests/streams/core/test_core.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from market import ChainState
from market.histogram_chain import HistogramValue

from ...wire.events import ReleasedValue, ValueItem
from ...wire.products import ProductFields
from ...wire.products.values import ValuesFields
from ...wire.trusted import trusted
from ..context import Context
from ..delivery import Release
from ..state import record_key
from ..stream import Stream
from .base import Exact, Identity, numbers, store_state, value_identity
from .retained import Retained

__all__ = ["Vectors"]


class Vectors(Retained):
    """Values released as vectors, on one lossless chain per value."""

    fields: ClassVar[type[ProductFields]] = ValuesFields
    name = ValuesFields.name

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        #: value id → (digest, state with its steps computed, steps computed) for the batch
        self._prepared: dict[str, tuple[str, ChainState, int]] = {}

    def exact(self, item: ValueItem) -> Exact:
        return numbers(self.terms, self.reg, item)

    def prepare(
        self, ctx: Context, stream: Stream[Any], values: Sequence[tuple[ValueItem, Exact]]
    ) -> None:
        """The steps every new value of the batch will be released at, in one chain call: on a
        stream whose every value is released at every level held (no privacy window) and
        whose chain is open; a value that turns out refused or known just wastes its steps."""
        held = stream.held_levels()
        if len(values) < 2 or not held or self.reg.sealed or stream.ledger.windowed:
            return
        chain = self.terms.chain
        step = min(chain.step_of(lv.value) for lv in held)
        states, identities, ids, digests = [], [], [], []
        for item, exact in values:
            if item.value_id in self._prepared or item.value_id in ids:
                continue
            if ctx.records.value(record_key(stream.id, item.value_id)) is not None:
                continue  # known (or a lost batch's): decided one by one
            states.append(_opened(exact))
            identities.append(value_identity(stream.id, item.value_id, exact.digest))
            ids.append(item.value_id)
            digests.append(exact.digest)
        if len(states) < 2:
            return
        drawn = [chain.new_steps(st, step) for st in states]
        chain.release(states, step, identities, ctx.noise)
        self._prepared = {
            v: (d, st, n) for v, d, st, n in zip(ids, digests, states, drawn, strict=True)
        }

    def prepared_done(self) -> None:
        self._prepared = {}

    def new_state(
        self, ctx: Context, stream: Stream[Any], identity: Identity, exact: Exact
    ) -> tuple[ChainState, int]:
        chain = self.terms.chain
        ready = self._prepared.pop(identity[1], None)
        if ready is not None and ready[0] == exact.digest:
            return ready[1], ready[2]  # its steps: counted here, found computed by releases
        if not self.reg.sealed:
            return _opened(exact), 0
        stream.ledger.record_held_by_market(stream.ledger.level(self.reg.cap))
        return chain.seal(exact.value, identity, ctx.noise), 1  # the cap-level release

    def releases(
        self,
        ctx: Context,
        state: ChainState | HistogramValue,
        identity: Identity,
        levels: set[float],
        released_before: float,
    ) -> tuple[dict[float, Release], int]:
        assert isinstance(state, ChainState)
        chain = self.terms.chain
        steps = {chain.step_of(lv) for lv in levels}
        if not steps:
            return {}, 0
        new_noise = chain.new_steps(state, min(steps))
        return {
            chain.levels[k]: chain.release([state], k, [identity], ctx.noise)[0]
            for k in sorted(steps)
        }, new_noise

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
            trusted(ReleasedValue, value_id=e.value_id, seq=e.seq, level=level, values=v.tolist())
            for e, v in zip(window, vectors, strict=True)
        ]
        return releases, new_noise


def _opened(exact: Exact) -> ChainState:
    """A new value's state on its open chain: what :meth:`ReleaseChain.open
    <market.chain.ReleaseChain.open>` makes of numbers :func:`~.base.numbers` checked
    (the chain's own checks and more: its family's rules, its range, the stream's
    dimension), without checking them again."""
    assert isinstance(exact.value, np.ndarray)
    exact.value.setflags(write=False)  # the chain's exact values are read-only
    return ChainState(exact.value, {})
