"""The vectorised float passes of the 10⁶-coordinate kernels against independent formulations.

The float passes decide an outcome only when it is certain, so they may change freely as long
as (a) each coordinate still reads its own law's parameters and (b) every error bound still
contains the ideal value. These tests pin both down where the kernels were rewritten for speed:

* discrete Laplace relaxation and bridge draw each coordinate's geometric from the plan of its
  part in one pass (:func:`market._dlap._pick`): the same ``G`` as drawing it from that plan
  alone, for plans of different shapes (direct, one or two digit groups), and the same
  releases as the exact path;
* the Gaussian float pass (:func:`market._normal.normals`, its ``cos(2πv)`` polynomial and the
  blocked :func:`~market._normal.add_normals`): every bound contains a long-double Box–Muller
  evaluated at both ends of the uniforms' intervals, and the blocked pass is :func:`add` of
  :func:`normals`.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from numpy.typing import NDArray

from market import _dlap, _normal, default_rng
from market._draws import Draws, key_from
from market.mechanisms import scaled

from .stats import assert_forced_exact_agrees

PI = np.longdouble("3.14159265358979323846264338327950288")
EDGE_WORDS = np.array(
    [0, 1, 2**11 - 1, 2**11, 2**52, 2**62, 2**63 - 1, 2**63, 2**64 - 2**11, 2**64 - 1],
    dtype=np.uint64,
)


def _words(seed: int, slots: int, n: int) -> list[NDArray[np.uint64]]:
    """Random words with the edge words (0, 2⁶⁴ − 1, the 53-bit boundaries) in every slot."""
    d = Draws(key_from(default_rng(seed)), n, slots)
    out = []
    for s in range(slots):
        w = d.slot(s).copy()
        w[s : s + EDGE_WORDS.size] = EDGE_WORDS
        out.append(w)
    return out


PLAN_PAIRS = {
    "direct/direct": (Fraction(3, 7), Fraction(1, 9)),
    "direct/one group": (Fraction(1, 2**18), Fraction(1, 2**30)),
    "one/two groups": (Fraction(5, 2**38), Fraction(3, 2**47)),
    "two/two groups": (Fraction(3, 2**47), Fraction(1, 2**45)),
    "one/direct": (Fraction(1, 2**33), Fraction(1, 2**19)),
}


@pytest.mark.parametrize("pair", PLAN_PAIRS.values(), ids=PLAN_PAIRS.keys())
def test_one_pass_with_picked_plans_matches_each_plan_alone(
    pair: tuple[Fraction, Fraction],
) -> None:
    """``G`` drawn with per-coordinate parameters (plan ``r`` where picked, ``q`` elsewhere,
    padded with empty digit groups) equals ``G`` drawn from the coordinate's own plan with
    only its own slots, and is undecided exactly where that is."""
    plan_q, plan_r = _dlap.plan(pair[0]), _dlap.plan(pair[1])
    width = max(len(plan_q.chunks), len(plan_r.chunks))
    n = 20_000
    words = _words(1, 1 + width, n)
    mask = default_rng(2).random(n) < 0.4
    mask[: 2 * EDGE_WORDS.size : 2] = True  # edge words under both plans
    picked = _dlap._pick(mask, _dlap._digits(plan_q, width), _dlap._digits(plan_r, width))
    g, und = _dlap._geometric_of(words, picked, _dlap.ETA)
    g_q, und_q = _dlap._geometric(words[: plan_q.slots], plan_q, _dlap.ETA)
    g_r, und_r = _dlap._geometric(words[: plan_r.slots], plan_r, _dlap.ETA)
    assert np.array_equal(und, np.where(mask, und_r, und_q))
    assert np.array_equal(g[~und], np.where(mask, g_r, g_q)[~und])
    assert 0 < int(und.sum()) < 20  # the words 2⁶⁴ − 1 (U near 1) are left to the exact path


LAWS = {
    "relax direct/one group": _dlap.Law(Fraction(1, 2**19), None, Fraction(999, 1000 * 2**19)),
    "bridge direct/one group": _dlap.Law(
        Fraction(1, 2**19), Fraction(1, 2**17), Fraction(999, 1000 * 2**19)
    ),
    "relax one/two groups": _dlap.Law(Fraction(1, 2**30), None, Fraction(2**17 - 1, 2**47)),
    "bridge coarse": _dlap.Law(Fraction(2), Fraction(5), Fraction(1, 3)),
}


@pytest.mark.parametrize("law", LAWS.values(), ids=LAWS.keys())
def test_relax_and_bridge_with_unlike_plans_agree_with_the_exact_path(
    law: _dlap.Law, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the outer and middle parts' geometrics have plans of different shapes, the one-pass
    float path gives the releases of the exact path (which draws each part's geometric from its
    own plan, one coordinate at a time), with L below, equal to and above U."""
    plan_q, plan_r = law.plans
    assert plan_r is not None
    assert plan_r.chunks != plan_q.chunks or not plan_q.chunks  # unlike shapes, or both direct
    n = 240
    g = default_rng(3)
    up = g.integers(-50, 50, n)
    scale = min(2.0**40, 1.0 / float(law.s_r))
    lo = up + np.rint(g.laplace(0.0, scale, n)).astype(np.int64)
    lo[:20] = up[:20]  # t = 0: the atom-atom part
    lo[20:40] = up[20:40] - 1
    draws = Draws(key_from(g), n, _dlap.slots(law))
    assert_forced_exact_agrees(law, up, lo, draws, monkeypatch)


# ------------------------------------------------------------------------------- Gaussian
def test_cos_2pi_is_within_its_bound() -> None:
    """The polynomial ``cos(2πv)`` on ``[−1/2, 1/2]`` is within 2⁻⁴⁷ of the long-double cosine
    (itself within 2⁻⁶⁰), at random points and at the reduction's edges."""
    v = default_rng(4).integers(-(2**63), 2**63 - 1, 1_000_000).astype(np.float64) * 2.0**-64
    edges = [0.0, 0.125, 0.25, 0.375, 0.5, 2.0**-60, 0.25 - 2.0**-54, 0.5 - 2.0**-54]
    v = np.concatenate([v, edges, [-e for e in edges]])
    got = _normal.cos_2pi(v.copy())
    ref = np.cos(2 * PI * v.astype(np.longdouble))
    assert float(np.max(np.abs(got.astype(np.longdouble) - ref))) < 2.0**-47


def _ideal_normals(w1: NDArray[np.uint64], w2: NDArray[np.uint64]) -> list[NDArray[np.longdouble]]:
    """``√(−2 ln U₁)·cos(2πU₂)`` in long doubles at the four corners of the uniforms' intervals
    ``[w·2⁻⁶⁴, (w + 1)·2⁻⁶⁴)`` (the float pass's bound must hold on all of them)."""
    out = []
    for d1 in (0, 1):
        u1 = (w1.astype(np.longdouble) + d1) * np.longdouble(2.0**-64)
        r = np.sqrt(-2 * np.log(u1))
        for d2 in (0, 1):
            u2 = (w2.astype(np.longdouble) + d2) * np.longdouble(2.0**-64)
            out.append(r * np.cos(2 * PI * u2))
    return out


def test_normals_bounds_contain_the_ideal_normals() -> None:
    """Every finite bound of the Gaussian float pass contains the ideal normal over the whole
    interval of its uniforms, for random words and edge words (a word 0 or one whose uniform
    rounds to 1 gets an infinite bound: the exact path)."""
    n = 300_000
    w1, w2 = _words(5, 2, n)
    draws = Draws(bytes(32), n, 2)
    draws._words[0], draws._words[1] = w1, w2
    h = _normal.normals(draws)
    finite = np.isfinite(h.err)
    assert not finite[0] and 0 < int((~finite).sum()) < 5  # the word 0
    assert np.all(h.z[~finite] == 0.0)
    z, err = h.z[finite].astype(np.longdouble), h.err[finite].astype(np.longdouble)
    for ideal in _ideal_normals(w1[finite], w2[finite]):
        assert bool(np.all(np.abs(z - ideal) <= err))
    assert float(np.median(h.err[finite])) < 2.0**-43  # and the bounds stay tight


def test_blocked_add_is_add_of_the_normals() -> None:
    """:func:`add_normals` (block by block) gives :func:`add` of :func:`normals` bit for bit,
    values and bounds, over several blocks and a partial one."""
    n = 3 * _normal.BLOCK + 123
    g = default_rng(6)
    h = _normal.Hidden(g.normal(0.0, 2.0, n), np.abs(g.normal(0.0, 1e-12, n)))
    draws = Draws(key_from(g), n, 2)
    got = _normal.add_normals(h, 0.7071067811865476, draws)
    want = _normal.add(h, 0.7071067811865476, _normal.normals(draws))
    assert np.array_equal(got.z, want.z) and np.array_equal(got.err, want.err)


# ------------------------------------------------------------------- grid encode / decode
@pytest.mark.parametrize("e", [-1100, -1074, -1023, -1022, -60, -32, 0, 12, 1023, 1024, 2000])
def test_scaling_by_a_power_of_two_is_ldexp(e: int) -> None:
    """The grid scaling (a product with ``2^e`` where that double is normal) gives
    :func:`numpy.ldexp`'s doubles bit for bit, subnormal, overflowing and signed zeros too."""
    g = default_rng(8)
    x = g.normal(0.0, 1.0, 50_000) * 10.0 ** g.integers(-320, 308, 50_000)
    x = np.concatenate(
        [x, [0.0, -0.0, np.inf, -np.inf, 5e-324, 2.0**-1022, 1.7976931348623157e308]]
    )
    with np.errstate(over="ignore"):
        got, want = scaled(x, e), np.ldexp(x, e)
        assert np.array_equal(scaled(x.copy(), e, inplace=True), want)
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))


def test_a_bridge_mixes_block_by_block() -> None:
    """A bridge's mixture evaluated per block inside :func:`add_normals` gives :func:`add` of
    :func:`mix` bit for bit, and the exact value's noise (``a = None``) mixes as zeros."""
    n = 2 * _normal.BLOCK + 77
    g = default_rng(9)
    a, b = (_normal.Hidden(g.normal(0.0, 2.0, n), np.abs(g.normal(0.0, 1e-12, n))) for _ in "ab")
    wa, wb = Fraction(2, 7), Fraction(5, 7)
    draws = Draws(key_from(g), n, 2)
    for upper in (a, None):
        full = upper or _normal.Hidden(np.zeros(n), np.zeros(n))
        want = _normal.add(_normal.mix(full, wa, b, wb), 0.5, _normal.normals(draws))
        got = _normal.add_normals(_normal.Mixed(upper, wa, b, wb), 0.5, draws)
        assert np.array_equal(got.z, want.z) and np.array_equal(got.err, want.err)


def _snap_block_reference(
    x: NDArray[np.float64], z: NDArray[np.float64], err: NDArray[np.float64], scale: float
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """The rounding's float pass as first written (the oracle of the leaner one)."""
    q = x * scale
    xi = np.floor(q)
    t = q - xi
    t += z * scale
    margin = (np.abs(t) + 2.0) * (2.0 * 2.0**-53) + err * scale
    f = np.floor(t + 0.5)
    dist = t + 0.5 - f
    undecided = (dist <= margin) | (dist >= 1.0 - margin) | ~np.isfinite(margin)
    f[undecided] = 0.0
    return xi.astype(np.int64) + f.astype(np.int64), undecided


def test_the_rounding_decides_as_before() -> None:
    """:func:`market._normal._snap_block` gives the reference's integers and undecided set,
    with values at half-integers of the grid, infinite and NaN bounds, and huge values (which
    it refuses, NaN included)."""
    g = default_rng(10)
    n = 4000
    x = g.normal(0.0, 1e3, n)
    x[:100] = np.round(x[:100]) + 0.5  # on a half-integer of the grid (scale 1)
    z = g.normal(0.0, 1.0, n) * 2.0**-30
    z[:50] = 0.0
    err = np.abs(g.normal(0.0, 2.0**-40, n))
    err[200:210], err[210:220] = np.inf, np.nan
    for scale in (1.0, 2.0**20, 2.0**-7):
        got, und = _normal._snap_block(x, z, err, scale)
        want, und_want = _snap_block_reference(x, z, err, scale)
        assert np.array_equal(und, und_want) and np.array_equal(got[~und], want[~und])
        assert und[200:220].all()
    for bad in (2.0**62, -(2.0**62), np.nan):
        with pytest.raises(OverflowError):
            _normal._snap_block(np.array([0.0, bad]), np.zeros(2), np.zeros(2), 1.0)
