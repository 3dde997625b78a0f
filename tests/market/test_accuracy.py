"""Error models and intervals: stated accuracy is what releases deliver.

Coverage is checked by simulation on releases made by the samplers themselves (200,000
coordinates, fixed seeds) within binomial error, with a negative control showing the check has
the power to catch a half-width only 3 % too small. Poisson half-widths are also checked
exactly against the Poisson CDF (the law is discrete: coverage is at least the confidence, and
one step less would not be).

The laws of integer noise (Poisson, discrete Laplace) are also checked without sampling: the
interval of a release holds a truth exactly when the noise is in the model's integer range, for
any truth, and the range's mass, summed from the pmf here, is at least the confidence and the
least it can be. Negative controls run the Poisson coverage checks on the interval as it was
once computed, ``release − λ ± t`` in doubles (:func:`float_interval`), and see them fail: that
form dropped a boundary outcome (coverage 0.843 at a stated 90 % for λ = 0.7022 and a truth of
7); the minimality check fails on the integers within ± t of λ, the old interval's outcomes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

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


def noise_pmf(model: ErrorModel, n: np.ndarray) -> np.ndarray:
    """P(noise = n) of an integer-noise model, from the law itself (scipy's Poisson pmf or the
    discrete Laplace formula), not from anything in :mod:`market.accuracy`."""
    if model.mechanism == "poisson":
        return np.asarray(stats.poisson.pmf(n, model.scale), dtype=np.float64)
    return dlap_pmf(model, n)


def noise_mass(model: ErrorModel, lo: int, hi: int) -> float:
    """P(lo ≤ noise ≤ hi), summed outcome by outcome from the pmf."""
    return math.fsum(noise_pmf(model, np.arange(lo, hi + 1)).tolist())


def float_interval(
    model: ErrorModel, release: np.ndarray, c: float
) -> tuple[np.ndarray, np.ndarray]:
    """The interval as it was computed before the integer ranges: ``release − offset ± t`` in
    doubles. The half-width is unchanged (the same t, the distance from λ of the farthest
    integer held), so this reproduces the old intervals bit for bit."""
    est = np.asarray(release, dtype=np.float64) - model.offset
    t = model.half_width(c)
    return est - t, est + t


def poisson_model(lam: float) -> ErrorModel:
    """The model of Poisson noise of rate λ, as a client rebuilds it from a release's fields."""
    return ErrorModel("poisson", 1.0 / lam, "omega", lam, math.sqrt(lam), lam)


def assert_at_least(hits: int, n: int, p: float, z: float = 4.5) -> None:
    """A binomial proportion is at least p, less z standard errors."""
    se = math.sqrt(p * (1 - p) / n)
    assert hits / n >= p - z * se, f"coverage {hits / n:.5f} < {p:.5f} (se {se:.2e}, n={n})"


#: λ = 1/1.424 ≈ 0.7022 (Δ = 1, ω = 1.424: the review's example), 12.3, and 150 rates drawn
#: log-uniformly from [0.05, 5000] (none whole)
RATES = [
    error_model(Poisson(1.0), 1.424).scale,
    12.3,
    *np.exp(np.random.default_rng(2024).uniform(math.log(0.05), math.log(5000.0), 150)).tolist(),
]


@pytest.mark.parametrize(("mech", "level", "truth"), CASES)
def test_intervals_cover_the_true_value_as_stated(
    mech: Mechanism, level: float, truth: float
) -> None:
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
        if isinstance(mech, Poisson | DiscreteLaplace):  # discrete: the law's mass, at least c
            exact = noise_mass(model, *model.noise_range(c))
            assert exact >= c
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
    """Laplace on its grid g = 2^-11 (Δ = 2, d = 1): noise g·DLap(e^{−ε/D}), D = 4097, and the
    value rounded by at most g/2; the Gaussian's own grid adds at most half a step."""
    lap = error_model(Laplace(2.0), 0.5)  # b = g·D/ε ≈ 4
    g, a = 2.0**-11, Fraction(1, 2) / 4097
    assert lap.grid == g and lap.scale == 4097 * g / 0.5
    assert lap.std == pytest.approx(4.0 * math.sqrt(2.0), rel=1e-3)
    p = math.exp(-float(a))  # smallest whole t with P(|J| > t) = 2p^{t+1}/(1+p) ≤ 5 %
    t = next(t for t in range(10**6) if 2 * p ** (t + 1) / (1 + p) <= 0.05)
    assert lap.half_width(0.95) == pytest.approx((t + 0.5) * g, abs=1e-12)
    assert lap.half_width(0.95) == pytest.approx(4.0 * math.log(20.0), rel=1e-3)
    gau = error_model(Gaussian(1.0), 0.5)  # σ² = 1, grid 2^-16
    assert gau.grid == 2.0**-16
    assert gau.std == pytest.approx(1.0) and gau.half_width(0.95) == pytest.approx(
        1.959964 + 2.0**-17, abs=1e-6
    )
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
    assert err.value.best == 4.0
    assert err.value.error == pytest.approx(math.log(20.0) / 4.0, rel=1e-3)
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
    lo, hi = model.noise_range(0.9999)
    assert math.isfinite(t) and time.perf_counter() - t0 < 1.0
    assert t <= 4.0 * math.sqrt(lam) + 2.0  # about 3.9 sd: not a runaway
    assert 0 <= lo <= hi and hi - lo <= 2.0 * t * (1 + 1e-15) and lo <= lam + 1 and hi >= lam - 1


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


# --- integer noise: exact intervals ---------------------------------------------------------


@pytest.mark.parametrize("c", [0.90, 0.95, 0.99])
def test_a_poisson_noise_range_is_the_fewest_outcomes_that_reach_the_confidence(c: float) -> None:
    """Mass ≥ c, dropping the less likely end (so either end) falls short, and no range of one
    outcome fewer anywhere reaches c; the range is never wider than ± the quoted half-width."""
    for lam in RATES:
        model = poisson_model(lam)
        lo, hi = model.noise_range(c)
        pmf = noise_pmf(model, np.arange(int(lam + 15 * math.sqrt(lam) + 40)))
        assert 0 <= lo <= hi < len(pmf), (lam, lo, hi)
        mass = math.fsum(pmf[lo : hi + 1].tolist())
        assert mass >= c, (lam, lo, hi, mass)
        assert mass - min(pmf[lo], pmf[hi]) < c, (lam, lo, hi, mass)
        if hi > lo:  # every range of hi − lo outcomes, as prefix-sum differences
            cum = np.concatenate([[0.0], np.cumsum(pmf)])
            assert float(np.max(cum[hi - lo :] - cum[: lo - hi])) < c, (lam, lo, hi)
        assert hi - lo <= 2.0 * model.half_width(c) + 1e-9


def test_the_range_of_the_symmetric_half_width_is_not_always_the_shortest() -> None:
    """Why the range is chosen by mass, not by distance from λ: the integers within ± t of λ
    (the old interval's outcomes) are sometimes more than needed, and then dropping an end of
    them still reaches c. The check above would catch a range chosen that way."""
    longer = not_minimal = 0
    for lam in RATES:
        model, exact = poisson_model(lam), Fraction(lam)
        for c in (0.90, 0.95, 0.99):
            t = Fraction(model.half_width(c))  # the distance of an integer, as a double
            a, b = max(0, math.ceil(exact - t)), math.floor(exact + t)
            lo, hi = model.noise_range(c)
            longer += b - a > hi - lo
            ends = noise_pmf(model, np.array([a, b]))
            not_minimal += noise_mass(model, a, b) - float(ends.min()) >= c
    assert longer > 0 and not_minimal > 0


@pytest.mark.parametrize("c", [0.90, 0.95, 0.99])
def test_a_poisson_interval_holds_a_truth_exactly_when_the_noise_is_in_its_range(c: float) -> None:
    """For every truth, the interval of the release truth + n holds the truth iff n is in the
    noise range (so coverage is the range's mass), with both ends exact integers, whether the
    release is int64 (as sampled) or float64 (as the wire carries it)."""
    for lam in RATES[:40]:
        model = poisson_model(lam)
        lo, hi = model.noise_range(c)
        n = np.arange(max(0, lo - 3), hi + 4)
        for truth in (0, 1, 7, 12_345, 2**40 + 3, 2**52 - 5):
            y = truth + n
            for release in (y, y.astype(np.float64)):
                low, high = model.interval(release, c)
                assert np.array_equal(low, y - hi) and np.array_equal(high, y - lo)
                held = (low <= truth) & (truth <= high)
                assert np.array_equal(held, (lo <= n) & (n <= hi)), (lam, truth)


def test_the_float_interval_dropped_a_boundary_outcome() -> None:
    """The defect, deterministically: at λ = 1/1.424 the 90 % range is {0, 1, 2} (t = 2 − λ),
    and ``9 − λ − t`` in doubles lands a hair above 7, so a truth of 7 released as 9 was
    missed: coverage P(N ≤ 1) = 0.843. The integer interval holds it."""
    model = error_model(Poisson(1.0), 1.424)
    assert model.noise_range(0.90) == (0, 2)
    y = 7 + np.arange(3)
    low, high = float_interval(model, y, 0.90)
    assert ((low <= 7) & (high >= 7)).tolist() == [True, True, False]
    low, high = model.interval(y, 0.90)
    assert ((low <= 7) & (high >= 7)).tolist() == [True, True, True]


def exact_coverage(
    model: ErrorModel, truth: int, c: float, interval: Callable[..., tuple[Any, Any]]
) -> float:
    """P(the interval of truth + N holds truth), summed over the outcomes of N (to 15 sd)."""
    n = np.arange(int(model.scale + 15 * math.sqrt(model.scale) + 40))
    low, high = interval(model, truth + n, c)
    held = (low <= truth) & (truth <= high)
    return math.fsum(noise_pmf(model, n[held]).tolist())


def random_settings(count: int) -> list[tuple[ErrorModel, int, float]]:
    """Poisson models, truths and confidences: Δ ~ U[0.5, 3], ω ~ U[0.01, 3] with truths in
    [1, 50], and λ log-uniform in [0.05, 5000] with truths up to 10⁶ (fixed seed)."""
    rng = np.random.default_rng(77)
    out = []
    for i in range(count):
        c = float(rng.choice([0.90, 0.95, 0.99]))
        if i % 2:
            mech, omega = Poisson(float(rng.uniform(0.5, 3.0))), float(rng.uniform(0.01, 3.0))
            out.append((error_model(mech, omega), int(rng.integers(1, 51)), c))
        else:
            lam = math.exp(float(rng.uniform(math.log(0.05), math.log(5000.0))))
            out.append((poisson_model(lam), int(rng.integers(0, 10**6 + 1)), c))
    return out


def test_poisson_coverage_is_at_least_the_confidence_for_any_rate_and_truth() -> None:
    """2,000 random settings, coverage summed exactly over the noise outcomes: never below c.
    The float interval falls short in some of the same settings (negative control)."""
    short_old = []
    for model, truth, c in random_settings(2000):
        assert exact_coverage(model, truth, c, ErrorModel.interval) >= c, (model, truth, c)
        old = exact_coverage(model, truth, c, float_interval)
        if old < c:
            short_old.append(old - c)
    assert len(short_old) >= 10 and min(short_old) < -0.05  # 22 settings, worst 0.861 at 95 %


@pytest.mark.parametrize("omega", [1.424, 1.0 / 12.3])  # λ ≈ 0.7022 and λ ≈ 12.3
def test_poisson_intervals_cover_a_nonzero_truth_as_stated(omega: float) -> None:
    """Releases by the sampler itself, truth 7: at least c within binomial error (200,000
    coordinates: se 0.0007 at 90 %), and the range's exact mass."""
    mech, truth = Poisson(1.0), 7
    model = error_model(mech, omega)
    y = releases(mech, omega, truth, seed=13)
    for c in (0.90, 0.95, 0.99):
        exact = noise_mass(model, *model.noise_range(c))
        assert exact >= c
        low, high = model.interval(y, c)
        hits = int(np.count_nonzero((low <= truth) & (truth <= high)))
        assert_at_least(hits, N, c)
        assert_proportion(hits, N, exact)


def test_the_simulation_catches_the_float_interval() -> None:
    """Negative control: the same check on the old interval fails (0.843 against 90 %)."""
    mech, truth, omega = Poisson(1.0), 7, 1.424
    model = error_model(mech, omega)
    y = releases(mech, omega, truth, seed=13)
    low, high = float_interval(model, y, 0.90)
    hits = int(np.count_nonzero((low <= truth) & (truth <= high)))
    assert abs(hits / N - 0.843) < 0.005
    with pytest.raises(AssertionError, match="coverage"):
        assert_at_least(hits, N, 0.90)


def test_of_two_ranges_as_short_and_as_likely_the_lower_is_held() -> None:
    """The only exact ties of the Poisson pmf: P(N = λ − 1) = P(N = λ) at a whole λ."""
    assert poisson_model(1.0).noise_range(0.30) == (0, 0)  # P(N = 0) = P(N = 1) = e^{-1}
    assert poisson_model(3.0).noise_range(0.20) == (2, 2)  # P(N = 2) = P(N = 3) = 0.224
    assert poisson_model(3.0).noise_range(0.40) == (2, 3)


@pytest.mark.parametrize("c", [0.90, 0.95, 0.99])
def test_a_discrete_laplace_interval_holds_a_truth_exactly_when_the_noise_is_in_its_range(
    c: float,
) -> None:
    """Discrete Laplace noise is integer too: its interval is release ± t in integers, with
    mass at least c. (Its old float interval was already exact: offset 0 and a whole t, so
    ``release ± t`` is a sum of whole doubles below 2^53; it is checked here to stay so.)"""
    levels = [0.05, 0.3, 1.0, 2.5, 7.0, *np.random.default_rng(5).uniform(0.01, 10.0, 20)]
    for level in levels:
        model = error_model(DiscreteLaplace(1.0), float(level))
        t = int(model.half_width(c))
        assert model.noise_range(c) == (-t, t)
        assert noise_mass(model, -t, t) >= c
        n = np.arange(-t - 3, t + 4)
        for truth in (-(2**52) + 5, -12_345, -4, 0, 3, 2**40 + 3, 2**52 - 5):
            y = truth + n
            for release in (y, y.astype(np.float64)):
                low, high = model.interval(release, c)
                assert np.array_equal(low, y - t) and np.array_equal(high, y + t)
                held = (low <= truth) & (truth <= high)
                assert np.array_equal(held, np.abs(n) <= t), (level, truth)
                old_low, old_high = float_interval(model, release, c)
                assert np.array_equal(old_low, low) and np.array_equal(old_high, high)


def test_an_integer_interval_takes_whole_releases_and_rounds_outwards_beyond_2_53() -> None:
    model = error_model(Poisson(1.0), 1.424)
    lo, hi = model.noise_range(0.90)
    with pytest.raises(ValueError, match="whole"):
        model.interval([3.5], 0.90)
    low, high = model.interval([math.nan, 7.0], 0.90)
    assert math.isnan(low[0]) and math.isnan(high[0]) and (low[1], high[1]) == (7 - hi, 7 - lo)
    truth = 2**55 + 1  # no double: the ends are rounded away from each other
    y = truth + np.arange(lo, hi + 1, dtype=np.int64)
    low, high = model.interval(y, 0.90)
    assert all(a <= truth <= b for a, b in zip(low.tolist(), high.tolist(), strict=True))
    with pytest.raises(ValueError, match="2\\^61"):
        model.interval(np.array([2**62]), 0.90)
    with pytest.raises(ValueError, match="not integer"):
        error_model(Laplace(1.0), 1.0).noise_range(0.90)
