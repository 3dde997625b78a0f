"""Binomial thinning of long count vectors through Walker alias tables.

Every Poisson relaxation and bridge draws ``Binomial(n_i, p)`` for each coordinate, with one ``p``
for the whole vector and small ``n_i`` (the count noise between two levels, a few dozen). numpy
draws those by sequential inversion, one walk per coordinate: 2.4x the cost of its own Poisson
sampler here. For a long vector we instead build, once per call, an alias table (Walker 1977,
Vose 1991) for every row ``Binomial(N, p)``, ``N = 0 .. max n_i``, over a fixed width of
:data:`WIDTH` columns (columns past ``N`` have probability 0), and spend one 64-bit word per
coordinate: its six low bits pick the column uniformly and exactly, its 53 high bits are the
uniform that decides between the column and its alias. No loop runs over coordinates.

The result has the law of numpy's draw up to the rounding of the table (relative error of the
order of 2⁻⁵³ per entry, as for numpy's own inversion, whose recurrence rounds too); the bits
differ. A caller whose draws must stay the same across versions (the service's chains: their
noise is a pure function of the request, recorded by every market) passes ``method="numpy"``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy import stats

__all__ = ["ALIAS_MIN_SIZE", "MAX_N", "WIDTH", "alias_tables", "thin"]

WIDTH = 64
"""Columns of every row: a power of two, so the column is the word's low bits, exactly uniform."""
MAX_N = WIDTH - 1
"""Largest count the tables cover; a vector holding a larger one is thinned by numpy."""
ALIAS_MIN_SIZE = 4096
"""Shortest vector thinned through tables: below it, building them costs more than it saves."""

Method = Literal["alias", "numpy"]


def alias_tables(nmax: int, p: float) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
    """Alias tables of ``Binomial(N, p)`` for ``N = 0 .. nmax``, rows of :data:`WIDTH` columns.

    Returns ``(accept, alias)``, both of shape ``(nmax + 1, WIDTH)``: column ``j`` of row ``N``
    is kept with probability ``accept[N, j]``, else ``alias[N, j]`` is returned. Vose's
    construction, exact in real arithmetic; every row's probabilities sum to one.
    """
    rows = np.arange(nmax + 1)[:, None]
    cols = np.arange(WIDTH)[None, :]
    pmf = np.where(cols <= rows, stats.binom.pmf(cols, rows, p), 0.0)
    accept = np.ones((nmax + 1, WIDTH))
    alias = np.broadcast_to(np.arange(WIDTH), (nmax + 1, WIDTH)).copy()
    for r in range(nmax + 1):
        q = (pmf[r] / pmf[r].sum() * WIDTH).tolist()
        small = [j for j in range(WIDTH) if q[j] < 1.0]
        large = [j for j in range(WIDTH) if q[j] >= 1.0]
        while small and large:
            s, big = small.pop(), large[-1]
            accept[r, s], alias[r, s] = q[s], big
            q[big] -= 1.0 - q[s]
            if q[big] < 1.0:
                small.append(large.pop())
        # what is left holds probability 1 up to rounding: it keeps its own column
    return accept, alias


def thin(
    rng: np.random.Generator, n: NDArray[np.int64], p: float, method: Method = "alias"
) -> NDArray[np.int64]:
    """``Binomial(n_i, p)`` for every coordinate of ``n`` (non-negative counts), ``0 < p < 1``.

    With ``method="alias"`` a vector of at least :data:`ALIAS_MIN_SIZE` coordinates, none above
    :data:`MAX_N`, is drawn through :func:`alias_tables`; any other input, and every input with
    ``method="numpy"``, by ``rng.binomial`` (whose bits the service's chains depend on).
    """
    if method == "numpy" or n.size < ALIAS_MIN_SIZE or not 0.0 < p < 1.0:
        return rng.binomial(n, p)
    nmax = int(n.max())
    if nmax > MAX_N or int(n.min()) < 0:  # numpy refuses a negative count with an error
        return rng.binomial(n, p)
    accept, alias = alias_tables(nmax, p)
    word = rng.integers(0, np.iinfo(np.uint64).max, size=n.size, dtype=np.uint64, endpoint=True)
    col = (word & np.uint64(WIDTH - 1)).astype(np.intp)
    u = (word >> np.uint64(11)).astype(np.float64) * 2.0**-53  # bits 11-63: disjoint from col
    flat = n.astype(np.intp) * WIDTH + col
    keep = u < accept.ravel()[flat]
    return np.where(keep, col, alias.ravel()[flat]).astype(np.int64)
