"""Lossless multiple release of a linear query ``A x`` through a public factorization ``A = L R``
(Andersson et al. §5.1, Algorithm 2).

The factorization mechanism releases ``L (R x + Z)`` with Gaussian ``Z``. Only ``R x`` is private
and its noise follows the lossless Gaussian process, so every release level of ``A x`` is a
post-processing (by ``L``) of one :class:`~market.release_state.ReleaseState` over ``R x``: any
order of levels, stored levels returned bit for bit, the coalition of all releases no more
informative than the most accurate one. With ``L`` left-invertible the release is lossless;
otherwise weakly lossless (Lemma 5.1).

:func:`prefix_sum_tree` builds the classic binary-tree factorization of the prefix-sum workload
(range queries over a histogram): ``R`` releases the ``2n − 1`` dyadic interval sums, ``L`` adds
at most ``log2 n`` of them per prefix, at sensitivity ``sqrt(log2 n + 1)``: each answer's variance
grows like ``log² n`` instead of the ``n`` of noising every prefix sum directly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .errors import InvalidValueError
from .mechanisms import Gaussian
from .release_state import ReleaseState
from .rng import RngLike

__all__ = ["FactorizationRelease", "l2_sensitivity", "prefix_sum_identity", "prefix_sum_tree"]


def l2_sensitivity(R: NDArray[np.float64]) -> float:
    """ℓ2 sensitivity of ``x ↦ R x`` when one coordinate of ``x`` changes by 1: max column norm."""
    return float(np.sqrt((R**2).sum(axis=0)).max())


class FactorizationRelease:
    """Releases of ``A x = L R x`` at any zCDP levels ρ, in any order, losslessly.

    Parameters
    ----------
    L, R : array_like
        The factorization of the workload ``A = L R`` (``L`` is m × k, ``R`` is k × n).
    x : array_like
        The private data, length n.
    sensitivity : float, optional
        ℓ2 sensitivity of ``R x``; by default :func:`l2_sensitivity` of ``R`` (one coordinate
        of ``x`` changes by one).
    cap : float, optional
        The largest ρ that may be released.

    Raises
    ------
    InvalidValueError
        Shapes that do not compose.
    """

    def __init__(
        self,
        L: Any,
        R: Any,
        x: Any,
        *,
        sensitivity: float | None = None,
        cap: float | None = None,
    ) -> None:
        self.L = np.asarray(L, dtype=np.float64)
        self.R = np.asarray(R, dtype=np.float64)
        xv = np.asarray(x, dtype=np.float64)
        if self.L.ndim != 2 or self.R.ndim != 2 or self.L.shape[1] != self.R.shape[0]:
            raise InvalidValueError(f"L {self.L.shape} and R {self.R.shape} do not compose")
        if xv.shape != (self.R.shape[1],):
            raise InvalidValueError(f"x has shape {xv.shape}, R expects ({self.R.shape[1]},)")
        # sensitivity of R x for neighbouring x (one count changes by one) unless given
        self.sensitivity = l2_sensitivity(self.R) if sensitivity is None else sensitivity
        self._state = ReleaseState(Gaussian(self.sensitivity), self.R @ xv, cap=cap)

    @property
    def levels(self) -> tuple[float, ...]:
        """The ρ released so far, increasing."""
        return self._state.levels

    def release(self, rho: float, *, rng: RngLike = None) -> NDArray[np.float64]:
        """``L (R x + Z_ρ)``: the answer to every query of ``A`` at level ``rho``."""
        return np.asarray(self.L @ self._state.release(rho, rng=rng), dtype=np.float64)

    def answer_variance(self, rho: float) -> NDArray[np.float64]:
        """Per-query noise variance at level ρ: diag(L Lᵀ) · Δ²/(2ρ)."""
        return np.asarray((self.L**2).sum(axis=1) * self.sensitivity**2 / (2 * rho))


def prefix_sum_identity(n: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Baseline factorization of prefix sums: L = I, R = A (noise every prefix sum directly).

    Returns
    -------
    (ndarray, ndarray)
        ``L`` and ``R`` for the n × n lower-triangular all-ones matrix ``A``.
    """
    A = np.tril(np.ones((n, n)))
    return np.eye(n), A


def prefix_sum_tree(n: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Binary-tree factorization of the n × n prefix-sum matrix.

    Parameters
    ----------
    n : int
        The number of prefix sums, a power of two.

    Returns
    -------
    (ndarray, ndarray)
        ``L`` (n × (2n − 1)) sums the dyadic intervals of each prefix; ``R`` ((2n − 1) × n)
        computes them. Each column of ``R`` has log₂n + 1 ones.
    """
    if n < 1 or n & (n - 1):
        raise InvalidValueError(f"n must be a power of two, got {n}")
    levels = int(math.log2(n)) + 1
    rows: list[tuple[int, int]] = []  # dyadic intervals [start, end)
    for lvl in range(levels):
        size = n >> lvl
        rows += [(s, s + size) for s in range(0, n, size)]
    index = {iv: i for i, iv in enumerate(rows)}
    R = np.zeros((len(rows), n))
    for i, (s, e) in enumerate(rows):
        R[i, s:e] = 1.0
    L = np.zeros((n, len(rows)))
    for p in range(n):  # prefix [0, p]: greedy decomposition into dyadic intervals
        start, end = 0, p + 1
        while start < end:
            size = 1 << int(math.log2(end - start))
            while start % size:
                size >>= 1
            L[p, index[(start, start + size)]] = 1.0
            start += size
    return L, R
