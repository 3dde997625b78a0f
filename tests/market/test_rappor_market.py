"""The market's RAPPOR releases (docs/protocol.md §1.10, market.rappor): each level's bits have
the law of a fresh randomized response at the parameters it states; a coalition's bits at
several levels are functions of the top Laplace release and noise independent of the data; a
buyer's estimate covers the population's frequencies."""

from __future__ import annotations

import numpy as np
from scipy import stats

from market import Laplace
from market.chain import ReleaseChain
from market.rappor import estimate_bits, market_response, released_bits
from market.rng import NoiseKeys

LEVELS = (2.0, 4.0, 8.0)
N = 40_000  # coordinates: 20,000 with the member's bit 0 and 20,000 with it 1


def keys() -> NoiseKeys:
    return NoiseKeys(b"r" * 32)


def chain_releases(dimension: int = N) -> tuple[np.ndarray, list[np.ndarray]]:
    """One value of alternating bits, released at every level of one chain: each coordinate's
    noise is independent, so each is one member's bit (the test of the law per coordinate)."""
    mech = Laplace(2.0, dimension=dimension)
    chain = ReleaseChain(mech, LEVELS)
    y = (np.arange(dimension) % 2).astype(np.float64)
    st = chain.open(y)
    return y, [chain.release([st], k, [("s", "v", "d")], keys())[0] for k in range(len(LEVELS))]


def binomial_p(ones: int, n: int, p: float) -> float:
    return float(stats.binomtest(ones, n, p).pvalue)


def test_each_level_releases_the_randomized_response_it_states() -> None:
    y, releases = chain_releases()
    for level, release in zip(LEVELS, releases, strict=True):
        bits = released_bits(release)
        rr = market_response(2.0, N, level)
        for member, p in ((0.0, rr.p_if_0), (1.0, rr.p_if_1)):
            got = bits[y == member]
            assert binomial_p(int(got.sum()), got.size, p) > 1e-3, (level, member)
            # power: the response of a level 25 % away is rejected
            wrong = market_response(2.0, N, level * 1.25)
            p_wrong = wrong.p_if_0 if member == 0.0 else wrong.p_if_1
            assert binomial_p(int(got.sum()), got.size, p_wrong) < 1e-6, (level, member)
        # the bits of different coordinates are independent: neighbours do not agree more
        table = np.histogram2d(bits[:-2:2], bits[2::2], bins=2)[0]
        assert stats.chi2_contingency(table).pvalue > 1e-3


def test_a_coalitions_lower_bits_are_the_top_release_plus_noise_independent_of_the_data() -> None:
    """Bits at a lower level are ``[Y_top + W > 1/2]`` with ``W`` independent of the member's
    bit: a coalition of buyers at every level learns nothing the top level's Laplace release
    (charged at its ε) does not hold."""
    y, releases = chain_releases()
    top = releases[-1]
    for low in releases[:-1]:
        w = low - top
        assert np.array_equal(released_bits(low), released_bits(top + w))
        edges = np.quantile(w, np.linspace(0, 1, 11))
        table = [np.histogram(w[y == b], np.unique(edges))[0] for b in (0.0, 1.0)]
        assert stats.chi2_contingency(table).pvalue > 1e-3
        # power: the same test sees the data in the top release itself
        edges = np.quantile(top, np.linspace(0, 1, 11))
        seen = [np.histogram(top[y == b], np.unique(edges))[0] for b in (0.0, 1.0)]
        assert stats.chi2_contingency(seen).pvalue < 1e-6


def test_the_estimate_covers_the_populations_frequencies() -> None:
    """4,000 members in 8 categories (one-hot reports), released at ε = 8: every category's
    99 % interval holds its true frequency; the response of another level misses."""
    k, members = 8, 4_000
    freq = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
    cats = np.repeat(np.arange(k), (freq * members).astype(int))
    reports = np.eye(k)[cats]
    chain = ReleaseChain(Laplace(2.0, dimension=k), LEVELS)
    states = [chain.open(r) for r in reports]
    ids = [("s", f"v{i}", "d") for i in range(len(states))]
    bits = np.asarray([released_bits(r) for r in chain.release(states, 2, ids, keys())])
    est = estimate_bits(bits, market_response(2.0, k, 8.0), confidence=0.99)
    assert est.reports == members
    assert np.all((est.low <= freq) & (freq <= est.high)), (est.low, freq, est.high)
    assert np.abs(est.fraction - freq).max() < 0.05
    wrong = estimate_bits(bits, market_response(2.0, k, 4.0), confidence=0.99)
    assert not np.all((wrong.low <= freq) & (freq <= wrong.high))
