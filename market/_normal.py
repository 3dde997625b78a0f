"""Exact Gaussian releases on a grid: sums of keyed normals, rounded without a float decision.

A Gaussian release in noise format v2 is ``n·g``, ``n`` the integer nearest to ``(x + Z)/g``,
where ``x`` is the exact value, ``g = 2^e`` the release's grid and ``Z`` the *ideal* real noise:
a linear form ``Z = Σ_j q_j·√r_j·N_j`` in independent standard normals ``N_j``, each the
Box–Muller transform ``√(−2 ln U₁)·cos(2π U₂)`` of two ideal uniforms (slots 0 and 1 of the
draws of its request key, :mod:`market._draws`). Rounding is post-processing, so a release has
exactly the privacy of the real-valued Gaussian mechanism it rounds; and every outcome is
defined by ideal real arithmetic, never by a float.

**Float pass.** Each normal is computed in floats with a rigorous error bound per coordinate:
the uniforms' 64-bit prefixes pin ``U₁`` and ``U₂`` to intervals, and the platform's ``log``,
``sqrt`` and ``cos`` are trusted to :data:`TAU` relative (64 units in the last place; the
libraries numpy uses document at most 4). The bounds add up through the sum, and a coordinate
is decided only when ``(x + Z)/g`` is farther from every half-integer than its bound.

**Exact path.** Any other coordinate (about one in 10⁷) is recomputed in
:mod:`market._interval` arithmetic from its uniforms, extended by more random bits and digits
until the enclosure of ``(x + Z)/g`` lies between two half-integers; it terminates with
probability one. The outcome is that of the ideal reals whichever path decides, so forcing
every coordinate through the exact path gives the same integers (tested).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from . import _interval as iv
from ._draws import Draws, LazyUniform, lazy_at, to_unit, unit_bounds

__all__ = [
    "SLOTS",
    "TAU",
    "Hidden",
    "Term",
    "add",
    "combine",
    "floor_log2",
    "grid_exponent",
    "hidden",
    "mix",
    "normals",
    "snap",
]

TAU = 2.0**-46
"""Relative error trusted of a platform ``log``, ``sqrt`` or ``cos`` result (64 ulps)."""
SLOTS = 2
_EPS = 2.0**-53
_TWO_PI = 2.0 * math.pi
_MAX_ROUNDS = 60


@dataclass(frozen=True, slots=True)
class Term:
    """One keyed standard normal vector times the coefficient ``q·√r`` (both rational).

    ``r`` is a variance (a rational of the levels' doubles) and ``q`` a rational weight (1 on a
    chain; a bridge's weights in a :class:`~market.ReleaseState`): the exact path evaluates
    ``√r`` to any precision, so the coefficient is an exact real, not a float.
    """

    key: bytes
    q: Fraction
    r: Fraction

    def coefficient(self) -> float:
        """``q·√r`` in floats, within 2⁻⁵⁰ relative."""
        return float(self.q) * math.sqrt(float(self.r))


class Hidden(NamedTuple):
    """The float pass of a linear form: values and a bound on their distance to the ideal."""

    z: NDArray[np.float64]
    err: NDArray[np.float64]


def normals(draws: Draws) -> Hidden:
    """The standard normals of a request key, with per-coordinate error bounds.

    ``R = √(−2 ln U₁)`` is bracketed from one logarithm: with ``U₁ ∈ [lo, hi)``,
    ``R(lo)² − R(hi)² = 2 ln(hi/lo) ≤ D = 2(hi − lo)/lo``. ``cos(2π U₂)`` moves by at most
    ``2π·2⁻⁵³`` over the 53-bit prefix of ``U₂``.
    """
    lo, hi = unit_bounds(draws.slot(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.log(lo)
        r2 *= -2.0
        r2 *= 1.0 + 2.0 * TAU  # an upper bound of −2 ln lo (the true ln within TAU)
        d = hi - lo
        d /= lo
        d *= 2.0 * (1.0 + 4.0 * _EPS)
    r_hi = np.sqrt(r2)
    r_lo = np.sqrt(np.maximum(r2 - d - 4.0 * TAU * r2, 0.0))
    c = np.cos(to_unit(draws.slot(1)) * _TWO_PI)
    z = r_hi + r_lo
    z *= 0.5
    z *= c
    err = r_hi - r_lo
    err *= 0.5
    err += r_hi * (2.0**-48 + 2.0 * TAU)  # U₂'s prefix, 2π's rounding, cos's and sqrt's errors
    err += np.abs(z) * (4.0 * _EPS)
    bad = ~np.isfinite(err)  # U₁'s prefix reaches 0: leave it to the exact path
    z[bad], err[bad] = 0.0, np.inf
    return Hidden(z, err)


def hidden(terms: Sequence[Term], n: int, start: Hidden | None = None) -> Hidden:
    """The float pass of ``Σ terms`` (added to ``start`` in order, rounding error included)."""
    h = Hidden(np.zeros(n), np.zeros(n)) if start is None else start
    for t in terms:
        h = add(h, t.coefficient(), normals(Draws(t.key, n, SLOTS)))
    return h


def add(h: Hidden, c: float, nz: Hidden) -> Hidden:
    """The float pass of ``h + c·N`` from that of the normals ``N`` (``c`` within 2⁻⁵⁰)."""
    prod = nz.z * c
    err = h.err + abs(c) * (1.0 + 2.0**-49) * nz.err
    err += np.abs(prod) * 2.0**-49
    z = h.z + prod
    err += np.abs(z) * _EPS  # the addition's rounding
    return Hidden(z, err)


def combine(
    a: Sequence[Term], wa: Fraction, b: Sequence[Term], wb: Fraction
) -> tuple[Term, ...]:
    """The linear form ``wa·a + wb·b``: terms of one key (one normal vector, shared history)
    are merged, in the order they first appear."""
    merged: dict[bytes, Term] = {}
    for terms, w in ((a, wa), (b, wb)):
        for t in terms:
            old = merged.get(t.key)
            q = t.q * w + (old.q if old is not None else 0)
            merged[t.key] = Term(t.key, q, t.r)
    return tuple(t for t in merged.values() if t.q != 0)


def mix(a: Hidden, wa: Fraction, b: Hidden, wb: Fraction) -> Hidden:
    """The float pass of ``wa·a + wb·b`` from those of ``a`` and ``b`` (bounds carried)."""
    fa, fb = float(wa), float(wb)
    pa, pb = a.z * fa, b.z * fb
    err = abs(fa) * (1.0 + 2.0**-50) * a.err
    err += abs(fb) * (1.0 + 2.0**-50) * b.err
    err += (np.abs(pa) + np.abs(pb)) * 2.0**-50  # the weights' and products' rounding
    z = pa + pb
    err += np.abs(z) * _EPS
    return Hidden(z, err)


def floor_log2(x: Fraction) -> int:
    """``⌊log₂ x⌋`` of a positive rational, exactly."""
    num, den = x.numerator, x.denominator
    e = num.bit_length() - den.bit_length()  # 2^(e−1) < x < 2^(e+1)
    if (num << max(0, -e)) < (den << max(0, e)):
        e -= 1
    return e


GRID_BITS = 16


def grid_exponent(variance: Fraction) -> int:
    """``k`` of the grid ``2^k`` of a release whose noise has this (exact) variance:
    ``⌊log₂ σ⌋ − 16``, so the grid is between 2⁻¹⁷ and 2⁻¹⁶ of the standard deviation
    (``⌊log₂ σ⌋ = ⌊⌊log₂ v⌋ / 2⌋``: exact, the same everywhere)."""
    return floor_log2(variance) // 2 - GRID_BITS


def snap(
    exact: NDArray[np.float64],
    h: Hidden,
    grid_exp: int,
    settle: Callable[[int], int],
) -> NDArray[np.int64]:
    """The integers ``round((x + Z)/g)`` of the ideal noise ``Z``, ``g = 2^grid_exp``.

    Parameters
    ----------
    exact : ndarray of float64
        What the noise is added to (the exact values ``x``).
    h : Hidden
        The float pass of ``Z`` (:func:`hidden`).
    grid_exp : int
        The grid's exponent.
    settle : callable
        ``settle(i)`` decides coordinate ``i`` exactly (:func:`exact_snap` with its terms):
        called for the coordinates the float pass leaves undecided.

    Returns
    -------
    ndarray of int64
        The release on the grid, in units of ``g`` (``x/g`` must stay below 2⁶² in magnitude).
    """
    q = np.ldexp(exact, -grid_exp)  # exact: a power-of-two scaling
    if not bool(np.all(np.abs(q) < 2.0**62)):
        raise OverflowError("a value is too large for its release grid")
    xi = np.floor(q)
    t = q - xi  # in [0, 1), within 2⁻⁵³
    t += np.ldexp(h.z, -grid_exp)
    margin = np.ldexp(h.err, -grid_exp)
    margin += (np.abs(t) + 2.0) * (2.0 * _EPS)
    f = np.floor(t + 0.5)
    dist = t + 0.5 - f  # in [0, 1): where t sits between two half-integers
    undecided = (dist <= margin) | (dist >= 1.0 - margin) | ~np.isfinite(margin)
    f[undecided] = 0.0
    out = xi.astype(np.int64) + f.astype(np.int64)
    for i in np.flatnonzero(undecided):
        out[i] = settle(int(i))
    return out


def exact_snap(x: float, terms: Sequence[Term], n: int, i: int, grid_exp: int) -> int:
    """``round((x + Z_i)/g)`` for coordinate ``i``, decided in interval arithmetic.

    Every round adds 64 random bits to each uniform and 30 digits of precision, so the
    enclosure of ``Z_i`` narrows until it lies between two half-integers of the grid.
    """
    us = [(lazy_at(t.key, n, 0, i), lazy_at(t.key, n, 1, i)) for t in terms]
    scale = Fraction(2) ** (-grid_exp)
    prec = 40
    for _ in range(_MAX_ROUNDS):
        try:
            z = iv.Iv.of(0, prec)
            for t, (u1, u2) in zip(terms, us, strict=True):
                coef = iv.Iv.of(t.q, prec) * iv.sqrt(iv.Iv.of(t.r, prec))
                z = z + coef * _normal_iv(u1, u2, prec)
            total = (iv.Iv.of(Fraction(x), prec) + z) * iv.Iv.of(scale, prec)
            half = iv.Iv.of(Fraction(1, 2), prec)
            lo, hi = total.lo + half.lo, total.hi + half.hi
            if math.floor(lo) == math.floor(hi):
                return math.floor(lo)
        except ValueError:  # a uniform's known bits do not yet keep it away from 0
            pass
        for u1, u2 in us:
            u1.refine()
            u2.refine()
        prec += 30
    raise RuntimeError("the exact Gaussian path did not converge")  # pragma: no cover


def _normal_iv(u1: LazyUniform, u2: LazyUniform, prec: int) -> iv.Iv:
    """``√(−2 ln U₁)·cos(2π U₂)`` enclosed over the known bits of both uniforms."""
    a, b = u1.bounds()
    if a == 0:
        raise ValueError("U1 not yet away from 0")
    lnu = iv.ln(iv.Iv(iv.Iv.of(a, prec).lo, iv.Iv.of(b, prec).hi, prec))
    r = iv.sqrt(lnu * iv.Iv.of(-2, prec))
    c_lo, c_hi = u2.bounds()
    return r * iv.cos_2pi(c_lo, c_hi, prec)
