"""Running totals: a stream of increments sold as its running sums (continual counting).

The released product after the ``t``-th increment is ``S_t = x_0 + … + x_{t−1}``. Noising each
``S_t`` directly would need noise growing with the stream (one increment is in every later
sum); noising each increment and adding them up makes the error of ``S_t`` grow like ``t``.
The binary-tree mechanism (Dwork et al. 2010, Chan, Shi & Song 2011; the factorization of
``market.factorization.prefix_sum_tree``) releases instead the sums of dyadic intervals:

* node ``(j, m)`` is the sum of increments ``[m·2^j, (m+1)·2^j)``; it is complete once its last
  increment arrived, and its exact sum is the sum of its two children's;
* ``S_t`` is the sum of the nodes of the binary decomposition of ``t`` — ``popcount(t)`` of
  them, at most ``tree_height`` — so its noise variance is ``popcount(t)·σ²``;
* one increment is in one node per tree level, ``tree_height + 1`` nodes, so the nodes as a
  vector have ℓ2 sensitivity ``Δ·sqrt(tree_height + 1)``; each node is released at level ρ with
  Gaussian noise of variance ``Δ²(tree_height + 1)/(2ρ)``, which makes the release of *every*
  node, hence every running total, at ρ ρ-zCDP for one increment;
* each node is a value of the stream's lossless Gaussian :class:`~market.chain.ReleaseChain`,
  keyed by the stream, the node and a digest of its exact sum, so buying a higher level refines
  every running total losslessly and the noise is a pure function of the request, as for values.

So a total's variance grows like ``log t · (tree_height + 1)``: ``log² n`` for ``n = 2^height``
increments, not ``n``. Node states are kept in the ``releases`` store (keys
``stream/.j.m``: ids never contain a dot, so they cannot collide with a value's key) while a
retained total or a future one needs them: at most ``2·retain_last + 2·(tree_height + 1)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from market import ChainState
from market.accuracy import AccuracyNotForSaleError

from ...wire.events import ReleasedValue, StreamRegistration, ValueItem
from ...wire.products.totals import TotalsFields
from ...wire.trusted import trusted
from ..context import Context
from ..delivery import Listed, Release
from ..ledger import Level, Made
from ..outputs import Reject
from ..replay.watermarks import saw_value
from ..state import EvictedValue, ValueEntry, ValueState, record_key
from ..stream import Stream
from .base import Exact, Product, digest_values, drop_state, numbers, retire, store_state

__all__ = ["Totals", "completed_by", "decomposition", "terms_of"]

Node = tuple[int, int]
Releases = dict[float, Release]


def terms_of(count: int) -> int:
    """How many tree nodes the total after ``count`` increments sums: popcount(count)."""
    return count.bit_count()


def decomposition(t: int) -> list[Node]:
    """The tree nodes whose sums add up to the first ``t`` increments (largest first)."""
    out, start = [], 0
    for j in reversed(range(t.bit_length())):
        if t >> j & 1:
            out.append((j, start >> j))
            start += 1 << j
    return out


def completed_by(i: int) -> list[Node]:
    """The nodes the increment of index ``i`` (0-based) completes, lowest first."""
    out, j = [], 0
    while (i + 1) % (1 << j) == 0:
        out.append((j, (i + 1) // (1 << j) - 1))
        j += 1
    return out


def _needed(node: Node, lo: int, hi: int) -> bool:
    """Whether a total after ``lo … hi`` increments (or any later one) sums ``node``: node
    (j, m) is in the decomposition of exactly the counts ``[(m+1)·2^j, (m+2)·2^j)``."""
    j, m = node
    return (m + 1) << j <= hi and ((m + 2) << j) > lo


class Totals(Product):
    """Increments sold as their running sums, through a tree of lossless Gaussian releases."""

    fields = TotalsFields
    name = TotalsFields.name

    @classmethod
    def chains_walked(cls, reg: StreamRegistration, values: int) -> int:
        """The tree nodes the totals of ``values`` consecutive increments need at most
        (``2·values + 2·(height + 1)``)."""
        assert reg.tree_height is not None
        return 2 * values + 2 * (reg.tree_height + 1)

    @classmethod
    def error_factor(cls, reg: StreamRegistration) -> float:
        """The least accurate total sums ``tree_height`` nodes: √tree_height times a node's
        error."""
        assert reg.tree_height is not None
        return math.sqrt(reg.tree_height)

    @classmethod
    def accuracy_refusal(cls, reg: StreamRegistration, exc: AccuracyNotForSaleError) -> str:
        """The error of the least accurate total, which sums ``tree_height`` nodes (a tree of
        height 1 has one node per total: the error of a value's)."""
        per = cls.error_factor(reg)
        if per == 1.0:
            return super().accuracy_refusal(reg, exc)
        return (
            f"no level for sale makes every running total that accurate: the best, "
            f"{exc.best:g}, gives {exc.error * per:.4g} on the least accurate total "
            f"({reg.tree_height} tree nodes); buy it with target_level {exc.best:g}"
        )

    # -- values ---------------------------------------------------------------------------------
    def exact(self, item: ValueItem) -> Exact:
        return numbers(self.terms, self.reg, item, bounded=False)  # its nodes are bounded

    def known(self, ctx: Context, stream: Stream[Any], value_id: str) -> ValueState | None:
        """An increment's mark; or, while it is retained, its window entry (the mark of a
        retained increment may have been forgotten by a rebuilt index of the horizon)."""
        known = super().known(ctx, stream, value_id)
        if known is None and (entry := stream.entry(value_id)) is not None:
            known = EvictedValue.of(entry)
        return known

    def ingest(
        self, ctx: Context, stream: Stream[Any], item: ValueItem, exact: Exact
    ) -> tuple[int, int]:
        """The tree nodes the increment completes, and the running total after it at every
        level held."""
        st = stream.state
        oldest = st.window[0].seq + 1 if st.window else None
        assert not isinstance(exact.value, ChainState)
        self._add_increment(ctx, stream, np.asarray(exact.value))

        def release(fits: frozenset[Level]) -> Made[tuple[ValueEntry, Releases, int]]:
            by_level, new_noise = self._totals_at(ctx, stream, st.next_seq + 1, fits)
            entry = stream.append(item, exact.digest, ctx.clock())
            saw_value(stream, item.published_at_ms)
            return Made(entry, by_level, (entry, by_level, new_noise))

        ledger = stream.ledger
        entry, by_level, new_noise = ledger.deliver(
            item.published_at_ms, ledger.level(0.0), stream.held_levels(), release, new=True
        )
        key = record_key(stream.id, item.value_id)
        ctx.records.mark_value(stream.id, key, EvictedValue.of(entry), expires=False)  # dedup
        retire(ctx, stream)
        self._retain_nodes(ctx, stream, oldest)
        released = ctx.deliveries.queue(
            st, item.value_id, entry.seq, _listed(by_level), terms=terms_of(entry.seq + 1)
        )
        return released, new_noise

    def resend(
        self, ctx: Context, stream: Stream[Any], value_id: str, known: ValueState
    ) -> tuple[int, int]:
        """A retained increment's running total again, at every level held."""
        entry = stream.entry(value_id)
        if entry is None:
            return 0, 0

        def release(fits: frozenset[Level]) -> Made[tuple[Releases, int]]:
            made = self._totals_at(ctx, stream, entry.seq + 1, fits)
            return Made(entry, made[0], made)

        ledger = stream.ledger
        by_level, new_noise = ledger.deliver(
            entry.published_at_ms, ledger.level(entry.level), stream.held_levels(), release
        )
        released = ctx.deliveries.queue(
            stream.state, value_id, entry.seq, _listed(by_level), terms=terms_of(entry.seq + 1)
        )
        return released, new_noise

    # -- purchases ------------------------------------------------------------------------------
    def release_window(
        self, ctx: Context, stream: Stream[Any], level: float
    ) -> tuple[list[ReleasedValue], int]:
        """Every retained running total at ``level``."""
        window = stream.state.window
        counts = [e.seq + 1 for e in window]
        totals, new_noise = self._totals(ctx, stream, counts, level)
        releases = [
            trusted(
                ReleasedValue,
                value_id=e.value_id,
                seq=e.seq,
                level=level,
                values=v.tolist(),
                terms=terms_of(c),
            )
            for e, v, c in zip(window, totals, counts, strict=True)
        ]
        return releases, new_noise

    # -- the tree -------------------------------------------------------------------------------
    def _totals_at(
        self, ctx: Context, stream: Stream[Any], count: int, levels: frozenset[Level]
    ) -> tuple[Releases, int]:
        """The running total after ``count`` increments at each of ``levels``."""
        by_level: Releases = {}
        new_noise = 0
        for lv in sorted({lv.value for lv in levels}):
            (by_level[lv],), drawn = self._totals(ctx, stream, [count], lv)
            new_noise += drawn
        return by_level, new_noise

    def _add_increment(self, ctx: Context, stream: Stream[Any], exact: NDArray[Any]) -> None:
        """Store the largest node the next increment completes (its leaf, or the parent its
        leaf closes, up the tree) with its exact sum; refuse the increment once the tree is
        full, or if its running total would overflow (nothing is stored then)."""
        reg = self.reg
        assert reg.tree_height is not None
        i = stream.state.next_seq
        if i >= 1 << reg.tree_height:
            raise Reject(
                "stream_full",
                f"stream {reg.stream_id!r} has taken its 2**{reg.tree_height} increments "
                "(tree_height); register a new stream to go on",
            )
        sid = reg.stream_id
        made: dict[Node, NDArray[Any]] = {}
        for j, m in completed_by(i):  # children first: a parent's right child is just made
            if j == 0:
                made[(j, m)] = np.asarray(exact, dtype=np.float64)
                continue
            left, right = (j - 1, 2 * m), (j - 1, 2 * m + 1)
            made[(j, m)] = _exact(self._state(ctx, sid, left)) + made[right]
        total = np.zeros(reg.dimension)
        for n in decomposition(i + 1):
            total += made[n] if n in made else _exact(self._state(ctx, sid, n))
        # every node is released on the chain's grids, and its float sum must round by a
        # fraction of the sensitivity (the bound the release sensitivity allows for)
        limit = min(self.terms.chain.value_limit, self.fields.totals_limit(reg))
        if not all(np.all(np.abs(v) <= limit) for v in (total, *made.values())):  # inf, NaN
            raise Reject(
                "invalid_value",
                f"with this increment the running total of stream {sid!r} would exceed "
                f"{limit:g} in magnitude (or overflow): the most its tree can hold exactly "
                "enough (2^40 × sensitivity / ((tree_height + 1) × √dimension), and its release "
                "grid)",
            )
        # only the top node is ever read again (every node a total or a parent reads has an
        # even index; the lower ones just closed are right children, merged into it)
        top = max(made)
        store_state(ctx, _node_key(sid, top), self.terms.chain.open(made[top]))

    def _totals(
        self, ctx: Context, stream: Stream[Any], counts: list[int], level: float
    ) -> tuple[list[NDArray[np.float64]], int]:
        """The running totals after ``counts`` increments, released at ``level``, and the new
        chain steps drawn. Every node needed is released once, in one vectorised call."""
        sid = stream.id
        chain = self.terms.chain
        step = chain.step_of(level)
        nodes = sorted({n for c in counts for n in decomposition(c)})
        states = [self._state(ctx, sid, n) for n in nodes]
        new_noise = sum(chain.new_steps(s, step) for s in states)
        idents = [
            (sid, f".{n[0]}.{n[1]}", digest_values(_exact(s)))
            for n, s in zip(nodes, states, strict=True)
        ]
        released = dict(zip(nodes, chain.release(states, step, idents, ctx.noise), strict=True))
        if new_noise:
            for n, s in zip(nodes, states, strict=True):
                store_state(ctx, _node_key(sid, n), s)
        out = []
        for c in counts:
            total = np.zeros(self.reg.dimension, dtype=np.float64)
            for n in decomposition(c):
                total += released[n]
            out.append(total)
        return out, new_noise

    @staticmethod
    def _state(ctx: Context, stream_id: str, node: Node) -> ChainState:
        state = ctx.records.value(_node_key(stream_id, node))
        if not isinstance(state, ChainState) or state.exact is None:
            raise Reject(
                "internal_error",
                f"stream {stream_id!r} lost the state of its tree node {node}; operators: the "
                "releases table is incomplete",
            )
        return state

    @staticmethod
    def _retain_nodes(ctx: Context, stream: Stream[Any], oldest_before: int | None) -> None:
        """After an increment, drop the nodes no retained total and no later total needs:
        those merged into the node it completed, and those of totals that left the window
        (``oldest_before`` is the oldest retained count before the increment). O(height)."""
        sid = stream.id
        window = stream.state.window
        lo, hi = window[0].seq + 1, window[-1].seq + 1
        candidates = set(decomposition(hi - 1)) - set(decomposition(hi))
        for count in range(oldest_before or lo, lo):
            candidates.update(decomposition(count))
        for n in candidates:
            if not _needed(n, lo, hi):
                drop_state(ctx, _node_key(sid, n))


def _listed(by_level: Releases) -> dict[float, Listed]:
    """A running total at each level, as JSON-ready numbers."""
    return {lv: Totals.listed(r) for lv, r in by_level.items()}


def _node_key(stream_id: str, node: Node) -> str:
    """Where a tree node's state is kept (``stream/.j.m``: ids never contain a dot, so it
    cannot collide with a value's key)."""
    return record_key(stream_id, f".{node[0]}.{node[1]}")


def _exact(state: ChainState) -> NDArray[Any]:
    assert state.exact is not None  # node states are open chains
    return state.exact
