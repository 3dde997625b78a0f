"""The compiled Gaussian float pass of a release of any size against the numpy reference.

A Gaussian release adds a keyed normal to its neighbours' float pass and rounds the sum
(:func:`market._step.gaussian_release`): the reference does it with numpy, block by block; the
compiled pass in one vectorised loop with its own ``ln`` (within 2⁻⁴⁹) and the reference's
``cos(2πv)`` polynomial. Both decide a coordinate only where its bound clears the grid's
half-integers, so they must release the same integers and leave the same coordinates to the
exact path; the bounds must hold the ideal normal wherever a uniform's bits put it, the edges of
the logarithm's reduction included. The chain's bookkeeping around the noise step (its states'
direct accessors, the Gaussian path built only for an undecided coordinate) must change nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from numpy.typing import NDArray

from market import Gaussian, ReleaseState, _normal, _step, default_rng
from market._draws import Draws, key_from
from market.chain import ChainState, ReleaseChain
from market.rng import NoiseKeys

from .test_kernels import _ideal_normals

COMPILED = _step.BACKEND == "compiled"
needs_compiled = pytest.mark.skipif(not COMPILED, reason=f"no compiled step: {_step.REASON}")
BOTH = ["numpy", pytest.param("compiled", marks=needs_compiled)]

N = 2 * _normal.BLOCK + 77  # two blocks of the reference and a partial one
GRID = -12


@pytest.fixture(autouse=True)
def _compiled_loop_at_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled pass at every size, whatever this CPU's vector width (a CPU without
    AVX-512 runs it only up to :data:`market._step.SCALAR_MAX` coordinates: slower above, not
    different; every build of the loop gives the same doubles)."""
    monkeypatch.setattr(_step, "WIDE", True)


def _edge_words(n: int) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
    """Random words for ``U₁`` and ``U₂``, with ``U₁``'s first words where its ``ln`` is
    hardest: 0 (the exact path), near 1 (``u`` rounding to 1, and just below), just either
    side of ``1/√2`` and ``√2/2^k`` (the reduction's switch), and tiny uniforms."""
    g = default_rng(11)
    w1 = g.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    w2 = g.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    edges: list[int] = [0, 1, 2, 2**11, 2**64 - 1, 2**64 - 2**9, 2**64 - 2**12, 2**64 - 2**20]
    for k in range(0, 40, 3):
        u = math.sqrt(0.5) * 2.0**-k  # where m = u·2^j crosses √2
        s = round((u - 1.0) * 2.0**64) % 2**64 if u >= 0.5 else round(u * 2.0**64)
        edges += [(s + d) % 2**64 for d in (-(2**12), -1, 0, 1, 2**12)]
    w1[: len(edges)] = np.array(edges, dtype=np.uint64)
    return w1, w2


def _draws(n: int) -> Draws:
    d = Draws(key_from(default_rng(12)), n, 2)
    d._words[0], d._words[1] = _edge_words(n)
    return d


def _priors(n: int) -> dict[str, _normal.Hidden | _normal.Mixed | None]:
    g = default_rng(13)
    a, b = (_normal.Hidden(g.normal(0.0, 3.0, n), np.abs(g.normal(0.0, 1e-12, n))) for _ in "ab")
    return {
        "fresh": None,
        "tighten": a,
        "bridge from the exact value": _normal.Mixed(None, Fraction(2, 7), b, Fraction(5, 7)),
        "bridge": _normal.Mixed(a, Fraction(3, 11), b, Fraction(8, 11)),
    }


def _release(
    backend: str,
    prior: _normal.Hidden | _normal.Mixed | None,
    c: float,
    draws: Draws,
    base: NDArray[np.float64],
) -> tuple[_normal.Hidden, NDArray[np.int64], list[int]]:
    asked: list[int] = []

    def settle(i: int) -> int:
        asked.append(i)
        return -(10**12) - i

    with _step.using(backend):
        h, ints = _step.gaussian_release(prior, c, draws, base, GRID, settle)
    return h, ints, sorted(asked)


@needs_compiled
@pytest.mark.parametrize("form", list(_priors(8)))
def test_the_compiled_pass_releases_the_reference_integers(form: str) -> None:
    """Fresh, tightening and both bridges' forms: the same integers and the same coordinates
    settled exactly (the edge words' ones included), and float passes whose bounds overlap and
    are as tight as the reference's."""
    draws = _draws(N)
    base = default_rng(14).normal(0.0, 50.0, N)
    prior = _priors(N)[form]
    h_c, ints_c, asked_c = _release("compiled", prior, 0.7071067811865476, draws, base)
    h_r, ints_r, asked_r = _release("numpy", prior, 0.7071067811865476, draws, base)
    assert np.array_equal(ints_c, ints_r) and asked_c == asked_r
    assert asked_c[:1] == [0]  # U₁ = 0: no finite bound on either side
    ok = np.isfinite(h_r.err)
    assert np.array_equal(ok, np.isfinite(h_c.err))
    assert np.all(np.abs(h_c.z[ok] - h_r.z[ok]) <= h_c.err[ok] + h_r.err[ok])
    assert np.allclose(h_c.err[ok], h_r.err[ok], rtol=1e-2, atol=0.0)


@needs_compiled
def test_strided_inputs_are_read_as_the_reference_reads_them() -> None:
    """Views with a stride (a slice of a wider float pass, of a batch's values) are read by
    value, not refused nor misread."""
    n = 3000
    g = default_rng(17)
    wide = g.normal(0.0, 3.0, (3, 2 * n))
    prior = _normal.Mixed(
        _normal.Hidden(wide[0, ::2], np.abs(wide[1, ::2]) * 1e-12),
        Fraction(1, 3),
        _normal.Hidden(wide[2, ::2], np.abs(wide[1, 1::2]) * 1e-12),
        Fraction(2, 3),
    )
    base = wide[2, 1::2] * 40.0
    got = _release("compiled", prior, 0.25, _draws(n), base)
    want = _release("numpy", prior, 0.25, _draws(n), base)
    assert np.array_equal(got[1], want[1]) and got[2] == want[2]


@pytest.mark.parametrize("backend", BOTH)
def test_undecided_and_oversized_values_are_handled_alike(backend: str) -> None:
    """Values on half-grid points under a negligible coefficient leave every coordinate to the
    exact path; a value beyond the grid's range is refused."""
    n = 1000
    draws = _draws(n)
    base = (np.arange(n) - n / 2 + 0.5) * 2.0**GRID
    _, ints, asked = _release(backend, None, 2.0**-80, draws, base)
    assert asked == list(range(n)) and np.array_equal(ints, -(10**12) - np.arange(n))
    with pytest.raises(OverflowError, match="too large"):
        _release(backend, None, 1.0, draws, np.full(n, 2.0**70))


@needs_compiled
def test_compiled_bounds_hold_the_ideal_normals_at_the_edges_of_the_logarithm() -> None:
    """The compiled normals' bounds contain the long-double Box–Muller normal at every corner
    of the uniforms' intervals, at the logarithm's reduction edges and at random words."""
    n = 200_000
    draws = _draws(n)
    with _step.using("compiled"):
        h = _step.normals(draws)
    finite = np.isfinite(h.err)
    assert not finite[0] and np.all(h.z[~finite] == 0.0)
    w1, w2 = draws.slot(0), draws.slot(1)
    z, err = h.z[finite].astype(np.longdouble), h.err[finite].astype(np.longdouble)
    for ideal in _ideal_normals(w1[finite], w2[finite]):
        assert bool(np.all(np.abs(z - ideal) <= err))
    assert float(np.median(h.err[finite])) < 2.0**-43


def _four_releases(backend: str, n: int) -> list[NDArray[np.float64]]:
    st = ReleaseState(Gaussian(1.0), default_rng(15).normal(0.0, 10.0, n))
    rng = default_rng(16)
    with _step.using(backend):  # fresh, tighten, relax, bridge
        return [np.array(st.release(lv, rng=rng)) for lv in (1.0, 0.5, 2.0, 0.75)]


@needs_compiled
def test_release_states_release_the_same_bits_on_either_pass() -> None:
    """A long Gaussian release state's fresh, tightening, relaxing and bridging releases."""
    for got, want in zip(_four_releases("compiled", N), _four_releases("numpy", N), strict=True):
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("backend", BOTH)
def test_a_gaussian_chain_settles_every_coordinate_exactly_alike(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the float pass's trust in ``log`` made absurdly loose, every coordinate of a
    Gaussian chain's step goes to the exact path (the path's terms built for it alone): the
    same release as the float pass decides, for several values at once."""
    chain = ReleaseChain(Gaussian(1.0), (0.5, 1.0, 2.0))
    keys = NoiseKeys(bytes(range(32)))
    x = np.linspace(-3.0, 3.0, 5)
    idents = [("v", str(i)) for i in range(3)]

    def release() -> list[NDArray[np.float64]]:
        with _step.using(backend):
            return chain.release([chain.open(x + i) for i in range(3)], 0, idents, keys)

    want = release()
    loose = 2.0**10
    monkeypatch.setattr(_normal, "TAU", loose)
    _, c_cos, two_pi = _step._NORMAL_CONSTANTS
    monkeypatch.setattr(_step, "_NORMAL_CONSTANTS", (loose, c_cos, two_pi))
    calls: list[int] = []
    exact_snap: Callable[..., int] = _normal.exact_snap

    def counted(*args: object) -> int:
        calls.append(1)
        return exact_snap(*args)

    monkeypatch.setattr(_normal, "exact_snap", counted)
    got = release()
    assert len(calls) == 15 and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_chain_state_accessors_agree_with_its_steps_mapping() -> None:
    """:meth:`ChainState.get`, :meth:`~ChainState.has` and :meth:`~ChainState.put` (what the
    chain uses per value-step) see and change what the ``steps`` mapping does, packed or not."""
    x = np.arange(4.0)
    st = ChainState(x, {3: np.arange(4), 1: np.arange(4) + 1})
    for packed in (False, True):
        if packed:
            st.pack()
        for k in range(6):
            assert st.has(k) == (k in st.steps)
            got = st.get(k)
            assert (got is None) if k not in st.steps else np.array_equal(got, st.steps[k])
    st.put(1, np.arange(4) + 7)  # a packed step replaced
    st.put(0, np.arange(4) + 9)
    assert sorted(st.steps) == [0, 1, 3] and st.has(0) and st.has(1)
    assert np.array_equal(st.steps[1], np.arange(4) + 7)
    assert np.array_equal(st.get(0), np.arange(4) + 9)  # type: ignore[arg-type]
    assert np.array_equal(st.exact, x)  # type: ignore[arg-type]
