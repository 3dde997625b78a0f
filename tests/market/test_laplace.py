"""Statistical and exactness verification of the lattice Laplace release process (format v2).

``Laplace(Δ, d)`` releases ``g·n`` with ``n = round(x/g) + J`` on the grid ``g = 2^k``,
``k = ⌊log₂(Δ/d)⌋ − 12``, and ``J`` discrete Laplace of ``a = ε/D``, ``D = ⌊Δ/g⌋ + d``. The
right reference for every law is therefore the exact discrete law on the grid
(:mod:`tests.market.stats`, written from ``docs/math.md`` §4.5 alone), not the continuous
Laplace: on a fine grid a KS test against the continuous law has no power to tell them apart,
so it would pass for a wrong lattice law too. Each law is checked by a chi-square over
quantile cells of the exact CDF (with cells of their own for the atoms), and each test also runs
a plausible wrong sampler the same test rejects.

A vector of n i.i.d. coordinates released through one ``ReleaseState`` gives n independent
draws of the whole joint law at once (its grid follows from its dimension n, so these tests
run on a fine grid, ``2^-30`` for n = 2·10^5); tests of the coarse-grid regime, where the lattice
law visibly differs from the continuous one, call the mechanism directly.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from market import Laplace, ReleaseState, _dlap, default_rng
from market._draws import Draws, key_from
from market.mechanisms import Anchor, Mechanism, _LatticeLaplace

from .stats import (
    assert_close_z,
    assert_forced_exact_agrees,
    assert_proportion,
    binned_p,
    conditional_cdf,
    dlap_cdf,
    dlap_numpy,
    law_edges,
    sample,
    step_cdf,
    step_numpy,
    w0,
)

N = 200_000


def ratio(mech: Mechanism, level: float) -> float:
    """``a = ε/D`` of a level, as a float (the sampler uses the exact rational)."""
    assert isinstance(mech, _LatticeLaplace)
    return float(mech.ratio(level))


def lattice(st: ReleaseState, level: float) -> NDArray[np.int64]:
    """The lattice integers of a stored release."""
    return np.asarray(st.point(level).values)


def dlap_p(n: NDArray[np.int64], a: float, cells: int = 40) -> float:
    """Chi-square p-value of lattice noise ``n`` against DLap(e^{−a}) (the atom 0 its own cell)."""
    cdf = functools.partial(dlap_cdf, a)
    return binned_p(n, law_edges(cdf, cells, atoms=(0,)), cdf)


def unchanged(a1: float, a2: float) -> float:
    """``P(release at a1 = release at a2)`` for ``a1 < a2``: the atom ``w0`` plus the mass
    of ``DLap(a1)`` at 0, ``tanh(a1/2)``."""
    m = w0(a1, a2)
    return m + (1 - m) * math.tanh(a1 / 2)


# --------------------------------------------------------------------------------- the grid
def test_grid_units_and_encoding() -> None:
    """The grid exponent and ``D`` follow the documented formulas, the exact value is rounded
    half to even, and a release is ``g·n`` exactly (an integer multiple of ``g``)."""
    m = Laplace(1.0, dimension=3)  # Δ/d = 1/3: ⌊log₂⌋ = −2, k = −14
    assert m.grid_exponent == -14 and m.units() == 2**14 + 3
    assert Laplace(2.0).grid_exponent == -11 and Laplace(2.0).units() == 4097
    g = 2.0**-14
    x = np.array([0.5, 1.5, 2.5, -0.5, 0.7, -0.3, 1e3]) * g
    assert m.origin(x).values.tolist() == [0, 2, 2, 0, 1, 0, 1000]
    st = ReleaseState(Laplace(1.0), np.full(1000, 0.123))
    assert st.mechanism == Laplace(1.0, dimension=1000)  # the state binds the dimension
    y = st.release(1.0, rng=1)
    k = st.mechanism.grid_exponent
    assert np.array_equal(y, np.ldexp(lattice(st, 1.0).astype(np.float64), k))
    assert np.array_equal(np.ldexp(y, -k), np.rint(np.ldexp(y, -k)))


# --------------------------------------------------------------------------- relaxation
class TestRelax:
    e1, e2 = 1.0, 2.5

    def _pair(self, seed: int) -> ReleaseState:
        st = ReleaseState(Laplace(1.0), np.zeros(N))
        rng = default_rng(seed)
        st.release(self.e1, rng=rng)
        st.release(self.e2, rng=rng)
        return st

    def test_marginals_are_single_release_laws(self) -> None:
        """Each release of a relaxation is a fresh release's law: DLap(ε/D) on the grid."""
        st = self._pair(1)
        for lv in (self.e1, self.e2):
            assert dlap_p(lattice(st, lv), ratio(st.mechanism, lv)) > 1e-3, lv

    def test_wrong_scale_is_detected(self) -> None:
        """Power check: the same test rejects a law 3 % off in scale."""
        st = self._pair(1)
        assert dlap_p(lattice(st, self.e2), ratio(st.mechanism, self.e2) / 1.03) < 1e-6

    def test_atom_probability(self) -> None:
        """P(Y1 = Y2) = w0 + (1 − w0)·tanh(a1/2), w0 = (sinh(a1/2)/sinh(a2/2))² ≈ (ε1/ε2)²."""
        st = self._pair(2)
        a1, a2 = (ratio(st.mechanism, lv) for lv in (self.e1, self.e2))
        hits = int((lattice(st, self.e1) == lattice(st, self.e2)).sum())
        assert_proportion(hits, N, unchanged(a1, a2))

    def test_correlation(self) -> None:
        """Y1 = Y2 + independent noise, so corr = sqrt(Var Y2 / Var Y1) (≈ ε1/ε2)."""
        st = self._pair(3)
        y1, y2 = (np.asarray(st.get(lv)) for lv in (self.e1, self.e2))
        r = float(np.corrcoef(y1, y2)[0, 1])
        m = st.mechanism
        # var of the sample correlation of heavy-ish tailed pairs; 0.01 is ~5 SE at n=2e5
        assert abs(r - math.sqrt(m.variance(self.e2) / m.variance(self.e1))) < 0.01

    @pytest.mark.parametrize("x0", [0.3, -1.7, 4.0])
    @pytest.mark.parametrize("upper", [math.inf, 4.0], ids=["relax", "bridge"])
    def test_conditional_law_given_stored_noise(self, upper: float, x0: float) -> None:
        """Given the difference ``k = L − U`` (``x0`` in value units) of the neighbours, the new
        release has ``P(j | k) ∝ P(W1 = j)·P(W2 = k − j)`` exactly: for a relaxation the
        lattice form of Koufogiannis's Algorithm 1 (keep ``k``, or a piece left of 0, between 0
        and ``k``, or beyond it), for a bridge with the second atom (keep ``U``) too. The mirror
        law, and the law that ignores ``L`` (a fresh release or a tightening), are rejected."""
        m = Laplace(1.0)  # one coordinate per value: the grid 2^-12
        a1, a2 = ratio(m, self.e1), ratio(m, self.e2)
        a_u = None if math.isinf(upper) else ratio(m, upper)
        k = round(x0 / 2.0**m.grid_exponent)
        u = np.asarray(m.origin(np.full(N, 0.25)).values)
        out = sample(m, self.e2, Anchor(upper, u), Anchor(self.e1, u + k), seed=4)
        j = np.asarray(out.values) - u
        cdf = conditional_cdf(a2, a_u, a1, k)
        edges = law_edges(cdf, 40, atoms=(0, k))
        assert binned_p(j, edges, cdf) > 1e-3
        assert binned_p(j, edges, conditional_cdf(a2, a_u, a1, -k)) < 1e-6
        assert binned_p(j, edges, functools.partial(step_cdf, a2, a_u)) < 1e-6

    def test_exact_zero_stored_noise(self) -> None:
        """A stored noise of exactly 0: the release keeps 0 w.p. c2 (w0 + (1 − w0) c1)/c1
        (≈ ε1/ε2, as for the continuous law), otherwise ±(1 + Geom(e^{−(a1+a2)})), fair sign."""
        m = Laplace(1.0)
        a1, a2 = ratio(m, self.e1), ratio(m, self.e2)
        zero = np.zeros(N)
        out = sample(m, self.e2, m.origin(zero), Anchor(self.e1, np.zeros(N, np.int64)), seed=5)
        j = np.asarray(out.values)
        c1, c2, mu = math.tanh(a1 / 2), math.tanh(a2 / 2), w0(a1, a2)
        p0 = c2 * (mu + (1 - mu) * c1) / c1
        assert abs(p0 - self.e1 / self.e2) < 1e-3
        assert_proportion(int((j == 0).sum()), N, p0)
        moved = j[j != 0]
        assert_proportion(int((moved > 0).sum()), moved.shape[0], 0.5)

        def geom_cdf(s: float, g: NDArray[np.int64]) -> NDArray[np.float64]:
            return np.where(g < 0, 0.0, -np.expm1(-s * (np.asarray(g, np.float64) + 1)))

        cdf = functools.partial(geom_cdf, a1 + a2)
        assert binned_p(np.abs(moved) - 1, law_edges(cdf, 30), cdf) > 1e-3
        wrong = functools.partial(geom_cdf, a2)  # the fresh law's tail: rejected
        assert binned_p(np.abs(moved) - 1, law_edges(cdf, 30), wrong) < 1e-6

    def test_long_chain(self) -> None:
        """Twenty relaxation steps: every marginal stays exact; atoms compose along the chain
        (w0 is transitive), so P(Y_first = Y_last) is the one-step formula."""
        levels = list(np.geomspace(0.2, 5.0, 20))
        st = ReleaseState(Laplace(2.0), np.full(N, 10.0))
        rng = default_rng(6)
        for lv in levels:
            st.release(lv, rng=rng)
        m = st.mechanism
        assert isinstance(m, Laplace)
        centre = int(np.ldexp(10.0, -m.grid_exponent))
        for lv in st.levels:
            assert dlap_p(lattice(st, lv) - centre, ratio(m, lv)) > 1e-4, lv
        lo, hi = st.levels[0], st.levels[-1]
        hits = int((lattice(st, lo) == lattice(st, hi)).sum())
        assert_proportion(hits, N, unchanged(ratio(m, lo), ratio(m, hi)))


# ---------------------------------------------------------------------------- tightening
def test_tightening_from_most_private_release() -> None:
    """Eq. (25) on the lattice: below every release, keep w.p. w0, else add DLap(a1); the
    marginal is DLap(a1), and the moved difference is DLap(a1) given ≠ 0."""
    st = ReleaseState(Laplace(1.0), np.zeros(N))
    rng = default_rng(7)
    st.release(3.0, rng=rng)
    st.release(1.2, rng=rng)
    m = st.mechanism
    a1, a2 = ratio(m, 1.2), ratio(m, 3.0)
    y1, y2 = lattice(st, 1.2), lattice(st, 3.0)
    assert dlap_p(y1, a1) > 1e-3
    assert_proportion(int((y1 == y2).sum()), N, unchanged(a1, a2))
    diff = (y1 - y2)[y1 != y2]

    def nonzero_cdf(a: float, e: NDArray[np.int64]) -> NDArray[np.float64]:
        c = math.tanh(a / 2)
        return (dlap_cdf(a, e) - c * (np.asarray(e) >= 0)) / (1 - c)

    cdf = functools.partial(nonzero_cdf, a1)
    edges = law_edges(cdf, 40)
    assert binned_p(diff, edges, cdf) > 1e-3
    assert binned_p(diff, edges, functools.partial(nonzero_cdf, a1 * 1.03)) < 1e-6


# ------------------------------------------------------------------------------ bridging
def _joint_table(
    y1: NDArray[np.int64],
    y2: NDArray[np.int64],
    y3: NDArray[np.int64],
    edges_d: NDArray[np.float64],
    edges_w: NDArray[np.float64],
) -> NDArray[np.int64]:
    """Counts of (atom pattern, bin of Y1-Y3, bin of Y2-Y3): a discretised joint law."""
    d, w = y1 - y3, y2 - y3
    pattern = np.where(y2 == y3, 0, np.where(y2 == y1, 1, 2))
    bd = np.searchsorted(edges_d, d)
    bw = np.where(pattern == 2, np.searchsorted(edges_w, w), 0)
    cell = (pattern * (len(edges_d) + 1) + bd) * (len(edges_w) + 1) + bw
    return np.bincount(cell, minlength=3 * (len(edges_d) + 1) * (len(edges_w) + 1))


def _lemma_f5_bridge(
    m: Laplace, level: float, upper: Anchor, lower: Anchor, seed: int
) -> NDArray[np.int64]:
    """The bridge with the atoms paired as printed in Andersson et al.'s Lemma F.5: ``W1``
    carries ``μ_b`` and ``W2`` carries ``μ_a``. The float pass of the library's kernel with the
    two atom weights exchanged (``K_0 = μ_b(1 − μ_a)c_l``, ``K_t = μ_a(1 − μ_b)c``); the few
    coordinates it cannot decide keep ``U`` (a wrong sampler need not be exact)."""
    assert lower.level < level < upper.level
    law = m._law(level, upper.level, lower.level)
    cst = _dlap.float_constants(law)
    c, c_l = math.tanh(float(law.a) / 2), math.tanh(float(law.a_l or 0) / 2)
    swapped = cst._replace(k_0=cst.k_t * c_l / c, k_t=cst.k_0 * c / c_l)
    up, lo = np.asarray(upper.values), np.asarray(lower.values)
    draws = Draws(key_from(default_rng(seed)), up.shape[0], _dlap.slots(law))
    out = np.empty(up.shape[0], dtype=np.int64)
    words = [draws.slot(s) for s in range(draws.slots)]
    _dlap._block(out, up, lo, law, swapped, words, (0.0, 0.0))
    undecided = out == _dlap._UNDECIDED
    assert int(undecided.sum()) < 10
    out[undecided] = up[undecided]
    return out


@pytest.mark.parametrize("order", [(3.0, 1.0, 2.0), (1.0, 3.0, 2.0)])
def test_bridge_joint_law_matches_forward_chain(order: tuple[float, float, float]) -> None:
    """Releasing 2.0 between 1.0 and 3.0 gives the joint law of (Y1, Y2, Y3) of the forward
    construction (numpy's own geometrics: Y3 = DLap(a3), each step down adds 0 w.p. w0 else
    DLap); the bridge with the atoms swapped (the pairing printed in Andersson et al.'s Lemma
    F.5) is rejected by the same test, as is a bridge that ignores its lower neighbour."""
    st0 = ReleaseState(Laplace(1.0), np.zeros(N))
    m = st0.mechanism
    assert isinstance(m, Laplace)
    a = {lv: ratio(m, lv) for lv in (1.0, 2.0, 3.0)}
    rng = default_rng(8)
    r3 = dlap_numpy(rng, a[3.0], N)
    r2 = r3 + step_numpy(rng, a[2.0], a[3.0], N)
    r1 = r2 + step_numpy(rng, a[1.0], a[2.0], N)

    def engine(kind: str) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        st = ReleaseState(Laplace(1.0), np.zeros(N))
        g = default_rng(9)
        for lv in order[:2]:
            st.release(lv, rng=g)
        up, lo = st.point(3.0), st.point(1.0)
        if kind == "ours":
            st.release(2.0, rng=g)
            y2 = lattice(st, 2.0)
        elif kind == "lemma F.5":
            y2 = _lemma_f5_bridge(m, 2.0, up, lo, seed=10)
        else:  # "no lower": a tightening from the upper neighbour
            y2 = np.asarray(sample(m, 2.0, up, None, seed=10).values)
        return np.asarray(lo.values), y2, np.asarray(up.values)

    edges_d = np.quantile(r1 - r3, np.linspace(0.1, 0.9, 9))
    moved = (r2 != r3) & (r2 != r1)
    edges_w = np.quantile((r2 - r3)[moved], np.linspace(0.1, 0.9, 9))
    t_ref = _joint_table(r1, r2, r3, edges_d, edges_w)
    for kind, expect_ok in (("ours", True), ("lemma F.5", False), ("no lower", False)):
        y1, y2, y3 = engine(kind)
        t = _joint_table(y1, y2, y3, edges_d, edges_w)
        keep = (t + t_ref) > 0
        p = stats.chi2_contingency(np.vstack([t[keep], t_ref[keep]]))[1]
        assert (p > 1e-3) == expect_ok, f"{kind}: p={p:.3g}"


def test_bridge_with_equal_neighbours_almost_pins() -> None:
    """A zero difference between two releases: the atom-atom event (keep both) has weight
    μ_a μ_b, every other outcome O(ε/D), so the new release moves with the small exact
    probability of the lattice law (about 3·10⁻⁴ here), neither never (the continuous law's
    pin) nor as a tightening would."""
    m = Laplace(1.0)  # the grid 2^-12
    a3, a2, a1 = (ratio(m, lv) for lv in (3.0, 2.0, 1.0))
    y = np.asarray(m.origin(default_rng(10).laplace(0, 1, N)).values)
    out = np.asarray(sample(m, 2.0, Anchor(3.0, y), Anchor(1.0, y.copy()), seed=11).values)
    cdf = conditional_cdf(a2, a3, a1, 0)
    p_moved = float(1 - (cdf(np.array([0])) - cdf(np.array([-1])))[0])
    assert 1e-4 < p_moved < 1e-3
    moves = int((out != y).sum())
    assert_proportion(moves, N, p_moved)
    assert moves > 0


def test_arbitrary_order_pairwise_law() -> None:
    """Seven levels released in a shuffled order: marginals exact, P(Y_i = Y_j) is the
    one-step atom, and Cov(Y_i, Y_j) = Var(Y_max(i,j))."""
    levels = [0.3, 0.5, 0.8, 1.0, 1.7, 2.2, 4.0]
    order = [1.0, 0.3, 4.0, 0.8, 2.2, 0.5, 1.7]
    st = ReleaseState(Laplace(1.0), np.zeros(N))
    rng = default_rng(12)
    for lv in order:
        st.release(lv, rng=rng)
    m = st.mechanism
    ns = {lv: lattice(st, lv) for lv in levels}
    ys = {lv: np.asarray(v) for lv, v in st}
    for lv in levels:
        assert dlap_p(ns[lv], ratio(m, lv)) > 1e-4, lv
    for i, a in enumerate(levels):
        for b in levels[i + 1 :]:
            assert_proportion(int((ns[a] == ns[b]).sum()), N, unchanged(ratio(m, a), ratio(m, b)))
            cov = float(np.mean(ys[a] * ys[b]))
            # Var of a product of Laplace-type variables: generous 6-SE band
            se = float(np.std(ys[a] * ys[b])) / math.sqrt(N)
            assert_close_z(cov, m.variance(b), se, z=6)


# ------------------------------------------------------------------- the coarse lattice
class TestCoarseLattice:
    """At ε near ``D`` the grid is coarse against the noise (``a = ε/D`` near 1): the lattice
    law is visibly not a rounded continuous Laplace, and the mechanism's ``a`` must be ε/D."""

    m = Laplace(1.0)  # D = 4097
    e1, e2 = 0.5 * 4097, 1.5 * 4097  # a = 0.5 and 1.5 exactly

    def test_fresh_release_is_the_discrete_law(self) -> None:
        a = ratio(self.m, self.e1)
        assert a == 0.5
        y = np.asarray(sample(self.m, self.e1, self.m.origin(np.zeros(N)), seed=13).values)
        support = np.arange(-30, 31)
        assert binned_p(y, support, functools.partial(dlap_cdf, a)) > 1e-3
        naive = np.rint(default_rng(13).laplace(0.0, 1 / a, N)).astype(np.int64)
        assert binned_p(naive, support, functools.partial(dlap_cdf, a)) < 1e-10

    def test_value_is_rounded_to_the_grid(self) -> None:
        """The noise is centred on round(x/g): 0.7 g is released around 1, not 0 (floor)."""
        a, g = ratio(self.m, self.e1), 2.0**self.m.grid_exponent
        x = np.full(N, 0.7 * g)
        y = np.asarray(sample(self.m, self.e1, self.m.origin(x), seed=14).values)
        support = np.arange(-30, 31)
        cdf = functools.partial(dlap_cdf, a)
        assert binned_p(y - 1, support, cdf) > 1e-3
        assert binned_p(y, support, cdf) < 1e-10

    def test_relax_atom(self) -> None:
        """P(unchanged) = w0 + (1 − w0)·tanh(a1/2), far from w0 alone on a coarse grid."""
        zero = np.zeros(N)
        lo = sample(self.m, self.e1, self.m.origin(zero), seed=15)
        hi = sample(self.m, self.e2, self.m.origin(zero), lo, seed=16)
        hits = int((np.asarray(lo.values) == np.asarray(hi.values)).sum())
        assert_proportion(hits, N, unchanged(0.5, 1.5))
        with pytest.raises(AssertionError):
            assert_proportion(hits, N, w0(0.5, 1.5))


# ------------------------------------------------------------------------------ exactness
FINE = Laplace(1.0, dimension=10**6)  # the grid 2^-32; at ε ~ 1e-4, a ~ 2^-45: chunked plans


@pytest.mark.parametrize("mech", [Laplace(1.0), FINE], ids=["direct", "chunked"])
@pytest.mark.parametrize(
    ("level", "upper", "lower"),
    [(1.0, math.inf, None), (0.4, 3.0, None), (1.5, math.inf, 0.7), (1.0, 3.0, 0.25)],
    ids=["fresh", "tighten", "relax", "bridge"],
)
def test_exact_path_agrees_bit_for_bit(
    mech: Laplace,
    level: float,
    upper: float,
    lower: float | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forcing (nearly) every coordinate through the rational path changes no outcome, for
    the plain geometric plan and for the chunked one of a fine grid (several uniforms per
    geometric): the float pass decides only what is certain."""
    scale = 1e-4 if mech is FINE else 1.0
    level, upper = level * scale, upper * scale
    lower = None if lower is None else lower * scale
    law = mech._law(level, upper, lower)
    if mech is FINE:
        assert len(_dlap.plan(law.s_q).chunks) >= 2
    n = 600
    g = default_rng(12)
    sd = math.sqrt(mech.lattice_variance(level))
    u = g.integers(-50, 50, n)
    lo = None if lower is None else u + np.rint(g.laplace(0, sd, n)).astype(np.int64)
    draws = Draws(key_from(g), n, _dlap.slots(law))
    assert_forced_exact_agrees(law, u, lo, draws, monkeypatch)


# ------------------------------------------------------------------------- joint privacy
def _count(
    p: tuple[NDArray[np.float64], NDArray[np.float64]], a: float, b: float, atom: bool | None
) -> int:
    m = (p[0] > a) & (p[1] > b)
    if atom is not None:
        m &= (p[0] == p[1]) == atom
    return int(m.sum())


def _quadrant_log_ratios(
    pairs_u: tuple[NDArray[np.float64], NDArray[np.float64]],
    pairs_v: tuple[NDArray[np.float64], NDArray[np.float64]],
    thresholds: list[float],
) -> list[tuple[float, float]]:
    """(log P_v(E)/P_u(E), its standard error) for quadrant events E = {y1 > a, y2 > b} and the
    same events intersected with {y1 == y2}, over a grid of thresholds."""
    out = []
    for a in thresholds:
        for b in thresholds:
            for atom in (None, True, False):
                cu, cv = (_count(p, a, b, atom) for p in (pairs_u, pairs_v))
                if min(cu, cv) >= 400:
                    out.append((math.log(cv / cu), math.sqrt(1 / cu + 1 / cv)))
    return out


@pytest.mark.slow
def test_joint_privacy_of_two_releases() -> None:
    """For neighbouring inputs u = 0 and u' = Δ = 1, every joint event of (y1, y2) has
    probability ratio at most e^{ε2}; the fresh-independent-noise sampler exceeds it."""
    e1, e2, n = 1.0, 2.0, 2_000_000
    thresholds = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]

    def lossless(u: float, seed: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        st = ReleaseState(Laplace(1.0), np.full(n, u))
        g = default_rng(seed)
        return np.asarray(st.release(e1, rng=g)), np.asarray(st.release(e2, rng=g))

    def independent(u: float, seed: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        g = default_rng(seed)
        m = Laplace(1.0, dimension=n)
        return np.asarray(m.release(np.full(n, u), e1, rng=g)), np.asarray(
            m.release(np.full(n, u), e2, rng=g)
        )

    ok = _quadrant_log_ratios(lossless(0.0, 20), lossless(1.0, 21), thresholds)
    assert len(ok) > 50
    worst = max(r - 3 * se for r, se in ok)
    assert worst <= e2, f"lossless release exceeds ε2: {worst:.3f}"
    bad = _quadrant_log_ratios(independent(0.0, 22), independent(1.0, 23), thresholds)
    assert max(r - 3 * se for r, se in bad) > e2 + 0.5, "independent sampler not detected"
