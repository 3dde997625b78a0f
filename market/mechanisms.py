"""Additive-noise mechanisms whose noise families satisfy a convolution preorder.

Each mechanism is a small frozen object (name, sensitivity) that knows three things:

* how its privacy *level* maps to a noise distribution (Laplace scale Δ/ε, Gaussian variance
  Δ²/(2ρ), Poisson rate Δ²/ω);
* how to sample a release **conditioned on its neighbours** in a release state
  (:meth:`Mechanism.conditional`): the single operation from which fresh release, relaxation
  (Koufogiannis Alg. 1), bridging (Andersson Alg. 1 / Lemma F.5 / Poisson binomial bridge) and
  tightening (Koufogiannis eq. 25) all follow;
* what a level means in privacy terms (:meth:`Mechanism.epsilon`) and in accuracy terms
  (:meth:`Mechanism.variance`, :meth:`Mechanism.precision`).

An :class:`Anchor` is a known point of the release process: a released vector and its level, or
the exact value, which sits at level ``+inf`` (zero noise). A new level ``l`` is sampled from its
closest anchors ``upper`` (more accurate, ``upper.level > l``) and ``lower`` (less accurate,
``lower.level < l``, or ``None`` when ``l`` is below every release).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from . import _dlap, _kernels
from ._binomial import Method, thin
from .errors import InvalidLevelError, InvalidValueError
from .levels import (
    MAX_LEVEL,
    MIN_LEVEL,
    as_count_vector,
    as_float_vector,
    as_integer_vector,
    canonical_level,
)
from .rng import Identity, KeyedRngFactory, RngLike, default_rng

__all__ = [
    "MECHANISMS",
    "Anchor",
    "DiscreteLaplace",
    "Gaussian",
    "Laplace",
    "Mechanism",
    "Poisson",
    "mechanism",
]

Vector = NDArray[Any]


@dataclass(frozen=True)
class Anchor:
    """A known point of the release process.

    Attributes
    ----------
    level : float
        The level ``values`` was released at; ``inf`` for the exact value (no noise).
    values : ndarray
        The released (or exact) vector.
    """

    level: float
    values: Vector = field(repr=False)


class Mechanism(ABC):
    """A family of i.i.d. additive noise distributions indexed by a privacy level.

    Subclasses are small frozen dataclasses holding only the sensitivity, so two mechanisms with
    the same parameters compare and hash equal (the service caches them per stream).

    Attributes
    ----------
    name : str
        Stable name on the wire (``"laplace"``, ``"gaussian"``, ``"poisson"``).
    level_unit : str
        What a level of this family measures: ``"epsilon"`` (pure DP), ``"rho"`` (zCDP) or
        ``"omega"`` (Poisson precision, Δ²/λ). Levels of different units are never comparable,
        so every figure shown to a person carries this unit.
    sensitivity : float
        ℓ1 (Laplace, Poisson) or ℓ2 (Gaussian) sensitivity Δ of the released query.
    """

    name: ClassVar[str]
    level_unit: ClassVar[str]
    code: ClassVar[int]  # stable id used by the state codec
    dtype: ClassVar[type[np.generic]]
    sensitivity: float

    def check_level(self, level: float) -> None:
        """Raise :class:`InvalidLevelError` if this family cannot release at ``level`` (beyond
        :func:`~market.levels.canonical_level`'s range); the service checks every level a
        stream sells when it is registered, so no level for sale fails later.

        Parameters
        ----------
        level : float
            A canonical level.
        """
        return  # every level canonical_level accepts, unless a family says otherwise

    def _check_sensitivity(self) -> None:
        s = self.sensitivity
        if (
            isinstance(s, bool)
            or not isinstance(s, (int, float))
            or not MIN_LEVEL <= s <= MAX_LEVEL
        ):
            raise InvalidValueError(
                f"sensitivity must be a number between {MIN_LEVEL:g} and {MAX_LEVEL:g}, got {s!r}"
            )

    # -- values ------------------------------------------------------------------------------
    @abstractmethod
    def validate_value(self, value: Any, *, dimension: int | None = None) -> Vector:
        """Check and copy an exact value.

        Parameters
        ----------
        value : array_like
            The exact value: a number or a 1-D sequence of numbers.
        dimension : int, optional
            Required length; checked when given.

        Returns
        -------
        ndarray
            A fresh 1-D vector of this mechanism's dtype (float64, or int64 for Poisson).

        Raises
        ------
        InvalidValueError
            Not numeric, not finite, not a non-negative integer count (Poisson), too long.
        DimensionMismatchError
            The length differs from ``dimension``.
        """

    # -- accuracy ----------------------------------------------------------------------------
    @abstractmethod
    def variance(self, level: float) -> float:
        """Noise variance per coordinate of a release at ``level``.

        Parameters
        ----------
        level : float
            A canonical level (see :func:`market.levels.canonical_level`).

        Returns
        -------
        float
            The variance, in the squared units of the value.
        """

    def precision(self, level: float) -> float:
        """Precision 1 / variance of a release at ``level``.

        Independent releases add precisions, which is why prices are functions of it
        (:mod:`market.pricing`): a schedule subadditive in precision leaves no arbitrage.
        """
        return 1.0 / self.variance(level)

    # -- privacy -----------------------------------------------------------------------------
    @abstractmethod
    def epsilon(self, level: float, delta: float = 0.0, dimension: int = 1) -> float:
        """An ε such that one release at ``level`` is (ε, δ)-differentially private.

        Parameters
        ----------
        level : float
            The release's level, in this family's unit (:attr:`level_unit`).
        delta : float, default 0.0
            The δ of the guarantee; Gaussian and Poisson need ``0 < delta < 1``.
        dimension : int, default 1
            Coordinates of the released vector. Laplace and Gaussian guarantees hold for any
            dimension (the sensitivity is a norm of the whole vector); the Poisson guarantee
            (Andersson et al. Thm E.2) weakens with it, so every caller must pass it.

        Returns
        -------
        float
            ε, or ``inf`` when the family gives no guarantee at this level.
        """

    # -- sampling ----------------------------------------------------------------------------
    @abstractmethod
    def conditional(
        self, level: float, upper: Anchor, lower: Anchor | None, rng: np.random.Generator
    ) -> Vector:
        """Sample a release at ``level`` given its closest known neighbours.

        This one operation gives a fresh release (``upper`` the exact value, no ``lower``), a
        relaxation (``upper`` exact, ``lower`` the most accurate release), a bridge (two
        releases around ``level``) and a tightening (no ``lower``).

        Parameters
        ----------
        level : float
            The new level, with ``lower.level < level < upper.level``.
        upper : Anchor
            The closest more accurate point: a release, or the exact value at level ``inf``.
        lower : Anchor or None
            The closest less accurate release, if any.
        rng : numpy.random.Generator
            The randomness; consumed only here.

        Returns
        -------
        ndarray
            A release with exactly the law of a fresh release at ``level``, such that all
            releases of the value keep the joint law of one lossless process.
        """

    def conditional_many(
        self,
        level: float,
        anchors: Sequence[tuple[Anchor, Anchor | None]],
        identities: Sequence[Identity],
        rngs: KeyedRngFactory,
    ) -> list[Vector]:
        """:meth:`conditional` for several independent values at one level.

        Item ``i`` draws from ``rngs(*identities[i])``, exactly what it would draw alone, so the
        result equals calling :meth:`conditional` item by item, bit for bit. Families that can
        vectorise across items override this to share one kernel call.
        """
        return [
            self.conditional(level, up, lo, rngs(*ident))
            for (up, lo), ident in zip(anchors, identities, strict=True)
        ]

    def stable(self) -> Mechanism:
        """This mechanism with samplers whose draws from a given generator never change between
        versions of this package (itself, for every family but :class:`Poisson`).

        :class:`~market.chain.ReleaseChain` uses it: a chain's noise is a pure function of its key,
        recorded by every market that ever released from it, so a faster sampler must not
        change it. Fresh draws from a caller's generator (:class:`ReleaseState`) take the
        fastest exact sampler instead.
        """
        return self

    def release(self, value: Any, level: float, *, rng: RngLike = None) -> Vector:
        """One independent release of ``value`` at ``level``, outside any release state.

        Parameters
        ----------
        value : array_like
            The exact value.
        level : float
            The privacy level, in :attr:`level_unit`.
        rng : Generator, int or None
            See :func:`market.rng.default_rng`; ``None`` draws fresh secure randomness.

        Returns
        -------
        ndarray
            The noisy release.
        """
        lvl = canonical_level(level)
        exact = self.validate_value(value)
        return self.conditional(lvl, Anchor(math.inf, exact), None, default_rng(rng))


def _grouped(
    anchors: Sequence[tuple[Anchor, Anchor | None]],
    sample: Callable[[float, float | None, Vector, Vector | None, list[int]], Vector],
) -> list[Vector]:
    """Run ``sample`` once per group of items sharing their neighbours' levels, on the items'
    vectors concatenated, and split the result back (each item gets its own array)."""
    groups: dict[tuple[float, float | None], list[int]] = {}
    for i, (up, lo) in enumerate(anchors):
        groups.setdefault((up.level, None if lo is None else lo.level), []).append(i)
    results: list[Vector | None] = [None] * len(anchors)
    for (up_level, lo_level), idx in groups.items():
        upper = np.concatenate([anchors[i][0].values for i in idx])
        lower = None
        if lo_level is not None:
            lower = np.concatenate([anchors[i][1].values for i in idx])  # type: ignore[union-attr]
        out = sample(up_level, lo_level, upper, lower, idx)
        start = 0
        for i in idx:
            n = int(anchors[i][0].values.shape[0])
            results[i] = out[start : start + n].copy()
            start += n
    return [r for r in results if r is not None]


def _ratio(a: float, b: float) -> float:
    """a / b with b possibly infinite (the exact value's level)."""
    return 0.0 if math.isinf(b) else a / b


class _Vectorised(Mechanism):
    """A family whose conditional sample is one vectorised transform of per-coordinate draws:
    several values at one level can then share a single kernel call (:meth:`conditional_many`),
    each drawing from its own generator exactly what it would draw alone."""

    @abstractmethod
    def _draws(self, rng: np.random.Generator, n: int) -> Any:
        """The randomness a single conditional sample of n coordinates consumes."""

    @abstractmethod
    def _draw(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        """The same draws, materialised, for concatenation with other values'."""

    @abstractmethod
    def _join(self, parts: list[NDArray[np.float64]]) -> Any:
        """Concatenated draws of several values, in the form :meth:`_sample` takes."""

    @abstractmethod
    def _sample(
        self,
        level: float,
        upper_level: float,
        lower_level: float | None,
        upper: Vector,
        lower: Vector | None,
        draws: Any,
    ) -> Vector:
        """Transform the draws into the release at ``level`` given the neighbours' vectors."""

    def conditional(
        self, level: float, upper: Anchor, lower: Anchor | None, rng: np.random.Generator
    ) -> Vector:
        return self._sample(
            level,
            upper.level,
            None if lower is None else lower.level,
            upper.values,
            None if lower is None else lower.values,
            self._draws(rng, int(upper.values.shape[0])),
        )

    def conditional_many(
        self,
        level: float,
        anchors: Sequence[tuple[Anchor, Anchor | None]],
        identities: Sequence[Identity],
        rngs: KeyedRngFactory,
    ) -> list[Vector]:
        def sample(
            up: float, lo: float | None, upper: Vector, lower: Vector | None, idx: list[int]
        ) -> Vector:
            # rngs re-keys one generator per call: each item draws before the next is keyed
            parts = [
                self._draw(rngs(*identities[i]), int(anchors[i][0].values.shape[0])) for i in idx
            ]
            return self._sample(level, up, lo, upper, lower, self._join(parts))

        return _grouped(anchors, sample)


@dataclass(frozen=True)
class Laplace(_Vectorised):
    """ε-DP Laplace mechanism for ℓ1 sensitivity Δ: noise Lap(Δ/ε) on every coordinate.

    Optimal among additive mechanisms for the identity query (Koufogiannis Thm. 8) and the one
    whose release process is *lazy*: a relaxation ε1 → ε2 keeps the old sample with probability
    (ε1/ε2)² on average, so consecutive releases often share coordinates bit for bit.

    Parameters
    ----------
    sensitivity : float, default 1.0
        ℓ1 sensitivity Δ of the released vector; the noise scale at level ε is Δ/ε.

    Examples
    --------
    >>> from market import Laplace
    >>> Laplace(sensitivity=2.0).variance(1.0)   # 2 (Δ/ε)²
    8.0
    """

    sensitivity: float = 1.0
    name: ClassVar[str] = "laplace"
    level_unit: ClassVar[str] = "epsilon"
    code: ClassVar[int] = 1
    dtype: ClassVar[type[np.generic]] = np.float64

    def __post_init__(self) -> None:
        self._check_sensitivity()

    def validate_value(self, value: Any, *, dimension: int | None = None) -> Vector:
        return as_float_vector(value, dimension=dimension)

    def scale(self, level: float) -> float:
        """Laplace scale b = Δ/ε of a release at ``level``."""
        return self.sensitivity / level

    def variance(self, level: float) -> float:
        return 2.0 * self.scale(level) ** 2

    def epsilon(self, level: float, delta: float = 0.0, dimension: int = 1) -> float:
        return level

    def _draws(self, rng: np.random.Generator, n: int) -> _kernels.Uniforms:
        return _kernels.Uniforms(rng)  # drawn block by block inside the kernel

    def _draw(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        return rng.random(n)

    def _join(self, parts: list[NDArray[np.float64]]) -> _kernels.Uniforms:
        return _kernels.Uniforms(buf=np.concatenate(parts))

    def _sample(
        self,
        level: float,
        upper_level: float,
        lower_level: float | None,
        upper: Vector,
        lower: Vector | None,
        draws: _kernels.Uniforms,
    ) -> Vector:
        uniforms = draws
        out = np.empty(int(upper.shape[0]), dtype=np.float64)
        mu_a = _ratio(level, upper_level) ** 2  # atom of the piece upper -> level
        if lower is None or lower_level is None:
            _kernels.laplace_extend_into(out, upper, self.scale(level), mu_a, uniforms)
        else:
            _kernels.laplace_bridge_into(
                out,
                upper,
                lower,
                level / self.sensitivity,
                lower_level / self.sensitivity,
                mu_a,
                (lower_level / level) ** 2,
                uniforms,
            )
        return out


@dataclass(frozen=True)
class Gaussian(_Vectorised):
    """ρ-zCDP Gaussian mechanism for ℓ2 sensitivity Δ: noise N(0, Δ²/(2ρ)) per coordinate.

    The release process is a Brownian motion in the variance (Koufogiannis Thm. 14), sampled in
    any order with Andersson et al.'s Algorithm 1. (ε, δ) guarantees follow from
    ε = ρ + 2 sqrt(ρ ln(1/δ)) (Bun & Steinke 2016, Prop. 1.3).

    Parameters
    ----------
    sensitivity : float, default 1.0
        ℓ2 sensitivity Δ; the noise variance at level ρ is Δ²/(2ρ).
    """

    sensitivity: float = 1.0
    name: ClassVar[str] = "gaussian"
    level_unit: ClassVar[str] = "rho"
    code: ClassVar[int] = 2
    dtype: ClassVar[type[np.generic]] = np.float64

    def __post_init__(self) -> None:
        self._check_sensitivity()

    def validate_value(self, value: Any, *, dimension: int | None = None) -> Vector:
        return as_float_vector(value, dimension=dimension)

    def variance(self, level: float) -> float:
        return self.sensitivity**2 / (2.0 * level)

    def epsilon(self, level: float, delta: float = 0.0, dimension: int = 1) -> float:
        if not 0.0 < delta < 1.0:
            raise InvalidLevelError(f"a Gaussian release needs 0 < delta < 1, got {delta!r}")
        return level + 2.0 * math.sqrt(level * math.log(1.0 / delta))

    def _draws(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        return rng.standard_normal(n)

    def _draw(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        return rng.standard_normal(n)

    def _join(self, parts: list[NDArray[np.float64]]) -> NDArray[np.float64]:
        return np.concatenate(parts)

    def _sample(
        self,
        level: float,
        upper_level: float,
        lower_level: float | None,
        upper: Vector,
        lower: Vector | None,
        draws: NDArray[np.float64],
    ) -> Vector:
        """Scale the standard normals in ``draws`` in place into the conditional release."""
        out = draws
        # Variances in units of Δ²/2: v(l) = 1/l, with v(inf) = 0 for the exact value.
        v = 1.0 / level
        v_u = _ratio(1.0, upper_level)
        if lower is None or lower_level is None:
            out *= self.sensitivity * math.sqrt((v - v_u) / 2.0)
            out += upper
            return out
        v_l = 1.0 / lower_level
        weight = (v - v_u) / (v_l - v_u)  # Brownian bridge: E[Y | U, L] = U + w (L - U)
        var = (v - v_u) * (v_l - v) / (v_l - v_u)
        out *= self.sensitivity * math.sqrt(var / 2.0)
        out += upper
        diff = lower - upper
        diff *= weight
        out += diff
        return out


@dataclass(frozen=True)
class Poisson(Mechanism):
    """Poisson mechanism for non-negative integer counts: noise Poi(λ), λ = Δ²/ω.

    The level ω is precision in sensitivity units (variance λ = Δ²/ω), the Poisson analogue of
    the Gaussian's 2ρ. Releases are exact integers, so they are immune to the floating-point
    attacks that affect Laplace and Gaussian samplers (Mironov 2012). Noise is non-negative:
    subtract λ for an unbiased estimate. (ε, δ) from Andersson et al. Theorem E.2 with
    Δ1 = Δ2 = Δ∞ = Δ, valid when λ > max(23 ln(10 d / δ), 2Δ); :meth:`epsilon` returns ``inf``
    where the theorem gives no guarantee.

    Parameters
    ----------
    sensitivity : float, default 1.0
        Sensitivity Δ of the counts; the noise rate at level ω is λ = Δ²/ω.
    thinning : {"alias", "numpy"}, default "alias"
        How a release between two others draws its binomial thinning: through alias tables for
        long vectors (:mod:`market._binomial`; about 4x numpy's sampler on 10⁶ counts, same law
        to double precision) or always by numpy's ``binomial`` (draws that never change between
        versions: what :meth:`stable` and every :class:`~market.chain.ReleaseChain` use).
    """

    sensitivity: float = 1.0
    thinning: Method = "alias"
    name: ClassVar[str] = "poisson"
    level_unit: ClassVar[str] = "omega"
    code: ClassVar[int] = 3
    dtype: ClassVar[type[np.generic]] = np.int64

    def __post_init__(self) -> None:
        self._check_sensitivity()
        if self.thinning not in ("alias", "numpy"):
            raise InvalidValueError(f"thinning must be 'alias' or 'numpy', got {self.thinning!r}")

    def stable(self) -> Poisson:
        return self if self.thinning == "numpy" else replace(self, thinning="numpy")

    def validate_value(self, value: Any, *, dimension: int | None = None) -> Vector:
        return as_count_vector(value, dimension=dimension)

    def rate(self, level: float) -> float:
        """Poisson rate λ = Δ²/ω of the noise at ``level`` (0 for the exact value)."""
        return _ratio(self.sensitivity**2, level)

    def variance(self, level: float) -> float:
        return self.rate(level)

    def epsilon(self, level: float, delta: float = 0.0, dimension: int = 1) -> float:
        if not 0.0 < delta < 1.0:
            raise InvalidLevelError(f"a Poisson release needs 0 < delta < 1, got {delta!r}")
        lam, d = self.rate(level), self.sensitivity
        if lam <= max(23.0 * math.log(10.0 * dimension / delta), 2.0 * d):
            return math.inf
        l125, l10 = math.log(1.25 / delta), math.log(10.0 / delta)
        return (
            d * math.sqrt(2.0 * l125) / math.sqrt(lam)
            + (5.0 * math.sqrt(2.0) * d * math.sqrt(l10) + 5.0 / 3.0 * d) / (lam * (1 - delta / 10))
            + (2.0 / 3.0 * d * l125 + 4.0 / 3.0 * d * math.log(20.0 * dimension / delta) * l10)
            / lam
        )

    def conditional(
        self, level: float, upper: Anchor, lower: Anchor | None, rng: np.random.Generator
    ) -> Vector:
        lam, lam_u = self.rate(level), self.rate(upper.level)
        base = upper.values.astype(np.int64, copy=True)
        if lower is None:
            base += rng.poisson(lam - lam_u, size=int(base.shape[0]))
            return base
        lam_l = self.rate(lower.level)
        # Poi(λ_l - λ_u) split as Poi(λ - λ_u) + Poi(λ_l - λ): given the total N = L - U, the
        # first part is Binomial(N, (λ - λ_u) / (λ_l - λ_u)) (Andersson Lemma E.4).
        n = lower.values - upper.values
        base += thin(rng, n, (lam - lam_u) / (lam_l - lam_u), self.thinning)
        return base


@dataclass(frozen=True)
class DiscreteLaplace(Mechanism):
    """ε-DP discrete Laplace mechanism for integers: noise P(k) ∝ p^|k|, p = exp(−ε/Δ).

    The integer analogue of :class:`Laplace` for counts (Canonne, Kamath & Steinke 2020):
    releases are exact integers, so no floating-point artefact can leak the value (Mironov
    2012), and unlike :class:`Poisson` the guarantee is pure ε-DP for an integer ℓ1
    sensitivity Δ. The release process is lossless and lazy like the continuous one: the step
    from level ε2 to ε1 < ε2 adds Z = 0 with probability w0 = (sinh(ε1/2Δ) / sinh(ε2/2Δ))²
    and Z ~ DLap(exp(−ε1/Δ)) otherwise, so the release stays the same with probability
    w0 + (1 − w0)·c1, c1 = (1 − p1)/(1 + p1) — not w0 (``docs/math.md`` §4.5).

    Sampling is exact: every outcome is the exact inverse-CDF outcome of uniform random bits,
    decided in floats only when certain and otherwise with rational arithmetic
    (:mod:`market._dlap`); the parameter is ``p = exp(−x)`` for the exact rational
    ``x = ε/Δ`` of the two doubles, never a rounded ``p``.

    Parameters
    ----------
    sensitivity : int, default 1
        ℓ1 sensitivity Δ of the integer vector, a positive integer (integer data cannot change
        by less than 1). Levels must keep ε/Δ ≥ 2^-20 so that the noise fits int64 for sure.

    Examples
    --------
    >>> from market import DiscreteLaplace
    >>> y = DiscreteLaplace(1).release([10, 0, -3], 1.0, rng=7)
    >>> y.dtype.name
    'int64'
    """

    sensitivity: float = 1.0
    name: ClassVar[str] = "discrete_laplace"
    level_unit: ClassVar[str] = "epsilon"
    code: ClassVar[int] = 4
    dtype: ClassVar[type[np.generic]] = np.int64
    MIN_RATIO: ClassVar[float] = 2.0**-20
    #: above it p = e^(−ε/Δ) < 1e-304: the noise variance underflows and the level is exact
    MAX_RATIO: ClassVar[float] = 700.0

    def __post_init__(self) -> None:
        self._check_sensitivity()
        if self.sensitivity != math.floor(self.sensitivity):
            raise InvalidValueError(
                f"a discrete Laplace sensitivity must be a whole number, got {self.sensitivity!r}"
            )
        object.__setattr__(self, "sensitivity", float(self.sensitivity))

    def validate_value(self, value: Any, *, dimension: int | None = None) -> Vector:
        return as_integer_vector(value, dimension=dimension)

    def parameter(self, level: float) -> float:
        """p = exp(−ε/Δ) of a release at ``level`` (0.0 for the exact value), rounded.

        Sampling never uses this float: it works with the exact rational ε/Δ.
        """
        return 0.0 if math.isinf(level) else math.exp(-level / self.sensitivity)

    def variance(self, level: float) -> float:
        a = level / self.sensitivity
        return 2.0 * math.exp(-a) / math.expm1(-a) ** 2  # 2p / (1 − p)²

    def epsilon(self, level: float, delta: float = 0.0, dimension: int = 1) -> float:
        return level

    def check_level(self, level: float) -> None:
        """ε/Δ must lie in [2^-20, 700] for a level to be sold: below, the noise may not fit
        int64; above, its variance underflows to 0 (no noise a price or an error model can
        describe)."""
        a = Fraction(level) / Fraction(self.sensitivity)
        if not Fraction(self.MIN_RATIO) <= a <= Fraction(self.MAX_RATIO):
            raise InvalidLevelError(
                f"a discrete Laplace level needs 2^-20 ≤ ε/Δ ≤ 700, got "
                f"{level:g}/{self.sensitivity:g}"
            )

    def _ratio(self, level: float) -> Fraction:
        """The exact rational ε/Δ of a finite level, at least :attr:`MIN_RATIO` (a level
        above :attr:`MAX_RATIO` samples fine — it is all but exact — but cannot be priced)."""
        a = Fraction(level) / Fraction(self.sensitivity)
        if a < Fraction(self.MIN_RATIO):
            self.check_level(level)  # raises, saying why
        return a

    def conditional(
        self, level: float, upper: Anchor, lower: Anchor | None, rng: np.random.Generator
    ) -> Vector:
        law = _dlap.Law(
            self._ratio(level),
            None if math.isinf(upper.level) else self._ratio(upper.level),
            None if lower is None else self._ratio(lower.level),
        )
        up = np.asarray(upper.values, dtype=np.int64)
        lo = None if lower is None else np.asarray(lower.values, dtype=np.int64)
        out = np.empty(int(up.shape[0]), dtype=np.int64)
        _dlap.sample_into(out, up, lo, law, rng)
        return out


MECHANISMS: dict[str, type[Laplace] | type[Gaussian] | type[Poisson] | type[DiscreteLaplace]] = {
    cls.name: cls for cls in (Laplace, Gaussian, Poisson, DiscreteLaplace)
}


def mechanism(name: str, sensitivity: float = 1.0) -> Mechanism:
    """Build a mechanism by its wire name.

    Parameters
    ----------
    name : {"laplace", "gaussian", "poisson", "discrete_laplace"}
        The family.
    sensitivity : float, default 1.0
        Its sensitivity Δ.

    Returns
    -------
    Mechanism

    Raises
    ------
    InvalidValueError
        Unknown name, or a sensitivity outside [1e-9, 1e9].
    """
    try:
        cls = MECHANISMS[name]
    except KeyError:
        raise InvalidValueError(
            f"unknown mechanism {name!r}; choose one of {sorted(MECHANISMS)}"
        ) from None
    return cls(sensitivity=sensitivity)
