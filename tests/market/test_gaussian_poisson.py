"""Statistical verification of the Gaussian (Brownian) and Poisson release processes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from market import Gaussian, Poisson, ReleaseState, default_rng
from market.mechanisms import Anchor

from .stats import assert_close_z, covariance_se

N = 200_000
ORDER = [1.0, 0.25, 4.0, 0.5, 2.0, 3.0, 0.1]


class TestGaussian:
    sens = 1.5

    def _ladder(self, seed: int) -> dict[float, np.ndarray]:
        st = ReleaseState(Gaussian(self.sens), np.full(N, -3.0))
        rng = default_rng(seed)
        for lv in ORDER:
            st.release(lv, rng=rng)
        return {lv: np.asarray(v) + 3.0 for lv, v in st}

    def test_marginals(self) -> None:
        ys = self._ladder(1)
        for lv, y in ys.items():
            sd = self.sens / math.sqrt(2 * lv)
            assert stats.kstest(y, stats.norm(scale=sd).cdf).pvalue > 1e-4, lv

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
        """Our variance-space bridge equals Andersson Alg. 1's ρ-space formulas (same draws)."""
        rho_k, rho, rho_k1 = 0.7, 1.3, 2.9
        yk, yk1 = np.array([0.4, -1.0]), np.array([0.1, 0.2])
        ours = Gaussian(self.sens).conditional(
            rho, Anchor(rho_k1, yk1), Anchor(rho_k, yk), default_rng(4)
        )
        z = default_rng(4).standard_normal(2)
        var = self.sens**2 * (1 - rho_k / rho) * (1 / rho - 1 / rho_k1) / (2 * (1 - rho_k / rho_k1))
        paper = math.sqrt(var) * z + (
            (1 - rho_k / rho) * yk1 + (rho_k / rho - rho_k / rho_k1) * yk
        ) / (1 - rho_k / rho_k1)
        np.testing.assert_allclose(ours, paper, rtol=1e-12, atol=1e-12)


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


@pytest.mark.parametrize("mech", [Gaussian(1.0), Poisson(1.0)])
def test_repeat_release_is_bitwise_identical(mech: Gaussian | Poisson) -> None:
    st = ReleaseState(mech, np.arange(100))
    a = st.release(1.0, rng=default_rng(1))
    b = st.release(1.0, rng=default_rng(2))
    assert a is b and a.tobytes() == b.tobytes()
