"""Small statistical helpers shared by the sampler tests.

Every helper turns an estimate into a z-score or p-value with an explicit tolerance so that a
test states both what it expects and how much sampling noise it allows. Seeds are fixed, so a
test either always passes or always fails for a given implementation. The exact laws of the
lattice (discrete) Laplace process are written here from their definitions alone, so the tests
never compare the sampler with itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from market import default_rng
from market._draws import Draws, key_from
from market.mechanisms import Anchor, Mechanism


def assert_proportion(hits: int | np.integer, n: int, p: float, z: float = 4.5) -> None:
    """Binomial proportion hits/n equals p within z standard errors."""
    se = math.sqrt(p * (1 - p) / n)
    est = float(hits) / n
    assert abs(est - p) <= z * se, f"proportion {est:.5f} != {p:.5f} (se {se:.2e}, n={n})"


def assert_close_z(est: float, expected: float, se: float, z: float = 4.5) -> None:
    assert abs(est - expected) <= z * se, f"{est:.6g} != {expected:.6g} (se {se:.2e})"


def covariance_se(x: NDArray[np.float64], y: NDArray[np.float64]) -> float:
    """Standard error of the sample covariance of x and y (delta method)."""
    xc, yc = x - x.mean(), y - y.mean()
    return float(np.std(xc * yc) / math.sqrt(len(x)))


def laplace_cdf(x: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
    return np.where(x < 0, 0.5 * np.exp(x / scale), 1 - 0.5 * np.exp(-x / scale))


# ------------------------------------------------------------------ lattice (discrete) laws
# Exact laws of the lattice Laplace / discrete Laplace process, written from the definitions in
# docs/math.md §4.5 alone (no code from market._dlap): DLap(a) has P(j) = tanh(a/2)·e^{−a|j|}
# on the integers, and the step to a noisier level a1 < a2 adds 0 w.p. w0(a1, a2), else
# DLap(a1). Arguments ``a`` are the rationals ε/D as floats.


def w0(a1: float, a2: float) -> float:
    """Atom of the step from ``a2`` to the noisier ``a1 < a2``: (sinh(a1/2)/sinh(a2/2))²."""
    return (math.sinh(a1 / 2) / math.sinh(a2 / 2)) ** 2


def dlap_cdf(a: float, j: NDArray[np.int64]) -> NDArray[np.float64]:
    """``P(J ≤ j)`` for ``J ~ DLap(e^{−a})``: ``q^{−j}/(1 + q)`` below 0, ``1 − q^{j+1}/(1 + q)``
    from 0 on."""
    jf = np.asarray(j, dtype=np.float64)
    inv = 1.0 / (1.0 + math.exp(-a))
    neg = np.exp(a * np.minimum(jf, 0.0)) * inv
    pos = 1.0 - np.exp(-a * (np.maximum(jf, 0.0) + 1.0)) * inv
    return np.where(jf < 0, neg, pos)


def step_cdf(a: float, a_u: float | None, j: NDArray[np.int64]) -> NDArray[np.float64]:
    """CDF of the noise added going from ``a_u`` (``None``: the exact value) to ``a < a_u``."""
    mu = 0.0 if a_u is None else w0(a, a_u)
    return mu * (np.asarray(j) >= 0) + (1.0 - mu) * dlap_cdf(a, j)


def _geo(s: float, m0: NDArray[np.float64], m1: NDArray[np.float64]) -> NDArray[np.float64]:
    """``Σ_{m = m0}^{m1} e^{−s m}`` (``m1`` may be ``inf``; 0 when ``m1 < m0``)."""
    count = np.maximum(m1 - m0 + 1.0, 0.0)
    with np.errstate(invalid="ignore"):
        body = -np.expm1(-s * count)
    body = np.where(np.isinf(count), 1.0, np.where(count == 0, 0.0, body))
    return np.exp(-s * m0) * body / -math.expm1(-s)


def conditional_cdf(
    a: float, a_u: float | None, a_l: float, k: int
) -> Callable[[NDArray[np.int64]], NDArray[np.float64]]:
    """CDF of ``W1`` given ``W1 + W2 = k``: the release at ``a`` between a more accurate
    neighbour ``U`` (parameter ``a_u``, ``None`` for the exact value) and a less accurate ``L``
    (``a_l < a``) with ``L − U = k``, from ``P(W1 = j | k) ∝ P(W1 = j)·P(W2 = k − j)``.

    ``W1 ~ μ_a δ0 + (1 − μ_a) DLap(a)`` and ``W2 ~ μ_b δ0 + (1 − μ_b) DLap(a_l)``; the product of
    the two DLap parts is geometric on each of ``j < 0``, ``0 ≤ j ≤ k`` and ``j > k`` (for
    ``k ≥ 0``; ``k < 0`` is the mirror image), so every sum is in closed form.
    """
    if k < 0:
        mirror = conditional_cdf(a, a_u, a_l, -k)
        return lambda e: 1.0 - mirror(-np.asarray(e) - 1)
    mu_a = 0.0 if a_u is None else w0(a, a_u)
    mu_b = w0(a_l, a)
    c, c_l = math.tanh(a / 2), math.tanh(a_l / 2)
    s_out, s_mid = a + a_l, a - a_l
    lk, uk = math.exp(-a_l * k), math.exp(-a * k)
    one, inf = np.float64(1.0), np.float64(np.inf)

    def mass(e: NDArray[np.int64]) -> NDArray[np.float64]:
        ef = np.asarray(e, dtype=np.float64)
        left = lk * _geo(s_out, np.maximum(one, -ef), np.full_like(ef, inf))
        mid = np.where(ef >= 0, lk * _geo(s_mid, np.zeros_like(ef), np.minimum(ef, k)), 0.0)
        right = np.where(ef > k, uk * _geo(s_out, np.ones_like(ef), ef - k), 0.0)
        cont = (1 - mu_a) * (1 - mu_b) * c * c_l * (left + mid + right)
        atoms = (mu_a * mu_b * (k == 0) + mu_a * (1 - mu_b) * c_l * lk) * (ef >= 0)
        atoms = atoms + (1 - mu_a) * mu_b * c * uk * (ef >= k)
        return np.asarray(cont + atoms, dtype=np.float64)

    total = float(mass(np.array([2**62]))[0])
    return lambda e: mass(e) / total


def law_edges(
    cdf: Callable[[NDArray[np.int64]], NDArray[np.float64]],
    cells: int = 40,
    atoms: tuple[int, ...] = (),
    span: int = 2**61,
) -> NDArray[np.int64]:
    """Integer cell edges at the ``1/cells`` quantiles of a law on the integers (by bisection
    on its CDF), plus cells of their own for the ``atoms``."""
    targets = np.arange(1, cells) / cells
    lo = np.full(targets.shape, -span, dtype=np.int64)
    hi = np.full(targets.shape, span, dtype=np.int64)
    while bool(np.any(hi - lo > 1)):  # cdf(hi) ≥ target > cdf(lo)
        mid = lo + (hi - lo) // 2
        up = cdf(mid) >= targets
        hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
    extra = [x for t in atoms for x in (t - 1, t)]
    return np.unique(np.concatenate([hi, np.array(extra, dtype=np.int64)]))


def binned_p(
    x: NDArray[np.int64],
    edges: NDArray[np.int64],
    cdf: Callable[[NDArray[np.int64]], NDArray[np.float64]],
    min_expected: float = 5.0,
) -> float:
    """Chi-square p-value of integer samples against a law on the integers, over the cells
    ``x ≤ e_0``, ``e_0 < x ≤ e_1``, …, ``x > e_last``; adjacent cells are merged until each
    expects at least ``min_expected`` samples."""
    n = x.shape[0]
    probs = np.diff(np.concatenate([[0.0], cdf(edges), [1.0]]))
    counts = np.bincount(np.searchsorted(edges, x, side="left"), minlength=edges.shape[0] + 1)
    obs, exp, acc_o, acc_e = [], [], 0, 0.0
    for o, p in zip(counts.tolist(), probs.tolist(), strict=True):
        acc_o, acc_e = acc_o + o, acc_e + p * n
        if acc_e >= min_expected:
            obs.append(acc_o)
            exp.append(acc_e)
            acc_o, acc_e = 0, 0.0
    if obs:  # the remainder joins the last cell
        obs[-1] += acc_o
        exp[-1] += acc_e
    assert len(obs) >= 2, "too few cells for a chi-square test"
    e = np.array(exp)
    return float(stats.chisquare(np.array(obs), e * sum(obs) / e.sum()).pvalue)


def dlap_numpy(rng: np.random.Generator, a: float, n: int) -> NDArray[np.int64]:
    """``n`` draws of DLap(e^{−a}) as the difference of two geometrics (numpy only: a
    reference sampler independent of market._dlap)."""
    p = -math.expm1(-a)
    return (rng.geometric(p, n) - rng.geometric(p, n)).astype(np.int64)


def step_numpy(rng: np.random.Generator, a: float, a_u: float, n: int) -> NDArray[np.int64]:
    """``n`` draws of the step noise from ``a_u`` to the noisier ``a`` (numpy only)."""
    keep = rng.random(n) < w0(a, a_u)
    return np.where(keep, 0, dlap_numpy(rng, a, n))


# ------------------------------------------------------------------ the v2 sampler interface
def sample(
    mech: Mechanism,
    level: float,
    upper: Anchor,
    lower: Anchor | None = None,
    seed: int = 0,
    base: NDArray[Any] | None = None,
) -> Anchor:
    """One call of ``mech.conditional``, reading the draws of a request key drawn from
    ``default_rng(seed)`` (one key per call: calls with different seeds are independent).

    ``base`` is what Gaussian noise is added to (the exact value); it defaults to
    ``upper.values``, which is right for the lattice families (they ignore it) and for a
    Gaussian release from the exact value.
    """
    n = int(upper.values.shape[0])
    slots = mech.slots(level, upper.level, None if lower is None else lower.level)
    draws = Draws(key_from(default_rng(seed)), n, slots)
    return mech.conditional(level, upper, lower, draws, upper.values if base is None else base)


def assert_forced_exact_agrees(
    law: Any,
    upper: NDArray[np.int64],
    lower: NDArray[np.int64] | None,
    draws: Any,
    monkeypatch: Any,
) -> None:
    """Forcing (nearly) every coordinate of a lattice law through the exact path changes no
    outcome: the float path decides only what is certain (market._dlap)."""
    from market import _dlap

    n = int(upper.shape[0])
    calls: list[object] = []
    exact = _dlap.exact_noise

    def counting(*args: Any) -> int:
        calls.append(args)
        return exact(*args)

    fast, forced = np.empty(n, np.int64), np.empty(n, np.int64)
    _dlap.sample_into(fast, upper, lower, law, draws)
    monkeypatch.setattr(_dlap, "exact_noise", counting)
    _dlap.sample_into(forced, upper, lower, law, draws, margin=1.0, eta=1.0)
    assert len(calls) > 0.9 * n
    assert np.array_equal(fast, forced)
