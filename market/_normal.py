"""Exact Gaussian releases on a grid: sums of keyed normals, rounded without a float decision.

A Gaussian release in noise format v2 is ``n·g``, ``n`` the integer nearest to ``(x + Z)/g``,
where ``x`` is the exact value, ``g = 2^e`` the release's grid and ``Z`` the *ideal* real noise:
a linear form ``Z = Σ_j q_j·√r_j·N_j`` in independent standard normals ``N_j``, each the
Box–Muller transform ``√(−2 ln U₁)·cos(2π U₂)`` of two ideal uniforms (slots 0 and 1 of the
draws of its request key, :mod:`market._draws`). Rounding is post-processing, so a release has
exactly the privacy of the real-valued Gaussian mechanism it rounds; and every outcome is
defined by ideal real arithmetic, never by a float.

**Float pass.** Each normal is computed in floats with a rigorous error bound per coordinate:
the uniforms' 64-bit prefixes pin ``U₁`` and ``U₂`` to intervals, the platform's ``log`` and
``sqrt`` are trusted to :data:`TAU` relative (64 units in the last place; the libraries numpy
uses document at most 4; the compiled pass, :func:`market._step.gaussian_release`, computes
``ln`` itself within 2⁻⁴⁹, its error argued in ``market/_cnoise.c``) and ``cos(2πU₂)`` is a
polynomial proved within 2⁻⁴⁷ (:func:`cos_2pi`). The bounds add up through the sum, and a
coordinate is decided only when ``(x + Z)/g`` is farther from every half-integer than its bound.

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
from ._draws import Draws, LazyUniform, lazy_at

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
"""Relative error trusted of a platform ``log`` or ``sqrt`` result (64 ulps), and the error
budget of ``cos(2πU₂)`` (:func:`cos_2pi` stays below it)."""
SLOTS = 2
_EPS = 2.0**-53
_U64 = 2.0**-64
BLOCK = 16384
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
    """The standard normals of the draws (slots 0 and 1), with per-coordinate error bounds.

    A word ``w`` is read as the signed ``s ≡ w (mod 2⁶⁴)`` (numpy converts signed integers to
    floats several times faster): ``U = s·2⁻⁶⁴``, plus 1 when ``s < 0``. Then ``u`` is within
    ``ρ = 2⁻⁵² + 2⁻⁶⁴/u`` relative of the ideal ``U₁``, so ``|ln U₁ − ln u| ≤ 2ρ`` and
    ``R² = −2 ln U₁`` is known to ``dR² = 2⁻⁴⁸ + 2⁻⁶⁰/u + 2τR²`` (the platform's ``log`` trusted
    to ``τ``); then ``|R − √R²_f| ≤ dR²/R_f``. ``cos(2πU₂) = cos(2π s₂ 2⁻⁶⁴)`` (one period) moves by
    at most ``2⁻⁴⁸`` over U₂'s interval and the roundings of its argument, and is computed to
    within ``τ`` (:func:`cos_2pi`). The product's rounding (``|z|·2ε ≤ R·2ε``) is counted in
    the ``R`` term. A coordinate whose bound is not finite (``U₁``'s word is 0, or ``u`` rounds
    to 1) is left to the exact path.
    """
    return add_normals(None, None, draws)


def add_normals(h: Hidden | Mixed | None, c: float | None, draws: Draws) -> Hidden:
    """The float pass of ``h + c·N`` for the standard normals ``N`` of the draws: :func:`add`
    of :func:`normals` (of :func:`mix` for a :class:`Mixed` ``h``), block by block, so the
    normals never leave the cache (``h = None`` for 0; ``c = None`` for the normals
    themselves; else ``c`` within 2⁻⁵⁰ of the coefficient)."""
    n = draws.n
    z, err = np.empty(n), np.empty(n)
    w1, w2 = draws.slot(0).view(np.int64), draws.slot(1).view(np.int64)
    for start in range(0, n, BLOCK):  # blocks that stay in cache (temporaries cost page faults)
        sl = slice(start, min(start + BLOCK, n))
        zb, eb = z[sl], err[sl]
        _normals_block(w1[sl], w2[sl], zb, eb)
        if c is not None:
            hb = (
                h.block(sl) if isinstance(h, Mixed) else None if h is None else (h.z[sl], h.err[sl])
            )
            _add_into(zb, eb, zb, eb, c, hb)
    return Hidden(z, err)


def _normals_block(
    w1: NDArray[np.int64],
    w2: NDArray[np.int64],
    z: NDArray[np.float64],
    err: NDArray[np.float64],
) -> None:
    """:func:`normals` on one block of words (read as signed integers), into ``z, err``."""
    u = w1.astype(np.float64)
    u *= _U64
    u += u < 0.0  # w ≥ 2⁶³: U = 1 + s·2⁻⁶⁴
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.log(u)
        r2 *= -2.0
        r = np.sqrt(r2)
        # dR²/R = (2⁻⁶⁰/u + 2⁻⁴⁸)/R + 2τR; plus R·(2⁻⁴⁸ + 2τ + 3ε) for cos, sqrt and the product
        e = np.divide(2.0**-60, u, out=u)
        e += 2.0**-48
        e /= r
        e += np.multiply(r, 4.0 * TAU + 2.0**-48 + 3.0 * _EPS, out=r2)
        np.multiply(e, 1.0 + 2.0**-50, out=err)
    v = w2.astype(np.float64)
    v *= _U64  # s₂·2⁻⁶⁴ ∈ [−1/2, 1/2): U₂ modulo 1
    np.multiply(cos_2pi(v), r, out=z)
    bad = ~np.isfinite(err)
    if bool(bad.any()):
        z[bad], err[bad] = 0.0, np.inf


_SIN = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(10))


def cos_2pi(v: NDArray[np.float64]) -> NDArray[np.float64]:
    """``cos(2πv)`` for ``v ∈ [−1/2, 1/2]``, within ``2⁻⁴⁷`` (absolute), plus the effect of
    the argument's roundings (below ``2⁻⁵⁰``), overwriting ``v``.

    ``cos(2πv) = sin(x)`` with ``x = 2π(1/4 − |v|) ∈ [−π/2, π/2]``, by the Taylor polynomial
    of degree 19 in Horner form: its truncation error is below ``(π/2)²¹/21! < 2⁻⁵¹`` and its
    rounding error below ``21ε·sinh(π/2) < 2⁻⁴⁷·⁴`` (so the sum is within :data:`TAU`, the
    error trusted of a platform ``cos`` before). Twenty-odd multiply-adds on whole arrays run
    two to three times faster than numpy's ``cos`` of doubles, and the bound is proved here
    rather than trusted.
    """
    x = np.abs(v, out=v)
    x -= 0.25
    x *= -2.0 * math.pi
    z = np.multiply(x, x)
    p: NDArray[np.float64] = np.multiply(z, _SIN[-1])
    for c in _SIN[-2:0:-1]:
        p += c
        p *= z
    p += _SIN[0]
    p *= x
    return p


def hidden(terms: Sequence[Term], n: int, start: Hidden | None = None) -> Hidden:
    """The float pass of ``Σ terms`` (added to ``start`` in order, rounding error included)."""
    h = start
    for t in terms:
        h = add_normals(h, t.coefficient(), Draws(t.key, n, SLOTS))
    return Hidden(np.zeros(n), np.zeros(n)) if h is None else h


def add(h: Hidden, c: float, nz: Hidden) -> Hidden:
    """The float pass of ``h + c·N`` from that of the normals ``N`` (``c`` within 2⁻⁵⁰)."""
    z, err = np.empty_like(nz.z), np.empty_like(nz.err)
    _add_into(z, err, nz.z, nz.err, c, (h.z, h.err))
    return Hidden(z, err)


def _add_into(
    z: NDArray[np.float64],
    err: NDArray[np.float64],
    nz: NDArray[np.float64],
    nerr: NDArray[np.float64],
    c: float,
    h: tuple[NDArray[np.float64], NDArray[np.float64]] | None,
) -> None:
    """``(z, err) ← h + c·(nz, nerr)`` (:func:`add`; ``h = None`` for 0, whose addition is
    exact; the outputs may be the inputs)."""
    np.multiply(nz, c, out=z)
    np.multiply(nerr, abs(c) * (1.0 + 2.0**-49), out=err)
    tmp = np.abs(z)
    tmp *= 2.0**-49  # the coefficient's and the product's rounding
    err += tmp
    if h is not None:
        err += h[1]
        z += h[0]
        np.abs(z, out=tmp)
        tmp *= _EPS  # the addition's rounding
        err += tmp


def combine(a: Sequence[Term], wa: Fraction, b: Sequence[Term], wb: Fraction) -> tuple[Term, ...]:
    """The linear form ``wa·a + wb·b``: terms of one key (one normal vector, shared history)
    are merged, in the order they first appear."""
    merged: dict[bytes, Term] = {}
    for terms, w in ((a, wa), (b, wb)):
        for t in terms:
            old = merged.get(t.key)
            q = t.q * w + (old.q if old is not None else 0)
            merged[t.key] = Term(t.key, q, t.r)
    return tuple(t for t in merged.values() if t.q != 0)


class Mixed(NamedTuple):
    """The linear form ``wa·a + wb·b`` of two float passes (``a = None`` for the exact value's
    noise, 0), evaluated block by block where it is used (:func:`add_normals`), so a bridge's
    mixture never fills memory."""

    a: Hidden | None
    wa: Fraction
    b: Hidden
    wb: Fraction

    def block(self, sl: slice) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Values and bounds of the coordinates ``sl`` (:func:`mix`)."""
        a, b = self.a, self.b
        fa, fb = float(self.wa), float(self.wb)
        pb = b.z[sl] * fb
        eb = np.multiply(b.err[sl], abs(fb) * (1.0 + 2.0**-50))
        if a is None:
            err, z = eb, pb.copy()
            pa = np.abs(pb)
        else:
            pa = a.z[sl] * fa
            err = np.multiply(a.err[sl], abs(fa) * (1.0 + 2.0**-50))
            err += eb
            z = pa + pb
            np.abs(pa, out=pa)
            pa += np.abs(pb, out=pb)
        pa *= 2.0**-50  # the weights' and products' rounding
        err += pa
        np.abs(z, out=pa)
        pa *= _EPS
        err += pa
        return z, err


def mix(a: Hidden, wa: Fraction, b: Hidden, wb: Fraction) -> Hidden:
    """The float pass of ``wa·a + wb·b`` from those of ``a`` and ``b`` (bounds carried)."""
    return Hidden(*Mixed(a, wa, b, wb).block(slice(None)))


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
    scale = math.ldexp(1.0, -grid_exp)  # a power of two: products by it are exact
    n = int(exact.shape[0])
    out = np.empty(n, dtype=np.int64)
    undecided = np.zeros(n, dtype=bool)
    for start in range(0, n, BLOCK):
        sl = slice(start, min(start + BLOCK, n))
        out[sl], undecided[sl] = _snap_block(exact[sl], h.z[sl], h.err[sl], scale)
    for i in np.flatnonzero(undecided):
        out[i] = settle(int(i))
    return out


def _snap_block(
    x: NDArray[np.float64], z: NDArray[np.float64], err: NDArray[np.float64], scale: float
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """:func:`snap` on one block: the integers, and where they are not certain."""
    q = x * scale
    if not (float(q.max()) < 2.0**62 and float(q.min()) > -(2.0**62)):  # NaN fails too
        raise OverflowError("a value is too large for its release grid")
    xi = np.floor(q)
    t = np.subtract(q, xi, out=q)  # in [0, 1), within 2⁻⁵³
    t += z * scale
    margin = np.abs(t)
    margin += 2.0
    margin *= 2.0 * _EPS
    margin += err * scale
    dist = t + 0.5
    f = np.floor(dist)
    dist -= f  # in [0, 1): where t sits between two half-integers
    undecided = np.greater(dist, margin)
    np.logical_not(undecided, out=undecided)  # near the lower half-integer, or a margin NaN
    undecided |= dist >= 1.0 - margin
    f[undecided] = 0.0
    ints = xi.astype(np.int64)
    ints += f.astype(np.int64)
    return ints, undecided


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
            shifted = total + iv.Iv.of(Fraction(1, 2), prec)  # outward, never the thread's context
            if math.floor(shifted.lo) == math.floor(shifted.hi):
                return math.floor(shifted.lo)
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
