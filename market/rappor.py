"""RAPPOR with relaxable parameters (Koufogiannis et al. §4.2, eqs. 38–42).

RAPPOR (Erlingsson et al. 2014) hashes a client's string into a Bloom filter ``y`` of ``k`` bits,
memoises a *permanent* randomized response ``z`` (each bit replaced by a fair coin with
probability α) and sends *instantaneous* randomized responses ``w`` of ``z``
(``P(w=1|z=1) = β``, ``P(w=1|z=0) = γ``). Its parameters are fixed forever. Written with Laplace
noise and a threshold, each randomization is a post-processing of a Laplace mechanism, so the
parameters can be relaxed later with the lossless Laplace process instead of re-randomising:

* permanent: ``z = [y + V_f > 1/2]``, ``V_f ~ Lap(b_f)``, ``b_f = 1 / (−2 ln α)`` (eq. 41);
* instantaneous: ``w = [z + V_g > θ]``, ``θ = ln(2γ) / ln(4γ(1−β))``,
  ``V_g ~ Lap(b_g)``, ``b_g = 1 / (−ln(4γ(1−β)))``.

Eq. (42) prints the instantaneous scale as ``1/(−ln(4β(1−γ)))``, which is negative for the usual
``β > ½ > γ``; solving ``P(V > θ) = γ`` and ``P(V > θ − 1) = β`` gives ``4γ(1−β)`` (tested). The
Laplace level of each randomization is ``ε_f = −2 ln α`` and ``ε_g = −ln(4γ(1−β))``: relaxing the
client to smaller α (resp. γ closer to 0, β closer to 1) is a Laplace relaxation of its stored
noise, which keeps the earlier reports' information and adds only the difference.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from . import _special as special
from .errors import InvalidValueError
from .mechanisms import Laplace
from .release_state import ReleaseState
from .rng import RngLike, default_rng

__all__ = [
    "BitEstimate",
    "MarketResponse",
    "RapporClient",
    "RapporParams",
    "bloom_bits",
    "decode",
    "estimate_bits",
    "market_response",
    "released_bits",
]


@dataclass(frozen=True)
class RapporParams:
    """RAPPOR's parameters.

    Parameters
    ----------
    k : int, default 32
        Bloom filter bits.
    hashes : int, default 2
        Hash functions per value.
    alpha : float, default 0.5
        Probability that a permanent bit is replaced by a fair coin (RAPPOR's f).
    beta, gamma : float, default 0.75, 0.5
        ``P(w = 1 | z = 1)`` and ``P(w = 1 | z = 0)`` of the instantaneous report
        (RAPPOR's q and p).

    Raises
    ------
    InvalidValueError
        Out of range, or β = γ = ½ (reports independent of the data).
    """

    k: int = 32
    hashes: int = 2
    alpha: float = 0.5
    beta: float = 0.75
    gamma: float = 0.5

    def __post_init__(self) -> None:
        if not (0 < self.alpha < 1 and 0.5 <= self.beta < 1 and 0 < self.gamma <= 0.5):
            raise InvalidValueError("need 0 < alpha < 1, 1/2 <= beta < 1, 0 < gamma <= 1/2")
        if self.k < 1 or not 1 <= self.hashes <= self.k:
            raise InvalidValueError("need k >= 1 and 1 <= hashes <= k")
        if 4.0 * self.gamma * (1.0 - self.beta) >= 1.0:
            raise InvalidValueError(
                "beta = gamma = 1/2 makes every instantaneous report a fair coin, independent of "
                "the data (its Laplace level is 0 and its threshold undefined); choose beta > 1/2 "
                "or gamma < 1/2"
            )

    @property
    def permanent_epsilon(self) -> float:
        """Laplace level of the permanent randomization, ε_f = −2 ln α (eq. 41)."""
        return -2.0 * math.log(self.alpha)

    @property
    def instantaneous_epsilon(self) -> float:
        """Laplace level of the instantaneous randomization, ε_g = −ln(4γ(1−β)) (corrected)."""
        return -math.log(4.0 * self.gamma * (1.0 - self.beta))

    @property
    def threshold(self) -> float:
        """θ = ln(2γ) / ln(4γ(1−β)) (eq. 42)."""
        return math.log(2.0 * self.gamma) / math.log(4.0 * self.gamma * (1.0 - self.beta))


def bloom_bits(value: str, params: RapporParams, cohort: int = 0) -> NDArray[np.int64]:
    """The Bloom filter bits ``value`` sets.

    Parameters
    ----------
    value : str
        The string.
    params : RapporParams
        Filter size and hash count.
    cohort : int, default 0
        Selects the hash family.

    Returns
    -------
    ndarray of int64
        Sorted distinct indices (SHA-256 based hash family).
    """
    out = set()
    for h in range(params.hashes):
        digest = hashlib.sha256(f"{cohort}:{h}:{value}".encode()).digest()
        out.add(int.from_bytes(digest[:8], "big") % params.k)
    return np.asarray(sorted(out), dtype=np.int64)


class RapporClient:
    """One client: a Bloom filter, its permanent noise process and its reports.

    Parameters
    ----------
    value : str
        The client's private string.
    params : RapporParams
        The initial parameters; later calls may pass relaxed ones.
    cohort : int, default 0
        The client's cohort (selects the hash family).
    rng : Generator, int or None
        See :func:`market.rng.default_rng`.
    """

    def __init__(
        self, value: str, params: RapporParams, *, cohort: int = 0, rng: RngLike = None
    ) -> None:
        self.params = params
        self._rng = default_rng(rng)
        self.bloom = np.zeros(params.k)
        self.bloom[bloom_bits(value, params, cohort)] = 1.0
        # permanent noise V_f: one lossless Laplace process per bit, exact value 0
        self._permanent = ReleaseState(Laplace(1.0), np.zeros(params.k))

    def permanent(self, params: RapporParams | None = None) -> NDArray[np.int64]:
        """The memoised permanent response z at ``params`` (relaxed losslessly if α decreased)."""
        p = params or self.params
        noise = self._permanent.release(p.permanent_epsilon, rng=self._rng)
        return (self.bloom + noise > 0.5).astype(np.int64)

    def report(self, params: RapporParams | None = None) -> NDArray[np.int64]:
        """An instantaneous report w of the permanent response (fresh noise per report)."""
        p = params or self.params
        z = self.permanent(p)
        v = self._rng.laplace(0.0, 1.0 / p.instantaneous_epsilon, p.k)
        return (z + v > p.threshold).astype(np.int64)


def decode(
    reports: NDArray[np.int64],
    candidates: Sequence[str],
    params: RapporParams,
    cohort: int = 0,
) -> NDArray[np.float64]:
    """Estimated frequency of each candidate string from a matrix of reports (one per row).

    Parameters
    ----------
    reports : ndarray
        One report per row, ``k`` bits each.
    candidates : sequence of str
        The strings whose frequencies are estimated.
    params : RapporParams
        The parameters the reports were made with.
    cohort : int, default 0
        The cohort of every report.

    Returns
    -------
    ndarray
        One non-negative frequency per candidate.

    Notes
    -----
    Per bit, invert both randomizations: ``t = (mean(w) − γ)/(β − γ)`` estimates ``P(z = 1)``, and
    ``(t − α/2)/(1 − α)`` the fraction of Bloom filters with the bit set. Then fit non-negative
    candidate frequencies to those bit fractions (least squares), as RAPPOR's decoder does.
    """
    w = np.asarray(reports, dtype=np.float64).mean(axis=0)
    t = (w - params.gamma) / (params.beta - params.gamma)
    bits = (t - params.alpha / 2) / (1 - params.alpha)
    design = np.zeros((params.k, len(candidates)))
    for j, c in enumerate(candidates):
        design[bloom_bits(c, params, cohort), j] = 1.0
    from scipy import optimize  # noqa: PLC0415 - deferred: the noise needs no scipy

    freq, _ = optimize.nnls(design, bits)
    return np.asarray(freq, dtype=np.float64)


@dataclass(frozen=True)
class MarketResponse:
    """The randomized response of a bit the market releases at one level.

    Attributes
    ----------
    p_if_0, p_if_1 : float
        Probability that a released bit is 1 where the member's bit is 0, resp. 1.
    f : float
        RAPPOR's f, ``1 − (p_if_1 − p_if_0)``: a bit is replaced by a fair coin with this
        probability (the two flips differ by ``P(J = t)``, below 2⁻¹⁰ of either).
    """

    p_if_0: float
    p_if_1: float
    f: float


def market_response(sensitivity: float, dimension: int, level: float) -> MarketResponse:
    """The law of a bit released as ``[y + g·J > 1/2]`` at ``level`` (docs/protocol.md §1.10).

    Parameters
    ----------
    sensitivity : float
        The stream's ℓ1 sensitivity Δ (twice the most bits a report sets).
    dimension : int
        Bits per report.
    level : float
        ε of the release.

    Returns
    -------
    MarketResponse
        With ``J ~ DLap(a)``, ``a = ε/D``, ``q = e^{−a}`` and the threshold ``t = 2^{−k−1}`` grid
        units (``g = 2^k`` the Laplace grid): ``P(J > t) = q^{t+1}/(1 + q)`` and
        ``P(J > −t) = 1 − q^t/(1 + q)``. Why ½ in value units: it is a power of two on the grid,
        so the released bit is an exact comparison of the portable lattice release, with no
        logarithm in the decision.
    """
    m = Laplace(sensitivity, dimension)
    a = float(Fraction(level) / m.units())
    t = math.ldexp(1.0, -m.grid_exponent - 1)
    q = math.exp(-a)
    p0 = math.exp(-a * (t + 1.0)) / (1.0 + q)
    p1 = 1.0 - math.exp(-a * t) / (1.0 + q)
    return MarketResponse(p0, p1, 1.0 - (p1 - p0))


def released_bits(release: NDArray[np.float64]) -> NDArray[np.float64]:
    """The bits of a Laplace release of a report: ``[y + V > 1/2]``, 0.0 or 1.0.

    The release is the double nearest ``n·2^k`` and rounding is monotone with ½ a double, so the
    comparison is that of the exact lattice point: the same on every platform.
    """
    return (np.asarray(release, dtype=np.float64) > 0.5).astype(np.float64)


@dataclass(frozen=True)
class BitEstimate:
    """The estimated fraction of members whose bit is set, per bit, with a confidence interval.

    Attributes
    ----------
    fraction, low, high : ndarray
        The unbiased estimate ``(w̄ − p_if_0)/(p_if_1 − p_if_0)`` (it may leave [0, 1]) and the
        interval's ends (clipped to [0, 1]).
    reports : int
        Reports counted.
    confidence : float
        The interval's coverage.
    """

    fraction: NDArray[np.float64]
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    reports: int
    confidence: float


def estimate_bits(
    bits: NDArray[np.float64] | Sequence[Sequence[float]],
    response: MarketResponse,
    *,
    confidence: float = 0.95,
) -> BitEstimate:
    """What a buyer learns of the population from released bits at one level.

    Parameters
    ----------
    bits : array of shape (reports, bits)
        The released bits, one report per row, all at one level.
    response : MarketResponse
        That level's randomized response (the quote's or release's ``randomized_response``).
    confidence : float, default 0.95
        Coverage of the interval.

    Returns
    -------
    BitEstimate
        Per bit: on a category stream (one bit set per report) each bit's fraction is its
        category's frequency.

    Notes
    -----
    A released bit is 1 with probability ``π = p_if_0 + x(p_if_1 − p_if_0)``, ``x`` the
    fraction of members with the bit set, independently across members; the Wilson score
    interval of ``π`` (sound at small counts and near 0 or 1) is mapped through the inverse
    line. It covers sampling and noise both, since the released bits are i.i.d. Bernoulli(π).
    """
    w = np.asarray(bits, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] == 0:
        raise InvalidValueError("bits: one row per report, at least one report")
    if not 0.0 < confidence < 1.0:
        raise InvalidValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    n = w.shape[0]
    mean = w.mean(axis=0)
    z = float(special.ndtri(0.5 + confidence / 2.0))
    centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    span = response.p_if_1 - response.p_if_0

    def inv(p: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.asarray((p - response.p_if_0) / span, dtype=np.float64)

    return BitEstimate(
        fraction=inv(mean),
        low=np.clip(inv(centre - half), 0.0, 1.0),
        high=np.clip(inv(centre + half), 0.0, 1.0),
        reports=n,
        confidence=confidence,
    )
