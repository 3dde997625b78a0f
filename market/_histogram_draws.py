"""The random quantities of a histogram release, each an exact outcome of ideal uniforms.

A histogram chain's step ``j`` (:class:`~market.histogram_chain.HistogramChain`) reads the
draws (``docs/protocol.md`` §1.2) of four kinds of request keys, all under the identity
``("emarket-histogram-v2", fingerprint, V…, j, part…)``:

* ``"walk"`` — the walk's increment of every key tracked when the step starts:
  ``σ_j·N_{j,i}``, ``N`` the Box–Muller normal of slots 0 and 1 of coordinate ``i``
  (:mod:`market._normal`), ``σ_j² = Δ²(ρ_j − ρ_{j−1})/2`` exactly;
* ``"count"`` — how many never-released zero counts first exceed: ``q ~ Binomial(N, p_j)``
  by inversion of slot 0 (one coordinate), decided in interval arithmetic against the
  cumulative probabilities (:func:`binomial`);
* ``"keys"`` — which keys: main words ``w_0, w_1, …`` read in turn, a word's top ``b`` bits
  (``b`` the bit length of ``d − 1``) taken as a key, kept if below ``d`` and not tracked
  nor already drawn (:func:`fresh_keys`; integers only);
* ``"cell"`` and ``("start", e, t)`` — each new key's walk ``S_j`` given that it exceeds:
  a cell of the survival law by the first ``c`` with ``U < cdf_c`` (``U`` slot 0 of
  coordinate ``e`` of ``"cell"``), then trials ``t = 0, 1, …`` of a point ``x`` uniform in the
  cell and an increment ``y`` above ``β = (a_j − r)/σ_j`` (``r`` the cell's right end) by
  Robert's exponential proposal ``y = β + E/λ``, ``E = −ln U₁``, kept iff ``U₂ < e^{−(y −
  λ)²/2}`` and ``x + σ_j·y > a_j``; then ``S_j = x + σ_j·y`` (:func:`new_start`).

Every decision compares an ideal uniform with an exact or enclosed real, in
:mod:`market._interval` arithmetic refined (more digits, more random bits) until certain, so the
outcome is the ideal one on every platform; the only floats are public numbers of the chain
(``p_j``, the cells, ``cdf``, ``λ``), themselves computed without any library's
transcendental function (:mod:`market._gauss`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from . import _interval as iv
from ._draws import Draws, LazyUniform, lazy_at
from ._normal import _normal_iv

__all__ = [
    "MAX_ROUNDS",
    "Cell",
    "Part",
    "Start",
    "binomial",
    "fresh_keys",
    "new_start",
    "pick_cell",
    "robert_rate",
    "settle",
    "uniform_iv",
]

MAX_ROUNDS = 60
"""Refinements (64 random bits and 20 digits each) before a decision is declared a bug: an
undecided comparison after ``t`` of them has probability about ``2^(−64t)``."""
_PREC = 30


def uniform_iv(u: LazyUniform, prec: int) -> iv.Iv:
    """The enclosure of an ideal uniform's known bits."""
    lo, hi = u.bounds()
    return iv.Iv(iv.Iv.of(lo, prec).lo, iv.Iv.of(hi, prec).hi, prec)


def _below(u: LazyUniform, x: iv.Iv) -> bool | None:
    """Whether ``U < x``: ``None`` while the known bits of ``U`` and the enclosure overlap."""
    lo, hi = u.bounds()
    if hi <= Fraction(x.lo):
        return True
    if lo >= Fraction(x.hi):
        return False
    return None


def _ln_one_minus(p: Fraction, prec: int) -> iv.Iv:
    """``ln(1 − p)`` for ``0 ≤ p < 1``: its series ``−Σ pⁿ/n`` for small ``p`` (whose tail
    after ``n`` terms is below ``p^{n+1}/((n+1)(1 − p))``), so a ``p`` of 10⁻²⁶ keeps its
    digits."""
    if p >= Fraction(1, 4):
        return iv.ln(iv.Iv.of(1 - p, prec))
    total, term, n = Fraction(0), Fraction(1), 0
    bound = Fraction(1, 10 ** (prec + 5)) * p
    while True:
        n += 1
        term *= p
        total -= term / n
        tail = term * p / ((n + 1) * (1 - p))
        if tail <= bound or tail == 0:
            return iv.Iv(iv.Iv.of(total - tail, prec).lo, iv.Iv.of(total, prec).hi, prec)


def binomial(n: int, p: float, key: bytes, limit: int) -> int:
    """``q ~ Binomial(n, p)`` by inversion of slot 0 of ``key``'s draws: the least ``m`` with
    ``U < Σ_{i ≤ m} C(n, i) pⁱ(1 − p)^{n−i}``, or ``limit + 1`` if that is more than
    ``limit`` (the caller refuses it).

    ``P(0) = e^{n·ln(1−p)}`` is enclosed, and ``P(i + 1) = P(i)·(n − i)/(i + 1)·p/(1 − p)``
    multiplies it by exact rationals; a comparison the enclosure cannot decide is retried with
    more digits and more bits of ``U``.
    """
    if n <= 0 or p <= 0.0:
        return 0
    u = lazy_at(key, 1, 0, 0)
    fast = _float_binomial(u.num, n, p, limit)
    if fast is not None:
        return fast
    pr = Fraction(p)
    ratio = pr / (1 - pr) if pr < 1 else None
    prec = _PREC
    for _ in range(MAX_ROUNDS):
        if ratio is None:  # p = 1: every one exceeds
            return min(n, limit + 1)
        pmf = iv.exp(_ln_one_minus(pr, prec) * iv.Iv.of(n, prec))
        cdf = pmf
        m = 0
        while True:
            below = _below(u, cdf)
            if below is None:
                break
            if below:
                return m
            if m >= min(n, limit + 1):
                return m
            pmf = pmf * iv.Iv.of(Fraction(n - m, m + 1) * ratio, prec)
            cdf = cdf + pmf
            m += 1
        u.refine()
        prec += 20
    raise RuntimeError("the binomial did not settle")  # pragma: no cover


def _float_binomial(word: int, n: int, p: float, limit: int) -> int | None:
    """:func:`binomial` in doubles from the uniform's first 64 bits ``[w·2⁻⁶⁴, (w+1)·2⁻⁶⁴)``:
    each comparison with the cumulative probability decided only when clear of it by a
    relative margin far above the float error (``log1p`` and ``exp`` trusted to 64 ulps, so
    ``P(0)`` within ``2⁻⁴⁴·(1 + |n·ln(1−p)|)``; each later term and sum adds a few ``2⁻⁵³``);
    ``None`` when one is not (then intervals decide)."""
    if p >= 0.5:
        return None
    log_q = n * math.log1p(-p)
    pmf = math.exp(log_q)
    if pmf < 1e-280:
        return None
    lo, hi = word * 2.0**-64, (word + 1) * 2.0**-64  # each within 2⁻¹¹⁶ relative
    ratio = p / (1.0 - p)
    slack = 2.0**-44 * (1.0 + abs(log_q))
    cdf, m = pmf, 0
    while True:
        rel = slack + (m + 4) * 2.0**-50
        if hi <= cdf * (1.0 - rel):
            return m
        if lo < cdf * (1.0 + rel):
            return None
        if m >= min(n, limit + 1):
            return m
        pmf *= (n - m) / (m + 1) * ratio
        cdf += pmf
        m += 1


def fresh_keys(key: bytes, q: int, tracked: set[int], domain: int) -> list[int]:
    """``q`` distinct keys of ``[0, domain)`` outside ``tracked``: main words of ``key`` in
    turn, each word's top ``b`` bits (``b`` the bit length of ``domain − 1``), kept if below
    ``domain`` and new (rejection: uniform over the untracked keys)."""
    b = (domain - 1).bit_length()
    out: list[int] = []
    seen = set(tracked)
    index = 0
    while len(out) < q:
        batch = max(16, 2 * (q - len(out)))
        words = _main_words(key, index, batch)
        index += batch
        for w in words:
            j = w >> (64 - b) if b else 0
            if j < domain and j not in seen:
                seen.add(j)
                out.append(j)
                if len(out) == q:
                    break
    return out


def _main_words(key: bytes, start: int, count: int) -> list[int]:
    from ._draws import _words  # noqa: PLC0415 - private helper of the sibling module

    words = _words(key, start + count)
    return [int(w) for w in words[start:].tolist()]


@dataclass(frozen=True, slots=True)
class Cell:
    """A cell ``[right − width, right]`` of the survival law (exact rationals), or the point
    0 (``width = 0``, before step 1)."""

    right: Fraction
    width: Fraction


@dataclass(slots=True)
class Start:
    """``S_j = a − width·(1 − U_x) + σ_j·E/λ`` of a key first exceeding at step ``j`` (``x =
    right − width·(1 − U_x)`` and ``y = β + E/λ``): its uniforms stay extensible, so a
    release at a later step decides its counts exactly too."""

    step: int
    a: Fraction
    var: Fraction  # σ_j²
    lam: Fraction
    width: Fraction
    ux: LazyUniform
    ue: LazyUniform
    floats: tuple[float, float, float, float]  # a, σ (within 2⁻⁵²), λ, width: exact doubles
    _float: tuple[float, float] | None = None

    def enclose(self, prec: int) -> iv.Iv:
        """An enclosure of ``S_j``."""
        one = iv.Iv.of(1, prec)
        e = -iv.ln(uniform_iv(self.ue, prec))
        shift = iv.sqrt(iv.Iv.of(self.var, prec)) * e / iv.Iv.of(self.lam, prec)
        back = iv.Iv.of(self.width, prec) * (one - uniform_iv(self.ux, prec))
        return iv.Iv.of(self.a, prec) - back + shift

    def float_bounds(self) -> tuple[float, float]:
        """``(mid, radius)`` in doubles with ``|S − mid| ≤ radius``, for the float pass of the
        counts: ``radius`` is 2⁻⁴⁰ of the terms' sizes (plus ``σ/λ`` for ``E`` near 0), far above
        the error of the uniforms' 64-bit prefixes, ``log`` (trusted to 64 ulps) and the
        roundings."""
        if self._float is None:
            ux, ue = self.ux.num * 2.0**-64, self.ue.num * 2.0**-64
            if ue < 2.0**-40:
                return 0.0, math.inf
            a, sigma, lam, width = self.floats
            unit = sigma / lam
            shift = unit * -math.log(ue)
            back = width * (1.0 - ux)
            mid = a - back + shift
            self._float = (mid, 2.0**-40 * (abs(a) + width + shift + unit))
        return self._float

    def refine(self) -> None:
        self.ux.refine()
        self.ue.refine()

    def ready(self) -> bool:
        """``U_E`` is known to be above 0 (``ln`` needs it)."""
        return self.ue.bounds()[0] > 0


def pick_cell(draws: Draws, e: int, cdf: Sequence[float]) -> int:
    """The cell of new key ``e``: the least ``c`` with ``U < cdf_c`` (``U`` slot 0 of
    coordinate ``e`` of the step's ``"cell"`` draws; the last ``cdf`` is 1)."""
    u = draws.lazy(0, e)
    guess = bisect.bisect_right(cdf, u.num * 2.0**-64)  # the float candidate, checked exactly
    lo, hi = u.bounds()
    if (guess == 0 or Fraction(cdf[guess - 1]) <= lo) and hi <= Fraction(
        cdf[min(guess, len(cdf) - 1)]
    ):
        return guess
    for _ in range(MAX_ROUNDS):
        lo, hi = u.bounds()
        first = _least_above(cdf, lo)  # the least c with lo < cdf_c
        if hi <= Fraction(cdf[first]):  # and then U < hi ≤ cdf_c, while U ≥ lo ≥ cdf_{c−1}
            return first
        u.refine()
    raise RuntimeError("the cell did not settle")  # pragma: no cover


def _least_above(cdf: Sequence[float], x: Fraction) -> int:
    lo, hi = 0, len(cdf) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if Fraction(cdf[mid]) > x:
            hi = mid
        else:
            lo = mid + 1
    return lo


def robert_rate(a: float, right: float, sd: float) -> float:
    """``λ`` of Robert's proposal, in binary64 (so every platform uses the same one):
    ``b = (a − right)/sd``, ``λ = (b + √(b² + 4))/2``."""
    b = (a - right) / sd
    return (b + math.sqrt(b * b + 4.0)) / 2.0


def new_start(
    key_of_trial: Callable[[int], bytes],
    j: int,
    a: float,
    var: Fraction,
    sd: float,
    cell: Cell,
) -> Start:
    """``S_j`` of a key that first exceeds ``a`` at step ``j``, from ``cell``.

    Trial ``t`` reads slots 0, 1, 2 (``U_x``, ``U_E``, ``U_V``) of the request key
    ``key_of_trial(t)``; it is kept iff ``U_V < e^{−(y − λ)²/2}`` and ``x + σ·y > a``. A kept
    ``(x, y)`` has density ``∝ λe^{−λ(y−β)}·e^{−(y−λ)²/2}·1{x + σy > a} ∝ φ(y)·1{x + σy > a}``
    on the cell (any ``λ > 0``; Robert's makes trials cheap): ``x`` with density
    ``∝ Φ((x − a)/σ)``, and ``y`` the normal truncated to exceed (``docs/math.md`` §11).
    """
    lam_f = robert_rate(a, float(cell.right), sd)
    lam = Fraction(lam_f)
    a_r = Fraction(a)
    beta_num = a_r - cell.right  # β = beta_num/σ
    sigma = math.sqrt(float(var))
    floats = (a, sigma, lam_f, float(cell.width))
    beta = float(beta_num) / sigma  # within a few 2⁻⁵³ relative
    t = 0
    while True:
        draws = Draws(key_of_trial(t), 1, 3)
        ux, ue, uv = draws.lazy(0, 0), draws.lazy(1, 0), draws.lazy(2, 0)
        start = Start(j, a_r, var, lam, cell.width, ux, ue, floats)
        if _trial(start, uv, beta_num, beta):
            return start
        t += 1


_MARGIN = 2.0**-30
"""Relative margin of the float pass of a trial: far above its error (a few units of 2⁻⁵² from
the uniforms' 64-bit prefixes, ``log`` and ``exp`` trusted to 64 ulps, and the roundings)."""


def _float_trial(start: Start, uv: LazyUniform, beta: float) -> bool | None:
    """The trial in doubles: its outcome if both comparisons clear :data:`_MARGIN`, else
    ``None`` (then :func:`_trial` decides in intervals)."""
    ux, ue, v = (u.num * 2.0**-64 for u in (start.ux, start.ue, uv))
    if ue < 2.0**-40:
        return None
    _, sigma, lam, width = start.floats
    e = -math.log(ue)  # within 2⁻⁵² (the prefix's rounding) + 2⁻⁴⁶·E
    dev = beta + e / lam - lam
    bound = math.exp(-0.5 * dev * dev)
    if v > bound * (1 + _MARGIN) + 2.0**-60:
        return False
    if v >= bound * (1 - _MARGIN):
        return None
    unit = sigma / lam
    shift = unit * e
    back = width * (1.0 - ux)
    slack = _MARGIN * (shift + back) + 2.0**-60 * width + 2.0**-50 * unit
    if shift - back > slack:
        return True
    if back - shift > slack:
        return False
    return None


def _trial(start: Start, uv: LazyUniform, beta_num: Fraction, beta: float) -> bool:
    """One trial of :func:`new_start`, decided exactly (``beta``: β in doubles)."""
    fast = _float_trial(start, uv, beta)
    if fast is not None:
        return fast
    prec = _PREC
    for _ in range(MAX_ROUNDS):
        if start.ready():
            sigma = iv.sqrt(iv.Iv.of(start.var, prec))
            e = -iv.ln(uniform_iv(start.ue, prec))
            lam = iv.Iv.of(start.lam, prec)
            dev = iv.Iv.of(beta_num, prec) / sigma + e / lam - lam  # y − λ
            accept = _below(uv, iv.exp(-_square(dev) * iv.Iv.of(Fraction(1, 2), prec)))
            if accept is False:
                return False
            over = start.enclose(prec) - iv.Iv.of(start.a, prec)  # S − a
            if accept is True and over.lo > 0:
                return True
            if accept is True and over.hi <= 0:
                return False
        start.refine()
        uv.refine()
        prec += 20
    raise RuntimeError("a trial did not settle")  # pragma: no cover


def _square(x: iv.Iv) -> iv.Iv:
    """``x²`` of an interval (its lower end 0 if it holds 0)."""
    sq = x * x
    if x.lo <= 0 <= x.hi:
        return iv.Iv(Decimal(0), sq.hi, x.prec)
    return sq


@dataclass(frozen=True, slots=True)
class Part:
    """The walk increment of step ``j``: ``σ_j·N`` from ``key`` (``n`` coordinates)."""

    key: bytes
    n: int
    var: Fraction


def settle(
    count: Fraction,
    start: Start | None,
    parts: Sequence[Part],
    i: int,
    level: Fraction,
    grid_exp: int,
    prec: int = _PREC,
) -> int:
    """``round((c + (S + Σ σ_j·N_{j,i})/ρ)/2^e)`` of tracked key ``i``, exactly: the integer
    the step releases (``S`` = 0 for a key in the data; ``prec`` digits to start with)."""
    us = [(lazy_at(p.key, p.n, 0, i), lazy_at(p.key, p.n, 1, i)) for p in parts]
    scale = Fraction(1, 1) / level * Fraction(2) ** (-grid_exp)
    for _ in range(MAX_ROUNDS):
        try:
            if start is not None and not start.ready():
                raise ValueError("U_E not yet away from 0")
            w = start.enclose(prec) if start is not None else iv.Iv.of(0, prec)
            for p, (u1, u2) in zip(parts, us, strict=True):
                w = w + iv.sqrt(iv.Iv.of(p.var, prec)) * _normal_iv(u1, u2, prec)
            total = iv.Iv.of(count * Fraction(2) ** (-grid_exp), prec) + w * iv.Iv.of(scale, prec)
            shifted = total + iv.Iv.of(Fraction(1, 2), prec)
            if math.floor(shifted.lo) == math.floor(shifted.hi):
                return math.floor(shifted.lo)
        except ValueError:
            pass
        for u1, u2 in us:
            u1.refine()
            u2.refine()
        if start is not None:
            start.refine()
        prec += 20
    raise RuntimeError("a histogram count did not settle")  # pragma: no cover
