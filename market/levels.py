"""Validation of privacy levels and released values.

A *level* is a mechanism's privacy parameter, oriented so that **larger means less private and
more accurate**: ε for Laplace, ρ (zCDP) for Gaussian, ω = Δ²/λ for Poisson. Levels are
compared for equality (a level that was already released returns the stored release), so they
are canonicalised to 15 significant digits: ``0.1 + 0.2`` and ``0.3`` name the same level, and a
level survives a JSON round trip in any language unchanged.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .errors import (
    DimensionMismatchError,
    InvalidLevelError,
    InvalidValueError,
    LevelNotForSaleError,
)

__all__ = [
    "MAX_DIMENSION",
    "MAX_EXACT_INTEGER",
    "MAX_LEVEL",
    "MIN_LEVEL",
    "as_count_vector",
    "as_float_vector",
    "as_integer_vector",
    "canonical_level",
    "step_of",
]

MAX_DIMENSION = 10**7
MAX_EXACT_INTEGER = 2**53 - 1
"""The largest integer a value may hold: every double beyond it is the reading of several."""
"""Largest vector the engine accepts; the service applies a smaller, configurable cap."""

MIN_LEVEL, MAX_LEVEL = 1e-9, 1e9
"""Levels (and sensitivities) outside this range make scales or variances overflow doubles."""


def canonical_level(level: Any, *, name: str = "level") -> float:
    """A privacy level as the canonical float every comparison and key uses.

    Parameters
    ----------
    level : float
        A positive, finite number in [1e-9, 1e9] (not a bool).
    name : str, default "level"
        What the number is, for the error message.

    Returns
    -------
    float
        ``level`` rounded to 15 significant digits: ``0.1 + 0.2`` and ``0.3`` are one level, and
        it survives a JSON round trip in any language unchanged.

    Raises
    ------
    InvalidLevelError
        Not a number, not finite, not positive, or out of range.

    Examples
    --------
    >>> canonical_level(0.1 + 0.2) == canonical_level(0.3)
    True
    """
    if isinstance(level, bool) or not isinstance(level, (int, float, np.integer, np.floating)):
        raise InvalidLevelError(f"{name} must be a number, not {type(level).__name__}")
    value = float(level)
    if not math.isfinite(value):
        raise InvalidLevelError(f"{name} must be finite")
    if value <= 0.0:
        raise InvalidLevelError(f"{name} must be > 0")
    if not MIN_LEVEL <= value <= MAX_LEVEL:
        raise InvalidLevelError(f"{name} must be between {MIN_LEVEL:g} and {MAX_LEVEL:g}")
    return float(f"{value:.15g}")


def _as_vector(value: Any, dimension: int | None, what: str) -> NDArray[Any]:
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged nested lists and the like
        raise InvalidValueError(f"{what} is not a numeric vector: {exc}") from None
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)
    ):
        raise InvalidValueError(f"{what} must be numeric, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise InvalidValueError(f"{what} must be real, got complex values")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise InvalidValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise InvalidValueError(f"{what} must have at least one coordinate")
    if arr.shape[0] > MAX_DIMENSION:
        raise InvalidValueError(
            f"{what} has {arr.shape[0]} coordinates; the engine accepts at most {MAX_DIMENSION}"
        )
    if dimension is not None and arr.shape[0] != dimension:
        raise DimensionMismatchError(f"{what} does not have its stream's dimension {dimension}")
    return arr


def as_float_vector(
    value: Any, *, dimension: int | None = None, what: str = "value"
) -> NDArray[np.float64]:
    """A finite float64 copy of ``value`` as a 1-D vector, every zero spelled ``0.0``.

    A value's bytes key its noise in the service (a digest of the exact numbers), so a number
    must have one spelling: ``-0.0`` (equal to ``0.0``) would otherwise buy a second,
    independent sample of the same value.

    Parameters
    ----------
    value : array_like
        A number or a 1-D sequence of real numbers (scalars become length 1).
    dimension : int, optional
        Required length.
    what : str, default "value"
        What is checked, for messages.

    Returns
    -------
    ndarray of float64

    Raises
    ------
    InvalidValueError
        Not numeric, complex, not 1-D, empty, too long, or not finite (the first bad
        coordinate is named).
    DimensionMismatchError
        Wrong length.
    """
    arr = _as_vector(value, dimension, what).astype(np.float64, copy=True)
    arr += 0.0  # -0.0 becomes 0.0: one number, one spelling, one digest (and so one noise)
    finite = np.isfinite(arr)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise InvalidValueError(
            f"{what} must be finite; coordinate {bad} is not "
            f"({int((~finite).sum())} non-finite coordinates in total)"
        )
    return arr


def as_count_vector(
    value: Any, *, dimension: int | None = None, what: str = "value"
) -> NDArray[np.int64]:
    """An int64 copy of ``value``, whose coordinates must be non-negative integer counts.

    Parameters
    ----------
    value : array_like
        Integers, or floats with integral values, of magnitude at most ``2**53 - 1``.
    dimension : int, optional
        Required length.
    what : str, default "value"
        What is checked, for messages.

    Returns
    -------
    ndarray of int64

    Raises
    ------
    InvalidValueError, DimensionMismatchError
        As :func:`as_float_vector`, and for fractional or negative counts.
    """
    arr = _integral(_as_vector(value, dimension, what), what, "counts")
    out = arr.astype(np.int64)
    neg = out < 0
    if neg.any():
        bad = int(np.flatnonzero(neg)[0])
        raise InvalidValueError(
            f"{what} must hold non-negative counts; coordinate {bad} is negative"
        )
    return out


def _integral(arr: NDArray[Any], what: str, kind: str) -> NDArray[Any]:
    """``arr`` itself, or its floats checked to be integers of magnitude at most 2**53 - 1.

    A double of magnitude 2**53 or more is the reading of more than one integer (2**53 + 1 reads
    as 2**53), so which count it stands for is not in the double: it is refused, however the
    number was written, and the double alone decides."""
    if np.issubdtype(arr.dtype, np.floating):
        farr = as_float_vector(arr, what=what)
        frac = farr != np.round(farr)
        if frac.any():
            bad = int(np.flatnonzero(frac)[0])
            raise InvalidValueError(
                f"{what} must hold integer {kind}; coordinate {bad} is not a whole number"
            )
        if (np.abs(farr) > MAX_EXACT_INTEGER).any():
            raise InvalidValueError(
                f"{what} has {kind} of magnitude 2**53 or more, which a double cannot tell apart "
                "(2**53 + 1 reads as 2**53); counts must be at most 2**53 - 1"
            )
        return farr
    return arr


def as_integer_vector(
    value: Any, *, dimension: int | None = None, what: str = "value"
) -> NDArray[np.int64]:
    """An int64 copy of ``value``, whose coordinates must be integers of magnitude < 2**53.

    Parameters
    ----------
    value : array_like
        Integers (of any sign), or floats with integral values.
    dimension : int, optional
        Required length.
    what : str, default "value"
        What is checked, for messages.

    Returns
    -------
    ndarray of int64
        Bounded by 2**53 - 1 (every larger double is the reading of several integers), so that
        a release (the value plus noise below 2**62) never overflows
        int64: the discrete Laplace mechanism returns exact integers, never wrapped ones.

    Raises
    ------
    InvalidValueError, DimensionMismatchError
        As :func:`as_float_vector`, and for fractional or too large values.
    """
    arr = _integral(_as_vector(value, dimension, what), what, "values")
    if (
        np.issubdtype(arr.dtype, np.integer)
        and arr.size
        and (arr.max() > MAX_EXACT_INTEGER or arr.min() < -MAX_EXACT_INTEGER)
    ):
        bad = int(np.flatnonzero((arr > MAX_EXACT_INTEGER) | (arr < -MAX_EXACT_INTEGER))[0])
        raise InvalidValueError(
            f"{what} must be at most 2**53 - 1 in magnitude; coordinate {bad} is not"
        )
    return arr.astype(np.int64)


def step_of(levels: Sequence[float], level: Any, *, unit: str) -> int:
    """The step at which ``level`` is sold on a chain of ``levels``.

    Parameters
    ----------
    levels : sequence of float
        The chain's levels, canonical and strictly increasing.
    level : float
        The level asked for (canonicalised here).
    unit : str
        The levels' unit, for the message.

    Returns
    -------
    int

    Raises
    ------
    LevelNotForSaleError
        ``level`` is not one of ``levels`` (the message lists them).
    """
    lvl = canonical_level(level)
    k = bisect.bisect_left(levels, lvl)
    if k == len(levels) or levels[k] != lvl:
        sells = ", ".join(f"{x:g}" for x in levels)
        raise LevelNotForSaleError(
            f"the level asked for is not sold here; the levels for sale ({unit}) are {sells}"
        )
    return k
