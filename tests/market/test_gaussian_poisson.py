"""Statistical and exactness verification of the Gaussian (Brownian) and Poisson release processes.

Gaussian (noise format v2): a release at level ρ is ``x + Z`` rounded to the grid ``2^k`` of
that level, where ``Z`` is the real noise of the lossless Brownian process, kept by every anchor
as an exact linear form in keyed normals (``Anchor.path``) with a float pass
(``Anchor.hidden``). The tests check the real process (marginals, covariances in any release
order, the bridge against Andersson et al.'s Algorithm 1 term by term), the rounding (each
release is the grid point nearest to ``x + Z``) and the exact path (interval arithmetic gives
the same integers as the float pass).

Poisson: exact ``Poi(λ)`` and binomial thinning by inversion; marginals, covariances and the
thinning law by chi-square, and the exact path against the float tables.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from market import Gaussian, Poisson, ReleaseState, _normal, _poisson, default_rng
from market._draws import Draws, key_from
from market.mechanisms import Anchor

from .stats import assert_close_z, covariance_se, sample

N = 200_000
_Path = tuple[_normal.Term, ...]
ORDER = [1.0, 0.25, 4.0, 0.5, 2.0, 3.0, 0.1]


def box_muller(key: bytes, n: int) -> NDArray[np.float64]:
    """The standard normals of a request key, computed here from its words alone:
    ``√(−2 ln U₁)·cos(2π U₂)`` with ``U₁`` slot 0 and ``U₂`` slot 1 (docs/protocol.md §1.5)."""
    d = Draws(key, n, 2)
    u1 = (d.slot(0).astype(np.float64) + 0.5) * 2.0**-64
    u2 = (d.slot(1) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


class TestGaussian:
    sens = 1.5

    def _state(self, seed: int, n: int = N) -> ReleaseState:
        st = ReleaseState(Gaussian(self.sens), np.full(n, -3.0))
        rng = default_rng(seed)
        for lv in ORDER:
            st.release(lv, rng=rng)
        return st

    def _ladder(self, seed: int) -> dict[float, NDArray[np.float64]]:
        return {lv: np.asarray(v) + 3.0 for lv, v in self._state(seed)}

    def test_marginals(self) -> None:
        """Every release, whichever operation made it (fresh, tighten, relax, bridge), is
        N(0, Δ²/(2ρ)) (the rounding, 2⁻¹⁶ sd, is far below what KS can see)."""
        ys = self._ladder(1)
        for lv, y in ys.items():
            sd = self.sens / math.sqrt(2 * lv)
            assert stats.kstest(y, stats.norm(scale=sd).cdf).pvalue > 1e-4, lv

    def test_release_is_the_hidden_noise_rounded(self) -> None:
        """Each release is ``n·2^k`` with ``n`` the integer nearest to ``(x + Z)/2^k`` for the
        anchor's real noise ``Z``: the residual lies in [−1/2, 1/2] grid steps and is uniform
        there (floor rounding, or rounding the previous release instead of ``Z``, fails)."""
        st = self._state(2, n=50_000)
        m = st.mechanism
        assert isinstance(m, Gaussian)
        x = -3.0
        for lv, y in st:
            pt = st.point(lv)
            assert pt.hidden is not None
            k = m.grid_exponent(lv)
            assert k == (math.floor(math.log2(m.variance(lv))) // 2) - 16
            n = np.ldexp(np.asarray(y), -k)
            assert np.array_equal(n, np.rint(n)) and np.array_equal(n, pt.values)
            resid = n - np.ldexp(x + pt.hidden.z, -k)
            slack = np.ldexp(pt.hidden.err, -k) + 1e-6
            assert bool(np.all(np.abs(resid) <= 0.5 + slack)), lv
            assert stats.kstest(resid, stats.uniform(loc=-0.5, scale=1.0).cdf).pvalue > 1e-4
            z = pt.hidden.z / math.sqrt(m.variance(lv))
            assert stats.kstest(z, stats.norm.cdf).pvalue > 1e-4, lv

    def test_covariance_in_arbitrary_order(self) -> None:
        """Cov(Y_ρi, Y_ρj) = Δ²/(2 max(ρi, ρj)) whatever order the levels were released in."""
        ys = self._ladder(2)
        lv = sorted(ys)
        for i, a in enumerate(lv):
            for b in lv[i:]:
                cov = float(np.cov(ys[a], ys[b])[0, 1])
                assert_close_z(cov, self.sens**2 / (2 * max(a, b)), covariance_se(ys[a], ys[b]))

    def test_independent_sampler_is_detected(self) -> None:
        """Power check: fresh independent noise at each level has covariance 0, not Δ²/(2ρ)."""
        g = default_rng(3)
        m = Gaussian(self.sens)
        ya = np.asarray(m.release(np.zeros(N), 1.0, rng=g))
        yb = np.asarray(m.release(np.zeros(N), 2.0, rng=g))
        cov = float(np.cov(ya, yb)[0, 1])
        assert abs(cov - self.sens**2 / 4) > 10 * covariance_se(ya, yb)

    def test_bridge_matches_paper_algorithm1(self) -> None:
        """Our variance-space bridge is Andersson Alg. 1's ρ-space formula: the new release's
        real noise is ``w_u Z_u + w_l Z_l + √s·N`` with ``w_u = (1 − ρ_k/ρ)/(1 − ρ_k/ρ_{k+1})``,
        ``w_l = (ρ_k/ρ − ρ_k/ρ_{k+1})/(1 − ρ_k/ρ_{k+1})`` and
        ``s = Δ²(1 − ρ_k/ρ)(1/ρ − 1/ρ_{k+1})/(2(1 − ρ_k/ρ_{k+1}))``: exactly (the linear form in
        keyed normals, in rationals), and draw for draw in floats (the float pass against the
        normals computed here from the words); the release rounds it."""
        rho_k, rho, rho_k1 = 0.7, 1.3, 2.9
        m, n = Gaussian(self.sens), 2000
        x = default_rng(4).normal(0.0, 3.0, n)
        up = sample(m, rho_k1, m.origin(x), None, seed=5, base=x)
        lo = sample(m, rho_k, up, None, seed=6, base=x)
        key = key_from(default_rng(7))
        mid = m.conditional(rho, up, lo, Draws(key, n, 2), x)
        # exact: the linear form, as {key: (coefficient², sign)}
        d2 = Fraction(self.sens) ** 2
        rk, r, rk1 = Fraction(rho_k), Fraction(rho), Fraction(rho_k1)
        den = 1 - rk / rk1
        w_u, w_l = (1 - rk / r) / den, (rk / r - rk / rk1) / den
        var = d2 * (1 - rk / r) * (1 / r - 1 / rk1) / (2 * den)
        assert w_u + w_l == 1

        def form(terms: tuple[_normal.Term, ...]) -> dict[bytes, tuple[Fraction, int]]:
            return {t.key: (t.q**2 * t.r, 1 if t.q > 0 else -1) for t in terms}

        (t1,) = up.path
        t1b, t2 = lo.path
        assert t1b == t1 and t1.r == d2 / (2 * rk1) and t2.r == d2 / (2 * rk) - d2 / (2 * rk1)
        expected = {t1.key: (t1.r, 1), t2.key: (w_l**2 * t2.r, 1), key: (var, 1)}
        assert form(mid.path) == expected
        # float pass, draw for draw
        assert up.hidden is not None and lo.hidden is not None and mid.hidden is not None
        paper = float(w_u) * up.hidden.z + float(w_l) * lo.hidden.z
        paper += math.sqrt(float(var)) * box_muller(key, n)
        np.testing.assert_allclose(mid.hidden.z, paper, rtol=1e-9, atol=1e-9)
        # the release rounds x + Z on its grid
        q = np.ldexp(x + mid.hidden.z, -m.grid_exponent(rho))
        clear = np.abs(q - np.floor(q) - 0.5) > 1e-6
        assert np.array_equal(mid.values[clear], np.rint(q[clear]).astype(np.int64))

    def test_exact_snap_agrees_with_the_float_pass(self) -> None:
        """Forcing every coordinate of every release (paths of one to seven terms: fresh,
        tighten, relax, bridge) through :func:`market._normal.exact_snap` gives the same
        integers as the float pass."""
        n = 60
        st = self._state(8, n=n)
        m = st.mechanism
        assert isinstance(m, Gaussian)
        for lv, _ in st:
            pt = st.point(lv)
            assert pt.hidden is not None
            grid = m.grid_exponent(lv)
            base = np.asarray(st.base)

            def settle(
                i: int, b: NDArray[np.float64] = base, path: _Path = pt.path, g: int = grid
            ) -> int:
                return _normal.exact_snap(float(b[i]), path, n, i, g)

            forced = _normal.snap(
                base, _normal.Hidden(pt.hidden.z, np.full(n, np.inf)), grid, settle
            )
            assert np.array_equal(forced, pt.values), lv


class TestPoisson:
    sens = 2.0

    def _ladder(self, seed: int, counts: np.ndarray) -> dict[float, np.ndarray]:
        st = ReleaseState(Poisson(self.sens), counts)
        rng = default_rng(seed)
        for lv in ORDER:
            st.release(lv, rng=rng)
        return {lv: np.asarray(v) - counts for lv, v in st}

    def test_releases_are_integers(self) -> None:
        st = ReleaseState(Poisson(1.0), [3, 0, 7])
        assert st.release(0.5, rng=default_rng(0)).dtype == np.int64

    def test_marginals_chi_square(self) -> None:
        counts = default_rng(5).integers(0, 50, N)
        ys = self._ladder(6, counts)
        for lv, noise in ys.items():
            lam = self.sens**2 / lv
            assert noise.min() >= 0
            hi = int(stats.poisson(lam).ppf(0.999))
            obs = np.bincount(np.minimum(noise, hi + 1), minlength=hi + 2)
            probs = np.append(stats.poisson(lam).pmf(np.arange(hi + 1)), stats.poisson(lam).sf(hi))
            exp = probs * N
            keep = exp >= 20
            obs_k, exp_k = obs[keep], exp[keep]
            if (~keep).any():
                obs_k = np.append(obs_k, obs[~keep].sum())
                exp_k = np.append(exp_k, exp[~keep].sum())
            assert stats.chisquare(obs_k, exp_k * obs_k.sum() / exp_k.sum()).pvalue > 1e-4, lv

    def test_covariance_in_arbitrary_order(self) -> None:
        """Y_lo = Y_hi + independent Poisson, so Cov = Var(Y at the larger level) = Δ²/ω."""
        ys = self._ladder(7, np.zeros(N, dtype=np.int64))
        lv = sorted(ys)
        for i, a in enumerate(lv):
            for b in lv[i:]:
                x, y = ys[a].astype(float), ys[b].astype(float)
                assert_close_z(
                    float(np.cov(x, y)[0, 1]), self.sens**2 / max(a, b), covariance_se(x, y)
                )

    @staticmethod
    def _thinning_p(
        out: NDArray[np.int64], counts: NDArray[np.int64], p: float, seed: int
    ) -> float:
        """KS p-value of the randomised PIT ``F(j − 1) + V·P(j)`` of ``j ~ Bin(N_i, p)`` (each
        coordinate with its own count): uniform exactly when the law is right."""
        law = stats.binom(counts, p)
        v = default_rng(seed).random(out.shape[0])
        pit = law.cdf(out - 1) + v * law.pmf(out)
        return float(stats.kstest(pit, "uniform").pvalue)

    @pytest.mark.parametrize("upper_level", [math.inf, 2.0], ids=["relax", "bridge"])
    def test_thinning_is_binomial(self, upper_level: float) -> None:
        """Between two anchors ``N = L − U`` apart, the new release adds ``Bin(N, p)``,
        ``p = (λ − λ_u)/(λ_l − λ_u)`` (Andersson Lemma E.4), for every count at once (one
        exact law per distinct count); ``p`` off by 5 % is rejected."""
        m = Poisson(self.sens)
        lam, lam_l = m.rate(0.5), m.rate(0.1)
        lam_u = m.rate(upper_level)
        p = (lam - lam_u) / (lam_l - lam_u)
        counts = default_rng(9).integers(0, 60, N)
        u = np.full(N, 7, dtype=np.int64)
        out = sample(m, 0.5, Anchor(upper_level, u), Anchor(0.1, u + counts), seed=10)
        j = np.asarray(out.values) - u
        assert bool(np.all((j >= 0) & (j <= counts)))
        assert self._thinning_p(j, counts, p, 11) > 1e-3
        assert self._thinning_p(j, counts, p * 1.05, 11) < 1e-6

    @pytest.mark.parametrize(
        "law",
        [
            _poisson.Poisson(Fraction(4)),
            _poisson.Poisson(Fraction(2.0) ** 2 / Fraction(0.016)),
            _poisson.Binomial(30, Fraction(1, 3)),
            _poisson.Binomial(0, Fraction(1, 3)),
            _poisson.Binomial(500, Fraction(0.01)),
        ],
        ids=["poi-4", "poi-250", "bin-30", "bin-0", "bin-500"],
    )
    def test_exact_outcome_agrees_with_the_float_table(self, law: _poisson._Law) -> None:
        """Forcing every coordinate through :func:`market._poisson.exact_outcome` (a table
        whose margin no uniform clears) gives the same integers as the float pass, for rates
        and probabilities that are rationals of doubles; the exact search also lands there
        from a guess a few outcomes off."""
        n = 150
        draws = Draws(key_from(default_rng(12)), n, 1)
        which = np.zeros(n, dtype=np.intp)
        fast = _poisson.sample([law], which, draws)
        forced_law = type(law).__new__(type(law))
        forced_law.__dict__.update(law.__dict__)
        forced_law.__dict__["table"] = dataclasses.replace(law.table, margin=1.0)
        forced = _poisson.sample([forced_law], which, draws)
        assert np.array_equal(fast, forced)
        for i in range(0, n, 15):
            for guess in (int(fast[i]) - 3, int(fast[i]) + 3):
                assert _poisson.exact_outcome(law, draws.lazy(0, i), guess) == fast[i]


@pytest.mark.parametrize("mech", [Gaussian(1.0), Poisson(1.0)])
def test_repeat_release_is_bitwise_identical(mech: Gaussian | Poisson) -> None:
    st = ReleaseState(mech, np.arange(100))
    a = st.release(1.0, rng=default_rng(1))
    b = st.release(1.0, rng=default_rng(2))
    assert a is b and a.tobytes() == b.tobytes()


# ------------------------------------------------ found by the review of noise format v2
def test_the_exact_rounding_ignores_the_threads_decimal_context() -> None:
    """The exact path once added ½ in the thread's default decimal context (28 digits, half to
    even): an outcome 3·10⁻¹⁰ below an integer at |x/g| = 2⁶⁰ was rounded onto it, and a thread
    whose context had 12 digits released other bytes. Built as the review did: a term whose
    weight puts x + Z + ½ just below an integer."""
    import decimal

    from market import _interval as iv
    from market._draws import lazy_at

    key, r = bytes(range(32)), Fraction(2**32)  # σ = 2^16, grid 1
    u1, u2 = lazy_at(key, 1, 0, 0), lazy_at(key, 1, 1, 0)
    for _ in range(3):
        u1.refine()
        u2.refine()
    normal = _normal._normal_iv(u1, u2, 90)
    mid = (Fraction(normal.lo) + Fraction(normal.hi)) / 2
    x = 2.0**60
    target = round(2**16 * mid) + Fraction(1, 2) - Fraction(3, 10**10)
    term = _normal.Term(key, Fraction(target / (2**16 * mid)).limit_denominator(10**60), r)
    z = iv.Iv.of(term.q, 90) * iv.sqrt(iv.Iv.of(r, 90)) * normal
    truth = iv.Iv.of(Fraction(x), 90) + z + iv.Iv.of(Fraction(1, 2), 90)
    assert math.floor(truth.lo) == math.floor(truth.hi)
    for prec in (28, 12):
        with decimal.localcontext() as ctx:
            ctx.prec = prec
            assert _normal.exact_snap(x, [term], 1, 0, 0) == math.floor(truth.lo)


@pytest.mark.parametrize("rate", [1540.5, 1600, 1691.5])
def test_poisson_tables_stay_finite_where_the_window_starts_at_zero(rate: float) -> None:
    """Rates 1540–1692: the window starts at 0, e^{−μ} underflows and the bare product
    μ²⁵⁵/255! overflowed: 0·inf made the table NaN and every coordinate took the 1.2 s exact
    path. The anchor is now multiplied in first."""
    law = _poisson.Poisson(Fraction(rate))
    assert bool(np.all(np.isfinite(law.table.cdf)))
    draws = Draws(key_from(default_rng(3)), 500, 1)
    u = _draws_unit(draws)
    k = np.searchsorted(law.table.cdf, u, side="right")
    decided = u >= np.where(k > 0, law.table.cdf[np.maximum(k - 1, 0)], 0.0) + law.table.margin
    assert float(np.mean(decided)) > 0.99


def _draws_unit(draws: Draws) -> NDArray[np.float64]:
    from market._draws import to_unit

    return to_unit(draws.slot(0))


def test_a_ladder_of_65_poisson_laws_is_tabled_once() -> None:
    """A chain cycles through its step laws; a cache of 64 laws made a 65-level stream rebuild
    every table every time (2.4 s a value)."""
    rates = [Fraction(250_000 + 7 * i) for i in range(65)]
    first = [_poisson.poisson(mu) for mu in rates]
    assert all(_poisson.poisson(mu) is law for mu, law in zip(rates, first, strict=True))
