"""Rigorous interval arithmetic at any precision, for the exact paths of the samplers.

A sampler's float pass decides an outcome only when it is clear of every threshold by a margin
larger than the float error; the rare coordinate it cannot decide is settled here, by
enclosing the ideal real numbers in intervals ``[lo, hi]`` of :class:`~decimal.Decimal` at a
precision of ``prec`` significant digits, narrowing them (more digits, more random bits) until
the decision is certain.

Every operation rounds outwards: ``+ − × ÷`` with directed rounding (``ROUND_FLOOR`` for ``lo``,
``ROUND_CEILING`` for ``hi``), and the functions Python's :mod:`decimal` computes correctly
rounded (``exp``, ``ln``, ``sqrt``, to nearest) widened by one unit in the last place. ``π``
comes from Machin's formula with a bounded remainder, ``cos(2πu)`` from its Taylor series with
the alternating-series bound. No result depends on the platform: :mod:`decimal` is exact
arithmetic on decimal digits.
"""

from __future__ import annotations

import decimal
import functools
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Decimal
from fractions import Fraction

__all__ = ["Iv", "cos_2pi", "down", "exp", "ln", "ln_factorial", "pi", "sqrt", "up"]


@functools.lru_cache(maxsize=64)
def _ctx(prec: int, rounding: str) -> decimal.Context:
    return decimal.Context(prec=prec, rounding=rounding, Emax=999_999, Emin=-999_999)


def down(prec: int) -> decimal.Context:
    """The context rounding towards −∞ at ``prec`` digits (lower bounds)."""
    return _ctx(prec, ROUND_FLOOR)


def up(prec: int) -> decimal.Context:
    """The context rounding towards +∞ at ``prec`` digits (upper bounds)."""
    return _ctx(prec, ROUND_CEILING)


_down, _up = down, up


def _near(prec: int) -> decimal.Context:
    return _ctx(prec, ROUND_HALF_EVEN)


@dataclass(frozen=True, slots=True)
class Iv:
    """A closed interval ``[lo, hi]`` of reals at a working precision of ``prec`` digits."""

    lo: Decimal
    hi: Decimal
    prec: int

    @staticmethod
    def of(x: Fraction | int, prec: int) -> Iv:
        """The tightest interval of ``prec`` digits around the exact rational ``x``."""
        q = Fraction(x)
        num, den = Decimal(q.numerator), Decimal(q.denominator)
        return Iv(_down(prec).divide(num, den), _up(prec).divide(num, den), prec)

    def __add__(self, o: Iv) -> Iv:
        p = self.prec
        return Iv(_down(p).add(self.lo, o.lo), _up(p).add(self.hi, o.hi), p)

    def __sub__(self, o: Iv) -> Iv:
        p = self.prec
        return Iv(_down(p).subtract(self.lo, o.hi), _up(p).subtract(self.hi, o.lo), p)

    def __neg__(self) -> Iv:
        return Iv(self.hi.copy_negate(), self.lo.copy_negate(), self.prec)  # exact

    def __mul__(self, o: Iv) -> Iv:
        p = self.prec
        down, up = _down(p), _up(p)
        pairs = [(self.lo, o.lo), (self.lo, o.hi), (self.hi, o.lo), (self.hi, o.hi)]
        return Iv(
            min(down.multiply(a, b) for a, b in pairs), max(up.multiply(a, b) for a, b in pairs), p
        )

    def __truediv__(self, o: Iv) -> Iv:
        if o.lo <= 0 <= o.hi:
            raise ZeroDivisionError("interval divisor contains 0")
        p = self.prec
        down, up = _down(p), _up(p)
        pairs = [(self.lo, o.lo), (self.lo, o.hi), (self.hi, o.lo), (self.hi, o.hi)]
        return Iv(
            min(down.divide(a, b) for a, b in pairs), max(up.divide(a, b) for a, b in pairs), p
        )

    def hull(self, o: Iv) -> Iv:
        return Iv(min(self.lo, o.lo), max(self.hi, o.hi), self.prec)

    @property
    def width(self) -> Decimal:
        return _up(self.prec).subtract(self.hi, self.lo)


def _widen(lo: Decimal, hi: Decimal, prec: int) -> Iv:
    """Round-to-nearest results widened by one unit in the last place (outward)."""
    return Iv(lo.next_minus(_near(prec)), hi.next_plus(_near(prec)), prec)


def exp(x: Iv) -> Iv:
    """``exp`` is increasing: the enclosure of its values at the ends."""
    near = _near(x.prec)
    return _widen(near.exp(x.lo), near.exp(x.hi), x.prec)


def ln(x: Iv) -> Iv:
    """``ln`` of a positive interval (increasing)."""
    if x.lo <= 0:
        raise ValueError("ln of an interval reaching 0")
    near = _near(x.prec)
    return _widen(near.ln(x.lo), near.ln(x.hi), x.prec)


def sqrt(x: Iv) -> Iv:
    """``sqrt`` of a non-negative interval (increasing); a negative end from outward rounding
    is clamped to 0."""
    near = _near(x.prec)
    lo = max(x.lo, Decimal(0))
    return Iv(
        max(near.sqrt(lo).next_minus(near), Decimal(0)), near.sqrt(x.hi).next_plus(near), x.prec
    )


@functools.lru_cache(maxsize=16)
def pi(prec: int) -> Iv:
    """``π`` by Machin's formula ``16·atan(1/5) − 4·atan(1/239)``, remainder bounded.

    Each arctangent series alternates with decreasing terms, so the partial sums bracket it;
    computed in exact rationals to ``prec + 10`` digits and rounded outwards.
    """
    eps = Fraction(1, 10 ** (prec + 10))

    def atan_inv(k: int) -> tuple[Fraction, Fraction]:
        total, n, term = Fraction(0), 0, Fraction(1, k)
        while True:
            prev = total
            total += term / (2 * n + 1) if n % 2 == 0 else -term / (2 * n + 1)
            n += 1
            term /= k * k
            if term / (2 * n + 1) < eps:
                return (min(prev, total), max(prev, total)) if n > 1 else (total, total + eps)

    a_lo, a_hi = atan_inv(5)
    b_lo, b_hi = atan_inv(239)
    lo, hi = 16 * a_lo - 4 * b_hi, 16 * a_hi - 4 * b_lo
    return Iv(Iv.of(lo, prec).lo, Iv.of(hi, prec).hi, prec)


def _cos_point(x: Iv) -> Iv:
    """``cos`` on ``[0, π/2 + 0.1]`` by its Taylor series: the terms ``x^{2k}/(2k)!`` decrease
    from the second on there, so consecutive partial sums bracket the value."""
    one = Iv.of(1, x.prec)
    x2 = x * x
    total, term, k = one, one, 0
    tol = Decimal(10) ** (-x.prec - 2)
    while True:
        k += 1
        term = term * x2 / Iv.of((2 * k - 1) * (2 * k), x.prec)
        nxt = total - term if k % 2 else total + term
        if term.hi < tol and k > 1:
            return total.hull(nxt)
        total = nxt


def _cos_2pi_at(u: Fraction, prec: int) -> Iv:
    """``cos(2πu)`` for an exact rational ``u ∈ [0, 1]``, reduced to ``[0, π/2]``."""
    w = u if u <= Fraction(1, 2) else 1 - u  # cos(2πu) = cos(2π(1 − u))
    sign = 1
    if w > Fraction(1, 4):  # cos(2πw) = −cos(2π(1/2 − w))
        w, sign = Fraction(1, 2) - w, -1
    c = _cos_point(Iv.of(2 * w, prec) * pi(prec))
    return c if sign > 0 else -c


def cos_2pi(u_lo: Fraction, u_hi: Fraction, prec: int) -> Iv:
    """An enclosure of ``cos(2πu)`` for every ``u ∈ [u_lo, u_hi] ⊆ [0, 1]``.

    ``cos(2πu)`` is monotone between its extrema at ``u = 0, 1/2, 1``: the values at the ends,
    joined with an extremum the interval contains.
    """
    iv = _cos_2pi_at(u_lo, prec).hull(_cos_2pi_at(u_hi, prec))
    if u_lo <= Fraction(1, 2) <= u_hi:
        iv = iv.hull(Iv.of(-1, prec))
    if u_lo <= 0 or u_hi >= 1:
        iv = iv.hull(Iv.of(1, prec))
    return iv


@functools.lru_cache(maxsize=32)
def _bernoulli_terms(count: int) -> tuple[Fraction, ...]:
    """``B_{2k} / (2k (2k − 1))`` for ``k = 1 … count`` (the Stirling series' coefficients)."""
    b = [Fraction(1)]  # B_0, B_1, ... by the standard recurrence
    for m in range(1, 2 * count + 2):
        acc = Fraction(0)
        binom = 1
        for j in range(m):
            acc += binom * b[j]
            binom = binom * (m + 1 - j) // (j + 1)
        b.append(-acc / (m + 1))
    return tuple(b[2 * k] / (2 * k * (2 * k - 1)) for k in range(1, count + 1))


def ln_factorial(n: int, prec: int) -> Iv:
    """An enclosure of ``ln(n!)``.

    Small ``n``: the logarithm of the exact integer. Otherwise Stirling's series for
    ``ln Γ(z)`` at ``z = n + 1``, whose remainder after the term in ``B_{2K}`` has the sign and
    at most the size of the next term (for real ``z > 0``): the partial sums bracket it.
    """
    if n < 0:
        raise ValueError("ln(n!) of a negative n")
    if n < 256:
        f = Iv.of(_factorial(n), prec)
        return ln(f)
    z = n + 1
    zi = Iv.of(z, prec)
    half_ln_2pi = ln(pi(prec) * Iv.of(2, prec)) * Iv.of(Fraction(1, 2), prec)
    base = (zi - Iv.of(Fraction(1, 2), prec)) * ln(zi) - zi + half_ln_2pi
    terms = _bernoulli_terms(12)
    total = base
    for k, c in enumerate(terms, start=1):
        term = Iv.of(c / Fraction(z) ** (2 * k - 1), prec)
        nxt = total + term
        if abs(term.hi) < Decimal(10) ** (-prec - 2) or k == len(terms):
            return total.hull(nxt)
        total = nxt
    return total  # pragma: no cover - the loop returns


@functools.lru_cache(maxsize=256)
def _factorial(n: int) -> int:
    out = 1
    for k in range(2, n + 1):
        out *= k
    return out
