"""Statistical verification of the Laplace release process.

A vector of n i.i.d. coordinates released through one ReleaseState gives n independent draws of
the whole joint law at once, so every test below is a Monte-Carlo test with n ~ 2·10^5 samples.
Each test also runs a deliberately wrong sampler where that is cheap, to show it has the power to
fail.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from market import Laplace, ReleaseState, _kernels, default_rng
from market.mechanisms import Anchor

from .stats import assert_close_z, assert_proportion, laplace_cdf

N = 200_000


def ks_laplace(x: NDArray[np.float64], scale: float) -> float:
    return float(stats.kstest(x, lambda t: laplace_cdf(t, scale)).pvalue)


# --------------------------------------------------------------------------------- oracles
def algorithm1_oracle(
    x: NDArray[np.float64], e1: float, e2: float, rng: np.random.Generator
) -> NDArray[np.float64]:
    """Koufogiannis Algorithm 1 transcribed case by case (independent of market._kernels).

    The printed algorithm multiplies by sgn(x), which collapses every output to 0 when x = 0;
    the law at x = 0 is symmetric, so we use sign +1 there.
    """
    ax = np.abs(x)
    s = np.where(x < 0, -1.0, 1.0)
    e = np.exp(-(e2 - e1) * ax)
    p1 = e1 / e2 * e
    p2 = (e2 - e1) / (2 * e2)
    p3 = (e1 + e2) / (2 * e2) * (1 - e)
    u = rng.random(x.shape[0])
    out = np.empty_like(x)
    c1 = u < p1
    c2 = ~c1 & (u < p1 + p2)
    c3 = ~c1 & ~c2 & (u < p1 + p2 + p3)
    c4 = ~(c1 | c2 | c3)
    out[c1] = x[c1]
    out[c2] = -rng.exponential(1 / (e1 + e2), c2.sum())
    # truncated exponential on [0, |x|] with rate e2 - e1, by inversion
    v = rng.random(c3.sum())
    lam = e2 - e1
    out[c3] = -np.log1p(-v * (1 - np.exp(-lam * ax[c3]))) / lam
    out[c4] = ax[c4] + rng.exponential(1 / (e1 + e2), c4.sum())
    out[~c1] *= s[~c1]
    return out


def forward_chain(
    levels: list[float], n: int, rng: np.random.Generator, sensitivity: float = 1.0
) -> dict[float, NDArray[np.float64]]:
    """Releases for increasing `levels` built top-down with Claim F.3 only: Y_top is a fresh
    Laplace draw and each less accurate release adds W = 0 w.p. (l/l')² else Lap(Δ/l)."""
    lv = sorted(levels, reverse=True)
    out = {lv[0]: rng.laplace(0.0, sensitivity / lv[0], n)}
    for hi, lo in itertools.pairwise(lv):
        keep = rng.random(n) < (lo / hi) ** 2
        out[lo] = np.where(keep, out[hi], out[hi] + rng.laplace(0.0, sensitivity / lo, n))
    return out


# --------------------------------------------------------------------------- relaxation
class TestRelax:
    e1, e2 = 1.0, 2.5

    def _pair(self, seed: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        st = ReleaseState(Laplace(1.0), np.zeros(N))
        rng = default_rng(seed)
        y1 = st.release(self.e1, rng=rng)
        y2 = st.release(self.e2, rng=rng)
        return np.asarray(y1), np.asarray(y2)

    def test_marginals_are_single_release_laws(self) -> None:
        y1, y2 = self._pair(1)
        assert ks_laplace(y1, 1 / self.e1) > 1e-3
        assert ks_laplace(y2, 1 / self.e2) > 1e-3

    def test_wrong_scale_is_detected(self) -> None:
        _, y2 = self._pair(1)
        assert ks_laplace(y2, 1.03 / self.e2) < 1e-6  # 3 % off in scale: power check

    def test_atom_probability(self) -> None:
        y1, y2 = self._pair(2)
        assert_proportion(int((y1 == y2).sum()), N, (self.e1 / self.e2) ** 2)

    def test_correlation(self) -> None:
        y1, y2 = self._pair(3)
        r = float(np.corrcoef(y1, y2)[0, 1])
        # var of the sample correlation of heavy-ish tailed pairs; 0.01 is ~5 SE at n=2e5
        assert abs(r - self.e1 / self.e2) < 0.01

    def test_matches_algorithm1_conditionally(self) -> None:
        """Given the same stored noise x, the kernel and Algorithm 1 agree in law."""
        rng = default_rng(4)
        for x0 in (0.0, 0.3, -1.7, 4.0):
            x = np.full(N, x0)
            ours = np.asarray(
                Laplace(1.0).conditional(
                    self.e2, Anchor(math.inf, np.zeros(N)), Anchor(self.e1, x), rng
                )
            )
            ref = algorithm1_oracle(x, self.e1, self.e2, rng)
            assert_proportion(int((ours == x).sum()), N, float((ref == x).mean()), z=6)
            moved_ours, moved_ref = ours[ours != x], ref[ref != x]
            assert stats.ks_2samp(moved_ours, moved_ref).pvalue > 1e-3, x0

    def test_exact_zero_stored_noise(self) -> None:
        """A stored noise of exactly 0: atom w.p. ε1/ε2, otherwise ±Exp(ε1 + ε2), symmetric."""
        rng = default_rng(5)
        zero = np.zeros(N)
        y = np.asarray(
            Laplace(1.0).conditional(self.e2, Anchor(math.inf, zero), Anchor(self.e1, zero), rng)
        )
        assert_proportion(int((y == 0).sum()), N, self.e1 / self.e2)
        moved = y[y != 0]
        assert_proportion(int((moved > 0).sum()), moved.shape[0], 0.5)
        assert (
            stats.kstest(np.abs(moved), stats.expon(scale=1 / (self.e1 + self.e2)).cdf).pvalue
            > 1e-3
        )

    def test_long_chain(self) -> None:
        """Twenty relaxation steps: every marginal stays exact; atoms multiply along the chain."""
        levels = list(np.geomspace(0.2, 5.0, 20))
        st = ReleaseState(Laplace(2.0), np.full(N, 10.0))
        rng = default_rng(6)
        ys = [np.asarray(st.release(lv, rng=rng)) for lv in levels]
        for lv, y in zip(st.levels, ys, strict=True):
            assert ks_laplace(y - 10.0, 2.0 / lv) > 1e-4
        assert_proportion(int((ys[0] == ys[-1]).sum()), N, (st.levels[0] / st.levels[-1]) ** 2)


# ---------------------------------------------------------------------------- tightening
def test_tightening_from_most_private_release() -> None:
    """Eq. (25): below every release, atom (ε1/ε2)² else an added Lap(1/ε1)."""
    st = ReleaseState(Laplace(1.0), np.zeros(N))
    rng = default_rng(7)
    y2 = np.asarray(st.release(3.0, rng=rng))
    y1 = np.asarray(st.release(1.2, rng=rng))
    assert ks_laplace(y1, 1 / 1.2) > 1e-3
    assert_proportion(int((y1 == y2).sum()), N, (1.2 / 3.0) ** 2)
    assert (
        stats.kstest(y1[y1 != y2] - y2[y1 != y2], lambda t: laplace_cdf(t, 1 / 1.2)).pvalue > 1e-3
    )


# ------------------------------------------------------------------------------ bridging
def _joint_table(
    y1: NDArray[np.float64],
    y2: NDArray[np.float64],
    y3: NDArray[np.float64],
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


@pytest.mark.parametrize("order", [(3.0, 1.0, 2.0), (1.0, 3.0, 2.0)])
def test_bridge_joint_law_matches_forward_chain(order: tuple[float, float, float]) -> None:
    """Releasing 2.0 between 1.0 and 3.0 gives the same joint law of (Y1, Y2, Y3) as the
    forward construction from Claim F.3; the sampler with the atoms swapped (the pairing printed
    in Andersson et al.'s Lemma F.5) is rejected by the same test."""
    rng = default_rng(8)
    ref = forward_chain([1.0, 2.0, 3.0], N, rng)

    def engine(mu_swap: bool) -> dict[float, NDArray[np.float64]]:
        st = ReleaseState(Laplace(1.0), np.zeros(N))
        g = default_rng(9)
        if mu_swap:
            for lv in order[:2]:
                st.release(lv, rng=g)
            y3, y1 = np.asarray(st.get(3.0)), np.asarray(st.get(1.0))
            out = np.empty(N)
            _kernels.laplace_bridge_into(
                out, y3, y1, 2.0, 1.0, (1 / 2) ** 2, (2 / 3) ** 2, _kernels.Uniforms(g)
            )
            return {1.0: y1, 2.0: out, 3.0: y3}
        for lv in order:
            st.release(lv, rng=g)
        return {lv: np.asarray(v) for lv, v in st}

    edges_d = np.quantile(ref[1.0] - ref[3.0], np.linspace(0.1, 0.9, 9))
    moved = (ref[2.0] != ref[3.0]) & (ref[2.0] != ref[1.0])
    edges_w = np.quantile((ref[2.0] - ref[3.0])[moved], np.linspace(0.1, 0.9, 9))
    t_ref = _joint_table(ref[1.0], ref[2.0], ref[3.0], edges_d, edges_w)
    for swapped, expect_ok in ((False, True), (True, False)):
        got = engine(swapped)
        t = _joint_table(got[1.0], got[2.0], got[3.0], edges_d, edges_w)
        keep = (t + t_ref) > 0
        p = stats.chi2_contingency(np.vstack([t[keep], t_ref[keep]]))[1]
        assert (p > 1e-3) == expect_ok, f"swapped={swapped} p={p:.3g}"


def test_bridge_with_equal_neighbours_returns_them() -> None:
    """A zero difference between neighbours (both atoms taken) pins the new release."""
    y = default_rng(10).laplace(0, 1, 1000)
    out = Laplace(1.0).conditional(2.0, Anchor(3.0, y), Anchor(1.0, y.copy()), default_rng(11))
    assert np.array_equal(out, y)


def test_arbitrary_order_pairwise_law() -> None:
    """Seven levels released in a shuffled order: marginals exact, P(Y_i = Y_j) = (l_i/l_j)²,
    and Cov(Y_i, Y_j) = Var(Y_max(i,j)) = 2/max(l_i, l_j)²."""
    levels = [0.3, 0.5, 0.8, 1.0, 1.7, 2.2, 4.0]
    order = [1.0, 0.3, 4.0, 0.8, 2.2, 0.5, 1.7]
    st = ReleaseState(Laplace(1.0), np.zeros(N))
    rng = default_rng(12)
    for lv in order:
        st.release(lv, rng=rng)
    ys = {lv: np.asarray(v) for lv, v in st}
    for lv in levels:
        assert ks_laplace(ys[lv], 1 / lv) > 1e-4, lv
    for i, a in enumerate(levels):
        for b in levels[i + 1 :]:
            assert_proportion(int((ys[a] == ys[b]).sum()), N, (a / b) ** 2)
            cov = float(np.mean(ys[a] * ys[b]))
            # Var of a product of Laplace-type variables: generous 6-SE band
            se = float(np.std(ys[a] * ys[b])) / math.sqrt(N)
            assert_close_z(cov, 2 / b**2, se, z=6)


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
        m = Laplace(1.0)
        return np.asarray(m.release(np.full(n, u), e1, rng=g)), np.asarray(
            m.release(np.full(n, u), e2, rng=g)
        )

    ok = _quadrant_log_ratios(lossless(0.0, 20), lossless(1.0, 21), thresholds)
    assert len(ok) > 50
    worst = max(r - 3 * se for r, se in ok)
    assert worst <= e2, f"lossless release exceeds ε2: {worst:.3f}"
    bad = _quadrant_log_ratios(independent(0.0, 22), independent(1.0, 23), thresholds)
    assert max(r - 3 * se for r, se in bad) > e2 + 0.5, "independent sampler not detected"
