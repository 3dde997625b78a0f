"""Accuracy in the buyer's terms: the error of a release, its intervals, and the level to buy.

Buyers think in errors, not in ε: "±0.5 at 95 %", or "an RMS error of 0.3". Every release of a
mechanism at a level has a known noise law, so both directions are exact:

* :func:`error_model` — the noise of one coordinate at a level: its standard deviation (the RMS
  error of the unbiased estimate), its mean offset (Poisson noise is non-negative: subtract λ),
  and :meth:`ErrorModel.half_width` / :meth:`ErrorModel.interval` at any confidence;
* :func:`cheapest_level` — among the levels a stream sells, the least accurate (so cheapest, as
  prices increase with the level) that meets an accuracy target, or an error naming the best
  level for sale and the accuracy it gives.

Half-widths are exact for each law (no normal approximation):

* Laplace, scale b = Δ/ε: P(|V| > t) = e^{−t/b}, so t = b ln(1/(1 − c));
* Gaussian, σ² = Δ²/(2ρ): t = σ Φ⁻¹((1 + c)/2);
* discrete Laplace, P(V = k) ∝ p^|k| with p = e^{−1/b}, b = Δ/ε: P(|V| > t) = 2p^{t+1}/(1 + p)
  for whole t, so t is the smallest whole number with 2p^{t+1}/(1 + p) ≤ 1 − c (coverage at
  least c; the noise is an integer);
* Poisson, N ~ Poi(λ), λ = Δ²/ω, estimate = release − λ: the smallest t with
  P(|N − λ| ≤ t) ≥ c, found from the two tails (a doubling and bisection search on t, snapped
  to the distance of the farthest integer it holds). The law is discrete, so the coverage is at
  least c (not exactly c).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

from .errors import MarketError
from .levels import canonical_level
from .mechanisms import DiscreteLaplace, Gaussian, Laplace, Mechanism, Poisson

__all__ = ["AccuracyNotForSaleError", "ErrorModel", "cheapest_level", "error_model"]

#: confidences every release states a half-width for
STANDARD_CONFIDENCES = (0.90, 0.95, 0.99)


class AccuracyNotForSaleError(MarketError, ValueError):
    """No level for sale is accurate enough; ``best`` is the most accurate one, ``error`` its
    accuracy in the terms of the request (RMS error or half-width)."""

    def __init__(self, message: str, best: float, error: float) -> None:
        super().__init__(message)
        self.best, self.error = best, error


@dataclass(frozen=True)
class ErrorModel:
    """The noise of one coordinate of a release at ``level``.

    Attributes
    ----------
    mechanism : {"laplace", "gaussian", "poisson", "discrete_laplace"}
    level : float
        In the mechanism's unit (``unit``: epsilon, rho or omega).
    unit : str
    scale : float
        Laplace b, Gaussian σ, Poisson λ, discrete Laplace b = Δ/ε (its p is e^{−1/b}).
    std : float
        Standard deviation of the noise: the RMS error of the estimate ``release - offset``.
    offset : float
        Mean of the noise (λ for Poisson, 0 otherwise): subtract it for an unbiased estimate.
    """

    mechanism: str
    level: float
    unit: str
    scale: float
    std: float
    offset: float

    def half_width(self, confidence: float) -> float:
        """Smallest t with P(|noise − offset| ≤ t) ≥ ``confidence`` (exact for the law).

        Raises
        ------
        ValueError
            ``confidence`` is not in (0, 1).
        """
        c = _confidence(confidence)
        if self.scale == 0.0:
            return 0.0
        if self.mechanism == "laplace":
            return -self.scale * math.log1p(-c)  # accurate for c near 0 and near 1
        if self.mechanism == "gaussian":
            # Φ⁻¹((1+c)/2) = −Φ⁻¹((1−c)/2), accurate for c near 1 (scipy.stats costs 0.8 s
            # of import for a worker that needs this one function)
            return self.scale * float(-special.ndtri((1.0 - c) / 2.0))
        if self.mechanism == "discrete_laplace":
            return _discrete_laplace_half_width(self.scale, c)
        return _poisson_half_width(self.scale, c)

    def interval(
        self, release: ArrayLike, confidence: float = 0.95
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(low, high)`` around each released coordinate, holding the true value with
        probability at least ``confidence`` per coordinate."""
        est = np.asarray(release, dtype=np.float64) - self.offset
        t = self.half_width(confidence)
        return est - t, est + t

    def standard_half_widths(self) -> dict[str, float]:
        """Half-widths at 90, 95 and 99 % (what every release states), keyed "90", "95", "99"."""
        return {f"{round(c * 100)}": self.half_width(c) for c in STANDARD_CONFIDENCES}


def error_model(mechanism: Mechanism, level: float) -> ErrorModel:
    """The :class:`ErrorModel` of a release of ``mechanism`` at ``level``.

    Every release at a level has the law of a fresh one (lossless release), so the model
    holds for relaxed, tightened and bridged releases alike.

    Parameters
    ----------
    mechanism : Mechanism
        The stream's noise family and sensitivity.
    level : float
        The release's level, in the mechanism's unit.

    Returns
    -------
    ErrorModel

    Examples
    --------
    >>> from market import Laplace
    >>> m = error_model(Laplace(1.0), 1.0)
    >>> round(m.std, 4), round(m.half_width(0.95), 4)   # sqrt(2) b, b ln 20
    (1.4142, 2.9957)
    """
    lvl = canonical_level(level)
    var = mechanism.variance(lvl)
    if isinstance(mechanism, Laplace):
        scale, offset = mechanism.scale(lvl), 0.0
    elif isinstance(mechanism, Gaussian):
        scale, offset = math.sqrt(var), 0.0
    elif isinstance(mechanism, Poisson):
        scale = offset = mechanism.rate(lvl)
    elif isinstance(mechanism, DiscreteLaplace):
        scale, offset = mechanism.sensitivity / lvl, 0.0
    else:  # pragma: no cover - the three families are all there is
        raise TypeError(f"no error model for {type(mechanism).__name__}")
    return ErrorModel(mechanism.name, lvl, mechanism.level_unit, scale, math.sqrt(var), offset)


def cheapest_level(
    mechanism: Mechanism,
    levels: list[float],
    *,
    rmse: float | None = None,
    half_width: float | None = None,
    confidence: float = 0.95,
) -> float:
    """The least accurate level of ``levels`` that meets the target (the cheapest one, since
    prices increase with the level). Every level is checked in order: RMS errors shrink as the
    level grows, but a Poisson half-width (a discrete law) need not at every step.

    Parameters
    ----------
    mechanism : Mechanism
    levels : list of float
        The levels for sale.
    rmse : float, optional
        Largest acceptable RMS error per coordinate, in the value's units.
    half_width : float, optional
        Largest acceptable half-width of the ``confidence`` interval, in the value's units.
    confidence : float, default 0.95

    Returns
    -------
    float

    Raises
    ------
    AccuracyNotForSaleError
        No level is accurate enough; the error names the best level and its accuracy.
    ValueError
        Not exactly one of ``rmse`` and ``half_width`` is given, or it is not positive.
    """
    if (rmse is None) == (half_width is None):
        raise ValueError("give exactly one accuracy target: rmse or half_width")
    target = float(rmse if rmse is not None else half_width)  # type: ignore[arg-type]
    if not math.isfinite(target) or target <= 0:
        raise ValueError(f"an accuracy target must be a positive number, got {target!r}")
    kind: Literal["rmse", "half_width"] = "rmse" if rmse is not None else "half_width"

    def err(level: float) -> float:
        m = error_model(mechanism, level)
        return m.std if kind == "rmse" else m.half_width(confidence)

    ordered = sorted(canonical_level(x) for x in levels)
    errors = [err(lvl) for lvl in ordered]
    for lvl, e in zip(ordered, errors, strict=True):
        if e <= target:
            return lvl
    # the most accurate level for sale: usually the last, but a discrete (Poisson) half-width
    # need not shrink at every dearer level
    best = ordered[int(np.argmin(errors))]
    what = "RMS error" if kind == "rmse" else f"{confidence:.0%} half-width"
    raise AccuracyNotForSaleError(
        f"no level for sale reaches a {what} of {target:g}: the most accurate, "
        f"{best:g} ({mechanism.level_unit}), gives {min(errors):.4g}",
        best,
        min(errors),
    )


#: the most confidence a half-width is computed for. Poisson tails come from scipy, whose
#: accuracy for huge λ fades in the far tail: at 99.99 % the half-widths were checked against an
#: independent summation for λ from 10³ to 10¹⁰ (never under-covering); beyond it they were not.
MAX_CONFIDENCE = 0.9999


def _confidence(c: float) -> float:
    c = float(c)
    if not 0.0 < c <= MAX_CONFIDENCE:
        raise ValueError(f"a confidence is in (0, {MAX_CONFIDENCE}], got {c!r}")
    return c


def _poisson_miss(lam: float, t: float) -> float:
    """P(|N − λ| > t) for N ~ Poi(λ), from the tails (accurate when it is tiny)."""
    hi = math.floor(lam + t)
    lo = math.ceil(lam - t)
    # scipy.special's Poisson CDF and survival function: what scipy.stats.poisson calls, without
    # its per-call machinery (a quote evaluates this a few dozen times per level)
    below = float(special.pdtr(lo - 1, lam)) if lo >= 1 else 0.0
    return float(special.pdtrc(hi, lam)) + below


def _poisson_half_width(lam: float, c: float) -> float:
    """Smallest t with P(|N − λ| ≤ t) ≥ c for N ~ Poi(λ).

    The miss probability only changes where t reaches an integer's distance from λ, and falls
    as t grows: double t until it is small enough, bisect, then snap t to the distance of the
    farthest integer the interval holds. O(log λ) tail evaluations, for any λ.
    """
    alpha = 1.0 - c
    top = max(1.0, math.sqrt(lam))
    while _poisson_miss(lam, top) > alpha:
        top *= 2.0
    bottom = 0.0
    if _poisson_miss(lam, bottom) <= alpha:
        return _snap(lam, bottom)
    for _ in range(200):  # miss(bottom) > alpha >= miss(top)
        mid = (bottom + top) / 2.0
        if mid in (bottom, top) or _snap(lam, top) == _snap(lam, bottom):
            break
        if _poisson_miss(lam, mid) > alpha:
            bottom = mid
        else:
            top = mid
    return _snap(lam, top)


def _snap(lam: float, t: float) -> float:
    """The distance from λ of the farthest integer within ``t`` of it (0 if none)."""
    hi, lo = math.floor(lam + t), max(0, math.ceil(lam - t))
    return max(0.0, hi - lam if hi >= lam else 0.0, lam - lo if lo <= lam else 0.0)


def _discrete_laplace_tail(b: float, t: int) -> float:
    """P(|V| > t) for V ~ DLap(p = e^{−1/b}): 2 p^{t+1} / (1 + p)."""
    return 2.0 * math.exp(-(t + 1) / b) / (1.0 + math.exp(-1.0 / b))


def _discrete_laplace_half_width(b: float, c: float) -> float:
    """Smallest whole t with P(|V| ≤ t) ≥ c for discrete Laplace noise of scale ``b``.

    The closed form ``t = ⌈b ln(2 / ((1 − c)(1 + p)))⌉ − 1`` is rounded in floats, so the
    candidate is then moved to the smallest whole number whose tail, evaluated directly, is
    within ``1 − c`` (never under-covering by a rounding)."""
    p = math.exp(-1.0 / b)
    t = max(0, math.ceil(b * math.log(2.0 / ((1.0 - c) * (1.0 + p)))) - 1)
    while _discrete_laplace_tail(b, t) > 1.0 - c:
        t += 1
    while t > 0 and _discrete_laplace_tail(b, t - 1) <= 1.0 - c:
        t -= 1
    return float(t)
