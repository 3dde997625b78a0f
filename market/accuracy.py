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
  P(|N − λ| ≤ t) ≥ c (a figure to compare levels by; the law is discrete, so the coverage is at
  least c, not exactly c).

The two laws of integer noise (Poisson, discrete Laplace) give exact intervals: the truth of a
release Y is Y − N, so the interval is the integers [Y − n_hi, Y − n_lo] for an integer range of
noise outcomes with P(n_lo ≤ N ≤ n_hi) ≥ c (:meth:`ErrorModel.noise_range`), computed in
integers. An interval ``estimate ± t`` in floating point would not do: t is the distance from λ
of an integer, and ``Y − λ + t`` rounds to either side of the integer it stands for, dropping an
outcome the interval should hold (coverage 0.843 at a stated 90 % for λ = 0.7022 and a truth
of 7). For Poisson noise the range is the fewest outcomes that reach c (the highest-mass
outcomes, a range as the law is unimodal): never wider than ± the half-width, sometimes shorter,
and not centred on the estimate, as the law is skewed. For discrete Laplace noise it is [−t, t].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _special as special
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
        Laplace b = g·D/ε (its noise is g·DLap(e^{−g/b})), Gaussian σ, Poisson λ, discrete
        Laplace b = Δ/ε (its p is e^{−1/b}).
    std : float
        Standard deviation of the noise: the RMS error of the estimate ``release - offset``
        (besides the rounding to the grid, at most ``grid/2``).
    offset : float
        Mean of the noise (λ for Poisson, 0 otherwise): subtract it for an unbiased estimate.
    grid : float
        The release's grid ``g`` (Laplace: the value is rounded to it before the noise is
        added; Gaussian: the noisy value is rounded to it); 0 for the integer families, whose
        releases are exact integers.
    """

    mechanism: str
    level: float
    unit: str
    scale: float
    std: float
    offset: float
    grid: float = 0.0

    def half_width(self, confidence: float) -> float:
        """Smallest t with P(|noise − offset| ≤ t) ≥ ``confidence`` (exact for the law).

        The symmetric figure a quote states and :func:`cheapest_level` compares. For the two
        laws of integer noise it is a display figure only: ``estimate ± t`` evaluated in floating
        point can drop an outcome at its end; :meth:`interval` is exact.

        Raises
        ------
        ValueError
            ``confidence`` is not in (0, 1).
        """
        c = _confidence(confidence)
        if self.scale == 0.0:
            return 0.0
        if self.mechanism == "laplace":
            # g·DLap noise added to the value rounded to g: whole grid steps of noise, and half
            # a step of rounding
            return (_discrete_laplace_half_width(self.scale / self.grid, c) + 0.5) * self.grid
        if self.mechanism == "gaussian":
            # Φ⁻¹((1+c)/2) = −Φ⁻¹((1−c)/2), accurate for c near 1 (scipy.stats costs 0.8 s
            # of import for a worker that needs this one function); plus half a grid step of
            # rounding
            return self.scale * float(-special.ndtri((1.0 - c) / 2.0)) + self.grid / 2.0
        if self.mechanism == "discrete_laplace":
            return _discrete_laplace_half_width(self.scale, c)
        return _poisson_half_width(self.scale, c)

    def noise_range(self, confidence: float) -> tuple[int, int]:
        """The integers ``(n_lo, n_hi)``: noise outcomes with P(n_lo ≤ noise ≤ n_hi) ≥
        ``confidence``, for the laws of integer noise (Poisson, discrete Laplace).

        A release Y comes from the truth Y − noise, so the truths to hold are the integers
        Y − n_hi … Y − n_lo: what :meth:`interval` returns, decided by integers alone. Poisson:
        the fewest outcomes that reach the confidence (a range around the mode ⌊λ⌋, which need
        not be centred on λ; of two ranges as short and as likely, the lower); discrete
        Laplace: (−t, t) for t = :meth:`half_width`.

        Raises
        ------
        ValueError
            ``confidence`` is not in (0, 1), or the noise is not integer (Laplace, Gaussian).
        """
        c = _confidence(confidence)
        if self.mechanism == "poisson":
            return _poisson_noise_range(self.scale, c)
        if self.mechanism == "discrete_laplace":
            t = 0 if self.scale == 0.0 else int(_discrete_laplace_half_width(self.scale, c))
            return -t, t
        raise ValueError(f"{self.mechanism} noise is not integer: it has no noise range")

    def interval(
        self, release: ArrayLike, confidence: float = 0.95
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(low, high)`` around each released coordinate, holding the true value with
        probability at least ``confidence`` per coordinate.

        Laplace, Gaussian: ``estimate ± half_width``. Poisson, discrete Laplace: the whole
        numbers ``release − n_hi … release − n_lo`` of :meth:`noise_range`, computed in
        integers (exact as doubles below 2^53, rounded outwards beyond), so that the coverage is
        the noise law's mass on that range for any truth.

        Raises
        ------
        ValueError
            For integer noise: a finite coordinate is not a whole number, or is 2^61 or more.
        """
        if self.mechanism in ("poisson", "discrete_laplace"):
            return _whole_interval(release, *self.noise_range(confidence))
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
    >>> round(m.std, 4), round(m.half_width(0.95), 4)   # ≈ sqrt(2) b, b ln 20 (b = 1 + 2⁻¹²)
    (1.4146, 2.9967)
    """
    lvl = canonical_level(level)
    var = mechanism.variance(lvl)
    grid = 0.0
    if isinstance(mechanism, Laplace):
        scale, offset = mechanism.scale(lvl), 0.0
        grid = math.ldexp(1.0, mechanism.grid_exponent)
    elif isinstance(mechanism, Gaussian):
        scale, offset = math.sqrt(var), 0.0
        grid = math.ldexp(1.0, mechanism.grid_exponent(lvl))
    elif isinstance(mechanism, Poisson):
        scale = offset = mechanism.rate(lvl)
    elif isinstance(mechanism, DiscreteLaplace):
        scale, offset = mechanism.sensitivity / lvl, 0.0
    else:  # pragma: no cover - the three families are all there is
        raise TypeError(f"no error model for {type(mechanism).__name__}")
    return ErrorModel(
        mechanism.name, lvl, mechanism.level_unit, scale, math.sqrt(var), offset, grid
    )


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
        raise ValueError("an accuracy target must be a positive number")
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
        f"no level for sale reaches the {what} asked for: the most accurate, "
        f"{best:g} ({mechanism.level_unit}), gives {min(errors):.4g}",
        best,
        min(errors),
    )


#: the most confidence a half-width is computed for. Poisson tails come from scipy, whose
#: accuracy for huge λ fades in the far tail: at 99.99 % the half-widths were checked against an
#: independent summation for λ from 10³ to 10¹⁰ (never under-covering); beyond it they were not.
MAX_CONFIDENCE = 0.9999

#: releases and noise bounds of a discrete law are held as int64 below this magnitude, so that a
#: release minus a bound never overflows and its nearest double is at most 2^62 (converted back to
#: int64 exactly when rounding an endpoint outwards)
_WHOLE_LIMIT = 2**61


def _confidence(c: float) -> float:
    c = float(c)
    if not 0.0 < c <= MAX_CONFIDENCE:
        raise ValueError(f"a confidence is in (0, {MAX_CONFIDENCE}]")
    return c


def _smallest(holds: Callable[[int], bool], lo: int, hi: int | None = None) -> int | None:
    """Smallest integer i in [lo, hi] with ``holds(i)``, for a ``holds`` that is false and then
    true (``None`` if it never holds up to ``hi``; with no ``hi`` it must hold somewhere).

    Doubling steps from ``lo`` then bisection: O(log(i − lo)) calls, so a search over the
    outcomes of a Poisson law costs O(log λ) for any λ."""
    if holds(lo):
        return lo
    bad, step = lo, 1
    while True:
        probe = lo + step if hi is None else min(lo + step, hi)
        if holds(probe):
            good = probe
            break
        if probe == hi:
            return None
        bad, step = probe, 2 * step
    while good - bad > 1:  # holds(good) and not holds(bad)
        mid = (bad + good) // 2
        if holds(mid):
            good = mid
        else:
            bad = mid
    return good


def _poisson_miss(lam: float, lo: int, hi: int) -> float:
    """P(N < lo) + P(N > hi) for N ~ Poi(λ), from the two tails (accurate when it is tiny, where
    ``1 − P(lo ≤ N ≤ hi)`` would cancel)."""
    # scipy.special's Poisson CDF and survival function: what scipy.stats.poisson calls, without
    # its per-call machinery (a quote evaluates this a few dozen times per level)
    below = float(special.pdtr(float(lo - 1), lam)) if lo >= 1 else 0.0
    return float(special.pdtrc(float(hi), lam)) + below


def _poisson_half_width(lam: float, c: float) -> float:
    """Smallest t with P(|N − λ| ≤ t) ≥ c for N ~ Poi(λ): the symmetric figure a quote states.

    The coverage changes only where t reaches the distance from λ of an integer, so t is the
    distance of some integer: of a right end b ≥ λ (the ball is then [⌈2λ − b⌉, b]) or of a left
    end a ≤ λ (the ball is [a, ⌊2λ − a⌋]). Both families are searched for their nearest end
    that covers, and the ball's integers are found with exact rational arithmetic (``λ`` is a
    double, so ``Fraction(λ)`` is exact): no rounding decides which integers a ball holds.
    """
    if lam == 0.0:
        return 0.0
    alpha, exact, floor = 1.0 - c, Fraction(lam), math.floor(lam)
    first = math.ceil(exact)  # the nearest right end

    def right(i: int) -> bool:
        b = first + i
        return _poisson_miss(lam, max(0, math.ceil(2 * exact - b)), b) <= alpha

    def left(j: int) -> bool:
        a = floor - j
        return _poisson_miss(lam, a, math.floor(2 * exact - a)) <= alpha

    i = _smallest(right, 0)
    assert i is not None  # the right family covers: its balls grow without bound
    t = first + i - exact
    j = _smallest(left, 0, floor)  # None: no ball with a left end reaching 0 covers
    if j is not None:
        t = min(t, exact - (floor - j))
    return float(t)


def _poisson_noise_range(lam: float, c: float) -> tuple[int, int]:
    """The fewest consecutive outcomes [a, b] of N ~ Poi(λ) with P(a ≤ N ≤ b) ≥ c.

    The law is unimodal, so for each count k the heaviest range of k outcomes is the first one
    whose next outcome is no likelier than its first (P(N = a + k) ≤ P(N = a): sliding on would
    lose at least what it gains), which lies within k of the mode ⌊λ⌋; the smallest k whose
    heaviest range covers is found by doubling and bisection on k (its coverage grows with k).
    A range whose slide is an exact tie keeps the lower outcomes. This is the highest-mass set:
    every outcome held is at least as likely as every outcome left out, so dropping either end
    falls short of c.
    """
    if lam == 0.0:
        return 0, 0
    alpha, mode = 1.0 - c, math.floor(lam)

    def start(k: int) -> int:
        a = _smallest(lambda a: _poisson_not_rising(lam, a, k), max(0, mode - k), mode)
        # at the mode the pmf k outcomes on is lower; only for λ ~ 10¹⁶ and beyond, where the
        # pmf is flat to double precision over a few integers, may the test say otherwise
        return mode if a is None else a

    def covers(k: int) -> bool:
        a = start(k)
        return _poisson_miss(lam, a, a + k - 1) <= alpha

    k = _smallest(covers, 1)
    assert k is not None  # the coverage of the heaviest k outcomes tends to 1
    a = start(k)
    return a, a + k - 1


def _poisson_not_rising(lam: float, a: int, k: int) -> bool:
    """P(N = a + k) ≤ P(N = a) for N ~ Poi(λ), i.e. λ^k ≤ (a + 1)⋯(a + k).

    For k = 1 this is a + 1 ≥ λ, decided exactly (the only exact ties of the pmf are
    P(N = λ − 1) = P(N = λ) at a whole λ: a product of two or more consecutive integers is never
    a perfect power, Erdős–Selfridge 1975, and a double that is not whole has no whole power).
    Otherwise the two log-pmfs are compared in Loader's saddle-point form, accurate to about
    10⁻¹⁴ for any λ (a near tie only picks between two ranges of equal length and mass).
    """
    if k == 1:
        return a + 1 >= lam
    return _poisson_log_pmf(lam, a + k) <= _poisson_log_pmf(lam, a)


def _poisson_log_pmf(lam: float, n: int) -> float:
    """ln P(N = n) for N ~ Poi(λ) as −λ·g((n − λ)/λ) − ½ ln(2πn) − stirlerr(n), with
    g(u) = (1 + u) ln(1 + u) − u (Loader 2000): no cancellation between terms of size λ ln λ,
    which ``n ln λ − λ − ln n!`` suffers for large λ."""
    if n == 0:
        return -lam
    whole = math.floor(lam)
    u = (float(n - whole) - (lam - whole)) / lam  # n − λ with one rounding
    return -lam * _log1p_minus(u) - 0.5 * math.log(2.0 * math.pi * n) - _stirlerr(n)


def _log1p_minus(u: float) -> float:
    """(1 + u) ln(1 + u) − u for u > −1; by its series Σ (−u)^j / (j (j − 1)) near 0, where the
    closed form would lose the leading digits."""
    if abs(u) >= 0.1:
        return (1.0 + u) * math.log1p(u) - u
    total, power = 0.0, -u  # (−u)^j
    for j in range(2, 40):
        power *= -u
        term = power / (j * (j - 1))
        total += term
        if abs(term) <= 1e-17 * abs(total):
            break
    return total


def _stirlerr(n: int) -> float:
    """ln n! − (n + ½) ln n + n − ½ ln(2π): the error of Stirling's formula (n ≥ 1)."""
    if n <= 15:
        return math.lgamma(n + 1) - (n + 0.5) * math.log(n) + n - 0.5 * math.log(2.0 * math.pi)
    x = float(n)
    x2 = x * x
    return (1 / 12 - (1 / 360 - (1 / 1260 - (1 / 1680 - 1 / (1188 * x2)) / x2) / x2) / x2) / x


def _whole_interval(
    release: ArrayLike, n_lo: int, n_hi: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(release − n_hi, release − n_lo)`` in integers, as doubles rounded outwards.

    The truths a release of a discrete law can come from are whole numbers, so the interval is
    computed in int64 where no rounding can drop an outcome at its end; both ends are exact as
    doubles below 2^53, and beyond it each is rounded away from the other. Non-finite
    coordinates stay as they are.

    Raises
    ------
    ValueError
        A finite coordinate is not a whole number, or is 2^61 or more in size.
    """
    y = np.asarray(release)
    if y.dtype.kind in "biu":
        known = np.ones(y.shape, dtype=bool)
        if np.any(y >= _WHOLE_LIMIT) or np.any(y <= -_WHOLE_LIMIT):
            raise ValueError("a release this large (2^61 or more) has no exact interval")
        values = y.astype(np.float64)
        whole = y.astype(np.int64)
    else:
        values = y.astype(np.float64)
        known = np.isfinite(values)
        finite = values[known]
        if np.any(finite != np.floor(finite)):
            raise ValueError("a release of a discrete law is whole numbers")
        if np.any(np.abs(finite) >= _WHOLE_LIMIT):
            raise ValueError("a release this large (2^61 or more) has no exact interval")
        whole = np.where(known, values, 0.0).astype(np.int64)
    if max(abs(n_lo), abs(n_hi)) >= _WHOLE_LIMIT:
        raise ValueError("a noise range this wide (2^61 or more) has no exact interval")
    lo = _outwards(whole - np.int64(n_hi), up=False)
    hi = _outwards(whole - np.int64(n_lo), up=True)
    return np.where(known, lo, values), np.where(known, hi, values)


def _outwards(v: NDArray[np.int64], *, up: bool) -> NDArray[np.float64]:
    """The double nearest ``v``, moved one step up (``up``) or down where it fell on the wrong
    side (only possible beyond 2^53; |v| < 2^62, so the double converts back to int64)."""
    f = v.astype(np.float64)
    back = f.astype(np.int64)
    wrong = back < v if up else back > v
    return np.where(wrong, np.nextafter(f, np.inf if up else -np.inf), f)


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
