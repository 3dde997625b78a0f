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

from ..wire.events import ReleasedValue, StreamRegistration
from .context import Context, Terms
from .outputs import Reject
from .state import StreamState, record_key

__all__ = [
    "add_increment",
    "chains_walked",
    "completed_by",
    "decomposition",
    "is_totals",
    "release_totals",
    "retain_nodes",
    "terms_of",
    "totals_for",
    "worst_total_factor",
]

Node = tuple[int, int]


def chains_walked(reg: StreamRegistration, values: int) -> int:
    """How many chains releasing ``values`` consecutive values (totals) walks at most: the
    values themselves, or the tree nodes their totals need (``2·values + 2·(height + 1)``)."""
    if reg.tree_height is None:
        return values
    return 2 * values + 2 * (reg.tree_height + 1)


def terms_of(count: int) -> int:
    """How many tree nodes the total after ``count`` increments sums: popcount(count)."""
    return count.bit_count()


def worst_total_factor(reg: StreamRegistration) -> float:
    """What a node's error is multiplied by in the least accurate total (``tree_height``
    nodes: √tree_height); 1 on streams of values."""
    return 1.0 if reg.tree_height is None else math.sqrt(reg.tree_height)


def is_totals(reg: StreamRegistration) -> bool:
    """Whether the stream sells running totals."""
    return reg.tree_height is not None


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


def node_key(stream_id: str, node: Node) -> str:
    return record_key(stream_id, f".{node[0]}.{node[1]}")


def _identity(stream_id: str, node: Node, exact: NDArray[Any]) -> tuple[str, str, str]:
    from .values import digest_values  # noqa: PLC0415 - values imports this module

    return (stream_id, f".{node[0]}.{node[1]}", digest_values(exact))


def _exact_of(ctx: Context, stream_id: str, node: Node) -> NDArray[Any]:
    return _exact(_state(ctx, stream_id, node))


def _exact(state: ChainState) -> NDArray[Any]:
    assert state.exact is not None  # node states are open chains (see _state)
    return state.exact


def _state(ctx: Context, stream_id: str, node: Node) -> ChainState:
    state = ctx.stores.releases.get(node_key(stream_id, node))
    if not isinstance(state, ChainState) or state.exact is None:
        raise Reject(
            "internal_error",
            f"stream {stream_id!r} lost the state of its tree node {node}; operators: the "
            "releases table is incomplete",
        )
    return state


def add_increment(ctx: Context, st: StreamState, terms: Terms, exact: NDArray[Any]) -> None:
    """Store the largest node the next increment completes (its leaf, or the parent its leaf
    closes, up the tree) with its exact sum; refuse the increment once the tree is full, or
    if its running total would overflow (nothing is stored then)."""
    reg = st.registration
    assert reg.tree_height is not None
    i = st.next_seq
    if i >= 1 << reg.tree_height:
        raise Reject(
            "stream_full",
            f"stream {reg.stream_id!r} has taken its 2**{reg.tree_height} increments "
            "(tree_height); register a new stream to go on",
        )
    sid = reg.stream_id
    made: dict[Node, NDArray[Any]] = {}
    for j, m in completed_by(i):  # children first: a parent's right child is made just before
        if j == 0:
            made[(j, m)] = np.asarray(exact, dtype=np.float64)
            continue
        left, right = (j - 1, 2 * m), (j - 1, 2 * m + 1)
        made[(j, m)] = _exact(_state(ctx, sid, left)) + made[right]
    total = np.zeros(reg.dimension)
    for n in decomposition(i + 1):
        total += made[n] if n in made else _exact_of(ctx, sid, n)
    # every node is released on the chain's grids, and its float sum must round by a fraction
    # of the sensitivity (the bound the release sensitivity allows for)
    limit = min(terms.chain.value_limit, reg.totals_limit())
    if not all(np.all(np.abs(v) <= limit) for v in (total, *made.values())):  # and inf, NaN
        raise Reject(
            "invalid_value",
            f"with this increment the running total of stream {sid!r} would exceed "
            f"{limit:g} in magnitude (or overflow): the most its tree can hold exactly enough "
            "(2^40 × sensitivity / ((tree_height + 1) × √dimension), and its release grid)",
        )
    # only the top node is ever read again (every node a total or a parent reads has an even
    # index; the lower ones just closed are right children, merged into it); nothing is stored
    # for a refused increment
    top = max(made)
    ctx.stores.releases[node_key(sid, top)] = terms.chain.open(made[top])


def totals_for(
    ctx: Context, st: StreamState, terms: Terms, counts: list[int], level: float
) -> tuple[list[NDArray[np.float64]], int]:
    """The running totals after ``counts`` increments, released at ``level``, and the new
    chain steps drawn. Every node needed is released once, in one vectorised call."""
    sid = st.registration.stream_id
    chain = terms.chain
    step = chain.step_of(level)
    nodes = sorted({n for c in counts for n in decomposition(c)})
    states = [_state(ctx, sid, n) for n in nodes]
    new_noise = sum(chain.new_steps(s, step) for s in states)
    idents = [_identity(sid, n, _exact(s)) for n, s in zip(nodes, states, strict=True)]
    released = dict(zip(nodes, chain.release(states, step, idents, ctx.noise), strict=True))
    if new_noise:
        for n, s in zip(nodes, states, strict=True):
            s.trim(ctx.limits.max_message_bytes // 2)
            s.pack()
            ctx.stores.releases[node_key(sid, n)] = s
    dim = st.registration.dimension
    out = []
    for c in counts:
        total = np.zeros(dim, dtype=np.float64)
        for n in decomposition(c):
            total += released[n]
        out.append(total)
    return out, new_noise


def release_totals(
    ctx: Context, st: StreamState, level: float
) -> tuple[list[ReleasedValue], int]:
    """Every retained running total at ``level`` (what a purchase returns)."""
    terms = ctx.terms(st.registration)
    counts = [e.seq + 1 for e in st.window]
    totals, new_noise = totals_for(ctx, st, terms, counts, level)
    releases = [
        ReleasedValue.model_construct(value_id=e.value_id, seq=e.seq, level=level,
                                      values=v.tolist(), terms=terms_of(c))
        for e, v, c in zip(st.window, totals, counts, strict=True)
    ]  # fmt: skip
    return releases, new_noise


def _needed(node: Node, lo: int, hi: int) -> bool:
    """Whether a total after ``lo … hi`` increments (or any later one) sums ``node``: node
    (j, m) is in the decomposition of exactly the counts ``[(m+1)·2^j, (m+2)·2^j)``."""
    j, m = node
    return (m + 1) << j <= hi and ((m + 2) << j) > lo


def retain_nodes(ctx: Context, st: StreamState, oldest_before: int | None) -> None:
    """After an increment, drop the nodes no retained total (``st.window``) and no later total
    needs: those merged into the node it completed, and those of totals that left the window
    (``oldest_before`` is the oldest retained count before the increment). O(height)."""
    sid = st.registration.stream_id
    lo, hi = st.window[0].seq + 1, st.window[-1].seq + 1
    candidates = set(decomposition(hi - 1)) - set(decomposition(hi))
    for count in range(oldest_before or lo, lo):
        candidates.update(decomposition(count))
    for n in candidates:
        if not _needed(n, lo, hi):
            ctx.stores.releases.pop(node_key(sid, n), None)
