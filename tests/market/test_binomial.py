"""Binomial thinning through alias tables (:mod:`market._binomial`): the law, its power, the
fallbacks, and chains that keep numpy's draws."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from market import InvalidValueError, Poisson, ReleaseChain, ReleaseState, default_rng
from market._binomial import ALIAS_MIN_SIZE, MAX_N, WIDTH, alias_tables, thin
from market.rng import KeyedRngFactory


@pytest.mark.parametrize("p", [1e-3, 0.1, 0.5, 0.93])
def test_every_row_of_the_tables_is_the_binomial_law(p: float) -> None:
    accept, alias = alias_tables(MAX_N, p)
    for n in range(MAX_N + 1):
        law = np.bincount(np.arange(WIDTH), weights=accept[n], minlength=WIDTH)
        law += np.bincount(alias[n], weights=1.0 - accept[n], minlength=WIDTH)
        exact = np.where(np.arange(WIDTH) <= n, stats.binom.pmf(np.arange(WIDTH), n, p), 0.0)
        np.testing.assert_allclose(law / WIDTH, exact, rtol=0, atol=2e-15)  # a few ulps of 1


def _chi_square_pvalues(draws: np.ndarray, n: np.ndarray, p: float) -> list[float]:
    """One chi-square p-value per count n_i with enough coordinates, pooling sparse cells."""
    out = []
    for k in np.unique(n):
        got = draws[n == k]
        if got.size < 2_000 or k == 0:
            continue
        exp = stats.binom.pmf(np.arange(k + 1), k, p) * got.size
        obs = np.bincount(got, minlength=k + 1).astype(float)
        keep = exp >= 10
        obs_k = np.append(obs[keep], obs[~keep].sum())
        exp_k = np.append(exp[keep], exp[~keep].sum())
        if exp_k[-1] == 0:
            obs_k, exp_k = obs_k[:-1], exp_k[:-1]
        out.append(float(stats.chisquare(obs_k, exp_k * obs_k.sum() / exp_k.sum()).pvalue))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("p", [0.1, 0.5, 0.93])
def test_thinning_has_the_binomial_law_for_every_count(p: float) -> None:
    n = np.random.default_rng(11).poisson(12.0, 600_000)
    draws = thin(default_rng(12), n, p)
    pvalues = _chi_square_pvalues(draws, n, p)
    assert len(pvalues) >= 12
    assert min(pvalues) > 1e-4 / len(pvalues), pvalues  # Bonferroni over the rows


@pytest.mark.slow
def test_the_check_has_power_against_a_slightly_wrong_sampler() -> None:
    n = np.random.default_rng(11).poisson(12.0, 600_000)
    wrong = thin(default_rng(12), n, 0.51)  # what a sampler off by 0.01 in p would give
    assert min(_chi_square_pvalues(wrong, n, 0.5)) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("count", [23, 30, 47, 62, MAX_N])
def test_large_counts_are_drawn_from_their_own_row(count: int) -> None:
    """The mixed-count check above sees rows up to ~22 only: every count up to MAX_N must be
    drawn from its own row (a lookup capped or shifted by one row fails here)."""
    n = np.full(50_000, count)
    n[::7] = np.arange(n[::7].size) % (MAX_N + 1)  # other rows in the same table
    pvalues = _chi_square_pvalues(thin(default_rng(5), n, 0.37), n, 0.37)
    assert min(pvalues) > 1e-4 / len(pvalues), pvalues
    wrong = thin(default_rng(5), np.minimum(n, count - 1), 0.37)  # the row below
    assert min(_chi_square_pvalues(wrong, n, 0.37)) < 1e-6


def test_the_tables_serve_exactly_from_the_size_and_count_limits() -> None:
    at_size = np.arange(ALIAS_MIN_SIZE) % 20  # exactly the shortest vector
    at_count = np.full(ALIAS_MIN_SIZE, MAX_N)  # exactly the largest count
    for n in (at_size, at_count):
        assert thin(default_rng(3), n, 0.3).tobytes() != default_rng(3).binomial(n, 0.3).tobytes()


def test_short_vectors_large_counts_and_numpy_thinning_draw_numpys_bits() -> None:
    short = np.arange(ALIAS_MIN_SIZE - 1) % 20
    large = np.full(ALIAS_MIN_SIZE, MAX_N + 1)
    for n, method in ((short, "alias"), (large, "alias"), (np.arange(10_000) % 20, "numpy")):
        got = thin(default_rng(3), n, 0.3, method)  # type: ignore[arg-type]
        assert got.tobytes() == default_rng(3).binomial(n, 0.3).tobytes()


def test_long_vectors_use_the_tables() -> None:
    n = np.arange(10_000) % 20
    assert thin(default_rng(3), n, 0.3).tobytes() != default_rng(3).binomial(n, 0.3).tobytes()


def test_release_state_relaxes_through_the_tables_and_chains_keep_numpys_draws() -> None:
    counts = np.arange(20_000) % 7
    fast = ReleaseState(Poisson(1.0), counts)
    slow = ReleaseState(Poisson(1.0, thinning="numpy"), counts)
    for st in (fast, slow):
        st.release(0.05, rng=default_rng(1))
    a, b = fast.release(0.2, rng=default_rng(2)), slow.release(0.2, rng=default_rng(2))
    assert a.tobytes() != b.tobytes()  # the relaxation drew through the tables
    # a chain's noise is a pure function of its key in every version: it never uses the tables
    rngs = KeyedRngFactory(b"k" * 32)
    chains = [ReleaseChain(Poisson(1.0, thinning=t), (0.05, 0.2)) for t in ("alias", "numpy")]
    assert chains[0].mechanism == chains[1].mechanism == Poisson(1.0, thinning="numpy")
    out = [c.release([c.open(counts)], 1, [("v",)], rngs)[0].tobytes() for c in chains]
    assert out[0] == out[1]


def test_an_unknown_thinning_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="thinning"):
        Poisson(1.0, thinning="fast")  # type: ignore[arg-type]


def test_a_negative_count_is_an_error_as_in_numpy() -> None:
    n = np.arange(ALIAS_MIN_SIZE) % 20
    n[7] = -1
    with pytest.raises(ValueError, match="n < 0"):
        thin(default_rng(1), n, 0.3)
