"""The histogram chain: the dense algorithm's law, keyed by value, lossless across steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from market.errors import InvalidLevelError, InvalidValueError
from market.histogram_chain import (
    GRID,
    HistogramChain,
    HistogramValue,
    TooManyFalseKeysError,
    string_key,
)
from market.rng import KeyedRngFactory, default_rng
from tests.applications.test_histogram import COUNTS, SUPPORT, Runs, assert_same_law, run, summaries

from .stats import assert_close_z, covariance_se

D = 400
LEVELS = (0.5, 1.0, 2.0, 4.0)
RNGS = KeyedRngFactory(b"histogram chain test secret 0001")


def chain(false_keys: float = 40.0, domain: int = D, grid: int = GRID) -> HistogramChain:
    return HistogramChain(LEVELS, sensitivity=1.0, domain=domain, false_keys=false_keys,
                          grid=grid)  # fmt: skip


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
    ch = HistogramChain(tuple(ratio**i for i in range(4)), sensitivity=1.0, domain=2000,
                        false_keys=999.0)  # fmt: skip
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


@pytest.mark.parametrize(("ratio", "domain"), [(1.01, 2**40), (1.25, 2**40), (2.0, 2**40),
                                               (1.25, 2**62)])  # fmt: skip
def test_the_survival_law_converges_with_the_grid(ratio: float, domain: int) -> None:
    """The chance a never-released zero count first exceeds at each step, on the default grid
    (with its Richardson step), against four times as many cells: within 0.5 %. (Uniform
    cells alone were 5 % off for levels 1.01× apart; summing the four large terms of a
    transfer between far cells put rounding noise into the tiny masses near the threshold,
    up to 2× off on 4,096 cells; at 2**62 keys the threshold is 9 sd up, where Φ rounds to 1
    and the first step's cells next to it got mass 0: 0.69 of the truth at the next step.)"""
    levels = tuple(ratio**i for i in range(5))
    ch = HistogramChain(levels, sensitivity=1.0, domain=domain, false_keys=1.0)
    fine = HistogramChain(levels, sensitivity=1.0, domain=domain, false_keys=1.0, grid=4 * ch.grid)
    for a, b in zip(ch._rounds, fine._rounds, strict=True):
        assert a.p == pytest.approx(b.p, rel=5e-3, abs=0.0)  # p is ~1e-13: no absolute slack


@pytest.mark.parametrize(("levels", "domain"), [((1.0, 1.25), 400), ((1.0, 1.25), 2**40),
                                                ((1.0, 1.25), 2**62), ((1.0, 1.01), 2**62)])
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

    num, _ = integrate.quad(joint, -40 * s0, r0.a, limit=400, points=[r0.a - 5 * r1.sd],
                            epsabs=0.0, epsrel=1e-10)  # fmt: skip
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
    assert keys.tolist() == [1, 3] and bool(np.isfinite(counts).all()) and counts[0] == 1e300
    for i in range(300):  # a snapped count is compared with τ, never the unsnapped one
        for k, (_, shown) in ch.release_steps(ch.value([5], [ch.thresholds[0]]), {0, 1},
                                               ("s", f"t{i}", "d"), RNGS).items():  # fmt: skip
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
