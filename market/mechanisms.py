"""Additive-noise mechanisms on a grid, sampled exactly (noise format v2).

Each mechanism is a small frozen object (name, sensitivity) that knows:

* how its privacy *level* maps to a noise law (Laplace: a discrete Laplace on a ``2^k`` grid of
  ``ε/D``; Gaussian: the real Gaussian of variance ``Δ²/(2ρ)``, released rounded to a grid;
  Poisson: rate ``Δ²/ω``; discrete Laplace: ``p = e^{−ε/Δ}`` on the integers);
* how to sample a release **conditionally on its neighbours** (:meth:`Mechanism.conditional`):
  fresh release, relaxation, bridge and tightening all follow from it, so any set of levels
  released in any order keeps the joint law of one lossless process (``docs/math.md``);
* what a level means in privacy terms (:meth:`Mechanism.epsilon`) and in accuracy terms
  (:meth:`Mechanism.variance`).

Every release is an exact function of the request's random bits (:mod:`market._draws`): the
integer outcomes are decided in floats only where the decision is clear of the float error by a
margin, and otherwise in exact arithmetic. So the released bytes are the same on every machine,
and no floating-point artefact can leak the value (Mironov 2012): releases are integers or
multiples of a power of two.

An :class:`Anchor` is a known point of a value's release process: a release (its lattice
integers and, for the Gaussian, the hidden real noise it rounds) or the exact value, at level
``+inf``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from . import _dlap, _normal, _poisson, _step
from ._draws import Draws, key_from
from .errors import DimensionMismatchError, InvalidLevelError, InvalidValueError
from .levels import (
    MAX_LEVEL,
    MIN_LEVEL,
    as_count_vector,
    as_float_vector,
    as_integer_vector,
    canonical_level,
)
from .rng import RngLike, default_rng

__all__ = [
    "MECHANISMS",
    "Anchor",
    "DiscreteLaplace",
    "Gaussian",
    "Laplace",
    "Mechanism",
    "Poisson",
    "calibrated",
    "mechanism",
]

Vector = NDArray[Any]
Path = tuple[_normal.Term, ...]


@dataclass(frozen=True)
class Anchor:
    """A known point of the release process.

    Attributes
    ----------
    level : float
        The level ``values`` was released at; ``inf`` for the exact value (no noise).
    values : ndarray
        The lattice integers of the release (int64); for the exact value, the encoded exact
        value (the Gaussian keeps it as floats: its noise is added before rounding).
    path : tuple of Term
        Gaussian only: the hidden real noise ``Z`` of the release as a linear form in keyed
        normals (empty for the exact value); every future release of the value is conditioned
        on it, not on the rounded release.
    hidden : Hidden or None
        Gaussian only: the float pass of ``path`` (a cache; recomputed when absent).
    """

    level: float
    values: Vector = field(repr=False)
    path: Path = ()
    hidden: _normal.Hidden | None = field(default=None, repr=False, compare=False)


class Mechanism(ABC):
    """A family of additive noise laws indexed by a privacy level, released on a grid.

    Subclasses are small frozen dataclasses, so two mechanisms with the same parameters compare
    and hash equal (the service caches them per stream).

    Attributes
    ----------
    name : str
        Stable name on the wire (``"laplace"``, ``"gaussian"``, ``"poisson"``,
        ``"discrete_laplace"``).
    level_unit : str
        What a level measures: ``"epsilon"`` (pure DP), ``"rho"`` (zCDP) or ``"omega"``
        (Poisson precision, Δ²/λ). Levels of different units are never comparable.
    sensitivity : float
        ℓ1 (Laplace, Poisson, discrete Laplace) or ℓ2 (Gaussian) sensitivity Δ.
    """

    name: ClassVar[str]
    level_unit: ClassVar[str]
    code: ClassVar[int]  # stable id used by the state codec and the chain's fingerprint
    dtype: ClassVar[type[np.generic]]
    sensitivity: float

    def check_level(self, level: float) -> None:
        """Raise :class:`InvalidLevelError` if this family cannot release at ``level`` (beyond
        :func:`~market.levels.canonical_level`'s range); the service checks every level a
        stream sells when it is registered, so no level for sale fails later."""
        return

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
        """Check and copy an exact value: a fresh 1-D vector of this mechanism's dtype.

        Raises
        ------
        InvalidValueError
            Not numeric, not finite, not an integer (integer families), too long or too large.
        DimensionMismatchError
            The length differs from ``dimension``.
        """

    def origin(self, exact: Vector) -> Anchor:
        """The exact value as the anchor at level ``inf`` (lattice integers, or the floats)."""
        return Anchor(math.inf, exact)

    def value_limit(self, level: float) -> float:
        """The largest magnitude of a value a release at ``level`` can hold: ``2⁶¹`` grid steps
        (its lattice integers stay in int64 with the noise; the integer families' values are
        bounded by 2⁵³ anyway)."""
        return 2.0**61

    def decode(self, anchor: Anchor) -> Vector:
        """The release of an anchor: its integers (integer families) or ``n·2^k`` as floats."""
        return anchor.values

    # -- accuracy ----------------------------------------------------------------------------
    @abstractmethod
    def variance(self, level: float) -> float:
        """Noise variance per coordinate of a release at ``level`` (squared value units)."""

    def precision(self, level: float) -> float:
        """Precision 1 / variance of a release at ``level``.

        Independent releases add precisions, which is why prices are functions of it
        (:mod:`market.pricing`): a schedule subadditive in precision leaves no arbitrage.
        Cached per mechanism and level (every purchase prices two levels of a handful).
        """
        return _precision(self, level)

    # -- privacy -----------------------------------------------------------------------------
    @abstractmethod
    def epsilon(self, level: float, delta: float = 0.0, dimension: int = 1) -> float:
        """An ε such that one release at ``level`` is (ε, δ)-differentially private (``inf``
        when the family gives no guarantee at this level)."""

    # -- sampling ----------------------------------------------------------------------------
    @abstractmethod
    def slots(self, level: float, upper: float, lower: float | None) -> int:
        """Random words per coordinate :meth:`conditional` reads (public: levels only)."""

    def increments(
        self, steps: Sequence[tuple[float, float]], sizes: Sequence[int], draws: Draws
    ) -> Vector | None:
        """The noise added by several unconditional steps at once (a chain's descent): segment
        ``i`` of ``draws`` (``sizes[i]`` coordinates) takes the step from ``steps[i] = (level,
        upper level)``, exactly the integers :meth:`conditional` would add for it alone; ``None``
        when this family does not batch those steps (the caller then goes step by step)."""
        return None

    @abstractmethod
    def conditional(
        self, level: float, upper: Anchor, lower: Anchor | None, draws: Draws, base: Vector
    ) -> Anchor:
        """Sample the release at ``level`` given its closest known neighbours.

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
        draws : Draws
            The request's random words (:mod:`market._draws`), with :meth:`slots` slots per
            coordinate (lattice families accept the joined draws of several values at once).
        base : ndarray
            Gaussian only: what the hidden noise is added to before rounding (the exact value,
            or a sealed value's rounded root release).

        Returns
        -------
        Anchor
            A release with exactly the law of a fresh release at ``level``, such that all
            releases of the value keep the joint law of one lossless process.
        """

    def release(self, value: Any, level: float, *, rng: RngLike = None) -> Vector:
        """One independent release of ``value`` at ``level``, outside any release state.

        Parameters
        ----------
        value : array_like
            The exact value.
        level : float
            The privacy level, in :attr:`level_unit`.
        rng : Generator, int or None
            Draws the request key (:func:`market.rng.default_rng`; ``None``: fresh secure
            randomness).

        Notes
        -----
        A :class:`Laplace` mechanism is calibrated to the value's dimension first
        (:func:`calibrated`).
        """
        mech = calibrated(self, value)
        lvl = canonical_level(level)
        mech.check_level(lvl)
        exact = mech.validate_value(value)
        draws = Draws(
            key_from(default_rng(rng)), int(exact.shape[0]), mech.slots(lvl, math.inf, None)
        )
        return mech.decode(mech.conditional(lvl, mech.origin(exact), None, draws, exact))


def scaled(x: Vector, e: int, *, inplace: bool = False) -> Vector:
    """``x·2^e`` as :func:`numpy.ldexp` rounds it (into ``x`` with ``inplace``): a product with
    the double ``2^e`` when that is normal (correctly rounded too, and several times faster
    than ``ldexp`` on 10⁶ coordinates), else ``ldexp`` itself."""
    if not -1022 <= e <= 1023:
        out: Vector = np.ldexp(x, e, out=x if inplace else None)
        return out
    return np.multiply(x, math.ldexp(1.0, e), out=x if inplace else None)


def check_range(value: Vector, limit: float) -> None:
    """Raise :class:`InvalidValueError` if a coordinate of ``value`` exceeds ``limit`` in
    magnitude (:meth:`Mechanism.value_limit`), naming the first."""
    if not value.size or (float(value.max()) <= limit and float(value.min()) >= -limit):
        return  # two reductions, no temporary of the value's size
    big = np.abs(value) > limit
    if bool(big.any()):
        i = int(np.flatnonzero(big)[0])
        raise InvalidValueError(
            f"value too large for its release grid: coordinate {i} exceeds {limit:g} in "
            "magnitude, the most a release on this grid can hold"
        )


def _ratio(a: float, b: float) -> Fraction | None:
    """``a / b`` exactly, ``None`` when ``b`` is the exact value's infinite level."""
    return None if math.isinf(b) else Fraction(a) / Fraction(b)


# ---------------------------------------------------------------------------- Laplace family
@functools.lru_cache(maxsize=4096)
def _lattice_law(
    mech: _LatticeLaplace, level: float, upper: float, lower: float | None
) -> _dlap.Law:
    """The exact law of a lattice Laplace release between its neighbours' levels (checked;
    cached: a stream's few levels are asked for again and again)."""
    for lv in (level, upper, lower):
        if lv is not None and not math.isinf(lv):
            mech.check_level(lv)
    a_u = None if math.isinf(upper) else mech.ratio(upper)
    return _dlap.Law(mech.ratio(level), a_u, None if lower is None else mech.ratio(lower))


class _LatticeLaplace(Mechanism):
    """The discrete Laplace law on a grid ``2^k·ℤ`` at ``a = ε/D`` (``D`` the sensitivity in
    grid units): the exact sampler of :mod:`market._dlap` for every conditional law."""

    MIN_RATIO: ClassVar[Fraction] = Fraction(1, 2**48)
    """Smallest ``ε/D``: the noise (scale ``D/ε`` grid units) stays below 2⁶² for sure."""
    MAX_RATIO: ClassVar[Fraction] = Fraction(700)
    """Largest ``ε/D``: above it ``e^{−ε/D} < 10⁻³⁰⁴``, no noise a price can describe."""

    @abstractmethod
    def units(self) -> int:
        """``D``: the ℓ1 sensitivity of the encoded (lattice) value, in grid units."""

    def ratio(self, level: float) -> Fraction:
        """The exact rational ``a = ε/D`` of a level's noise ``DLap(e^{−a})``."""
        return Fraction(level) / self.units()

    def check_level(self, level: float) -> None:
        a = self.ratio(level)
        if not self.MIN_RATIO <= a <= self.MAX_RATIO:
            raise InvalidLevelError(
                f"a {self.name} level needs 2^-48 ≤ ε/D ≤ 700 (D = {self.units()} grid units of "
                f"sensitivity), got ε = {level:g}"
            )

    def _law(self, level: float, upper: float, lower: float | None) -> _dlap.Law:
        return _lattice_law(self, level, upper, lower)

    def lattice_variance(self, level: float) -> float:
        """Variance of ``DLap(e^{−a})`` in grid units: ``2p/(1 − p)²``."""
        a = float(self.ratio(level))
        return 2.0 * math.exp(-a) / math.expm1(-a) ** 2

    def epsilon(self, level: float, delta: float = 0.0, dimension: int = 1) -> float:
        return level

    def slots(self, level: float, upper: float, lower: float | None) -> int:
        return _dlap.slots(self._law(level, upper, lower))

    def increments(
        self, steps: Sequence[tuple[float, float]], sizes: Sequence[int], draws: Draws
    ) -> Vector | None:
        made: dict[tuple[float, float], _dlap.Law] = {}  # a call's steps share a few laws
        for step in steps:
            if step not in made:
                made[step] = self._law(step[0], step[1], None)
        laws = [made[step] for step in steps]
        if not _dlap.batchable(list(made.values())):
            return _step.dlap_plans(laws, sizes, draws)  # a fine grid's: compiled only
        return _step.dlap_segments(laws, sizes, draws)

    def conditional(
        self, level: float, upper: Anchor, lower: Anchor | None, draws: Draws, base: Vector
    ) -> Anchor:
        law = self._law(level, upper.level, None if lower is None else lower.level)
        up = np.asarray(upper.values, dtype=np.int64)
        lo = None if lower is None else np.asarray(lower.values, dtype=np.int64)
        out = np.empty(int(up.shape[0]), dtype=np.int64)
        _dlap.sample_into(out, up, lo, law, draws)
        return Anchor(level, out)


@functools.lru_cache(maxsize=4096)
def _precision(mechanism: Mechanism, level: float) -> float:
    """``1 / variance``, memoised: mechanisms are frozen dataclasses, equal when their
    parameters are, so a key names one law."""
    return 1.0 / mechanism.variance(level)


@dataclass(frozen=True)
class Laplace(_LatticeLaplace):
    """ε-DP Laplace mechanism for real vectors of ℓ1 sensitivity Δ, on a ``2^k`` grid.

    The value is rounded to the grid ``g = 2^k``, ``k = ⌊log₂(Δ/d)⌋ − 12`` (``d`` the
    dimension), and exact discrete Laplace noise ``g·DLap(e^{−ε/D})`` is added, where
    ``D = ⌊Δ/g⌋ + d`` bounds the ℓ1 distance of two rounded neighbours in grid units (rounding
    moves each coordinate by at most ``g/2``, so two neighbours' roundings differ by at most
    ``Δ + d·g``). So a release is **exactly ε-DP** for the value as given, its noise has the
    scale ``g·D/ε ≈ (Δ/ε)(1 + 2⁻¹²)`` (within 0.025 % of the continuous mechanism's) and every
    release is a multiple of ``g``: no float rounding, no attack on low bits (Mironov 2012;
    OpenDP's ``sample_discrete_laplace_Z2k``). The process is lazy like the continuous one: a
    relaxation keeps the previous sample with probability ≈ ``(ε₁/ε₂)²``.

    Parameters
    ----------
    sensitivity : float, default 1.0
        ℓ1 sensitivity Δ of the released vector.
    dimension : int, default 1
        Coordinates of the vectors released (the grid and ``D`` depend on it). A
        :class:`~market.ReleaseState` binds it to its value's length.

    Examples
    --------
    >>> from market import Laplace
    >>> m = Laplace(sensitivity=2.0, dimension=1)
    >>> m.grid_exponent, m.units()
    (-11, 4097)
    >>> round(m.variance(1.0), 3)        # 2 (Δ/ε)² (1 + 2⁻¹²)²
    8.004
    """

    sensitivity: float = 1.0
    dimension: int = 1
    name: ClassVar[str] = "laplace"
    level_unit: ClassVar[str] = "epsilon"
    code: ClassVar[int] = 1
    dtype: ClassVar[type[np.generic]] = np.float64
    GRID_BITS: ClassVar[int] = 12

    def __post_init__(self) -> None:
        self._check_sensitivity()
        if isinstance(self.dimension, bool) or not (
            isinstance(self.dimension, int) and 1 <= self.dimension <= 10**7
        ):
            raise InvalidValueError(f"dimension must be 1 … 10^7, got {self.dimension!r}")
        object.__setattr__(self, "sensitivity", float(self.sensitivity))

    @functools.cached_property
    def grid_exponent(self) -> int:
        """``k`` of the grid ``2^k``: ``⌊log₂(Δ/d)⌋ − 12``, of the exact rational ``Δ/d``."""
        return _normal.floor_log2(Fraction(self.sensitivity) / self.dimension) - self.GRID_BITS

    @functools.cached_property
    def _units(self) -> int:
        return math.floor(math.ldexp(self.sensitivity, -self.grid_exponent)) + self.dimension

    def units(self) -> int:
        return self._units

    def validate_value(self, value: Any, *, dimension: int | None = None) -> Vector:
        """As :meth:`Mechanism.validate_value`; the value must also have at most
        :attr:`dimension` coordinates: the grid's sensitivity ``D`` counts one rounding per
        coordinate, so a longer vector would be released above its ε."""
        x = as_float_vector(value, dimension=dimension)
        if x.shape[0] > self.dimension:
            raise DimensionMismatchError(
                f"a vector of {x.shape[0]} coordinates for a Laplace mechanism calibrated for "
                f"{self.dimension}: use Laplace({self.sensitivity:g}, dimension={x.shape[0]}) "
                "(its rounding to the grid adds one step of sensitivity per coordinate)"
            )
        check_range(x, self.value_limit(0.0))
        return x

    def value_limit(self, level: float) -> float:
        return math.ldexp(1.0, 61 + self.grid_exponent)

    def origin(self, exact: Vector) -> Anchor:
        """The value rounded to the grid (half to even; an exact IEEE operation)."""
        q = scaled(exact, -self.grid_exponent)
        np.rint(q, out=q)
        return Anchor(math.inf, q.astype(np.int64))

    def decode(self, anchor: Anchor) -> Vector:
        return scaled(anchor.values.astype(np.float64), self.grid_exponent, inplace=True)

    def scale(self, level: float) -> float:
        """The noise scale ``g·D/ε`` (in value units) of a release at ``level``."""
        return math.ldexp(self.units() / level, self.grid_exponent)

    def variance(self, level: float) -> float:
        return math.ldexp(self.lattice_variance(level), 2 * self.grid_exponent)


@dataclass(frozen=True)
class DiscreteLaplace(_LatticeLaplace):
    """ε-DP discrete Laplace mechanism for integers: noise P(k) ∝ p^|k|, p = exp(−ε/Δ).

    The integer analogue of :class:`Laplace` for counts (Canonne, Kamath & Steinke 2020): the
    grid is 1 and the data are on it, so nothing is rounded and ``D = Δ``. The release process
    is lossless and lazy: the step from level ε2 to ε1 < ε2 adds Z = 0 with probability
    w0 = (sinh(ε1/2Δ) / sinh(ε2/2Δ))² and Z ~ DLap(exp(−ε1/Δ)) otherwise (``docs/math.md``
    §4.5).

    Parameters
    ----------
    sensitivity : int, default 1
        ℓ1 sensitivity Δ of the integer vector, a positive integer.

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

    def __post_init__(self) -> None:
        self._check_sensitivity()
        if self.sensitivity != math.floor(self.sensitivity):
            raise InvalidValueError(
                f"a discrete Laplace sensitivity must be a whole number, got {self.sensitivity!r}"
            )
        object.__setattr__(self, "sensitivity", float(self.sensitivity))

    def units(self) -> int:
        return int(self.sensitivity)

    def validate_value(self, value: Any, *, dimension: int | None = None) -> Vector:
        return as_integer_vector(value, dimension=dimension)

    def parameter(self, level: float) -> float:
        """p = exp(−ε/Δ) of a release at ``level`` (0.0 for the exact value), rounded.

        Sampling never uses this float: it works with the exact rational ε/Δ.
        """
        return 0.0 if math.isinf(level) else math.exp(-level / self.sensitivity)

    def variance(self, level: float) -> float:
        return self.lattice_variance(level)


# ---------------------------------------------------------------------------------- Gaussian
@dataclass(frozen=True)
class Gaussian(Mechanism):
    """ρ-zCDP Gaussian mechanism for ℓ2 sensitivity Δ: noise N(0, Δ²/(2ρ)), released rounded.

    A release at level ρ is ``x + Z`` rounded to the grid ``2^k`` of that level (2⁻¹⁶ of its
    standard deviation, rounded down to a power of two: :func:`market._normal.grid_exponent`),
    where ``Z`` is the *real*
    Gaussian noise of the lossless Brownian process (Koufogiannis Thm. 14; Andersson et al.'s
    Algorithm 1 for any order). Rounding is post-processing: a release is **exactly ρ-zCDP**,
    and any set of releases is a post-processing of the real process at its highest level. The
    rounding is decided exactly (:mod:`market._normal`), so the bytes are the same everywhere.
    (ε, δ) guarantees follow from ε = ρ + 2 sqrt(ρ ln(1/δ)) (Bun & Steinke 2016, Prop. 1.3).

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
        object.__setattr__(self, "sensitivity", float(self.sensitivity))

    def validate_value(self, value: Any, *, dimension: int | None = None) -> Vector:
        return as_float_vector(value, dimension=dimension)

    def value_limit(self, level: float) -> float:
        return math.ldexp(1.0, 61 + self.grid_exponent(level))

    def origin(self, exact: Vector) -> Anchor:
        n = int(exact.shape[0])
        return Anchor(math.inf, exact, (), _normal.Hidden(np.zeros(n), np.zeros(n)))

    def variance(self, level: float) -> float:
        return self.sensitivity**2 / (2.0 * level)

    def exact_variance(self, level: float) -> Fraction:
        """``Δ²/(2ρ)`` as the exact rational of the doubles (0 for the exact value)."""
        if math.isinf(level):
            return Fraction(0)
        return Fraction(self.sensitivity) ** 2 / (2 * Fraction(level))

    def grid_exponent(self, level: float) -> int:
        """``k`` of the grid ``2^k`` a release at ``level`` is rounded to."""
        return _gaussian_grid(self.sensitivity, level)

    def decode(self, anchor: Anchor) -> Vector:
        return scaled(
            anchor.values.astype(np.float64), self.grid_exponent(anchor.level), inplace=True
        )

    def epsilon(self, level: float, delta: float = 0.0, dimension: int = 1) -> float:
        if not 0.0 < delta < 1.0:
            raise InvalidLevelError(f"a Gaussian release needs 0 < delta < 1, got {delta!r}")
        return level + 2.0 * math.sqrt(level * math.log(1.0 / delta))

    def slots(self, level: float, upper: float, lower: float | None) -> int:
        return _normal.SLOTS

    def conditional(
        self, level: float, upper: Anchor, lower: Anchor | None, draws: Draws, base: Vector
    ) -> Anchor:
        """The Brownian bridge in variance ``v``: given ``Z_u`` (``v_u``) and ``Z_l`` (``v_l``),
        ``Z = Z_u + w (Z_l − Z_u) + √s·N`` with ``w = (v − v_u)/(v_l − v_u)`` and
        ``s = (v − v_u)(v_l − v)/(v_l − v_u)``; without ``Z_l``, ``Z = Z_u + √(v − v_u)·N``."""
        v, v_u = self.exact_variance(level), self.exact_variance(upper.level)
        n = int(upper.values.shape[0])
        h_u = None  # the exact value's noise: 0
        if upper.path:
            h_u = upper.hidden or _normal.hidden(upper.path, n)
        h: _normal.Hidden | _normal.Mixed | None = h_u
        path = upper.path
        var = v - v_u
        if lower is not None:
            v_l = self.exact_variance(lower.level)
            w = (v - v_u) / (v_l - v_u)
            var = (v - v_u) * (v_l - v) / (v_l - v_u)
            path = _normal.combine(upper.path, 1 - w, lower.path, w)
            h = _normal.Mixed(h_u, 1 - w, lower.hidden or _normal.hidden(lower.path, n), w)
        new = _normal.Term(draws.key, Fraction(1), var)
        path = (*path, new)
        grid = self.grid_exponent(level)
        check_range(base, self.value_limit(level))

        def settle(i: int) -> int:
            return _normal.exact_snap(float(base[i]), path, n, i, grid)

        hidden, ints = _step.gaussian_release(h, new.coefficient(), draws, base, grid, settle)
        return Anchor(level, ints, path, hidden)


@functools.lru_cache(maxsize=4096)
def _gaussian_grid(sensitivity: float, level: float) -> int:
    return _normal.grid_exponent(Fraction(sensitivity) ** 2 / (2 * Fraction(level)))


# ----------------------------------------------------------------------------------- Poisson
@dataclass(frozen=True)
class Poisson(Mechanism):
    """Poisson mechanism for non-negative integer counts: noise Poi(λ), λ = Δ²/ω.

    The level ω is precision in sensitivity units (variance λ = Δ²/ω), the Poisson analogue of
    the Gaussian's 2ρ. Releases are exact integers, drawn exactly (:mod:`market._poisson`).
    Noise is non-negative: subtract λ for an unbiased estimate. (ε, δ) from Andersson et al.
    Theorem E.2 with Δ1 = Δ2 = Δ∞ = Δ, valid when λ > max(23 ln(10 d / δ), 2Δ);
    :meth:`epsilon` returns ``inf`` where the theorem gives no guarantee. Rates above 2²⁴ are
    not sold.

    Parameters
    ----------
    sensitivity : float, default 1.0
        Sensitivity Δ of the counts; the noise rate at level ω is λ = Δ²/ω.
    """

    sensitivity: float = 1.0
    name: ClassVar[str] = "poisson"
    level_unit: ClassVar[str] = "omega"
    code: ClassVar[int] = 3
    dtype: ClassVar[type[np.generic]] = np.int64

    def __post_init__(self) -> None:
        self._check_sensitivity()
        object.__setattr__(self, "sensitivity", float(self.sensitivity))

    def validate_value(self, value: Any, *, dimension: int | None = None) -> Vector:
        return as_count_vector(value, dimension=dimension)

    def check_level(self, level: float) -> None:
        if self.exact_rate(level) > _poisson.MAX_RATE:
            raise InvalidLevelError(
                f"a Poisson level needs a rate λ = Δ²/ω of at most 2^24, got {self.rate(level):g}"
            )

    def rate(self, level: float) -> float:
        """Poisson rate λ = Δ²/ω of the noise at ``level`` (0 for the exact value)."""
        return 0.0 if math.isinf(level) else self.sensitivity**2 / level

    def exact_rate(self, level: float) -> Fraction:
        """λ as the exact rational of the doubles (0 for the exact value)."""
        if math.isinf(level):
            return Fraction(0)
        return Fraction(self.sensitivity) ** 2 / Fraction(level)

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

    def slots(self, level: float, upper: float, lower: float | None) -> int:
        return 1

    def increments(
        self, steps: Sequence[tuple[float, float]], sizes: Sequence[int], draws: Draws
    ) -> Vector | None:
        laws = [_poisson_increment(self, level, upper) for level, upper in steps]
        return _step.poisson_segments(laws, sizes, draws)

    def conditional(
        self, level: float, upper: Anchor, lower: Anchor | None, draws: Draws, base: Vector
    ) -> Anchor:
        """``U + Poi(λ − λ_u)`` without a lower neighbour; between two, the first of two
        independent Poisson parts of their difference ``N = L − U``, which is
        ``Bin(N, (λ − λ_u)/(λ_l − λ_u))`` (Andersson Lemma E.4)."""
        lam, lam_u = self.exact_rate(level), self.exact_rate(upper.level)
        self.check_level(level)
        up = np.asarray(upper.values, dtype=np.int64)
        n = int(up.shape[0])
        if lower is None:
            law = _poisson.poisson(lam - lam_u)
            noise = _poisson.sample([law], np.zeros(n, dtype=np.intp), draws)
            return Anchor(level, up + noise)
        counts = np.asarray(lower.values, dtype=np.int64) - up
        p = (lam - lam_u) / (self.exact_rate(lower.level) - lam_u)
        distinct, which = np.unique(counts, return_inverse=True)
        laws = [_poisson.binomial(int(c), p) for c in distinct]
        thinned: Vector = _poisson.sample(laws, which.astype(np.intp), draws)
        return Anchor(level, up + thinned)


@functools.lru_cache(maxsize=4096)
def _poisson_increment(mech: Poisson, level: float, upper: float) -> _poisson.Poisson:
    """The law ``Poi(λ − λ_u)`` a Poisson chain's step adds (``level`` checked; cached: a
    stream's few steps are asked for again and again, and their rationals cost microseconds)."""
    mech.check_level(level)
    return _poisson.poisson(mech.exact_rate(level) - mech.exact_rate(upper))


def calibrated(mechanism: Mechanism, value: Any) -> Mechanism:
    """``mechanism`` calibrated for ``value``: a :class:`Laplace` takes the value's dimension (its
    grid and sensitivity in grid steps depend on it); every other family is returned as is.

    Parameters
    ----------
    mechanism : Mechanism
    value : array_like
        A value (a number or a 1-D vector; anything else is left to validation to refuse).
    """
    if not isinstance(mechanism, Laplace):
        return mechanism
    try:
        shape = np.shape(value)
    except (TypeError, ValueError):
        return mechanism
    n = int(shape[0]) if len(shape) == 1 and shape[0] > 0 else 1
    return mechanism if mechanism.dimension == n else dataclasses.replace(mechanism, dimension=n)


MECHANISMS: dict[str, type[Laplace] | type[Gaussian] | type[Poisson] | type[DiscreteLaplace]] = {
    cls.name: cls for cls in (Laplace, Gaussian, Poisson, DiscreteLaplace)
}


def mechanism(name: str, sensitivity: float = 1.0, dimension: int = 1) -> Mechanism:
    """Build a mechanism by its wire name.

    Parameters
    ----------
    name : {"laplace", "gaussian", "poisson", "discrete_laplace"}
        The family.
    sensitivity : float, default 1.0
        Its sensitivity Δ.
    dimension : int, default 1
        Coordinates of its values (the Laplace grid depends on it; the others ignore it).

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
    if cls is Laplace:
        return Laplace(sensitivity=sensitivity, dimension=dimension)
    return cls(sensitivity=sensitivity)
