"""Baselines that lossless release is measured against.

Both answer the same question as :meth:`market.release_state.ReleaseState.release` for a *gradual*
schedule (levels requested in increasing order): "the buyer has now paid for total privacy loss
``level``; what is the best estimate they hold?". Both spend the privacy budget through
sequential composition of independent releases, which is what a market without lossless release
would have to do.

* :class:`CompositionRelease`: a step from total level a to b buys an independent release at the
  increment b - a (Andersson et al., Fig. 2 baseline). With ``combine=True`` the buyer averages
  all releases with inverse-variance weights, the best linear estimate; for Gaussian zCDP this is
  lossless (Andersson §1.2), for Laplace it is not.
* :class:`DoublingRelease`: ε-doubling (Ligett et al. 2017): independent releases at levels
  base, 2·base, 4·base, …; a buyer entitled to total loss ``level`` gets the most accurate
  release whose cumulative cost fits, i.e. the largest ``2^j · base`` with ``(2^{j+1} - 1)·base
  <= level``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from .errors import InvalidLevelError
from .levels import canonical_level
from .mechanisms import Mechanism, calibrated
from .rng import RngLike, default_rng

__all__ = ["CompositionRelease", "DoublingRelease"]


class CompositionRelease:
    """Sequential composition: every step is an independent release at the increment.

    The baseline lossless release is measured against (Andersson et al. Fig. 2).

    Parameters
    ----------
    mechanism : Mechanism
        The noise family.
    value : array_like
        The exact value.
    combine : bool, default False
        Serve the inverse-variance-weighted average of all increments instead of the newest
        (lossless for zCDP Gaussians, lossy for Laplace).
    rng : Generator, int or None
        See :func:`market.rng.default_rng`.
    """

    def __init__(
        self, mechanism: Mechanism, value: Any, *, combine: bool = False, rng: RngLike = None
    ) -> None:
        self._mechanism = calibrated(mechanism, value)  # a Laplace grid fits the value
        self._exact = self._mechanism.validate_value(value)
        self._combine = combine
        self._rng = default_rng(rng)
        self._spent = 0.0
        self._releases: list[tuple[float, NDArray[Any]]] = []

    @property
    def spent(self) -> float:
        """Total privacy loss by basic composition: the sum of the increments = the last level."""
        return self._spent

    def release(self, level: float) -> NDArray[np.float64]:
        """Move up to total loss ``level``: the newest (or combined) independent release."""
        lvl = canonical_level(level)
        if lvl <= self._spent:
            raise InvalidLevelError(
                f"composition baseline only moves up: {lvl:g} <= already spent {self._spent:g}"
            )
        step = lvl - self._spent
        self._releases.append((step, self._mechanism.release(self._exact, step, rng=self._rng)))
        self._spent = lvl
        if not self._combine:
            return np.asarray(self._releases[-1][1], dtype=np.float64)
        weights = np.array([self._mechanism.precision(s) for s, _ in self._releases])
        stacked = np.stack([np.asarray(v, dtype=np.float64) for _, v in self._releases])
        return np.asarray(weights @ stacked / weights.sum(), dtype=np.float64)


class DoublingRelease:
    """ε-doubling (Ligett et al. 2017): independent releases at base·2^j.

    A total loss ``l`` affords the largest ``base·2^j`` with ``(2^{j+1} − 1)·base ≤ l``.

    Parameters
    ----------
    mechanism : Mechanism
        The noise family.
    value : array_like
        The exact value.
    base : float
        The first level.
    rng : Generator, int or None
        See :func:`market.rng.default_rng`.
    """

    def __init__(
        self, mechanism: Mechanism, value: Any, *, base: float, rng: RngLike = None
    ) -> None:
        self._mechanism = calibrated(mechanism, value)  # a Laplace grid fits the value
        self._exact = self._mechanism.validate_value(value)
        self._base = canonical_level(base, name="base")
        self._rng = default_rng(rng)
        self._releases: dict[int, NDArray[Any]] = {}

    def affordable_level(self, level: float) -> float | None:
        """The doubling level served for total loss ``level`` (None if not even ``base``)."""
        j = self._affordable_index(canonical_level(level))
        return None if j < 0 else self._base * 2**j

    def _affordable_index(self, level: float) -> int:
        # cumulative cost of releases 0..j is (2^(j+1) - 1) * base
        return int(np.floor(np.log2(level / self._base + 1.0) + 1e-12)) - 1

    def spent(self) -> float:
        """Total privacy loss of the releases made so far (basic composition)."""
        return float(sum(self._base * 2**j for j in self._releases))

    def release(self, level: float) -> NDArray[np.float64]:
        """The best doubling release affordable with total loss ``level``."""
        j = self._affordable_index(canonical_level(level))
        if j < 0:
            raise InvalidLevelError(
                f"total level {level:g} cannot afford the first doubling release {self._base:g}"
            )
        for i in range(j + 1):  # every earlier rung is paid for on the way up
            if i not in self._releases:
                self._releases[i] = self._mechanism.release(
                    self._exact, self._base * 2**i, rng=self._rng
                )
        return np.asarray(self._releases[j], dtype=np.float64)
