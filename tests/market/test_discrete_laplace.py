"""Verification of the exact, lossless discrete Laplace release process (docs/math.md §4.5).

Three kinds of checks: the derivation itself in exact rational arithmetic (no sampling), the
sampler's laws against exact pmfs computed here from the definitions alone (chi-square, fixed
seeds, each with a wrong sampler the same test rejects), and the exactness machinery (the exact
path agrees with the float path bit for bit, and decides boundary cases correctly).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from market import (
    DiscreteLaplace,
    InvalidLevelError,
    InvalidValueError,
    ReleaseChain,
    ReleaseState,
    _dlap,
    default_rng,
    mechanism,
)
from market._draws import Draws, LazyUniform, key_from
from market.codec import decode_state, encode_state
from market.mechanisms import Anchor
from market.rng import NoiseKeys

from .stats import assert_forced_exact_agrees, assert_proportion, binned_p, law_edges, sample

N = 200_000


# ------------------------------------------------------------------ exact pmfs (no kernel)
def c_of(p: float) -> float:
    return (1 - p) / (1 + p)


def dlap_pmf(p: float, j: NDArray[np.int64]) -> NDArray[np.float64]:
    return c_of(p) * p ** np.abs(j).astype(np.float64)


def w0_of(p_noisy: float, p_acc: float) -> float:
    """The claimed atom of the step to the noisier level: (1−p1)² p2 / ((1−p2)² p1)."""
    return (1 - p_noisy) ** 2 * p_acc / ((1 - p_acc) ** 2 * p_noisy)


def step_pmf(p_noisy: float, p_acc: float | None, j: NDArray[np.int64]) -> NDArray[np.float64]:
    """Law of the noise added going from ``p_acc`` (None: the exact value) to ``p_noisy``."""
    w0 = 0.0 if p_acc is None else w0_of(p_noisy, p_acc)
    return w0 * (j == 0) + (1 - w0) * dlap_pmf(p_noisy, j)


def p_of(eps: float, sens: float = 1.0) -> float:
    return math.exp(-eps / sens)


def chi2_p(
    samples: NDArray[np.int64], cells: NDArray[np.int64], probs: NDArray[np.float64]
) -> float:
    """Goodness of fit of ``samples`` (cell ids) to ``probs`` over ``cells``; everything else
    (and every cell expecting fewer than 5) is lumped into one remainder cell."""
    n = samples.shape[0]
    keep = probs * n >= 5
    cells, probs = cells[keep], probs[keep]
    idx = np.searchsorted(cells, samples)
    idx[(idx >= cells.shape[0]) | (cells[np.minimum(idx, cells.shape[0] - 1)] != samples)] = -1
    counts = np.bincount(idx + 1, minlength=cells.shape[0] + 1)
    expected = np.concatenate([[max(1.0 - probs.sum(), 0.0)], probs]) * n
    ok = expected > 0
    assert counts[~ok].sum() == 0, "samples fell where the law has no mass"
    return float(stats.chisquare(counts[ok], expected[ok] * counts.sum() / expected.sum()).pvalue)


def marginal_p(y: NDArray[np.int64], p: float, shift: int = 0) -> float:
    support = np.arange(-60, 61)
    return chi2_p(y - shift, support, dlap_pmf(p, support))


# ------------------------------------------------------------------------ the derivation
def _geo(x: Fraction) -> Fraction:
    return x / (1 - x)


@pytest.mark.parametrize(
    ("p", "p_u", "p_l"),
    [
        (Fraction(1, 3), None, Fraction(1, 2)),  # relaxation (upper = exact value)
        (Fraction(2, 5), Fraction(1, 7), Fraction(3, 4)),  # bridge between two releases
        (Fraction(9, 10), Fraction(8, 9), Fraction(19, 20)),  # close levels
    ],
)
def test_closed_form_conditional_sums_to_the_step_law(
    p: Fraction, p_u: Fraction | None, p_l: Fraction
) -> None:
    """Exact rational check of docs §4.5: the five parts' masses (K·geometric sums) times
    p_l^t add up to P(W1 + W2 = k), the law of the whole step U → L, for every k; and each part
    equals the brute-force sum of P(W1 = j) P(W2 = k − j) over its range. The atoms paired as
    printed in Andersson et al.'s Lemma F.5 (``μ_b`` on ``W1``, ``μ_a`` on ``W2``) do not even
    add up to the step law: the erratum of docs §4.3, on the lattice, in exact arithmetic."""
    c, c_l = (1 - p) / (1 + p), (1 - p_l) / (1 + p_l)

    def w0(pn: Fraction, pa: Fraction) -> Fraction:
        return (1 - pn) ** 2 * pa / ((1 - pa) ** 2 * pn)

    mu_a = Fraction(0) if p_u is None else w0(p, p_u)
    mu_b = w0(p_l, p)
    q, r = p * p_l, p / p_l
    cc = (1 - mu_a) * (1 - mu_b) * c * c_l
    whole = Fraction(0) if p_u is None else w0(p_l, p_u)  # atoms compose: w0 is transitive

    def pw1(j: int) -> Fraction:
        return mu_a * (j == 0) + (1 - mu_a) * c * p ** abs(j)

    def pw2(j: int) -> Fraction:
        return mu_b * (j == 0) + (1 - mu_b) * c_l * p_l ** abs(j)

    mismatch = []
    for t in (0, 1, 2, 7):
        parts = [
            cc * _geo(q),
            mu_a * (1 - mu_b) * c_l + mu_a * mu_b * (t == 0),
            cc * (1 - r ** (t + 1)) / (1 - r),
            (1 - mu_a) * mu_b * c * r**t,
            cc * r**t * _geo(q),
        ]
        step = whole * (t == 0) + (1 - whole) * c_l * p_l**t
        assert sum(parts) * p_l**t == step
        lemma_f5 = [
            parts[0],
            mu_b * (1 - mu_a) * c_l + mu_a * mu_b * (t == 0),
            parts[2],
            (1 - mu_b) * mu_a * c * r**t,
            parts[4],
        ]
        mismatch.append(sum(lemma_f5) * p_l**t != step)
        # brute force (floats: the tails are geometric, 400 terms are plenty)
        brute = [float(pw1(j) * pw2(t - j)) for j in range(-400, 401)]
        left = sum(brute[:400])
        assert math.isclose(left, float(parts[0] * p_l**t), rel_tol=1e-12)
        right = sum(brute[400 + t + 1 :])
        assert math.isclose(right, float(parts[4] * p_l**t), rel_tol=1e-12, abs_tol=1e-300)
    assert any(mismatch)  # (the totals can coincide at one t: c·r^t = c_l at t = 1, case 1)


def test_characteristic_function_identity() -> None:
    """φ_{p1} / φ_{p2} = w0 + (1 − w0) φ_{p1}: the step from p2 to p1 > p2 is w0 δ0 + DLap(p1)."""
    t = np.linspace(-math.pi, math.pi, 101)
    for p1, p2 in ((0.6, 0.2), (0.95, 0.94), (0.3, 1e-6)):
        phi1 = (1 - p1) ** 2 / (1 - 2 * p1 * np.cos(t) + p1**2)
        phi2 = (1 - p2) ** 2 / (1 - 2 * p2 * np.cos(t) + p2**2)
        w0 = w0_of(p1, p2)
        assert 0 < w0 < 1
        np.testing.assert_allclose(phi1 / phi2, w0 + (1 - w0) * phi1, rtol=1e-12)
        a1, a2 = -math.log(p1), -math.log(p2)
        assert math.isclose(w0, (math.sinh(a1 / 2) / math.sinh(a2 / 2)) ** 2, rel_tol=1e-9)


# ---------------------------------------------------------------------- sampled laws
@pytest.mark.parametrize(("eps", "sens"), [(1.0, 1.0), (0.3, 2.0)])
def test_fresh_release_marginal(eps: float, sens: float) -> None:
    """A fresh release has the DLap(exp(−ε/Δ)) pmf; integer dtype, exact integers."""
    x = np.full(N, -7, dtype=np.int64)
    y = DiscreteLaplace(sens).release(x, eps, rng=1)
    assert y.dtype == np.int64
    assert marginal_p(y, p_of(eps, sens), shift=-7) > 1e-3


def test_rounded_continuous_laplace_is_rejected() -> None:
    """round(Lap(Δ/ε)) — the naive sampler — has another pmf, and the same test says so."""
    naive = np.rint(default_rng(2).laplace(0.0, 1.0, N)).astype(np.int64)
    assert marginal_p(naive, p_of(1.0)) < 1e-10
    ours = DiscreteLaplace(1).release(np.zeros(N, dtype=np.int64), 1.0, rng=2)
    assert marginal_p(ours, p_of(1.0)) > 1e-3


class TestRelaxTighten:
    e1, e2 = 0.7, 1.5  # e1 is the noisier level

    def _pair(self, order: tuple[float, float], seed: int) -> tuple[NDArray[np.int64], ...]:
        st = ReleaseState(DiscreteLaplace(1), np.zeros(N, dtype=np.int64))
        rng = default_rng(seed)
        for lv in order:
            st.release(lv, rng=rng)
        return np.asarray(st.get(self.e1)), np.asarray(st.get(self.e2))

    @pytest.mark.parametrize("order", [(0.7, 1.5), (1.5, 0.7)], ids=["relax", "tighten"])
    def test_marginals(self, order: tuple[float, float]) -> None:
        y1, y2 = self._pair(order, 3)
        assert marginal_p(y1, p_of(self.e1)) > 1e-3
        assert marginal_p(y2, p_of(self.e2)) > 1e-3
        assert marginal_p(y2, p_of(self.e2 * 1.05)) < 1e-4  # 5 % off in ε: power check

    @pytest.mark.parametrize("order", [(0.7, 1.5), (1.5, 0.7)], ids=["relax", "tighten"])
    def test_atom(self, order: tuple[float, float]) -> None:
        """P(V1 = V2) = w0 + (1 − w0)·c1, not w0: the DLap part has mass at 0 itself."""
        y1, y2 = self._pair(order, 4)
        p1, p2 = p_of(self.e1), p_of(self.e2)
        w0 = w0_of(p1, p2)
        hits = int((y1 == y2).sum())
        assert_proportion(hits, N, w0 + (1 - w0) * c_of(p1))
        with pytest.raises(AssertionError):
            assert_proportion(hits, N, w0)

    @pytest.mark.parametrize("order", [(0.7, 1.5), (1.5, 0.7)], ids=["relax", "tighten"])
    def test_joint_law(self, order: tuple[float, float]) -> None:
        """Chi-square of the 2-D table of (V1, V2) against P(V2 = b) P(Z = a − b); independent
        releases at the two levels are rejected by the same test."""
        a, b = np.meshgrid(np.arange(-12, 13), np.arange(-12, 13), indexing="ij")
        a, b = a.ravel(), b.ravel()
        p1, p2 = p_of(self.e1), p_of(self.e2)
        probs = dlap_pmf(p2, b) * step_pmf(p1, p2, a - b)
        cells = (a + 100) * 1000 + (b + 100)

        def cell(y1: NDArray[np.int64], y2: NDArray[np.int64]) -> NDArray[np.int64]:
            return (y1 + 100) * 1000 + (y2 + 100)

        y1, y2 = self._pair(order, 5)
        assert chi2_p(cell(y1, y2), cells, probs) > 1e-3
        m, zero = DiscreteLaplace(1), np.zeros(N, dtype=np.int64)
        i1, i2 = m.release(zero, self.e1, rng=6), m.release(zero, self.e2, rng=7)
        assert chi2_p(cell(i1, i2), cells, probs) < 1e-10


@pytest.mark.parametrize("k", [0, 3, -3, 40])
@pytest.mark.parametrize("upper_level", [math.inf, 4.0], ids=["relax", "bridge"])
def test_conditional_given_difference(k: int, upper_level: float) -> None:
    """Given a stored difference k = L − U (zero, positive, negative, far), the new release has
    P(W1 = j | k) ∝ P(W1 = j) P(W2 = k − j), computed here by brute force."""
    e, e_l = 1.2, 0.5
    p, p_l = p_of(e), p_of(e_l)
    p_u = None if math.isinf(upper_level) else p_of(upper_level)
    u = np.full(N, 5, dtype=np.int64)
    new = sample(DiscreteLaplace(1), e, Anchor(upper_level, u), Anchor(e_l, u + k), seed=8 + k)
    out = np.asarray(new.values)
    j = np.arange(-400, 401)
    w = step_pmf(p, p_u, j) * step_pmf(p_l, p, k - j)
    support = np.arange(min(k, 0) - 30, max(k, 0) + 31)
    probs = (step_pmf(p, p_u, support) * step_pmf(p_l, p, k - support)) / w.sum()
    assert chi2_p(out - 5, support, probs) > 1e-3
    assert chi2_p(out - 5, support, probs[::-1]) < 1e-6 or k == 0  # the mirror law is wrong


@pytest.mark.parametrize(
    "order", [(2.0, 0.5, 1.0), (0.5, 2.0, 1.0), (1.0, 0.5, 2.0)], ids=["bridge", "bridge2", "mix"]
)
def test_three_levels_joint_law(order: tuple[float, float, float]) -> None:
    """Three levels released in any order (fresh, tighten, relax, bridge) have the joint law
    of the forward chain: chi-square on the 3-D table; independent releases are rejected."""
    lv = sorted(order)
    p = [p_of(x) for x in lv]
    a, b, c = (g.ravel() for g in np.meshgrid(*[np.arange(-8, 9)] * 3, indexing="ij"))
    probs = dlap_pmf(p[2], c) * step_pmf(p[1], p[2], b - c) * step_pmf(p[0], p[1], a - b)
    cells = ((a + 50) * 100 + (b + 50)) * 100 + (c + 50)

    def cell(ys: dict[float, NDArray[np.int64]]) -> NDArray[np.int64]:
        y0, y1, y2 = (np.clip(ys[x], -45, 45) for x in lv)
        return ((y0 + 50) * 100 + (y1 + 50)) * 100 + (y2 + 50)

    st = ReleaseState(DiscreteLaplace(1), np.zeros(N, dtype=np.int64))
    rng = default_rng(9)
    for x in order:
        st.release(x, rng=rng)
    assert chi2_p(cell({x: np.asarray(v) for x, v in st}), cells, probs) > 1e-3
    m = DiscreteLaplace(1)
    indep = {x: m.release(np.zeros(N, dtype=np.int64), x, rng=10 + i) for i, x in enumerate(lv)}
    assert chi2_p(cell(indep), cells, probs) < 1e-10


def test_equal_neighbours_keep_atom_atom_mass() -> None:
    """Unlike the continuous bridge, k = 0 between two releases does not pin the new release:
    the atom-atom event competes with the other parts at the same order."""
    u = np.zeros(N, dtype=np.int64)
    out = np.asarray(sample(DiscreteLaplace(1), 1.0, Anchor(2.0, u), Anchor(0.5, u), 11).values)
    p, p_u, p_l = p_of(1.0), p_of(2.0), p_of(0.5)
    j = np.arange(-400, 401)
    w = step_pmf(p, p_u, j) * step_pmf(p_l, p, -j)
    assert_proportion(int((out == 0).sum()), N, float(w[400] / w.sum()))
    assert 0.0 < float((out != 0).mean()) < 0.5


# ------------------------------------------------------------------------- joint privacy
def _cell_log_ratios(
    pu: tuple[NDArray[np.int64], NDArray[np.int64]],
    pv: tuple[NDArray[np.int64], NDArray[np.int64]],
) -> list[tuple[float, float]]:
    """(log P_v(cell)/P_u(cell), its standard error) for every cell (y1, y2) seen ≥ 400 times."""

    def counts(p: tuple[NDArray[np.int64], NDArray[np.int64]]) -> NDArray[np.int64]:
        y1, y2 = (np.clip(y, -20, 20) + 20 for y in p)
        return np.bincount(y1 * 41 + y2, minlength=41 * 41)

    cu, cv = counts(pu), counts(pv)
    ok = np.minimum(cu, cv) >= 400
    return [
        (math.log(v / u), math.sqrt(1 / u + 1 / v))
        for u, v in zip(cu[ok].tolist(), cv[ok].tolist(), strict=True)
    ]


@pytest.mark.slow
def test_joint_privacy_of_two_releases() -> None:
    """For neighbouring inputs 0 and Δ = 1, every cell of (y1, y2) has probability ratio at
    most e^{ε2}; independent releases at ε1 and ε2 reach e^{ε1 + ε2} and are flagged."""
    e1, e2, n = 1.0, 2.0, 1_000_000
    m = DiscreteLaplace(1)

    def lossless(u: int, seed: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        st = ReleaseState(m, np.full(n, u, dtype=np.int64))
        g = default_rng(seed)
        return np.asarray(st.release(e1, rng=g)), np.asarray(st.release(e2, rng=g))

    def independent(u: int, seed: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        x = np.full(n, u, dtype=np.int64)
        return m.release(x, e1, rng=seed), m.release(x, e2, rng=seed + 100)

    ok = _cell_log_ratios(lossless(0, 20), lossless(1, 21))
    assert len(ok) > 20
    worst = max(abs(r) - 3 * se for r, se in ok)
    assert worst <= e2, f"lossless release exceeds ε2: {worst:.3f}"
    bad = _cell_log_ratios(independent(0, 22), independent(1, 23))
    assert max(abs(r) - 3 * se for r, se in bad) > e2 + 0.5, "independent sampler not detected"


# ------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize(
    ("level", "upper", "lower", "sens"),
    [
        (1.0, math.inf, None, 1),
        (0.4, 3.0, None, 1),
        (1.5, math.inf, 0.7, 1),
        (1.0, 3.0, 0.25, 1),
        (2.5, 7.0, 0.5, 3),
        (650.0, math.inf, 0.5, 1),
    ],
    ids=["fresh", "tighten", "relax", "bridge", "bridge-sens3", "relax-extreme"],
)
def test_exact_path_agrees_bit_for_bit(
    level: float,
    upper: float,
    lower: float | None,
    sens: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forcing (nearly) every coordinate through the rational path changes no outcome: the
    float path only decides what is certain, and both compute the same inverse CDF (also at
    ε/Δ near the largest allowed, 700, where e^{−a} is near the bottom of the doubles)."""
    n = 1500
    g = default_rng(12)
    u = g.integers(-50, 50, n)
    lo = None if lower is None else u + g.integers(-6, 7, n)
    law = DiscreteLaplace(sens)._law(level, upper, lower)
    draws = Draws(key_from(default_rng(13)), n, _dlap.slots(law))
    assert_forced_exact_agrees(law, u, lo, draws, monkeypatch)


def test_exp_enclosures_against_decimal() -> None:
    getcontext().prec = 120
    for y in (
        Fraction(0),
        Fraction(1, 3),
        Fraction(7, 2),
        Fraction(2**53 + 1, 2**50),
        Fraction(50),
    ):
        iv = _dlap.exp_neg(y, 200)
        ref = (-Decimal(y.numerator) / Decimal(y.denominator)).exp()
        assert Decimal(iv.lo.numerator) / Decimal(iv.lo.denominator) <= ref
        assert ref <= Decimal(iv.hi.numerator) / Decimal(iv.hi.denominator)
        assert iv.hi - iv.lo < Fraction(1, 2**190)
    assert _dlap.exp_neg(Fraction(500), 64).hi <= Fraction(1, 2**64)


def test_undecided_geometric_is_decided_exactly() -> None:
    """A uniform whose 64-bit word straddles a threshold 1 − e^{−g s}: the float pass refuses
    to decide, the exact path extends the uniform with its extension words and returns
    floor(−log(1 − U)/s) of the extended U (checked with 120-digit decimals), which is g − 1 or
    g depending on those further bits (both occur over twenty keys)."""
    getcontext().prec = 120
    s, g = Fraction(3, 10), 7
    thr = _dlap.exp_neg(g * s, 200).complement()  # encloses 1 − e^{−g s} within 2^-200
    word = math.floor(thr.lo * 2**64)
    assert Fraction(word, 2**64) <= thr.lo < thr.hi < Fraction(word + 1, 2**64)
    pl = _dlap.plan(s)
    _, und = _dlap._geometric([np.array([word], dtype=np.uint64)], pl, _dlap.ETA)
    assert und[0]
    seen = set()
    for key in range(20):
        lazy = LazyUniform(word, bytes([key]) * 32, 1, 0)
        got = _dlap.exact_geometric(pl, [lazy])
        assert lazy.bits > 64  # more bits were needed
        lo, hi = lazy.bounds()
        for bound in (lo, hi - Fraction(1, 2**400)):
            e = -(1 - Decimal(bound.numerator) / Decimal(bound.denominator)).ln()
            assert int(e / (Decimal(s.numerator) / Decimal(s.denominator))) == got
        seen.add(got)
    assert seen == {g - 1, g}


def test_digit_groups_of_a_tiny_geometric() -> None:
    """For ``s < 2⁻²⁰`` (a fine grid) ``G = 2^M·H + Σ_i 2^{m_i}·R_i``, one uniform each
    (docs/protocol.md §1.4): ``G`` has the law Geom(e^{−s}), ``H`` is Geom(e^{−s·2^M}), each
    digit group is the truncated geometric of ratio ``e^{−s·2^{m_i}}``, and the groups are
    independent. Digit groups drawn from one shared uniform (a plausible slot mix-up) have the
    same marginals but are rejected by the independence test."""
    s = Fraction(3, 2**47)
    pl = _dlap.plan(s)
    assert len(pl.chunks) == 2
    (m0, b0), (m1, b1) = pl.chunks
    assert m0 == 0 and m1 == b0 and pl.shift == b0 + b1
    draws = Draws(key_from(default_rng(15)), N, pl.slots)
    words = [draws.slot(k) for k in range(pl.slots)]

    def digits(ws: list[NDArray[np.uint64]]) -> tuple[NDArray[np.int64], ...]:
        g, und = _dlap._geometric(ws, pl, _dlap.ETA)
        assert int(und.sum()) < 10
        g = g[~und]
        return g, g & (2**b0 - 1), (g >> m1) & (2**b1 - 1), g >> pl.shift

    def geom_cdf(ratio: float, span: float | None = None) -> Callable[..., NDArray[np.float64]]:
        norm = 1.0 if span is None else -math.expm1(-span)

        def cdf(e: NDArray[np.int64]) -> NDArray[np.float64]:
            x = -np.expm1(-ratio * (np.asarray(e, np.float64) + 1.0)) / norm
            return np.clip(np.where(np.asarray(e) < 0, 0.0, x), 0.0, 1.0)

        return cdf

    g, r0, r1, h = digits(words)
    for x, cdf in (
        (g, geom_cdf(float(s))),
        (h, geom_cdf(float(s * 2**pl.shift))),
        (r0, geom_cdf(float(s), float(s * 2**b0))),
        (r1, geom_cdf(float(s * 2**m1), float(s * 2**m1 * 2**b1))),
    ):
        assert binned_p(x, law_edges(cdf, 32), cdf) > 1e-3

    def independence_p(a: NDArray[np.int64], b: NDArray[np.int64]) -> float:
        """Contingency test on 8 x 8 cells (octiles of each)."""
        cells = [np.searchsorted(np.quantile(x, np.arange(1, 8) / 8), x) for x in (a, b)]
        table = np.zeros((8, 8))
        np.add.at(table, (cells[0], cells[1]), 1)
        return float(stats.chi2_contingency(table)[1])

    assert independence_p(r0, r1) > 1e-3
    assert independence_p(r1, h) > 1e-3
    _, shared0, shared1, _ = digits([words[0], words[1], words[1]])
    assert independence_p(shared0, shared1) < 1e-10


def test_each_coordinate_reads_only_its_own_words() -> None:
    """A coordinate's noise is a function of its own words and data: changing the other
    coordinates' data changes nothing else, and the joined draws of several requests (the
    chain's batches) give each request exactly its own release, on the float path and on the
    forced exact path (which reads each coordinate's extension words by its own key)."""
    m, n = DiscreteLaplace(1), 4000
    law = m._law(1.0, math.inf, 0.5)
    g = default_rng(14)
    u = np.zeros(n, dtype=np.int64)
    lo = g.integers(-5, 6, n)
    draws = Draws(key_from(g), n, _dlap.slots(law))
    out0, out1 = np.empty(n, np.int64), np.empty(n, np.int64)
    _dlap.sample_into(out0, u, lo, law, draws)
    lo2 = lo.copy()
    lo2[::2] += 50  # far: other parts for the even coordinates
    _dlap.sample_into(out1, u, lo2, law, draws)
    assert np.array_equal(out0[1::2], out1[1::2])
    assert not np.array_equal(out0[::2], out1[::2])
    sizes = [700, 1, 1300]
    keys = [key_from(g) for _ in sizes]
    parts = [Draws(k, s, _dlap.slots(law)) for k, s in zip(keys, sizes, strict=True)]
    joined = Draws.joined(parts)
    cut = np.cumsum([0, *sizes])
    lo3 = lo[: cut[-1]]
    for margins in ((_dlap.MARGIN, _dlap.ETA), (1.0, 1.0)):
        together = np.empty(cut[-1], np.int64)
        _dlap.sample_into(together, u[: cut[-1]], lo3, law, joined, *margins)
        for i, d in enumerate(parts):
            alone = np.empty(sizes[i], np.int64)
            _dlap.sample_into(alone, u[cut[i] : cut[i + 1]], lo3[cut[i] : cut[i + 1]], law, d)
            assert np.array_equal(together[cut[i] : cut[i + 1]], alone), (i, margins)


# --------------------------------------------------------------------------- integration
def test_chain_codec_and_registry() -> None:
    m = mechanism("discrete_laplace", 2)
    assert isinstance(m, DiscreteLaplace) and m == DiscreteLaplace(2.0)
    chain = ReleaseChain(m, [0.5, 1.0, 2.0])
    keys = NoiseKeys(b"s" * 32)
    a, b = chain.open([3, -4, 0]), chain.open([3, -4, 0])
    y2 = chain.release([a], 2, [("v",)], keys)[0]
    assert np.array_equal(chain.release([b], 2, [("v",)], keys)[0], y2)
    assert y2.dtype == np.int64
    st = ReleaseState(m, [3, -4, 0])
    st.release(1.0, rng=1)
    st.release(0.5, rng=2)
    assert decode_state(encode_state(st)).equals(st)


def test_validation() -> None:
    """Integer sensitivities and values only; levels with 2^-48 ≤ ε/Δ ≤ 700."""
    with pytest.raises(InvalidValueError):
        DiscreteLaplace(1.5)
    with pytest.raises(InvalidValueError):
        DiscreteLaplace(1).release([1.5], 1.0, rng=1)
    with pytest.raises(InvalidValueError):
        DiscreteLaplace(1).release([2**60], 1.0, rng=1)
    with pytest.raises(InvalidLevelError):
        DiscreteLaplace(10**6).release([1], 1e-9, rng=1)  # ε/Δ = 10^-15 < 2^-48
    with pytest.raises(InvalidLevelError):
        DiscreteLaplace(1).release([1], 701.0, rng=1)  # ε/Δ > 700
    assert DiscreteLaplace(1).release([1, -2], 700.0, rng=1).tolist() == [1, -2]
    assert DiscreteLaplace(10**9).release([0], 4e-6, rng=1).dtype == np.int64  # ε/Δ ≈ 2^-47.8
    assert math.isclose(DiscreteLaplace(1).variance(1.0), 2 * math.e / (math.e - 1) ** 2)


def test_a_middle_part_geometric_beyond_int64_goes_to_the_exact_path() -> None:
    """Relaxing between levels 2⁻⁷⁰ apart (ε/D near 2⁻⁴⁰) plans the middle part's geometric in
    M = 50 digits: the float pass built ``H << M`` in int64 and wrapped. Such coordinates are now
    left to the exact path (found by the review of noise format v2)."""
    from market._draws import Draws

    a_l = Fraction(1, 2**40)
    law = _dlap.Law(a_l + Fraction(1, 2**70), None, a_l)
    n, t = 4000, 2**60
    upper, lower = np.zeros(n, dtype=np.int64), np.full(n, t, dtype=np.int64)
    draws = Draws(bytes(range(32)), n, _dlap.slots(law))
    fast = np.empty(n, dtype=np.int64)
    _dlap.sample_into(fast, upper, lower, law, draws)
    middle = [i for i in range(n) if _dlap._exact_part(law, t, draws.lazy(0, i)) == _dlap.PART_M]
    assert middle  # the case is exercised
    assert all(int(fast[i]) == _dlap.exact_noise(law, t, draws, i) for i in middle)
