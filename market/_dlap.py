"""Exact vectorised sampler of the discrete Laplace release process (see ``docs/math.md`` §4.5).

Every conditional law of the process (fresh release, tightening, relaxation, bridge) is, for
the noise ``j`` added to the more accurate neighbour ``U`` and ``t = |L − U|`` (mirrored when
``L < U``), a mixture of five parts ordered by ``j``::

    L   j = −1 − G,          G ~ Geom(q)        weight K_L
    A0  j = 0                                   weight K_0 + K_00·[t = 0]
    M   j = G mod (t + 1),   G ~ Geom(r)        weight K_M (1 − r^{t+1})
    At  j = t                                   weight K_t r^t
    R   j = t + 1 + G,       G ~ Geom(q)        weight K_R r^t

where ``P(G ≥ g) = ratio^g`` and every constant is a function of ``p = exp(−ε/Δ)`` of the levels
involved (:func:`float_constants`, :func:`_exact_constants`). One uniform ``U1`` picks the part
by inversion and ``G`` is drawn by inversion too, ``G = floor(−log(1 − U2) / s)`` with
``ratio = exp(−s)`` (``s`` an exact rational: ``ε/Δ`` sums and differences), split into
independent digit groups with one uniform each when ``s`` is tiny (:class:`Plan`: the noise of a
fine grid).

**Exactness.** The outcome is defined as that of the inverse CDFs applied to *infinitely
precise* uniforms; nothing else. Each uniform's first 64 bits are a word of the request's draws
(:mod:`market._draws`); the float pass uses their 53-bit prefixes, which pin each to an interval
of width 2^-53, and decides a coordinate only when the whole interval lies, with a safety margin
far above the float rounding errors (2^-32 of the total weight for the part, 2^-40 relative for
``G``; the formulas are accurate to better than 2^-41), on one side of every threshold. The rare
undecided coordinate (probability about 10^-9) goes to :func:`exact_noise`, which extends its
uniforms with their extension words and compares them with rational interval enclosures of the
thresholds (:class:`_Iv`: exact :class:`~fractions.Fraction` arithmetic rounded outwards) at
increasing precision until the comparison is certain. Either way the result is the exact
inverse-CDF outcome, so the float path never changes an outcome: forcing every coordinate
through the exact path gives the same vector bit for bit (tested). Slot 0 of a coordinate is its
part uniform, slots 1… its geometric's (:func:`slots`): a law reads the same words whatever the
data, and a coordinate's outcome does not depend on which other coordinates needed the exact
path.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from ._draws import Draws, LazyUniform, to_unit

BLOCK = 16384
MARGIN = 2.0**-32
"""Fast-path margin on the part thresholds, relative to the total weight."""
ETA = 2.0**-40
"""Fast-path relative margin on ``E / s`` for the geometric index."""
LIMIT = 2**62
"""Largest noise magnitude the sampler returns (int64 releases must not overflow)."""
_U53 = 2.0**-53
_G_MAX = 2.0**52  # beyond this a float no longer holds every integer: decide exactly
_MAX_ROUNDS = 400  # 64 more bits per round; needing 400 rounds has probability < 2^-20000

PART_L, PART_A0, PART_M, PART_AT, PART_R = range(5)


@dataclass(frozen=True)
class Law:
    """The exact parameters of one conditional law, as rationals ``ε/Δ``.

    Attributes
    ----------
    a : Fraction
        ε/Δ of the new level: its noise is DLap(exp(−a)).
    a_u : Fraction or None
        ε/Δ of the more accurate neighbour, ``None`` for the exact value.
    a_l : Fraction or None
        ε/Δ of the less accurate neighbour, ``None`` for a fresh release or a tightening.
    """

    a: Fraction
    a_u: Fraction | None
    a_l: Fraction | None
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # a law is a cache key on every call: hashing its Fractions each time cost ~15 µs
        object.__setattr__(self, "_hash", hash((self.a, self.a_u, self.a_l)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def s_q(self) -> Fraction:
        """``−log q`` of the outer geometric parts (``q = p p_l``, or ``p`` with no lower)."""
        return self.a if self.a_l is None else self.a + self.a_l

    @property
    def s_r(self) -> Fraction:
        """``−log r`` of the middle part (``r = p / p_l``); 1 when there is no middle part."""
        return Fraction(1) if self.a_l is None else self.a - self.a_l

    @functools.cached_property
    def plans(self) -> tuple[Plan, Plan | None]:
        """The geometric plans of the outer parts and (with a lower neighbour) of the middle."""
        return plan(self.s_q), (None if self.a_l is None else plan(self.s_r))


class Constants(NamedTuple):
    """Float constants of a :class:`Law` (see the module docstring for their meaning)."""

    k_l: float
    k_0: float
    k_00: float
    k_m: float
    k_t: float
    k_r: float
    s_r: float
    inv_s_q: float
    inv_s_r: float


def _w0_float(a1: Fraction, a2: Fraction) -> tuple[float, float]:
    """(w0, 1 − w0) of the step from ``a2`` to the noisier ``a1 < a2``, cancellation-free."""
    e1, e2 = math.expm1(-float(a1)), math.expm1(-float(a2))
    w0 = math.exp(-float(a2 - a1)) * (e1 / e2) ** 2
    w1 = math.expm1(-float(a2 - a1)) * math.expm1(-float(a1 + a2)) / e2**2
    return w0, w1


def _q_over(s: Fraction) -> float:
    """q / (1 − q) for q = exp(−s), without overflow."""
    return math.exp(-float(s)) / -math.expm1(-float(s))


@functools.lru_cache(maxsize=1024)
def float_constants(law: Law) -> Constants:
    """The part weights' constants in floats (each within a few ulps of the exact value)."""
    c = math.tanh(float(law.a) / 2.0)
    mu_a, nmu_a = (0.0, 1.0) if law.a_u is None else _w0_float(law.a, law.a_u)
    if law.a_l is None:
        k_l = nmu_a * c * _q_over(law.a)
        return Constants(k_l, mu_a + nmu_a * c, 0.0, 0.0, 0.0, k_l, 1.0, 1.0 / float(law.a), 1.0)
    mu_b, nmu_b = _w0_float(law.a_l, law.a)
    c_l = math.tanh(float(law.a_l) / 2.0)
    cc = nmu_a * nmu_b * c * c_l
    k_l = cc * _q_over(law.s_q)
    s_r = float(law.s_r)
    return Constants(
        k_l,
        mu_a * nmu_b * c_l,
        mu_a * mu_b,
        cc / -math.expm1(-s_r),
        nmu_a * mu_b * c,
        k_l,
        s_r,
        1.0 / float(law.s_q),
        1.0 / s_r,
    )


# ---------------------------------------------------------------------- geometric plans
S_DIRECT = Fraction(1, 2**20)
"""Smallest ``s`` whose geometric is drawn from one uniform: ``E/s`` needs ``log₂(1/s) + 40``
good bits to be decided, and a uniform has 53 (see :class:`Plan`)."""
CHUNK_BITS = 20


@dataclass(frozen=True)
class Plan:
    """How ``G ~ Geom(e^{−s})`` is drawn: ``G = 2^M·H + Σ_i 2^{m_i}·R_i``, one uniform each.

    ``P(G = g) ∝ e^{−sg}`` factorises over the digits of ``g`` in any mixed radix, so
    ``H ~ Geom(e^{−s·2^M})`` and ``R_i`` (the digits of width ``b_i`` at ``m_i``) ~ the
    geometric of ratio ``e^{−s·2^{m_i}}`` truncated to ``[0, 2^{b_i})`` are independent. ``M``
    is the least with ``s·2^M ≥ 2⁻²⁰`` and the ``b_i ≤ 20`` split it: each part then needs
    at most ~40 bits of its uniform beyond its margins, whatever ``s`` (the noise of a fine
    grid has ``s`` near 2⁻⁴⁸).
    """

    s: Fraction
    top: Fraction
    chunks: tuple[tuple[int, int], ...]

    @property
    def slots(self) -> int:
        return 1 + len(self.chunks)

    @property
    def shift(self) -> int:
        return sum(b for _, b in self.chunks)


@functools.lru_cache(maxsize=256)
def plan(s: Fraction) -> Plan:
    """The :class:`Plan` of ``Geom(e^{−s})`` (a function of ``s`` alone, hence public)."""
    if s >= S_DIRECT:
        return Plan(s, s, ())
    m = 0
    while s * 2**m < S_DIRECT:
        m += 1
    count = -(-m // CHUNK_BITS)
    widths = [m // count + (1 if i < m % count else 0) for i in range(count)]
    starts = [sum(widths[:i]) for i in range(count)]
    return Plan(s, s * 2**m, tuple(zip(starts, widths, strict=True)))


def slots(law: Law) -> int:
    """Uniforms per coordinate a law reads: the part, then the geometric's (the middle part's
    plan may need more than the outer parts'; a coordinate uses the ones its part needs)."""
    plan_q, plan_r = law.plans
    return 1 + max(plan_q.slots, 0 if plan_r is None else plan_r.slots)


# ------------------------------------------------------------------------------ fast path
def sample_into(
    out: NDArray[np.int64],
    upper: NDArray[np.int64],
    lower: NDArray[np.int64] | None,
    law: Law,
    draws: Draws,
    margin: float = MARGIN,
    eta: float = ETA,
) -> None:
    """Write a sample of the conditional law into ``out`` (int64, length of ``upper``).

    ``draws`` must have ``n = len(upper)`` and :func:`slots` slots. ``margin`` and ``eta`` are
    test hooks: large ones send coordinates through the exact path, which must not change any
    outcome.
    """
    n = int(out.shape[0])
    if draws.n != n or draws.slots != slots(law):
        raise ValueError(f"draws of {draws.n}x{draws.slots}, law needs {n}x{slots(law)}")
    cst = float_constants(law)
    for start in range(0, n, BLOCK):
        sl = slice(start, min(start + BLOCK, n))
        words = [draws.slot(k)[sl] for k in range(draws.slots)]
        lo = None if lower is None else lower[sl]
        _block(out[sl], upper[sl], lo, law, cst, words, (margin, eta))
        for i in np.flatnonzero(out[sl] == _UNDECIDED):
            k = start + int(i)
            diff = 0 if lower is None else int(lower[k]) - int(upper[k])
            j = exact_noise(law, abs(diff), draws, k)
            out[k] = int(upper[k]) + (-j if diff < 0 else j)


_UNDECIDED = np.iinfo(np.int64).min  # marker of coordinates left to the exact path


def batchable(laws: Sequence[Law]) -> bool:
    """Whether :func:`sample_segments` can draw these laws in one pass: fresh or tightening
    laws (three parts, scalar thresholds) whose geometrics take one uniform each."""
    return all(law.a_l is None and not law.plans[0].chunks for law in laws)


def sample_segments(
    laws: Sequence[Law], sizes: Sequence[int], draws: Draws, eta: float = ETA
) -> NDArray[np.int64]:
    """The noise ``J`` of several :func:`batchable` laws at once: segment ``i`` (``sizes[i]``
    coordinates, in order) follows ``laws[i]``, reading the joined ``draws`` exactly as
    :func:`sample_into` would for it alone (two slots; the same decisions, per coordinate
    constants): a chain's steps, or several values' steps, in one vectorised pass."""
    if not batchable(laws) or draws.slots != 2 or draws.n != sum(sizes):
        raise ValueError("sample_segments needs batchable laws and their two-slot draws")
    consts = [float_constants(law) for law in laws]
    per = np.repeat(np.arange(len(laws)), sizes)
    k_l = np.array([c.k_l for c in consts])[per]
    c2 = k_l + np.array([c.k_0 for c in consts])[per]
    total = c2 + k_l
    inv_s = np.array([c.inv_s_q for c in consts])[per]
    part, undecided = _choose_part(to_unit(draws.slot(0)), (k_l, c2), total, MARGIN)
    g, und_g = _floor_exponential(to_unit(draws.slot(1)), inv_s, None, eta, inverse=True)
    undecided |= und_g & (part != PART_A0)
    g1 = g.astype(np.int64) + 1
    out: NDArray[np.int64] = (part == PART_R) * g1
    out -= (part == PART_L) * g1
    for i in np.flatnonzero(undecided):
        out[i] = exact_noise(laws[int(per[i])], 0, draws, int(i))
    return out


def _block(
    o: NDArray[np.int64],
    up: NDArray[np.int64],
    lo: NDArray[np.int64] | None,
    law: Law,
    cst: Constants,
    words: list[NDArray[np.uint64]],
    margins: tuple[float, float],
) -> None:
    """One block of :func:`sample_into`; undecided coordinates get :data:`_UNDECIDED`.

    The same numpy operations run for every coordinate whichever part it falls in; the only
    Python branches are on public facts (a lower neighbour, the laws' plans).
    """
    t: NDArray[np.int64] | int = 0
    sgn: NDArray[np.int64] | int = 1
    total: float | NDArray[np.float64]
    if lo is None:
        cums, total = _fresh_cums(cst)
    else:
        diff = lo - up
        sgn = np.where(diff < 0, -1, 1)
        t = tt = np.abs(diff)
        cums, total = _bridge_cums(cst, tt)
    part, undecided = _choose_part(to_unit(words[0]), cums, total, margins[0])
    plan_q, plan_r = law.plans
    g, und_g = _geometric(words[1:], plan_q, margins[1])
    if lo is not None:
        assert plan_r is not None
        mid = part == PART_M
        g_r, und_r = _geometric(words[1:], plan_r, margins[1])
        g = np.where(mid, g_r, g)
        und_g = np.where(mid, und_r, und_g)
    undecided |= und_g & (part != PART_A0) & (part != PART_AT)
    g1 = g + 1  # 1 + G: the distance of the outer parts from their atoms
    # j = −(1 + G) | 0 | G mod (t + 1) | t | t + (1 + G), by 0/1 indicators (no gather)
    j = (part == PART_R) * g1
    j -= (part == PART_L) * g1
    if lo is not None:
        j += (part == PART_M) * (g % (t + 1))
        j += (part >= PART_AT) * t
        j *= sgn
    np.add(up, j, out=o)
    np.copyto(o, _UNDECIDED, where=undecided)


Cums = tuple[float | NDArray[np.float64], ...]


def _fresh_cums(cst: Constants) -> tuple[Cums, float]:
    """Without a lower neighbour there are three parts (L, A0, R): two thresholds, the second
    counting for the three parts above it (M and At are empty)."""
    c1 = cst.k_l
    c2 = c1 + cst.k_0
    return (c1, c2), c2 + cst.k_r


def _bridge_cums(cst: Constants, t: NDArray[np.int64]) -> tuple[Cums, NDArray[np.float64]]:
    """Cumulative weights of the five parts, per coordinate (divided by ``p_l^t``)."""
    arg = t.astype(np.float64)
    arg *= -cst.s_r
    rt = np.exp(arg)  # r^t
    arg -= cst.s_r
    wm = np.expm1(arg)
    wm *= -cst.k_m  # K_M (1 − r^{t+1})
    c1 = cst.k_l
    c2: float | NDArray[np.float64] = c1 + cst.k_0
    if cst.k_00 != 0.0:  # both neighbours are releases (a public fact): atom-atom at t = 0
        c2 = (t == 0) * cst.k_00
        c2 += c1 + cst.k_0
    c3 = wm + c2
    c4 = rt * cst.k_t
    c4 += c3
    total = rt * cst.k_r
    total += c4
    return (c1, c2, c3, c4), total


def _choose_part(
    u1: NDArray[np.float64], cums: Cums, total: float | NDArray[np.float64], margin: float
) -> tuple[NDArray[np.int8], NDArray[np.bool_]]:
    """The part chosen by ``U1 ∈ [u1, u1 + 2^-53)``, and where that is not certain."""
    if len(cums) == 2 and not isinstance(total, np.ndarray):  # fresh or tightening: 3 parts
        return _choose_of_three(u1, (float(cums[0]), float(cums[1])), total, margin)
    x = u1 * total
    m = np.multiply(total, margin)
    lo = x - m
    hi = x + (m + np.multiply(total, _U53))
    part = np.zeros(u1.shape[0], dtype=np.int8)
    part_hi = np.zeros(u1.shape[0], dtype=np.int8)
    step = 3 if len(cums) == 2 else 1  # three parts: the second threshold leads to R
    for i, c in enumerate(cums):
        w = step if i == 1 else 1
        part += w * (lo >= c)  # U1 ≥ c / total for certain
        part_hi += w * (hi > c)  # U1 < c / total is not certain
    return part, part != part_hi


_OF_THREE = np.array([PART_L, PART_A0, PART_R], dtype=np.int8)


def _choose_of_three(
    u1: NDArray[np.float64], cums: tuple[float, float], total: float, margin: float
) -> tuple[NDArray[np.int8], NDArray[np.bool_]]:
    """:func:`_choose_part` for the fresh and tightening laws (scalar thresholds L | A0 | R):
    the same comparisons, against the two thresholds scaled to the uniform (two vector
    comparisons each: a search of two thresholds costs as much as the whole draw)."""
    e0, e1 = (c / total for c in cums)  # U1 ≥ c/total ⟺ U1·total ≥ c, with margins
    slack = margin + _U53
    lo = (u1 >= e0 + margin).view(np.int8) + (u1 >= e1 + margin).view(np.int8)  # certainly passed
    hi = (u1 > e0 - slack).view(np.int8) + (u1 > e1 - slack).view(np.int8)  # possibly passed
    return _OF_THREE[lo], lo != hi


def _geometric(
    words: list[NDArray[np.uint64]], pl: Plan, eta: float
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """``G`` of :class:`Plan` ``pl`` from its uniforms, and where it is not certain."""
    g, undecided = _floor_exponential(to_unit(words[0]), float(pl.top), None, eta)
    undecided |= g >= 2.0 ** (61 - pl.shift)  # G ≥ 2⁶¹ would wrap int64: the exact path
    g[undecided] = 0.0
    out = g.astype(np.int64) << pl.shift
    for k, (m, b) in enumerate(pl.chunks, start=1):
        sigma = pl.s * 2**m
        r, und = _floor_exponential(to_unit(words[k]), float(sigma), float(sigma * 2**b), eta)
        undecided |= und | (r >= 2**b)
        out += np.minimum(r, 2**b - 1).astype(np.int64) << m
    return out, undecided


def _floor_exponential(
    u: NDArray[np.float64],
    s: float | NDArray[np.float64],
    span: float | None,
    eta: float,
    *,
    inverse: bool = False,
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """``⌊E/s⌋`` for ``E = −log(1 − U·y)`` (``y = 1`` for a geometric, ``1 − e^{−span}`` for
    one truncated to ``span/s`` values), ``U ∈ [u, u + 2⁻⁵³)``, and where it is not certain
    (``s`` given as ``1/s``, per coordinate, when ``inverse``)."""
    y = 1.0 if span is None else -math.expm1(-span)
    arg = u * y
    e = np.log1p(-arg)
    e *= -1.0
    # E(u + 2⁻⁵³) − E(u) ≤ 2·2⁻⁵³·y / (1 − u·y) when 1 − u·y ≥ 2⁻⁵²
    de = np.divide(2.0 * _U53 * y, 1.0 - arg)
    inv_s = s if inverse else 1.0 / s
    x_lo = e * inv_s
    x_lo *= 1.0 - eta
    x_hi = e + de
    x_hi *= inv_s
    x_hi *= 1.0 + eta
    np.minimum(x_lo, _G_MAX, out=x_lo)
    g = np.floor(x_lo)
    undecided = np.floor(x_hi) != g
    undecided |= x_hi >= _G_MAX
    undecided |= arg > 1.0 - 2.0 * _U53
    return g, undecided


# ----------------------------------------------------------------------------- exact path
class _Imprecise(Exception):
    """An interval enclosure too wide to divide by: retry at a higher precision."""


@dataclass(frozen=True)
class _Iv:
    """A closed interval ``[lo, hi]`` of non-negative reals with dyadic rational ends."""

    lo: Fraction
    hi: Fraction

    @staticmethod
    def exact(x: Fraction | int) -> _Iv:
        return _Iv(Fraction(x), Fraction(x))

    def __add__(self, other: _Iv) -> _Iv:
        return _Iv(self.lo + other.lo, self.hi + other.hi)

    def mul(self, other: _Iv, w: int) -> _Iv:
        return _Iv(_down(self.lo * other.lo, w), _up(self.hi * other.hi, w))

    def div(self, other: _Iv, w: int) -> _Iv:
        if other.lo <= 0:
            raise _Imprecise
        return _Iv(_down(self.lo / other.hi, w), _up(self.hi / other.lo, w))

    def complement(self) -> _Iv:
        """``1 − x`` for ``x`` in ``[0, 1]``."""
        return _Iv(max(Fraction(0), 1 - self.hi), min(Fraction(1), 1 - self.lo))


def _down(x: Fraction, w: int) -> Fraction:
    return Fraction((x.numerator << w) // x.denominator, 1 << w)


def _up(x: Fraction, w: int) -> Fraction:
    return Fraction(-((-x.numerator << w) // x.denominator), 1 << w)


@functools.lru_cache(maxsize=1024)
def exp_neg(y: Fraction, w: int) -> _Iv:
    """An enclosure of ``exp(−y)`` (``y ≥ 0`` rational) of width about ``2^-w``.

    ``exp(−y) = exp(−y / 2^k)^(2^k)`` with ``y / 2^k ≤ 1/2``; the alternating Taylor series of
    ``exp(−z)`` brackets it between consecutive partial sums, and each squaring rounds outwards
    with ``k`` guard bits.
    """
    if y == 0:
        return _Iv.exact(1)
    if y >= w:  # exp(−y) < 2^-w
        return _Iv(Fraction(0), Fraction(1, 1 << w))
    k = max(0, y.numerator.bit_length() - y.denominator.bit_length() + 2)
    z = y / (1 << k)
    wk = w + k + 8
    term, total, n = Fraction(1), Fraction(1), 0
    while True:
        n += 1
        term = term * z / n
        prev = total
        total = total - term if n % 2 else total + term
        if term < Fraction(1, 1 << wk):
            break
    iv = _Iv(_down(min(prev, total), wk), _up(max(prev, total), wk))
    for _ in range(k):
        iv = iv.mul(iv, wk)
    return _Iv(_down(iv.lo, w), _up(iv.hi, w))


def _w0_iv(a1: Fraction, a2: Fraction, w: int) -> tuple[_Iv, _Iv]:
    """Enclosures of (w0, 1 − w0) of the step from ``a2`` to ``a1 < a2``."""
    f = exp_neg(a1, w).complement().div(exp_neg(a2, w).complement(), w)
    w0 = exp_neg(a2 - a1, w).mul(f.mul(f, w), w)
    e2 = exp_neg(a2, w).complement()
    num = exp_neg(a2 - a1, w).complement().mul(exp_neg(a1 + a2, w).complement(), w)
    return w0, num.div(e2.mul(e2, w), w)


def _tanh_half(a: Fraction, w: int) -> _Iv:
    """``(1 − p) / (1 + p)`` with ``p = exp(−a)``: the pmf of DLap(p) at 0."""
    p = exp_neg(a, w)
    return p.complement().div(_Iv.exact(1) + p, w)


@functools.lru_cache(maxsize=64)
def _exact_constants(law: Law, w: int) -> tuple[_Iv, ...]:
    """Enclosures of ``(K_L, K_0, K_00, K_M, K_t, K_R)`` at precision ``w``."""
    zero = _Iv.exact(0)
    c = _tanh_half(law.a, w)
    mu_a, nmu_a = (zero, _Iv.exact(1)) if law.a_u is None else _w0_iv(law.a, law.a_u, w)
    if law.a_l is None:
        q = exp_neg(law.a, w)
        k_l = nmu_a.mul(c, w).mul(q.div(q.complement(), w), w)
        return k_l, mu_a + nmu_a.mul(c, w), zero, zero, zero, k_l
    mu_b, nmu_b = _w0_iv(law.a_l, law.a, w)
    c_l = _tanh_half(law.a_l, w)
    cc = nmu_a.mul(nmu_b, w).mul(c.mul(c_l, w), w)
    q = exp_neg(law.s_q, w)
    k_l = cc.mul(q.div(q.complement(), w), w)
    k_m = cc.div(exp_neg(law.s_r, w).complement(), w)
    return (
        k_l,
        mu_a.mul(nmu_b, w).mul(c_l, w),
        mu_a.mul(mu_b, w),
        k_m,
        nmu_a.mul(mu_b, w).mul(c, w),
        k_l,
    )


def _exact_cums(law: Law, t: int, w: int) -> tuple[list[_Iv], _Iv]:
    """Enclosures of the cumulative part weights and the total, as in :func:`_bridge_cums`."""
    k_l, k_0, k_00, k_m, k_t, k_r = _exact_constants(law, w)
    rt = exp_neg(t * law.s_r, w) if law.a_l is not None else _Iv.exact(1)
    c2 = k_l + k_0 + (k_00 if t == 0 else _Iv.exact(0))
    c3 = c2 + k_m.mul(exp_neg((t + 1) * law.s_r, w).complement(), w)
    c4 = c3 + k_t.mul(rt, w)
    return [k_l, c2, c3, c4], c4 + k_r.mul(rt, w)


def _exact_part(law: Law, t: int, u: LazyUniform) -> int:
    """The part ``U1`` selects: the number of thresholds ``c_i / total`` it is above."""
    w = 64
    for _ in range(_MAX_ROUNDS):
        try:
            cums, total = _exact_cums(law, t, w)
        except _Imprecise:
            cums = []
        u_lo, u_hi = u.bounds()
        part: int | None = None if not cums else len(cums)
        for i, c in enumerate(cums):
            if u_lo * total.lo >= c.hi:  # U1 ≥ c / total for certain
                continue
            part = i if u_hi * total.hi <= c.lo else None  # U1 < c / total, or unknown
            break
        if part is not None:
            return part
        u.refine()
        w += 64
    raise RuntimeError("the exact discrete Laplace path did not converge")  # pragma: no cover


def _at_least(g: int, s: Fraction, span: Fraction | None, u: LazyUniform) -> bool:
    """Whether ``⌊E/s⌋ ≥ g`` for ``E = −log(1 − U·Y)``, ``Y = 1 − e^{−span}`` (``Y = 1``
    without a span), i.e. ``U·Y ≥ 1 − e^{−g s}``, decided exactly."""
    w = 64
    for _ in range(_MAX_ROUNDS):
        thr = exp_neg(g * s, w).complement()
        y = _Iv.exact(1) if span is None else exp_neg(span, w).complement()
        u_lo, u_hi = u.bounds()
        if u_lo * y.lo >= thr.hi:
            return True
        if u_hi * y.hi <= thr.lo:
            return False
        u.refine()
        w += 64
    raise RuntimeError("the exact discrete Laplace path did not converge")  # pragma: no cover


def _exact_floor(s: Fraction, span: Fraction | None, u: LazyUniform, guess: int) -> int:
    """The largest ``g`` with ``⌊E/s⌋ ≥ g`` (see :func:`_at_least`): gallop from the float
    guess, then bisect."""
    top = None if span is None else int(span / s)  # a truncated one is below span / s

    def at_least(g: int) -> bool:
        return (top is None or g < top) and _at_least(g, s, span, u)

    lo, hi, step = 0, None, 1
    g = max(0, guess if top is None else min(guess, top - 1))
    if at_least(g):
        lo = g
        while at_least(lo + step):
            lo, step = lo + step, 2 * step
        hi = lo + step
    else:
        hi = g
        while g - step > 0 and not at_least(g - step):
            hi, step = g - step, 2 * step
        lo = max(0, g - step)
    while hi - lo > 1:  # G ≥ lo is certain, G ≥ hi is not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at_least(mid) else (lo, mid)
    return lo


def _guess(u: LazyUniform, s: Fraction, span: Fraction | None) -> int:
    """The float estimate of ``⌊E/s⌋`` the exact search starts from."""
    y = 1.0 if span is None else -math.expm1(-float(span))
    x = -math.log1p(-min(u.num / 2.0**u.bits * y, 1.0 - 2.0**-53)) / float(s)
    return math.floor(min(x, _G_MAX))


def exact_geometric(pl: Plan, uniforms: list[LazyUniform]) -> int:
    """``G`` of :class:`Plan` ``pl`` decided exactly from its uniforms."""
    h = _exact_floor(pl.top, None, uniforms[0], _guess(uniforms[0], pl.top, None))
    g = h << pl.shift
    for u, (m, b) in zip(uniforms[1:], pl.chunks, strict=False):
        sigma = pl.s * 2**m
        span = sigma * 2**b
        g += _exact_floor(sigma, span, u, _guess(u, sigma, span)) << m
    return g


def exact_noise(law: Law, t: int, draws: Draws, index: int) -> int:
    """The noise of one coordinate, decided exactly from its uniforms (extended as needed).

    Parameters
    ----------
    law : Law
        The conditional law.
    t : int
        ``|L − U|`` of the coordinate (0 with no lower neighbour).
    draws : Draws
        The call's draws (their key selects the extension streams).
    index : int
        The coordinate's index in the call.

    Returns
    -------
    int
        The noise ``j`` (before mirroring for ``L < U``), as the float path would give it
        whenever that path is certain.
    """
    part = _exact_part(law, t, draws.lazy(0, index))
    if part in (PART_A0, PART_AT):
        return 0 if part == PART_A0 else t
    pl = plan(law.s_r if part == PART_M else law.s_q)
    g = exact_geometric(pl, [draws.lazy(k, index) for k in range(1, 1 + pl.slots)])
    j = -1 - g if part == PART_L else (g % (t + 1) if part == PART_M else t + 1 + g)
    if abs(j) > LIMIT:  # pragma: no cover - probability below exp(-2^40)
        raise OverflowError("discrete Laplace noise beyond 2^62")
    return j
