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
by inversion and one uniform ``U2`` gives ``G = floor(−log(1 − U2) / s)`` with
``ratio = exp(−s)``: ``s`` is an exact rational (``ε/Δ`` sums and differences).

**Exactness.** The outcome is defined as that of the inverse CDF applied to *infinitely
precise* uniforms ``U1, U2``; nothing else. Each is drawn as a 53-bit prefix (numpy's
``random()``), which pins it to an interval of width 2^-53. The float pass decides a coordinate
only when the whole interval lies, with a safety margin far above the float rounding errors
(2^-32 of the total weight for the part, 2^-40 relative for ``G``; the formulas are accurate to
better than 2^-41), on one side of every threshold. The rare undecided coordinate (probability
about 10^-9) goes to :func:`exact_noise`, which extends the uniforms with more random bits and
compares them with rational interval enclosures of the thresholds (:class:`_Iv`: exact
:class:`~fractions.Fraction` arithmetic rounded outwards) at increasing precision until the
comparison is certain. Either way the result is the exact inverse-CDF outcome, so the float
path never changes an outcome: forcing every coordinate through the exact path gives the same
vector bit for bit (tested).

The extra bits of coordinate ``i`` come from AES-CTR keyed by 128 bits drawn from the caller's
generator once per call, at counter ``(2 i + stage) · 2^64``: a call always consumes exactly
``2n`` uniforms and one key from the caller's generator, and a coordinate's outcome does not
depend on which other coordinates needed the exact path.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray
from randomgen import AESCounter

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

    @property
    def s_q(self) -> Fraction:
        """``−log q`` of the outer geometric parts (``q = p p_l``, or ``p`` with no lower)."""
        return self.a if self.a_l is None else self.a + self.a_l

    @property
    def s_r(self) -> Fraction:
        """``−log r`` of the middle part (``r = p / p_l``); 1 when there is no middle part."""
        return Fraction(1) if self.a_l is None else self.a - self.a_l


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


# ------------------------------------------------------------------------------ fast path
def sample_into(
    out: NDArray[np.int64],
    upper: NDArray[np.int64],
    lower: NDArray[np.int64] | None,
    law: Law,
    rng: np.random.Generator,
    margin: float = MARGIN,
    eta: float = ETA,
) -> None:
    """Write a sample of the conditional law into ``out`` (int64, length of ``upper``).

    ``margin`` and ``eta`` are test hooks: large ones send coordinates through the exact
    path, which must not change any outcome.
    """
    key = int.from_bytes(rng.bytes(16), "little")
    cst = float_constants(law)
    n = int(out.shape[0])
    for start in range(0, n, BLOCK):
        sl = slice(start, min(start + BLOCK, n))
        r = rng.random(2 * (sl.stop - start))
        lo = None if lower is None else lower[sl]
        _block(out[sl], upper[sl], lo, law, cst, r, (margin, eta))
        for i in np.flatnonzero(out[sl] == _UNDECIDED):
            _exact_coordinate(out, upper, lower, law, r, key, start, int(i))


_UNDECIDED = np.iinfo(np.int64).min  # marker of coordinates left to the exact path


def _exact_coordinate(
    out: NDArray[np.int64],
    upper: NDArray[np.int64],
    lower: NDArray[np.int64] | None,
    law: Law,
    r: NDArray[np.float64],
    key: int,
    start: int,
    i: int,
) -> None:
    """Fill the undecided coordinate ``start + i`` from the exact path."""
    b = r.shape[0] // 2
    k = start + i
    diff = 0 if lower is None else int(lower[k]) - int(upper[k])
    j = exact_noise(law, abs(diff), float(r[i]), float(r[b + i]), key, k)
    out[k] = int(upper[k]) + (-j if diff < 0 else j)


def _block(
    o: NDArray[np.int64],
    up: NDArray[np.int64],
    lo: NDArray[np.int64] | None,
    law: Law,
    cst: Constants,
    r: NDArray[np.float64],
    margins: tuple[float, float],
) -> None:
    """One block of :func:`sample_into`; undecided coordinates get :data:`_UNDECIDED`.

    The same numpy operations run for every coordinate whichever part it falls in; the only
    Python branch is on the (public) presence of a lower neighbour.
    """
    b = int(o.shape[0])
    u1, u2 = r[:b], r[b:]
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
    part, undecided = _choose_part(u1, cums, total, margins[0])
    g, und_g = _geometric(u2, part, cst, law.a_l is not None, margins[1])
    undecided |= und_g & (part != PART_A0) & (part != PART_AT)
    g1 = g.astype(np.int64)
    g1 += 1  # 1 + G: the distance of the outer parts from their atoms
    # j = −(1 + G) | 0 | G mod (t + 1) | t | t + (1 + G), by 0/1 indicators (no gather)
    j = (part == PART_R) * g1
    j -= (part == PART_L) * g1
    if lo is not None:
        g1 -= 1
        g1 %= t + 1
        j += (part == PART_M) * g1
        j += (part >= PART_AT) * t
        j *= sgn
    np.add(up, j, out=o)
    np.copyto(o, _UNDECIDED, where=undecided)


Cums = tuple[float | NDArray[np.float64], ...]


def _fresh_cums(cst: Constants) -> tuple[Cums, float]:
    c1 = cst.k_l
    c2 = c1 + cst.k_0
    return (c1, c2, c2, c2), c2 + cst.k_r


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
    x = u1 * total
    m = np.multiply(total, margin)
    lo = x - m
    hi = x + (m + np.multiply(total, _U53))
    part = np.zeros(u1.shape[0], dtype=np.int8)
    part_hi = np.zeros(u1.shape[0], dtype=np.int8)
    for c in cums:
        part += lo >= c  # U1 ≥ c / total for certain
        part_hi += hi > c  # U1 < c / total is not certain
    return part, part != part_hi


def _geometric(
    u2: NDArray[np.float64], part: NDArray[np.int8], cst: Constants, bridge: bool, eta: float
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """``G = floor(E / s)``, ``E = −log(1 − U2)``, and where that floor is not certain."""
    e = np.log1p(-u2)
    e *= -1.0
    de = np.divide(2.0 * _U53, 1.0 - u2)  # E(u2 + 2^-53) − E(u2) ≤ de when 1 − u2 ≥ 2^-52
    inv_s = np.where(part == PART_M, cst.inv_s_r, cst.inv_s_q) if bridge else cst.inv_s_q
    x_lo = e * inv_s
    x_lo *= 1.0 - eta
    x_hi = e + de
    x_hi *= inv_s
    x_hi *= 1.0 + eta
    np.minimum(x_lo, _G_MAX, out=x_lo)
    g = np.floor(x_lo)
    undecided = np.floor(x_hi) != g
    undecided |= x_hi >= _G_MAX
    undecided |= u2 > 1.0 - 2.0 * _U53
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


class _LazyUniform:
    """A uniform in [0, 1) known to ``bits`` binary digits, extended on demand."""

    def __init__(self, prefix: float, key: int, stream: int) -> None:
        self.num, self.bits = int(prefix * 2.0**53), 53
        self._key, self._stream = key, stream
        self._gen: AESCounter | None = None

    def bounds(self) -> tuple[Fraction, Fraction]:
        """``[lo, hi)`` holding the uniform."""
        return Fraction(self.num, 1 << self.bits), Fraction(self.num + 1, 1 << self.bits)

    def refine(self) -> None:
        """Draw 64 more bits (from this coordinate's own AES-CTR stream)."""
        if self._gen is None:
            self._gen = AESCounter(key=self._key, counter=self._stream << 64)
        self.num = (self.num << 64) | int(self._gen.random_raw())
        self.bits += 64


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


def _exact_part(law: Law, t: int, u: _LazyUniform) -> int:
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


def _at_least(g: int, s: Fraction, u: _LazyUniform) -> bool:
    """Whether ``G ≥ g``, i.e. ``1 − U2 ≤ exp(−g s)``, decided exactly."""
    w = 64
    for _ in range(_MAX_ROUNDS):
        e = exp_neg(g * s, w)
        u_lo, u_hi = u.bounds()
        if 1 - u_lo <= e.lo:
            return True
        if 1 - u_hi >= e.hi:
            return False
        u.refine()
        w += 64
    raise RuntimeError("the exact discrete Laplace path did not converge")  # pragma: no cover


def _exact_geometric(s: Fraction, u: _LazyUniform, guess: int) -> int:
    """The largest ``g`` with ``G ≥ g``: gallop from the float guess, then bisect."""
    lo, hi, step = 0, None, 1
    g = max(0, guess)
    if _at_least(g, s, u):
        lo = g
        while _at_least(lo + step, s, u):
            lo, step = lo + step, 2 * step
        hi = lo + step
    else:
        hi = g
        while g - step > 0 and not _at_least(g - step, s, u):
            hi, step = g - step, 2 * step
        lo = max(0, g - step)
    while hi - lo > 1:  # G ≥ lo is certain, G ≥ hi is not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _at_least(mid, s, u) else (lo, mid)
    return lo


def exact_noise(law: Law, t: int, u1: float, u2: float, key: int, index: int) -> int:
    """The noise of one coordinate, decided exactly from the uniforms' 53-bit prefixes.

    Parameters
    ----------
    law : Law
        The conditional law.
    t : int
        ``|L − U|`` of the coordinate (0 with no lower neighbour).
    u1, u2 : float
        The 53-bit prefixes of the part and geometric uniforms.
    key : int
        The call's 128-bit key of the extension streams.
    index : int
        The coordinate's index in the call (selects its extension streams).

    Returns
    -------
    int
        The noise ``j`` (before mirroring for ``L < U``), as the float path would give it
        whenever that path is certain.
    """
    part = _exact_part(law, t, _LazyUniform(u1, key, 2 * index))
    if part in (PART_A0, PART_AT):
        return 0 if part == PART_A0 else t
    s = law.s_r if part == PART_M else law.s_q
    guess = math.floor(min(-math.log1p(-u2) / float(s), _G_MAX))
    g = _exact_geometric(s, _LazyUniform(u2, key, 2 * index + 1), guess)
    j = -1 - g if part == PART_L else (g % (t + 1) if part == PART_M else t + 1 + g)
    if abs(j) > LIMIT:  # pragma: no cover - probability below exp(-2^40)
        raise OverflowError("discrete Laplace noise beyond 2^62")
    return j
