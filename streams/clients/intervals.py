"""Confidence intervals on what a buyer received, from the error model the release carries.

>>> lo, hi = intervals(event, 0.95)["v1"]      # doctest: +SKIP

Each released coordinate gives an interval that holds the true value with probability at least
``confidence`` (per coordinate); the estimate is the release minus the model's ``offset``
(Poisson noise is non-negative). Needs only the base package (numpy, scipy).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from market.accuracy import ErrorModel

__all__ = ["intervals", "model_of"]


def model_of(event: Any) -> ErrorModel:
    """The :class:`market.accuracy.ErrorModel` of a ``purchase_fulfilled`` or
    ``value_released`` event (its ``error_model`` field)."""
    info = event.error_model
    if info is None:
        raise ValueError("this event carries no error model (no level was released)")
    return ErrorModel(
        info.mechanism, info.level, info.unit, info.scale, info.std, info.offset, info.grid
    )


def intervals(
    event: Any, confidence: float = 0.95
) -> dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]]:
    """``value_id`` → ``(low, high)`` arrays for every release of ``event`` (opened)."""
    model = model_of(event)
    out = {}
    for r in event.releases:
        lo, hi = model.interval(r.values, confidence)
        if r.terms:  # a running total: the sum of `terms` independent Gaussian node noises,
            # each rounded to the grid (the roundings add up, at most half a step each)
            noise = model.half_width(confidence) - model.grid / 2
            half = noise * np.sqrt(r.terms) + r.terms * model.grid / 2
            mid = (lo + hi) / 2
            lo, hi = mid - half, mid + half
        out[r.value_id] = (lo, hi)
    return out
