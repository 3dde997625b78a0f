"""Small statistical helpers shared by the sampler tests.

Every helper turns an estimate into a z-score or p-value with an explicit tolerance so that a
test states both what it expects and how much sampling noise it allows. Seeds are fixed, so a
test either always passes or always fails for a given implementation.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray


def assert_proportion(hits: int | np.integer, n: int, p: float, z: float = 4.5) -> None:
    """Binomial proportion hits/n equals p within z standard errors."""
    se = math.sqrt(p * (1 - p) / n)
    est = float(hits) / n
    assert abs(est - p) <= z * se, f"proportion {est:.5f} != {p:.5f} (se {se:.2e}, n={n})"


def assert_close_z(est: float, expected: float, se: float, z: float = 4.5) -> None:
    assert abs(est - expected) <= z * se, f"{est:.6g} != {expected:.6g} (se {se:.2e})"


def covariance_se(x: NDArray[np.float64], y: NDArray[np.float64]) -> float:
    """Standard error of the sample covariance of x and y (delta method)."""
    xc, yc = x - x.mean(), y - y.mean()
    return float(np.std(xc * yc) / math.sqrt(len(x)))


def laplace_cdf(x: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
    return np.where(x < 0, 0.5 * np.exp(x / scale), 1 - 0.5 * np.exp(-x / scale))
