"""The normal law's functions in binary64 ``+ − × ÷`` only: the same bits on every platform.

The histogram chain's survival law (:mod:`market.histogram`) and its thresholds are public
numbers every worker of a market must compute alike: the chance that a zero count first shows
at each step picks how many do, bit for bit. Built on a platform's ``exp`` or on
:mod:`scipy.special`, they moved with the library's last bits (an audit saw one released count
in 4·10⁵ change when scipy's functions moved one ulp down). Here every function is a fixed
sequence of IEEE 754 operations that are correctly rounded (``+ − × ÷``, ``floor``, ``ldexp``),
on whole arrays and in a fixed order, so the results are a pure function of the arguments:

* :func:`exp`: Cody–Waite reduction ``x = k·ln 2 + r`` (``ln 2`` split so that ``k·ln2_hi`` is
  exact), the Taylor polynomial of degree 13 on ``|r| ≤ ln 2/2``, then ``2^k`` by ``ldexp``;
  within 2 ulps.
* :func:`erfcx`: ``e^{x²}·erfc(x)`` for ``x ≥ 0`` from a table of its values at ``j/16``
  (computed once per process, in 50-digit decimal arithmetic, by :func:`_erfcx_node`) and 11
  terms of its Taylor series about the nearest node, whose derivatives follow from ``y' = 2xy −
  2/√π`` (``y⁽ⁿ⁺¹⁾ = 2x·y⁽ⁿ⁾ + 2n·y⁽ⁿ⁻¹⁾``); beyond the table, the asymptotic series.
  Within 10⁻¹⁴ relative (``tests/market/test_histogram_portable.py`` against scipy).
* :func:`ndtr`: ``Φ(x) = erfcx(−x/√2)·e^{−x²/2}/2`` below 0, ``1 − Φ(−x)`` above: the lower
  tail relative-accurate however far out (``Φ(−38) ≈ 3·10⁻³¹⁷``).
* :func:`npdf`: ``φ(x) = e^{−x²/2}/√(2π)``.
* :func:`log`: ``x = 2^e·f`` (``frexp``, exact), ``f ∈ [√½, √2)``, ``ln f = 2·atanh((f − 1)/(f +
  1))`` by 20 terms of its series (``|z| ≤ 0.172``).
* :func:`ndtri`: ``Φ⁻¹(y)`` for ``0 < y ≤ 1/2``: Abramowitz–Stegun 26.2.23 (within 4.5·10⁻⁴),
  then six Newton steps on ``ln Φ(x) = ln y`` (relative-accurate in the tail).

These are the only functions the histogram chain's law is built from; numpy's and scipy's
transcendental functions are never called there (a test moves them by an ulp and sees the same
bytes).
"""

from __future__ import annotations

import functools
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "GAUSS_LEGENDRE_16",
    "dot",
    "erfcx",
    "exp",
    "linspace",
    "log",
    "ndtr",
    "ndtri",
    "npdf",
    "phi_and_tail",
    "total",
]

Array = NDArray[np.float64]

_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # 32 significant bits: k·_LN2_HI is exact
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
_EXP_TERMS = tuple(float(Fraction(1, _f)) for _f in (1, 1, 2, 6, 24, 120, 720, 5040, 40320,
                   362880, 3628800, 39916800, 479001600, 6227020800))  # fmt: skip
_SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")  # 1/√2 rounded
_INV_SQRT_PI = float.fromhex("0x1.20dd750429b6dp-1")  # 1/√π
_INV_SQRT_2PI = float.fromhex("0x1.9884533d43651p-2")  # 1/√(2π)
_STEP = 16  # nodes per unit of x
_TOP = 32.0  # the table's last node; the asymptotic series beyond
_TAYLOR = 11


def exp(x: ArrayLike) -> Array:
    """``e^x`` elementwise, within 2 ulps, from ``+ − × ÷`` and ``ldexp`` only."""
    given = np.asarray(x, dtype=np.float64)
    v = given.reshape(-1)
    clipped = np.clip(v, -746.0, 710.0)
    nan = np.isnan(v)
    if bool(nan.any()):
        clipped[nan] = 0.0
    k = clipped * _INV_LN2
    k += 0.5
    np.floor(k, out=k)
    r = k * _LN2_HI
    np.subtract(clipped, r, out=r)
    r -= k * _LN2_LO
    p = np.full_like(r, _EXP_TERMS[-1])
    for c in _EXP_TERMS[-2::-1]:
        p *= r
        p += c
    # 2^k in two halves: p·2^k may be subnormal, and ldexp of p rounds once there
    half = np.floor(k / 2.0)
    k -= half
    with np.errstate(over="ignore"):
        out = np.ldexp(np.ldexp(p, half.astype(np.int64)), k.astype(np.int64))
    out[v < -745.5] = 0.0
    out[v > 709.8] = np.inf
    out[nan] = np.nan
    return out.reshape(given.shape)


def _erfcx_node(j: int) -> float:
    """``erfcx(j/16)`` rounded to the nearest double, in decimal arithmetic of 50 digits:
    ``erfc`` from the Taylor series of ``erf`` below 3 and the continued fraction above (200
    levels deep: at ``x = 3``, 50 already agree with 4,000 to 10⁻²²)."""
    with localcontext() as ctx:
        ctx.prec = 50
        x = Decimal(j) / _STEP
        x2 = x * x
        sqrt_pi = Decimal(
            "1.7724538509055160272981674833411451827975494561223871282138077898529112845910"
        )
        if x < 3:
            term, total, n = x, x, 0
            while abs(term) > Decimal(10) ** -45:
                n += 1
                term = -term * x2 / n
                total += term / (2 * n + 1)
            erfc = 1 - 2 * total / sqrt_pi
            return float(erfc * x2.exp())
        # erfc(x) = e^{−x²}/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …))))
        frac = x
        for m in range(200, 0, -1):
            frac = x + Decimal(m) / 2 / frac
        return float(1 / (frac * sqrt_pi))


@functools.cache
def _table() -> tuple[Array, Array]:
    """The nodes ``j/16`` for ``0 ≤ j ≤ 512`` and ``erfcx`` there."""
    nodes = np.arange(int(_TOP) * _STEP + 1, dtype=np.float64) / _STEP
    values = np.array([_erfcx_node(j) for j in range(nodes.size)], dtype=np.float64)
    return nodes, values


def erfcx(x: ArrayLike) -> Array:
    """``e^{x²}·erfc(x)`` elementwise, for ``x ≥ 0`` (negative ``x`` are taken as 0)."""
    given = np.asarray(x, dtype=np.float64)
    v = np.maximum(given.reshape(-1), 0.0)
    nodes, values = _table()
    inside = v <= _TOP
    near = np.where(inside, v, 0.0)
    j = (near * _STEP + 0.5).astype(np.int64)  # the nearest node (v ≥ 0: truncation floors)
    x0, y0 = nodes[j], values[j]
    h = np.subtract(near, x0, out=near)  # exact: |h| ≤ 1/32 and x0 on a coarser grid
    # Taylor terms t_n = y⁽ⁿ⁾(x0)·hⁿ/n!: t_{n+1} = (2x0·t_n + 2h·t_{n−1})·h/(n+1)
    two_x0, two_h = 2.0 * x0, 2.0 * h
    prev = y0
    cur = two_x0 * y0
    cur -= 2.0 * _INV_SQRT_PI
    cur *= h
    total = y0 + cur
    for n in range(1, _TAYLOR):
        nxt = two_x0 * cur
        nxt += two_h * prev
        nxt *= h
        nxt *= 1.0 / (n + 1)
        total += nxt
        prev, cur = cur, nxt
    far = ~inside
    if bool(far.any()):  # erfcx(x) = (1/(x√π))·(1 − 1/(2x²) + 3/(2x²)² − 15/(2x²)³ + …)
        big = v[far]
        w = 1.0 / (2.0 * big * big)
        series = 1.0 - w * (1.0 - 3.0 * w * (1.0 - 5.0 * w * (1.0 - 7.0 * w * (1.0 - 9.0 * w))))
        total[far] = series * _INV_SQRT_PI / big
    return total.reshape(given.shape)


def phi_and_tail(u: ArrayLike) -> tuple[Array, Array]:
    """``(φ(u), Φ(−u))`` for ``u ≥ 0``, sharing one exponential."""
    v = np.asarray(u, dtype=np.float64)
    e = exp(-0.5 * v * v)
    tail = erfcx(v * _SQRT_HALF)
    tail *= e
    tail *= 0.5
    e *= _INV_SQRT_2PI
    return e, tail


def ndtr(x: ArrayLike) -> Array:
    """``Φ(x)``, the standard normal CDF, elementwise; the lower tail relative-accurate."""
    v = np.asarray(x, dtype=np.float64)
    u = np.abs(v) * _SQRT_HALF
    lower = 0.5 * erfcx(u) * exp(-0.5 * v * v)  # Φ(−|x|)
    return np.asarray(np.where(v <= 0.0, lower, 1.0 - lower), dtype=np.float64)


def npdf(x: ArrayLike) -> Array:
    """``φ(x)``, the standard normal density, elementwise."""
    v = np.asarray(x, dtype=np.float64)
    return np.asarray(exp(-0.5 * v * v) * _INV_SQRT_2PI, dtype=np.float64)


def linspace(lo: float, hi: float, cells: int) -> Array:
    """``cells + 1`` equally spaced edges from ``lo`` to ``hi``: ``lo + i·((hi − lo)/cells)``,
    the last one ``hi`` (written out: numpy's ``linspace`` has changed its formula before)."""
    edges = lo + np.arange(cells + 1, dtype=np.float64) * ((hi - lo) / cells)
    edges[-1] = hi
    return edges


def total(x: ArrayLike) -> float:
    """The sum of ``x`` correctly rounded (``math.fsum``): no summation order to depend on."""
    return math.fsum(np.asarray(x, dtype=np.float64).ravel().tolist())


def dot(m: ArrayLike, v: ArrayLike) -> Array:
    """``m @ v`` summed left to right along the last axis (a running sum: numpy's
    ``cumsum`` is sequential by definition), never by a BLAS whose order varies by CPU."""
    prod = np.asarray(m, dtype=np.float64) * np.asarray(v, dtype=np.float64)
    return np.asarray(np.cumsum(prod, axis=-1)[..., -1], dtype=np.float64)


_GL_HALF = (
    ("0x1.852bd6676a9f9p-4", "0x1.83feae80e4e01p-3"),
    ("0x1.205cae642337cp-2", "0x1.75f8c77e0c011p-3"),
    ("0x1.d50259a43a772p-2", "0x1.5a6ebbb5a7600p-3"),
    ("0x1.3c5a466d5e8b8p-1", "0x1.325f61bca3cbep-3"),
    ("0x1.82c45dda4726bp-1", "0x1.fe7af2bad3878p-4"),
    ("0x1.bb3403514e483p-1", "0x1.85c4ee79cc24bp-4"),
    ("0x1.e39f56616f9b0p-1", "0x1.fdfb1a2c1261ep-5"),
    ("0x1.fa92c264d787ep-1", "0x1.bcddab4b7c228p-6"),
)
GAUSS_LEGENDRE_16: tuple[Array, Array] = (
    np.array([-float.fromhex(x) for x, _ in reversed(_GL_HALF)]
             + [float.fromhex(x) for x, _ in _GL_HALF]),
    np.array([float.fromhex(w) for _, w in reversed(_GL_HALF)]
             + [float.fromhex(w) for _, w in _GL_HALF]),
)  # fmt: skip
"""The 16 Gauss–Legendre nodes and weights on [−1, 1], as numpy 2's ``leggauss(16)`` gave them
(an eigenvalue solver's last bits vary by platform; these are constants)."""


_LN2 = float.fromhex("0x1.62e42fefa39efp-1")
_SQRT2 = float.fromhex("0x1.6a09e667f3bcdp+0")


def log(x: ArrayLike) -> Array:
    """``ln x`` elementwise for positive finite ``x`` (within a few ulps)."""
    v = np.asarray(x, dtype=np.float64)
    f, e = np.frexp(v)  # v = f·2^e, f in [1/2, 1): exact
    low = f < _SQRT_HALF
    f = np.where(low, 2.0 * f, f)
    e = np.where(low, e - 1, e).astype(np.float64)
    z = (f - 1.0) / (f + 1.0)
    z2 = z * z
    p = np.full_like(z, 1.0 / 41.0)
    for k in range(19, -1, -1):
        p = p * z2 + 1.0 / (2 * k + 1)
    return np.asarray(e * _LN2 + 2.0 * z * p, dtype=np.float64)


def ndtri(y: ArrayLike) -> Array:
    """``Φ⁻¹(y)`` elementwise for ``0 < y ≤ 1/2`` (``−∞`` at 0): relative error of ``Φ`` at
    the result within 10⁻¹³."""
    v = np.asarray(y, dtype=np.float64)
    pos = np.where(v > 0.0, np.minimum(v, 0.5), 0.5)
    t = np.sqrt(-2.0 * log(pos))
    x = -(
        t
        - (2.515517 + t * (0.802853 + t * 0.010328))
        / (1.0 + t * (1.432788 + t * (0.189269 + t * 0.001308)))
    )
    ln_y = log(pos)
    for _ in range(6):
        phi = ndtr(x)
        x = x - (log(phi) - ln_y) * phi / npdf(x)
    return np.asarray(np.where(v > 0.0, x, -np.inf), dtype=np.float64)
