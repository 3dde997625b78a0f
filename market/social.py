"""Per-recipient privacy levels in a social network (Koufogiannis et al. §4.3, eq. 43).

A user shares a value with every member ``j`` of a graph at level ``ε_j = 1 / d(i, j)`` (closer
friends see more). Sampled independently, a group of distant members can average their releases
and, by composition, learn at level ``Σ ε_j``. Drawn from one lossless Laplace process instead,
every release is a post-processing of the closest member's, so the group learns at level
``max ε_j``. :func:`collusion_experiment` measures both by simulation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .mechanisms import Laplace
from .release_state import ReleaseState
from .rng import RngLike, default_rng

__all__ = ["CollusionResult", "bfs_distances", "collusion_experiment", "random_graph"]


def random_graph(n: int, mean_degree: float, *, rng: RngLike = None) -> list[list[int]]:
    """An Erdős–Rényi graph as adjacency lists (plus a path, so it is connected).

    Parameters
    ----------
    n : int
        Nodes.
    mean_degree : float
        Expected degree of the random part.
    rng : Generator, int or None
        See :func:`market.rng.default_rng`.
    """
    g = default_rng(rng)
    adj: list[set[int]] = [set() for _ in range(n)]
    for i in range(n - 1):
        adj[i].add(i + 1)
        adj[i + 1].add(i)
    m = int(mean_degree * n / 2)
    a, b = g.integers(0, n, m), g.integers(0, n, m)
    for i, j in zip(a.tolist(), b.tolist(), strict=True):
        if i != j:
            adj[i].add(j)
            adj[j].add(i)
    return [sorted(s) for s in adj]


def bfs_distances(adj: list[list[int]], source: int) -> NDArray[np.int64]:
    """Hop distance of every node from ``source``.

    Parameters
    ----------
    adj : list of list of int
        Adjacency lists.
    source : int
        The start node.

    Returns
    -------
    ndarray of int64
        Distances, −1 where unreachable.
    """
    dist = np.full(len(adj), -1, dtype=np.int64)
    dist[source] = 0
    queue = deque([source])
    while queue:
        u = queue.popleft()
        for v in adj[u]:
            if dist[v] < 0:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


@dataclass(frozen=True)
class CollusionResult:
    """Per group size: MSE and privacy loss of colluding groups, lossless vs independent.

    Attributes
    ----------
    group_sizes : list of int
        The sizes tried.
    lossless_mse, independent_mse, best_member_mse : list of float
        MSE of the group's averaged estimate with lossless and with independent releases, and
        of its single most accurate release.
    lossless_epsilon, independent_epsilon : list of float
        Privacy loss of the group: the largest ε_j (lossless) and the sum (independent).
    """

    group_sizes: list[int]
    lossless_mse: list[float]  # MSE of the group's averaged estimate, lossless releases
    independent_mse: list[float]  # the same with independent releases
    best_member_mse: list[float]  # MSE of the group's single most accurate release
    lossless_epsilon: list[float]  # max ε_j in the group
    independent_epsilon: list[float]  # Σ ε_j in the group (composition)


def collusion_experiment(
    epsilons: NDArray[np.float64],
    group_sizes: list[int],
    *,
    trials: int = 20_000,
    rng: RngLike = None,
) -> CollusionResult:
    """Groups made of the ``s`` most distant members (smallest ε) average their releases.

    Parameters
    ----------
    epsilons : ndarray
        Each member's level ε_j.
    group_sizes : list of int
        The group sizes s to try.
    trials : int, default 20000
        Independent runs.
    rng : Generator, int or None
        See :func:`market.rng.default_rng`.

    Returns
    -------
    CollusionResult

    Notes
    -----
    Vectorised over ``trials``: one ReleaseState over a vector of ``trials`` copies of the value 0
    gives ``trials`` independent runs of the lossless process at once.
    """
    g = default_rng(rng)
    order = np.argsort(epsilons)  # most private first
    eps = np.asarray(epsilons, dtype=np.float64)[order]
    largest = max(group_sizes)
    state = ReleaseState(Laplace(1.0), np.zeros(trials))
    lossless = np.stack([np.asarray(state.release(e, rng=g)) for e in eps[:largest]])
    independent = np.stack([g.laplace(0.0, 1.0 / e, trials) for e in eps[:largest]])
    out = CollusionResult([], [], [], [], [], [])
    for s in group_sizes:
        out.group_sizes.append(s)
        out.lossless_mse.append(float(np.mean(lossless[:s].mean(axis=0) ** 2)))
        out.independent_mse.append(float(np.mean(independent[:s].mean(axis=0) ** 2)))
        out.best_member_mse.append(float(np.mean(lossless[s - 1] ** 2)))
        out.lossless_epsilon.append(float(eps[:s].max()))
        out.independent_epsilon.append(float(eps[:s].sum()))
    return out
