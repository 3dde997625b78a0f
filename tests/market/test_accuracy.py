"""Error models and intervals: stated accuracy is what releases deliver.

Coverage is checked by simulation on releases made by the samplers themselves (200,000
coordinates, fixed seeds) within binomial error, with a negative control showing the check has
the power to catch a half-width only 3 % too small. Poisson half-widths are also checked
exactly against the Poisson CDF (the law is discrete: coverage is at least the confidence, and
one step less would not be).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from market import DiscreteLaplace, Gaussian, Laplace, Poisson, ReleaseState, default_rng
from market.accuracy import AccuracyNotForSaleError, ErrorModel, cheapest_level, error_model
from market.mechanisms import Mechanism

from .stats import assert_close_z, assert_proportion

N = 200_000
CASES: list[tuple[Mechanism, float, float]] = [  # mechanism, level, true value
    (Laplace(1.0), 0.5, 3.0),
    (Laplace(2.0), 2.0, -1.0),
    (Gaussian(1.0), 0.1, 3.0),
    (Gaussian(1.0), 2.0, 0.0),
    (Poisson(1.0), 0.05, 7.0),  # λ = 20
    (Poisson(2.0), 1.0, 0.0),  # λ = 4
    (DiscreteLaplace(1.0), 0.5, 3.0),
    (DiscreteLaplace(2.0), 3.0, -4.0),  # p = e^{-1.5}: mostly 0, ±1
]


def dlap_pmf(model: ErrorModel, k: np.ndarray) -> np.ndarray:
    """P(V = k) of discrete Laplace noise of the model's scale b: (1-p)/(1+p) p^|k|."""
    p = math.exp(-1.0 / model.scale)
    return (1 - p) / (1 + p) * p ** np.abs(k).astype(np.float64)


def releases(mech: Mechanism, level: float, truth: float, seed: int) -> np.ndarray:
    whole = isinstance(mech, Poisson | DiscreteLaplace)
    value = np.full(N, truth, dtype=np.int64 if whole else np.float64)
    return ReleaseState(mech, value).release(level, rng=default_rng(seed))


@pytest.mark.parametrize(("mech", "level", "truth"), CASES)
def test_intervals_cover_the_true_value_as_stated(mech: Mechanism, level: float,
                                                  truth: float) -> None:  # fmt: skip
    model = error_model(mech, level)
    y = releases(mech, level, truth, seed=11)
    est = y - model.offset
    # the RMS error of the unbiased estimate is the model's std
    # Var[(noise)²] / σ⁴: 5 for Laplace, 2 for Gaussian, 2 + 1/λ for centred Poisson
    kurt = {"laplace": 5.0, "gaussian": 2.0}.get(model.mechanism, 2.0 + 1.0 / (model.scale or 1))
    if isinstance(mech, DiscreteLaplace):  # E[V⁴]/σ⁴ − 1, summed over the pmf
        k = np.arange(-2000, 2001)
        kurt = float(np.sum(dlap_pmf(model, k) * k**4.0)) / model.std**4 - 1.0
    se = model.std**2 * math.sqrt(kurt) / math.sqrt(N)
    assert_close_z(float(np.mean((est - truth) ** 2)), model.std**2, se)
    for c in (0.90, 0.95, 0.99):
        lo, hi = model.interval(y, c)
        hits = int(np.count_nonzero((lo <= truth) & (truth <= hi)))
        if isinstance(mech, Poisson):  # discrete: at least c, exactly the law's mass
            lam, t = model.scale, model.half_width(c)
            exact = stats.poisson.cdf(math.floor(lam + t), lam) - stats.poisson.cdf(
                math.ceil(lam - t) - 1, lam
            )
            assert exact >= c
            assert_proportion(hits, N, float(exact))
        elif isinstance(mech, DiscreteLaplace):  # whole numbers too: the mass within ±t
            t = model.half_width(c)
            exact = float(np.sum(dlap_pmf(model, np.arange(-t, t + 1))))
            assert exact >= c and t == int(t)
            assert_proportion(hits, N, exact)
        else:
            assert_proportion(hits, N, c)


@pytest.mark.parametrize(("mech", "level"), [(Laplace(1.0), 1.0), (Gaussian(1.0), 1.0)])
def test_a_half_width_three_percent_too_small_is_caught(mech: Mechanism, level: float) -> None:
    """Negative control: the coverage check has the power to see a slightly wrong formula."""
    model = error_model(mech, level)
    y = releases(mech, level, 0.0, seed=12)
    t = 0.97 * model.half_width(0.95)
    hits = int(np.count_nonzero(np.abs(y) <= t))
    with pytest.raises(AssertionError):
        assert_proportion(hits, N, 0.95)


@pytest.mark.parametrize("lam", [0.3, 1.0, 4.0, 20.0, 20.5, 400.0])
@pytest.mark.parametrize("c", [0.5, 0.9, 0.95, 0.99])
def test_poisson_half_width_is_the_smallest_that_covers(lam: float, c: float) -> None:
    model = error_model(Poisson(1.0), 1.0 / lam)
    assert model.scale == pytest.approx(lam) and model.offset == model.scale
    t = model.half_width(c)

    def coverage(r: float) -> float:
        lo, hi = math.ceil(model.scale - r - 1e-12), math.floor(model.scale + r + 1e-12)
        return float(stats.poisson.cdf(hi, model.scale) - stats.poisson.cdf(lo - 1, model.scale))

    assert coverage(t) >= c
    smaller = [abs(k - model.scale) for k in range(int(model.scale + t) + 2)]
    below = max((d for d in smaller if d < t - 1e-9), default=None)
    if below is not None:
        assert coverage(below) < c


@pytest.mark.parametrize("level", [0.05, 0.5, 1.0, 2.0, 5.0, 20.0])
@pytest.mark.parametrize("c", [0.5, 0.9, 0.95, 0.99, 0.9999])
def test_discrete_laplace_half_width_is_the_smallest_whole_number_that_covers(
    level: float, c: float
) -> None:
    model = error_model(DiscreteLaplace(1.0), level)
    t = int(model.half_width(c))
    assert model.scale == 1.0 / level and model.offset == 0.0
    mass = float(np.sum(dlap_pmf(model, np.arange(-t, t + 1))))
    assert mass >= c
    if t > 0:
        assert float(np.sum(dlap_pmf(model, np.arange(-t + 1, t)))) < c
    p = math.exp(-level)
    assert model.std == pytest.approx(math.sqrt(2 * p) / (1 - p))


def test_laplace_and_gaussian_half_widths_match_their_closed_forms() -> None:
    lap = error_model(Laplace(2.0), 0.5)  # b = 4
    assert lap.scale == 4.0 and lap.std == pytest.approx(4.0 * math.sqrt(2.0))
    assert lap.half_width(0.95) == pytest.approx(4.0 * math.log(20.0))
    gau = error_model(Gaussian(1.0), 0.5)  # σ² = 1
    assert gau.std == pytest.approx(1.0) and gau.half_width(0.95) == pytest.approx(1.959964)
    assert set(gau.standard_half_widths()) == {"90", "95", "99"}
    with pytest.raises(ValueError, match="confidence"):
        gau.half_width(1.0)


def test_cheapest_level_meets_the_target_or_names_the_best_offer() -> None:
    mech, steps = Laplace(1.0), [0.5, 1.0, 2.0, 4.0]
    assert cheapest_level(mech, steps, rmse=1.0) == 2.0  # √2/ε ≤ 1 needs ε ≥ 1.41
    assert cheapest_level(mech, steps, rmse=3.0) == 0.5
    assert cheapest_level(mech, steps, half_width=1.5, confidence=0.9) == 2.0  # ln 10 / ε
    with pytest.raises(AccuracyNotForSaleError) as err:
        cheapest_level(mech, steps, half_width=0.5, confidence=0.95)
    assert err.value.best == 4.0 and err.value.error == pytest.approx(math.log(20.0) / 4.0)
    assert "4 (epsilon)" in str(err.value)
    with pytest.raises(ValueError, match="exactly one"):
        cheapest_level(mech, steps)
    with pytest.raises(ValueError, match="positive"):
        cheapest_level(mech, steps, rmse=-1.0)


@pytest.mark.parametrize("lam", [1e-6, 1e6, 1e11, 1e18])
def test_poisson_half_widths_are_cheap_and_finite_for_any_rate(lam: float) -> None:
    """A tail search, not a sum over 24√λ integers: a quote on a huge-λ stream stays cheap."""
    import time

    t0 = time.perf_counter()
    model = error_model(Poisson(math.sqrt(lam * 1e-3)), 1e-3)  # λ = Δ²/ω
    assert model.scale == pytest.approx(lam)
    t = model.half_width(0.9999)
    assert math.isfinite(t) and time.perf_counter() - t0 < 1.0
    assert t <= 4.0 * math.sqrt(lam) + 2.0  # about 3.9 sd: not a runaway


def test_confidence_is_capped_where_the_tails_are_trustworthy() -> None:
    model = error_model(Gaussian(1.0), 1.0)
    assert math.isfinite(model.half_width(0.9999))
    for bad in (0.99999, 1.0 - 2.0**-53, 0.0):
        with pytest.raises(ValueError, match="confidence"):
            model.half_width(bad)


def test_an_impossible_target_names_the_level_with_the_smallest_error() -> None:
    """Poisson half-widths are not monotone in the level: the best offer is the argmin."""
    mech = Poisson(1.0)
    with pytest.raises(AccuracyNotForSaleError) as err:
        cheapest_level(mech, [0.51, 0.73], half_width=1.0, confidence=0.95)
    assert err.value.best == 0.51 and err.value.error == pytest.approx(2.0392, abs=1e-3)
