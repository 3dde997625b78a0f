"""Exact Poisson and binomial samplers by inversion: float tables decide, intervals settle.

The Poisson mechanism's noise ``Poi(μ)`` and its binomial thinning ``Bin(n, p)`` (a release
between two others) are drawn by the inverse CDF of one ideal uniform ``U`` (slot 0 of the
request's draws, :mod:`market._draws`): the outcome is the least ``k`` with ``U < F(k)``. ``μ``
and ``p`` are exact rationals (functions of the levels' doubles), so the law is exactly defined;
no float result can change an outcome:

* **float pass**: a table of ``F`` over the window where the law has its mass (the mode
  ``± 12·sd + 12``), built from the probability at the mode, computed once in
  :mod:`market._interval` arithmetic and correctly rounded, by the ratios of consecutive
  probabilities (only ``× ÷ +`` in a fixed order: the same table on every platform). Its error
  is bounded (:attr:`Table.margin`); a coordinate is decided when ``U``'s 53-bit prefix interval
  is clear of its two thresholds by that margin;
* **exact path** (about one coordinate in 10⁸): ``F(k)`` enclosed in interval arithmetic
  (the probability at the window's start from Stirling's series, the ratios, a geometric bound
  on the tail below), ``U`` extended by more random bits, until the comparison is certain.

Poisson rates are limited to :data:`MAX_RATE` (2²⁴) so that a table holds at most ~330,000
entries and the exact path stays fast.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from . import _interval as iv
from ._draws import Draws, LazyUniform, to_unit

__all__ = ["MAX_RATE", "Binomial", "Poisson", "Table", "binomial", "poisson", "sample"]

MAX_RATE = Fraction(2**24)
"""Largest Poisson rate (and binomial count) a sampler accepts."""
_EPS = 2.0**-53
_TAIL_SDS = 12  # the mass beyond 12 sd + 12 is below 2⁻¹⁰⁰: left to the exact path
_BLOCK = 256
_CACHE_BYTES = 256 << 20
"""Tables kept (a chain cycles through its step laws: a cache smaller than a stream's ladder
would rebuild every one every time)."""
_MAX_ROUNDS = 200


@dataclass(frozen=True)
class Table:
    """``F(lo + i)`` for ``i < len(cdf)`` in floats, within ``margin`` of the exact CDF."""

    lo: int
    cdf: NDArray[np.float64]
    margin: float


class _Law:
    """A law on the integers given by its mode, window, anchor probability and ratios."""

    def mode(self) -> int:
        raise NotImplementedError

    def window(self) -> tuple[int, int]:
        raise NotImplementedError

    def ratio_up(self, j: NDArray[np.float64]) -> NDArray[np.float64]:
        """``P(j + 1) / P(j)`` in floats."""
        raise NotImplementedError

    def ln_pmf(self, k: int, prec: int) -> iv.Iv:
        raise NotImplementedError

    def tail_below(self, a: int, pa: iv.Iv) -> iv.Iv:
        """An upper bound of ``P(X < a)`` from ``P(a)`` (``a`` at most the mode)."""
        raise NotImplementedError

    def sd(self) -> float:
        raise NotImplementedError

    def ratio_bounds(self, j: int, prec: int) -> tuple[Decimal, Decimal]:
        """``P(j + 1) / P(j)`` rounded down and up."""
        raise NotImplementedError

    @functools.cached_property
    def table(self) -> Table:
        """The float CDF over the window (see the module docstring).

        Probabilities are anchored every :data:`_BLOCK` outcomes (each anchor correctly rounded
        from an interval) and carried between anchors by the float ratios, the anchor multiplied
        in first (so no partial product overflows), so each is within ``(4·_BLOCK + 2)·2⁻⁵³``
        relative (a binomial ratio is four roundings) or below 2⁻¹⁰⁰⁰ absolute where it
        underflows; prefix sums run within blocks, then over the blocks' totals, so the sums add
        at most ``(_BLOCK + N/_BLOCK + 2)·2⁻⁵³``.
        """
        lo, hi = self.window()
        starts = np.arange(lo, hi + 1, _BLOCK)
        anchors = np.array([float(iv.exp(self.ln_pmf(int(j), 30)).lo) for j in starts])
        j = np.arange(lo, hi + 1, dtype=np.float64)
        ratios = self.ratio_up(j[:-1])
        size = hi - lo + 1
        pmf = np.empty(size)
        for b, start in enumerate(range(0, size, _BLOCK)):
            stop = min(start + _BLOCK, size)
            pmf[start:stop] = np.cumprod(
                np.concatenate([anchors[b : b + 1], ratios[start : stop - 1]])
            )
        blocks = [np.cumsum(pmf[k : k + _BLOCK]) for k in range(0, size, _BLOCK)]
        offsets = np.concatenate([[0.0], np.cumsum([blk[-1] for blk in blocks])[:-1]])
        cdf = np.concatenate([blk + off for blk, off in zip(blocks, offsets, strict=True)])
        if not bool(np.all(np.isfinite(cdf))):  # pragma: no cover - the products stay ≤ 1
            raise ArithmeticError("a Poisson or binomial table is not finite")
        margin = (5 * _BLOCK + size / _BLOCK + 8) * _EPS + 2.0**-1000
        return Table(lo, cdf, margin)

    def cdf_iv(self, k: int, prec: int) -> iv.Iv:
        """An enclosure of ``F(k) = P(X ≤ k)``.

        Sums the probabilities from an anchor ``a`` far enough below (``z`` standard deviations
        under the mode, ``z`` growing with the precision so the geometric bound on the tail
        below ``a`` stays under ``10^-prec``) with directed rounding: all terms are positive,
        so rounding every product and sum down (up) gives a lower (upper) bound.
        """
        if k < 0:
            return iv.Iv.of(0, prec)
        z = math.sqrt(2.0 * (prec + 5) * math.log(10.0)) + 2.0
        a = max(0, min(k, self.mode() - math.ceil(z * self.sd() + z)))
        pa = iv.exp(self.ln_pmf(a, prec))
        down, up = iv.down(prec), iv.up(prec)
        p_lo, p_hi = pa.lo, pa.hi
        s_lo, s_hi = p_lo, p_hi
        for j in range(a, k):
            r_lo, r_hi = self.ratio_bounds(j, prec)
            p_lo, p_hi = down.multiply(p_lo, r_lo), up.multiply(p_hi, r_hi)
            s_lo, s_hi = down.add(s_lo, p_lo), up.add(s_hi, p_hi)
        tail = self.tail_below(a, pa)
        return iv.Iv(s_lo, up.add(s_hi, tail.hi), prec)


class Poisson(_Law):
    """``Poi(μ)`` for an exact rational ``0 < μ ≤ MAX_RATE``."""

    def __init__(self, mu: Fraction) -> None:
        if not 0 < mu <= MAX_RATE:
            raise ValueError(f"a Poisson rate must be in (0, 2^24], got {float(mu):g}")
        self.mu = mu

    def mode(self) -> int:
        return math.floor(self.mu)

    def window(self) -> tuple[int, int]:
        w = math.ceil(_TAIL_SDS * math.sqrt(float(self.mu)) + _TAIL_SDS)
        return max(0, self.mode() - w), self.mode() + w

    def ratio_up(self, j: NDArray[np.float64]) -> NDArray[np.float64]:
        return float(self.mu) / (j + 1.0)

    def ln_pmf(self, k: int, prec: int) -> iv.Iv:
        mu = iv.Iv.of(self.mu, prec)
        return iv.Iv.of(k, prec) * iv.ln(mu) - mu - iv.ln_factorial(k, prec)

    def sd(self) -> float:
        return math.sqrt(float(self.mu))

    def ratio_bounds(self, j: int, prec: int) -> tuple[Decimal, Decimal]:
        r = iv.Iv.of(self.mu / (j + 1), prec)
        return r.lo, r.hi

    def tail_below(self, a: int, pa: iv.Iv) -> iv.Iv:
        if a == 0:
            return iv.Iv.of(0, pa.prec)
        rho = Fraction(a) / self.mu  # P(j − 1)/P(j) = j/μ ≤ a/μ < 1 below the mode
        return pa * iv.Iv.of(rho / (1 - rho), pa.prec)


class Binomial(_Law):
    """``Bin(n, p)`` for an integer ``0 ≤ n ≤ MAX_RATE`` and an exact rational ``0 < p < 1``."""

    def __init__(self, n: int, p: Fraction) -> None:
        if not (0 <= n <= MAX_RATE and 0 < p < 1):
            raise ValueError(f"Bin({n}, {float(p):g}) is out of range")
        self.n, self.p = n, p
        self.odds = p / (1 - p)

    def mode(self) -> int:
        return min(self.n, math.floor((self.n + 1) * self.p))

    @functools.cached_property
    def table(self) -> Table:
        if self.n == 0:  # the outcome is 0 whatever U: a table no uniform can leave
            return Table(0, np.array([2.0]), 0.0)
        return super().table

    def window(self) -> tuple[int, int]:
        w = math.ceil(_TAIL_SDS * self.sd() + _TAIL_SDS)
        return max(0, self.mode() - w), min(self.n, self.mode() + w)

    def ratio_up(self, j: NDArray[np.float64]) -> NDArray[np.float64]:
        odds = float(self.p / (1 - self.p))
        return (self.n - j) / (j + 1.0) * odds

    def ln_pmf(self, k: int, prec: int) -> iv.Iv:
        lc = iv.ln_factorial(self.n, prec) - iv.ln_factorial(k, prec)
        lc = lc - iv.ln_factorial(self.n - k, prec)
        lp = iv.ln(iv.Iv.of(self.p, prec)) * iv.Iv.of(k, prec)
        lq = iv.ln(iv.Iv.of(1 - self.p, prec)) * iv.Iv.of(self.n - k, prec)
        return lc + lp + lq

    def sd(self) -> float:
        return math.sqrt(self.n * float(self.p) * float(1 - self.p))

    def ratio_bounds(self, j: int, prec: int) -> tuple[Decimal, Decimal]:
        r = iv.Iv.of(Fraction(self.n - j, j + 1) * self.odds, prec)
        return r.lo, r.hi

    def tail_below(self, a: int, pa: iv.Iv) -> iv.Iv:
        if a == 0:
            return iv.Iv.of(0, pa.prec)
        # P(j − 1)/P(j) = j(1 − p) / ((n − j + 1) p), increasing in j: at most its value at a
        rho = Fraction(a) * (1 - self.p) / ((self.n - a + 1) * self.p)
        return pa * iv.Iv.of(rho / (1 - rho), pa.prec)


_LAWS: OrderedDict[tuple[int, Fraction], _Law] = OrderedDict()
_LAW_BYTES = [0]


def _cached(key: tuple[int, Fraction], make: Callable[[], _Law]) -> _Law:
    """A law from the cache, or made, tabled and kept; the least recently used tables go when
    they hold more than :data:`_CACHE_BYTES` (a stream's ladder of up to 65 laws always fits:
    a table holds at most ~100,000 numbers)."""
    law = _LAWS.get(key)
    if law is not None:
        _LAWS.move_to_end(key)
        return law
    law = make()
    _LAWS[key] = law
    _LAW_BYTES[0] += law.table.cdf.nbytes
    while _LAW_BYTES[0] > _CACHE_BYTES and len(_LAWS) > 1:
        _, old = _LAWS.popitem(last=False)
        _LAW_BYTES[0] -= old.table.cdf.nbytes
    return law


def poisson(mu: Fraction) -> Poisson:
    """The (cached) law ``Poi(μ)``: its table is built once per rate."""
    law = _cached((-1, mu), lambda: Poisson(mu))
    assert isinstance(law, Poisson)
    return law


def binomial(n: int, p: Fraction) -> Binomial:
    """The (cached) law ``Bin(n, p)``."""
    law = _cached((n, p), lambda: Binomial(n, p))
    assert isinstance(law, Binomial)
    return law


def sample(laws: Sequence[_Law], which: NDArray[np.intp], draws: Draws) -> NDArray[np.int64]:
    """Outcomes of ``laws[which[i]]`` for every coordinate ``i`` from slot 0 of ``draws``."""
    u = to_unit(draws.slot(0))
    out = np.empty(u.shape[0], dtype=np.int64)
    for li, law in enumerate(laws):
        idx = np.flatnonzero(which == li)
        if idx.size == 0:
            continue
        tab = law.table
        ui = u[idx]
        k = np.searchsorted(tab.cdf, ui, side="right")  # thresholds at or below u
        below = np.where(k > 0, tab.cdf[np.maximum(k - 1, 0)], 0.0)
        above = np.where(k < tab.cdf.shape[0], tab.cdf[np.minimum(k, tab.cdf.shape[0] - 1)], 2.0)
        ok = (ui >= below + tab.margin) & (ui + _EPS + tab.margin <= above)
        ok &= k < tab.cdf.shape[0]
        out[idx] = tab.lo + k
        for i in idx[~ok]:
            out[i] = exact_outcome(
                law,
                draws.lazy(0, int(i)),
                int(tab.lo + np.searchsorted(tab.cdf, u[i], side="right")),
            )
    return out


def _below(law: _Law, k: int, u: LazyUniform) -> bool:
    """Whether ``U < F(k)``, decided exactly (more bits and digits until certain)."""
    prec = 30
    for _ in range(_MAX_ROUNDS):
        f = law.cdf_iv(k, prec)
        lo, hi = u.bounds()
        if _dec(hi, prec, up=True) <= f.lo:
            return True
        if _dec(lo, prec, up=False) >= f.hi:
            return False
        u.refine()
        prec += 20
    raise RuntimeError("the exact inversion did not converge")  # pragma: no cover


def _dec(x: Fraction, prec: int, *, up: bool) -> Decimal:
    i = iv.Iv.of(x, prec)
    return i.hi if up else i.lo


def exact_outcome(law: _Law, u: LazyUniform, guess: int) -> int:
    """The least ``k`` with ``U < F(k)``, searched from the float guess (the mode when the
    guess is off the window)."""
    lo, hi = law.window()
    k = guess if lo <= guess <= hi else law.mode()
    while not _below(law, k, u):
        k += 1
    while k > 0 and _below(law, k - 1, u):
        k -= 1
    return k
