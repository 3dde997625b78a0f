"""The histogram chain: the dense algorithm's law, keyed by value, lossless across steps."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import integrate, special, stats

from market import histogram_chain
from market.errors import InvalidLevelError, InvalidValueError
from market.histogram import first_exceedance
from market.histogram_chain import (
    GRID,
    HistogramChain,
    HistogramValue,
    TooManyFalseKeysError,
    _first_appearance,
    _richardson,
    _Round,
    _survival_law,
    string_key,
)
from market.levels import canonical_level
from market.rng import KeyedRngFactory, default_rng
from tests.applications.test_histogram import COUNTS, SUPPORT, Runs, assert_same_law, run, summaries

from .stats import assert_close_z, covariance_se

D = 400
LEVELS = (0.5, 1.0, 2.0, 4.0)
RNGS = KeyedRngFactory(b"histogram chain test secret 0001")


def chain(false_keys: float = 40.0, domain: int = D, grid: int = GRID) -> HistogramChain:
    return HistogramChain(LEVELS, sensitivity=1.0, domain=domain, false_keys=false_keys, grid=grid)


def chain_runs(ch: HistogramChain, reps: int, tag: str) -> Runs:
    value = ch.value(SUPPORT, COUNTS)
    return [
        [ch.release(value, k, ("s", f"{tag}{i}", "d"), RNGS) for k in range(len(ch))]
        for i in range(reps)
    ]


def test_thresholds_follow_the_false_key_tolerance() -> None:
    ch = chain(false_keys=2.0, domain=2**40)
    z = -special.ndtri(2.0 / (2**40 * 4))
    for lvl, tau in zip(ch.levels, ch.thresholds, strict=True):
        assert tau == pytest.approx(z / math.sqrt(2 * lvl))
    assert ch.max_false_keys == 68


@pytest.mark.slow
def test_the_chain_has_the_dense_algorithms_law() -> None:
    """Per step: how many zero counts are released, their values, the support's values, and
    how many zero counts of one step are released again at the next (the joint law)."""
    ch = chain()
    dense = summaries(run("dense", 600, 11, list(zip(ch.levels, ch.thresholds, strict=True))))
    assert dense["n0"].mean() > 5  # zero counts are released at every step: the test has power
    assert_same_law(dense, summaries(chain_runs(ch, 600, "law")))


def test_a_wrong_first_release_law_is_caught() -> None:
    """Power check: zero counts first released at step 1 drawn as if their walk started afresh
    (ignoring that they stayed below step 0's threshold) have visibly other values than the
    chain's, with the chain's own sample size."""
    ch = chain()
    first: list[float] = []
    support = set(SUPPORT.tolist())
    for rounds in chain_runs(ch, 600, "power"):
        before = set(rounds[0][0].tolist()) | support
        first += [v for i, v in zip(*rounds[1], strict=True) if i not in before]
    rng = default_rng(3)
    s1 = math.sqrt(ch.levels[1] / 2)  # Var W_1 = ρ_1/2 from 0: the naive law
    a = ch.levels[1] * ch.thresholds[1]
    naive = stats.truncnorm.rvs(a / s1, np.inf, scale=s1, size=4000, random_state=rng)
    assert len(first) > 1000
    assert stats.ks_2samp(first, naive / ch.levels[1]).pvalue < 1e-4


@pytest.mark.parametrize("ratio", [1.01, 1.25, 2.0])
def test_a_key_first_shown_at_a_later_step_says_nothing_of_the_data(ratio: float) -> None:
    """Keys in the data with count ~0 and keys not in it are shown for the first time at each
    later step equally often, also for the closest levels sold (1 % apart, four steps). The
    survival law taken at cell centres made this 1e-20 of the truth at a gap of 1e-5; uniform
    cells wider than a step's boundary layer made it 1.3-1.5x from the third step on at that
    gap (now refused: levels at least 1 % apart)."""
    ch = HistogramChain(
        tuple(ratio**i for i in range(4)), sensitivity=1.0, domain=2000, false_keys=999.0
    )
    value = ch.value(np.arange(1000), np.full(1000, 1e-300))  # in the data, count ~0
    listed, unlisted = np.zeros((400, 3)), np.zeros((400, 3))
    for i in range(400):
        got = ch.release_steps(value, {0, 1, 2, 3}, ("s", f"g{i}", "d"), RNGS)
        seen = set(got[0][0].tolist())
        for k in (1, 2, 3):
            new = np.asarray(sorted(set(got[k][0].tolist()) - seen), dtype=np.int64)
            listed[i, k - 1], unlisted[i, k - 1] = (new < 1000).sum(), (new >= 1000).sum()
            seen |= set(got[k][0].tolist())
    for k in range(3):
        a, b = listed[:, k], unlisted[:, k]
        assert b.mean() > 0.5  # keys do appear at every later step: the test has power
        se = math.sqrt(a.var() / a.size + b.var() / b.size)
        assert abs(a.mean() - b.mean()) < 4.5 * se, (k + 1, a.mean(), b.mean())


# -- the exact law of a zero count's first appearance, with no grid ----------------------------
#
# Standardised, the walk of a zero count is X_k = S_k/sd(S_k) = r_k X_{k-1} + s_k ε with
# r_k = √(ρ_{k-1}/ρ_k), s_k = √(1 − r_k²), and it first shows at step k iff X_j ≤ z for j < k and
# X_k > z (z = Φ⁻¹(1 − m/(dK)): τ_k = z·Δ/√(2ρ_k) is z standard deviations of S_k/ρ_k). The
# reference below carries the sub-density of X_k on never-exceeded paths on composite
# Gauss–Legendre nodes (Nyström), written apart from the market's code, with other panels, order
# and cut-off than market.histogram.first_exceedance; it is checked against scipy's adaptive
# quadrature (two and three steps), against itself on panels half as wide, and against a Monte
# Carlo that samples the walk backwards from the exceedance (the chain is reversible).

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(12)
_LOW = -12.0  # in standard deviations of S: below, Φ(−12) ≈ 2e-33 of the mass


def ladder(ratio: float, k: int, start: float = 1.0) -> tuple[float, ...]:
    """``k`` levels, each the smallest canonical level at least ``ratio`` times the previous
    (what registration accepts at the ratio)."""
    out = [canonical_level(start)]
    while len(out) < k:
        nxt = canonical_level(out[-1] * ratio)
        while nxt < ratio * out[-1]:
            nxt = canonical_level(nxt * (1 + 1e-13))
        out.append(nxt)
    return tuple(out)


def _panels(lo: float, hi: float, width: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    n = max(1, math.ceil((hi - lo) / width))
    edges = np.linspace(lo, hi, n + 1)
    mid, half = (edges[1:] + edges[:-1]) / 2, (edges[1:] - edges[:-1]) / 2
    return (mid[:, None] + half[:, None] * _NODES).ravel(), (half[:, None] * _WEIGHTS).ravel()


class ExactLaw:
    """First appearance of a zero count on ``levels`` with thresholds ``z`` deviations up."""

    def __init__(self, levels: tuple[float, ...], z: float, resolution: float = 1.0) -> None:
        lv = np.asarray(levels)
        self.z = z
        self.r = np.sqrt(lv[:-1] / lv[1:])
        self.s = np.sqrt(1.0 - self.r**2)
        # panels twice the narrower of a step's spread and the density's decay length 1/z
        self.width = 2.0 * min(0.5, float(self.s.min(initial=1.0)), 1.0 / z) / resolution
        x, w = _panels(_LOW, z, self.width)
        u = stats.norm.pdf(x)
        self.walk = [(x, w, u)]  # the sub-density u_k of X_k at nodes x (weights w), k = 0 …
        for rk, sk in zip(self.r[:-1], self.s[:-1], strict=True):
            u = self._density(x, w * u, rk, sk, x)
            self.walk.append((x, w, u))

    @staticmethod
    def _density(
        x: NDArray[np.float64], mass: NDArray[np.float64], r: float, s: float, y: Any
    ) -> NDArray[np.float64]:
        """The next step's sub-density at ``y`` from masses at ``x``."""
        yy = np.asarray(y, dtype=np.float64)
        out = np.empty_like(yy)
        for i in range(0, yy.size, 4096):
            t = (yy[i : i + 4096, None] - r * x[None, :]) / s
            out[i : i + 4096] = np.exp(-0.5 * t * t) @ mass / (s * math.sqrt(2 * math.pi))
        return out

    def first(self) -> NDArray[np.float64]:
        """P(a zero count first shows at step k), k = 0 … K−1."""
        out = [float(special.ndtr(-self.z))]
        for k in range(1, self.r.size + 1):
            x, w, u = self.walk[k - 1]
            out.append(
                float(np.sum(w * u * special.ndtr((self.r[k - 1] * x - self.z) / self.s[k - 1])))
            )
        return np.asarray(out)

    def start_cdf(self, k: int, points: NDArray[np.float64]) -> NDArray[np.float64]:
        """CDF of ``X_{k−1}`` of the zero counts that first show at step ``k ≥ 1``, at
        increasing ``points`` below z: density ∝ u_{k−1}(y)·P(X_k > z | X_{k−1} = y)."""
        cuts = np.concatenate([[_LOW], points, [self.z]])
        total = [0.0]
        for lo, hi in itertools.pairwise(cuts):
            y, wy = _panels(float(lo), float(hi), min(self.width, max(float(hi - lo), 1e-300)))
            if k == 1:
                u = stats.norm.pdf(y)
            else:
                x, w, uu = self.walk[k - 2]
                u = self._density(x, w * uu, float(self.r[k - 2]), float(self.s[k - 2]), y)
            q = special.ndtr((self.r[k - 1] * y - self.z) / self.s[k - 1])
            total.append(total[-1] + float(np.sum(wy * u * q)))
        cdf = np.asarray(total[1:])
        return np.asarray(cdf[:-1] / cdf[-1])


def _z(levels: tuple[float, ...], domain: int, false_keys: float) -> float:
    return -float(special.ndtri(false_keys / (domain * len(levels))))


def _error(first: NDArray[np.float64], exact: NDArray[np.float64]) -> float:
    return float(np.max(np.abs(first / exact - 1.0)))


def _old_grid(ch: HistogramChain) -> tuple[_Round, ...]:
    """The chain's survival law as it was: 512 and 256 equal cells, Richardson."""
    fine = _survival_law(ch.levels, ch.thresholds, ch.sensitivity, 512, graded=False)
    coarse = _survival_law(ch.levels, ch.thresholds, ch.sensitivity, 256, graded=False)
    return _richardson(fine, coarse)


# registrations the chain accepts: the closest levels (1.01× apart, 16 of them) at the largest
# domains and fewest false keys, the usual ladders, wide and mixed ones, small thresholds
REGISTRATIONS = [
    (ladder(1.01, 16), 2**40, 1e-6),
    (ladder(1.01, 16), 2**62, 1e-6),
    ((0.25, 0.5, 1.0, 2.0), 2**40, 1.0),
    (LEVELS, D, 40.0),
    (ladder(1.25, 5), 2**62, 1.0),
    (ladder(2.0, 16, 1e-3), 2**62, 1e-6),
    (ladder(10.0, 8, 1e-3), 2**10, 1000.0),
    (ladder(1.01, 4), 2**10, 100.0),
    ((1.0, 1.01, 2.0, 2.02, 100.0, 101.0), 2**30, 0.01),
]


@pytest.mark.slow
def test_the_exact_reference_is_the_integral_and_converges() -> None:
    """Two and three steps against scipy's adaptive quadrature of the Gaussian transition
    kernels (to 1e-9), and sixteen steps against the same reference on panels half as wide:
    the reference is exact to far below the 0.5 % it judges."""
    for levels, z in [((1.0, 1.01), 10.6), ((1.0, 4.0), 10.6), ((1.0, 1.01), 3.0)]:
        r, s = math.sqrt(levels[0] / levels[1]), math.sqrt(1 - levels[0] / levels[1])
        num, _ = integrate.quad(
            lambda x, r=r, s=s, z=z: stats.norm.pdf(x) * special.ndtr((r * x - z) / s),
            _LOW,
            z,
            points=[z - 1.0, z - 0.3],
            epsabs=0.0,
            epsrel=1e-12,
            limit=400,
        )
        assert ExactLaw(levels, z).first()[1] == pytest.approx(num, rel=1e-9, abs=0.0)
    for levels, z in [((1.0, 1.01, 1.0201), 10.6), ((1.0, 1.25, 1.5625), 7.4)]:
        r1, r2 = math.sqrt(levels[0] / levels[1]), math.sqrt(levels[1] / levels[2])
        s1, s2 = math.sqrt(1 - r1 * r1), math.sqrt(1 - r2 * r2)

        def inner(
            x0: float, r1: float = r1, r2: float = r2, s1: float = s1, s2: float = s2, z: float = z
        ) -> float:
            lo = max(_LOW, r1 * x0 - 40 * s1)
            if lo >= z:
                return 0.0
            pts = [p for p in (z - 3 * s2, z - 0.5 * s2, r1 * x0) if lo < p < z]
            v, _ = integrate.quad(
                lambda x1: (
                    stats.norm.pdf(x1, loc=r1 * x0, scale=s1) * special.ndtr((r2 * x1 - z) / s2)
                ),
                lo,
                z,
                points=pts or None,
                epsabs=0.0,
                epsrel=1e-11,
                limit=200,
            )
            return float(v)

        num, _ = integrate.quad(
            lambda x0, z=z: stats.norm.pdf(x0) * inner(x0),
            _LOW,
            z,
            points=[z - 3 * s1, z - 1.0, z - 0.3],
            epsabs=0.0,
            epsrel=1e-10,
            limit=200,
        )
        assert ExactLaw(levels, z).first()[2] == pytest.approx(num, rel=1e-9, abs=0.0)
    levels = ladder(1.01, 16)
    z = _z(levels, 2**62, 1e-6)
    coarse, fine = ExactLaw(levels, z).first(), ExactLaw(levels, z, resolution=2.0).first()
    assert _error(coarse, fine) < 1e-9


@pytest.mark.slow
def test_the_exact_reference_agrees_with_a_monte_carlo_of_the_walk() -> None:
    """Importance sampling without approximation: X_k drawn given X_k > z (inverting the
    tail), the walk drawn backwards from it (a stationary Gaussian chain is reversible: X_{j}
    given X_{j+1} is N(r X_{j+1}, 1 − r²)), and the fraction that stayed below z before:
    P(first at k) = P(X_k > z)·that fraction. 16 levels 1.01× apart at 2**62 keys and
    m = 1e-6 (late steps first show 0.3× as often as the first: the grid's hardest case),
    within 4.5 standard errors (~0.07 % each)."""
    levels = ladder(1.01, 16)
    z = _z(levels, 2**62, 1e-6)
    exact = ExactLaw(levels, z).first()
    rng = default_rng(20240611)
    tail = float(special.ndtr(-z))
    for k in (1, 3, 15):
        n = 2_000_000
        stayed = 0
        for _ in range(2):
            x = -special.ndtri((1.0 - rng.random(n)) * tail)  # X_k given X_k > z
            below = np.ones(n, dtype=bool)
            for j in range(k - 1, -1, -1):
                r = math.sqrt(levels[j] / levels[j + 1])
                x = r * x + math.sqrt(1 - r * r) * rng.standard_normal(n)
                below &= x <= z
            stayed += int(below.sum())
        frac = stayed / (2 * n)
        se = tail * math.sqrt(frac * (1 - frac) / (2 * n))
        assert abs(tail * frac - exact[k]) < 4.5 * se, (k, tail * frac / exact[k] - 1)


@pytest.mark.parametrize(("levels", "domain", "false_keys"), REGISTRATIONS)
def test_a_zero_count_first_shows_at_each_step_as_often_as_the_exact_law_says(
    levels: tuple[float, ...], domain: int, false_keys: float
) -> None:
    """The chance the chain gives a key with a zero count of first showing at each step (what
    the sampler draws: p_k times not before) within 0.5 % (relative) of the exact law, which
    is what the chain itself measured when it was built; and the market's own exact law
    (market.histogram.first_exceedance, which the chain checks itself against) agrees with
    this file's to 1e-8. On 512 equal cells (the grid before) the closest levels were 8.7 %
    (2**40 keys) and 24 % (2**62) too low at the 16th step."""
    ch = HistogramChain(levels, sensitivity=1.0, domain=domain, false_keys=false_keys)
    z = _z(ch.levels, domain, false_keys)
    exact = ExactLaw(ch.levels, z).first()
    err = _error(ch.first_appearance(), exact)
    assert err <= 5e-3, err
    assert ch.survival_error == pytest.approx(err, abs=1e-7)
    bounds = [x * t / math.sqrt(x / 2) for x, t in zip(ch.levels, ch.thresholds, strict=True)]
    assert _error(first_exceedance(ch.levels, bounds), exact) < 1e-8


@pytest.mark.parametrize(("domain", "at_least"), [(2**40, 0.05), (2**62, 0.2)])
def test_the_old_grid_is_caught_misstating_late_first_appearances(
    domain: int, at_least: float
) -> None:
    """Power: the comparison above, on the survival law as it was (512 and 256 equal cells,
    Richardson), fails far beyond 0.5 % for 16 levels 1.01× apart (measured: 8.7 % and 24 %
    too low at the 16th step), and the chain as it is, on the same code, passes."""
    ch = HistogramChain(ladder(1.01, 16), sensitivity=1.0, domain=domain, false_keys=1e-6)
    exact = ExactLaw(ch.levels, _z(ch.levels, domain, 1e-6)).first()
    old = _first_appearance(_old_grid(ch))
    assert _error(old, exact) > at_least
    assert old[-1] < exact[-1]  # too low: a key first shown late is more likely in the data
    assert _error(ch.first_appearance(), exact) < 5e-3


@pytest.mark.parametrize(
    ("levels", "domain"), [(ladder(1.01, 16), 2**62), (ladder(1.25, 16), 2**62)]
)
def test_new_zero_counts_start_from_the_exact_law(levels: tuple[float, ...], domain: int) -> None:
    """The law of S_{k−1} of the zero counts that first show at step k (what their released
    value is drawn from), cell by cell, against the exact law: within 1e-3 in CDF (measured
    ≤ 3.1e-4); on the old equal cells up to 3.5e-3 (the test has power)."""
    ch = HistogramChain(levels, sensitivity=1.0, domain=domain, false_keys=1e-6)
    law = ExactLaw(ch.levels, _z(ch.levels, domain, 1e-6))
    old = _old_grid(ch)
    worst_new, worst_old = 0.0, 0.0
    for k in (1, 3, len(levels) - 1):
        dists = []
        for r in (ch._rounds[k], old[k]):
            assert r.grid is not None and r.cdf is not None
            half = (r.width if r.width is not None else r.grid[1] - r.grid[0]) / 2
            right = (r.grid + half) / math.sqrt(ch.levels[k - 1] / 2)  # X_{k-1} = S/sd(S)
            inner = r.cdf < 1.0
            exact = law.start_cdf(k, right[inner])
            dists.append(float(np.max(np.abs(exact - r.cdf[inner]))))
        worst_new, worst_old = max(worst_new, dists[0]), max(worst_old, dists[1])
    assert worst_new < 1e-3
    if levels[1] / levels[0] < 1.1:
        assert worst_old > 2e-3


@pytest.mark.slow
@pytest.mark.parametrize(
    "levels",
    [
        ladder(1.01, 16),
        ladder(1.02, 16),
        ladder(1.1, 16),
        ladder(1.25, 16),
        ladder(2.0, 16, 1e-3),
        ladder(10.0, 8, 1e-3),
    ],
)
@pytest.mark.slow
def test_every_accepted_registration_is_within_the_bound(levels: tuple[float, ...]) -> None:
    """The sweep: domains 2**10 … 2**62, false_keys 1e-6 … 1000, against the exact law."""
    for domain in (2**10, 2**40, 2**62):
        for m in (1e-6, 1.0, 1000.0):
            if m >= domain * len(levels) / 2:
                continue
            ch = HistogramChain(levels, sensitivity=1.0, domain=domain, false_keys=m)
            exact = ExactLaw(ch.levels, _z(ch.levels, domain, m)).first()
            err = _error(ch.first_appearance(), exact)
            assert err <= 5e-3 and ch.survival_error == pytest.approx(err, abs=1e-7), (domain, m)


@pytest.mark.slow
def test_a_grid_off_the_exact_law_is_refined_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Held to a tighter tolerance, the closest levels get twice the cells (and meet it); held
    to one no grid meets, they are refused, saying what to change."""
    levels = ladder(1.01, 16)
    usual = HistogramChain(levels, sensitivity=1.0, domain=2**62, false_keys=1e-6)
    assert usual.cells == GRID and 5e-4 < usual.survival_error <= histogram_chain.ACCURACY
    monkeypatch.setattr(histogram_chain, "ACCURACY", 5e-4)
    ch = HistogramChain(levels, sensitivity=1.0, domain=2**62, false_keys=1e-6)
    assert ch.cells == 2 * GRID and ch.survival_error <= 5e-4
    exact = ExactLaw(ch.levels, _z(ch.levels, 2**62, 1e-6)).first()
    assert _error(ch.first_appearance(), exact) <= 5e-4
    assert ch.fingerprint != usual.fingerprint  # another grid, another law: other noise
    monkeypatch.setattr(histogram_chain, "ACCURACY", 1e-9)
    with pytest.raises(InvalidLevelError, match="space consecutive levels further apart"):
        HistogramChain(levels, sensitivity=1.0, domain=2**62, false_keys=1e-6)


@pytest.mark.parametrize(
    ("levels", "domain"),
    [((1.0, 1.25), 400), ((1.0, 1.25), 2**40), ((1.0, 1.25), 2**62), ((1.0, 1.01), 2**62)],
)
def test_the_second_steps_exceedance_is_the_exact_integral(
    levels: tuple[float, float], domain: int
) -> None:
    """P(a zero count first exceeds at step 1 | it did not at step 0), computed by quadrature
    from the two Gaussians, against the chain's: within 0.2 %. At 2**62 keys the threshold
    is 9 sd up, where Φ rounds to 1: first-step masses taken as differences of Φ were 0
    next to it, and this probability 0.69 of the truth."""
    from scipy import integrate

    ch = HistogramChain(levels, sensitivity=1.0, domain=domain, false_keys=1.0)
    r0, r1 = ch._rounds
    s0 = math.sqrt(0.5)

    def joint(x: float) -> float:
        return float(stats.norm.pdf(x, scale=s0) * special.ndtr((x - r1.a) / r1.sd))

    num, _ = integrate.quad(
        joint, -40 * s0, r0.a, limit=400, points=[r0.a - 5 * r1.sd], epsabs=0.0, epsrel=1e-10
    )
    exact = num / float(special.ndtr(r0.a / s0))
    assert r1.p == pytest.approx(exact, rel=2e-3, abs=0.0)  # p is ~1e-19: no absolute slack


def test_support_counts_are_lossless_across_steps() -> None:
    """A large count is always released: its noise at step k is N(0, 1/(2ρ_k)) and
    Cov(Y_j, Y_k) = Var(Y_k) for j < k (Brownian motion in the precision)."""
    ch = chain(false_keys=1.0)
    value = ch.value([7], [1e6])

    def noise(i: int) -> list[float]:
        steps = ch.release_steps(value, {0, 1, 2, 3}, ("s", f"c{i}", "d"), RNGS)
        return [float(counts[keys == 7][0]) - 1e6 for keys, counts in steps.values()]

    ys = np.array([noise(i) for i in range(6000)])
    for k, lvl in enumerate(LEVELS):
        var = 1 / (2 * lvl)
        assert_close_z(float(ys[:, k].var()), var, var * math.sqrt(2 / ys.shape[0]))
    for j, k in [(0, 1), (0, 3), (2, 3)]:
        cov = float(np.cov(ys[:, j], ys[:, k])[0, 1])
        assert_close_z(cov, 1 / (2 * LEVELS[k]), covariance_se(ys[:, j], ys[:, k]))


@pytest.mark.slow
def test_false_keys_stay_within_the_tolerance() -> None:
    """An empty histogram over 2**40 keys: the mean number of distinct keys shown over all steps
    is at most false_keys (the union bound), and close to it."""
    ch = chain(false_keys=3.0, domain=2**40)
    value = ch.value([], [])
    shown = []
    for i in range(1500):
        keys: set[int] = set()
        for k in range(4):
            keys.update(ch.release(value, k, ("s", f"f{i}", "d"), RNGS)[0].tolist())
        shown.append(len(keys))
    mean = float(np.mean(shown))
    assert 1.0 < mean <= 3.0 + 4.5 * math.sqrt(3.0 / 1500), mean
    assert max(shown) < ch.max_false_keys


def test_a_release_is_a_pure_function_of_the_request() -> None:
    ch = chain()
    value = ch.value(SUPPORT, COUNTS)
    top = ch.release(value, 3, ("s", "v", "d"), RNGS)
    again = HistogramChain(LEVELS, sensitivity=1.0, domain=D, false_keys=40.0).release(
        ch.value(SUPPORT[::-1], COUNTS[::-1]), 3, ("s", "v", "d"), RNGS
    )
    assert top[0].tobytes() == again[0].tobytes() and top[1].tobytes() == again[1].tobytes()
    other = ch.release(value, 3, ("s", "w", "d"), RNGS)
    assert other[1].tobytes() != top[1].tobytes()
    assert bool((np.diff(top[0]) > 0).all())


def test_the_low_bits_of_a_count_do_not_say_where_its_key_came_from() -> None:
    """A zero count released for the first time gets its noise by inverting a normal tail
    (u·2⁵³ on a lattice); a count in the data by ``normal``. Released counts are snapped to a
    public grid, so the lattice detector that told them apart (100 % against 6 % in the far
    tail) finds neither."""
    ch = HistogramChain((0.25, 1.0, 4.0), sensitivity=1.0, domain=1000, false_keys=300.0)
    r0 = ch._rounds[0]
    tail = special.ndtr(-r0.a / r0.sd)
    value = ch.value(np.arange(200), np.full(200, 1e-300))
    fresh: list[float] = []
    for i in range(400):
        keys, counts = ch.release(value, 0, ("s", f"b{i}"), RNGS)
        grain = 2.0 ** (math.floor(math.log2(1 / math.sqrt(0.5))) - 32)
        assert np.array_equal(np.round(counts / grain) * grain, counts)
        u = special.ndtr(-counts[keys >= 200] * r0.level / r0.sd) / tail
        fresh += (u[u <= 1e-2] * 2.0**53).tolist()
    k = np.asarray(fresh)
    assert k.size > 100
    assert float(np.mean(np.abs(k - np.round(k)) < 0.05)) < 0.2


def test_huge_counts_are_released_as_numbers_and_every_shown_count_exceeds_the_threshold() -> None:
    ch = chain(false_keys=1.0)
    value = ch.value([1, 2, 3], [1e300, -1e300, 80.0])
    keys, counts = ch.release(value, 3, ("s", "huge", "d"), RNGS)
    # keys 1 and 3, not 2; zero counts too, as the noise has it (m = 1: often one at step 3)
    assert {1, 3} <= set(keys.tolist()) and 2 not in keys
    assert bool(np.isfinite(counts).all()) and counts[keys == 1][0] == 1e300
    for i in range(300):  # a snapped count is compared with τ, never the unsnapped one
        for k, (_, shown) in ch.release_steps(
            ch.value([5], [ch.thresholds[0]]), {0, 1}, ("s", f"t{i}", "d"), RNGS
        ).items():
            assert bool((shown > ch.thresholds[k]).all())


def test_values_are_validated() -> None:
    ch = chain()
    for keys, counts, why in [
        ([1, 1], [1.0, 2.0], "twice"),
        ([400], [1.0], "lie in"),
        ([-1], [1.0], "lie in"),
        ([1], [math.nan], "finite"),
        ([1, 2], [1.0], "same length"),
    ]:
        with pytest.raises(InvalidValueError, match=why):
            ch.value(keys, counts)
    v = ch.value([5, 2], [1.0, 3.0])
    assert v.keys.tolist() == [2, 5] and v.counts.tolist() == [3.0, 1.0]
    # a key at count 0 (or -0.0) is a key not listed: one histogram, one digest, one noise
    assert ch.value([5, 2, 9, 7], [1.0, 3.0, 0.0, -0.0]).digest() == v.digest()
    assert isinstance(v, HistogramValue) and v.digest() != ch.value([2, 5], [1.0, 3.0001]).digest()


def test_chain_parameters_are_checked() -> None:
    with pytest.raises(InvalidLevelError):
        HistogramChain((1.0, 0.5), sensitivity=1.0, domain=D, false_keys=1.0)
    with pytest.raises(InvalidValueError, match="false_keys"):
        HistogramChain(LEVELS, sensitivity=1.0, domain=D, false_keys=0.0)
    with pytest.raises(InvalidValueError, match="false_keys"):
        HistogramChain(LEVELS, sensitivity=1.0, domain=10, false_keys=20.0)
    with pytest.raises(InvalidValueError, match="domain"):
        HistogramChain(LEVELS, sensitivity=1.0, domain=2**62 + 1, false_keys=1.0)
    with pytest.raises(InvalidValueError, match="raise false_keys"):
        HistogramChain(LEVELS, sensitivity=1.0, domain=2**62, false_keys=5e-324)
    with pytest.raises(InvalidLevelError, match="apart"):
        HistogramChain((1.0, 1.005), sensitivity=1.0, domain=D, false_keys=1.0)
    with pytest.raises(InvalidLevelError, match="at most 16"):
        HistogramChain(tuple(range(1, 18)), sensitivity=1.0, domain=D, false_keys=1.0)


def test_too_many_false_keys_are_refused_not_truncated() -> None:
    ch = chain(false_keys=40.0)
    object.__setattr__(ch, "max_false_keys", 0)
    with pytest.raises(TooManyFalseKeysError, match="not released"):
        ch.release(ch.value([], []), 3, ("s", "v", "d"), RNGS)


def test_string_keys_are_a_public_hash() -> None:
    assert string_key("berlin") == 3111825729699964213  # fixed for good: buyers map keys by it
    assert string_key("a") != string_key("b")
    assert all(0 <= string_key(s) < 2**62 for s in ["", "ü", "x" * 1000])


def test_histogram_values_round_trip_through_the_codec() -> None:
    from market.codec import decode_histogram_value, encode_histogram_value
    from market.errors import StateFormatError

    ch = chain(domain=2**62)
    for value in [ch.value([], []), ch.value([2**62 - 1, 0, 5], [-1.5, 0.0, 1e300])]:
        data = encode_histogram_value(value)
        back = decode_histogram_value(data)
        assert back.equals(value) and not back.keys.flags.writeable
    bad = bytearray(encode_histogram_value(ch.value([1, 2], [1.0, 2.0])))
    bad[20] ^= 1
    for broken in [bytes(bad), b"EMHV", b"EMCSxxxxxxxxxxxx"]:
        with pytest.raises(StateFormatError):
            decode_histogram_value(broken)
