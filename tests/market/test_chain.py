"""The canonical release chain: exact laws step by step, and noise that is a function of the key.

Every law is checked on tens of thousands of coordinates with fixed keys; each check is shown to
have power against the sampler a bug would most likely produce (independent noise per step).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from market import DiscreteLaplace, Gaussian, Laplace, Poisson
from market.chain import ChainState, ReleaseChain
from market.codec import decode_chain_state, encode_chain_state
from market.errors import LevelNotForSaleError, SealedStateError, StateFormatError
from market.rng import NoiseKeys

N = 40_000
LEVELS = (0.5, 1.0, 2.0, 4.0)


def rngs(tag: bytes = b"k") -> NoiseKeys:
    return NoiseKeys(tag * 32)


def all_steps(chain: ReleaseChain, exact: object, ident: tuple[object, ...] = ("v",)) -> list:
    st = chain.seal(exact, ident, rngs()) if chain.sealed else chain.open(exact)
    return [chain.release([st], k, [ident], rngs())[0] for k in range(len(chain))]


def w0(a1: float, a2: float) -> float:
    """The lazy atom of the lattice step from parameter a2 down to a1 < a2 (docs/math.md §4.5)."""
    return (math.sinh(a1 / 2) / math.sinh(a2 / 2)) ** 2


@pytest.mark.parametrize("sealed", [False, True])
def test_laplace_chain_marginals_atoms_and_correlations(sealed: bool) -> None:
    """The lattice Laplace chain (d = 40,000: a fine grid, a chunked geometric): each step is
    the value rounded to the grid plus g·DLap(ε/D) (≈ Laplace(g·D/ε), KS), consecutive steps
    share a coordinate with probability w0 + (1 − w0)·tanh(a/2), and corr = ε_j/ε_k."""
    mech = Laplace(1.0, dimension=N)
    chain = ReleaseChain(mech, LEVELS, sealed=sealed)
    ys = all_steps(chain, np.zeros(N))
    for lvl, y in zip(LEVELS, ys, strict=True):
        assert stats.kstest(y, stats.laplace(scale=mech.scale(lvl)).cdf).pvalue > 1e-3
    a = [float(mech.ratio(x)) for x in LEVELS]
    for k in range(1, len(LEVELS)):
        atom = w0(a[k - 1], a[k])
        same = atom + (1 - atom) * math.tanh(a[k - 1] / 2)
        got = float(np.mean(ys[k] == ys[k - 1]))
        assert abs(got - same) < 4 * np.sqrt(same * (1 - same) / N), (k, got, same)
        # fresh noise per step would never share a coordinate: the test has power
        assert float(np.mean(ys[k] == all_steps(chain, np.zeros(N), ("other",))[k - 1])) < 1e-3
    for j in range(len(LEVELS)):
        for k in range(j + 1, len(LEVELS)):
            r = float(np.corrcoef(ys[j], ys[k])[0, 1])
            assert abs(r - LEVELS[j] / LEVELS[k]) < 0.03, (j, k, r)


@pytest.mark.parametrize("sealed", [False, True])
def test_gaussian_and_poisson_chains_have_the_lossless_covariance(sealed: bool) -> None:
    g = ReleaseChain(Gaussian(1.0), (0.5, 1.0, 2.0), sealed=sealed)
    ys = all_steps(g, np.zeros(N))
    for j, yj in enumerate(ys):
        for k, yk in enumerate(ys):
            want = 1.0 / (2 * max(g.levels[j], g.levels[k]))  # Var at the more accurate level
            assert abs(float(np.mean(yj * yk)) - want) < 0.03, (j, k)
    p = ReleaseChain(Poisson(1.0), (0.02, 0.05, 0.1), sealed=sealed)  # rates 50, 20, 10
    ys = all_steps(p, np.zeros(N, dtype=np.int64))
    for y, lvl in zip(ys, p.levels, strict=True):
        assert y.dtype == np.int64 and abs(float(y.mean()) - 1 / lvl) < 5 * np.sqrt(1 / lvl / N)
    cov = float(np.cov(ys[0], ys[2])[0, 1])
    assert abs(cov - 10.0) < 0.6, cov  # Cov = λ at the more accurate level
    for k in range(1, 3):  # each step below adds its own independent Poisson noise
        assert bool(np.all(ys[k - 1] >= ys[k]))


def test_release_is_a_function_of_the_key_not_of_the_history() -> None:
    chain = ReleaseChain(Laplace(1.0, dimension=500), LEVELS)
    x = np.linspace(-3, 3, 500)
    direct = chain.open(x)
    top = chain.release([direct], 3, [("s", "v", "d")], rngs())[0]
    # another order, another process, nothing cached in between
    other = chain.open(x)
    chain.release([other], 1, [("s", "v", "d")], rngs())
    other.drop_cache()
    chain.release([other], 0, [("s", "v", "d")], rngs())
    assert chain.release([other], 3, [("s", "v", "d")], rngs())[0].tobytes() == top.tobytes()
    assert all(direct.steps[k].tobytes() == other.steps[k].tobytes() for k in direct.steps)
    # another secret, another identity, another chain: independent noise
    for changed in (
        chain.release([chain.open(x)], 3, [("s", "v", "d")], rngs(b"z"))[0],
        chain.release([chain.open(x)], 3, [("s", "v", "other digest")], rngs())[0],
        ReleaseChain(Laplace(1.0, dimension=500), (0.5, 1.0, 3.0, 4.0)).release(
            [chain.open(x)], 3, [("s", "v", "d")], rngs()
        )[0],
    ):
        assert abs(float(np.corrcoef(top - x, changed - x)[0, 1])) < 0.2


@pytest.mark.parametrize(
    "mech", [Laplace(1.0, dimension=30), Gaussian(1.0), Poisson(1.0), DiscreteLaplace(1.0)]
)
def test_many_values_at_once_equal_one_by_one(mech: object) -> None:
    chain = ReleaseChain(mech, (0.05, 0.5, 1.0, 2.0))  # type: ignore[arg-type]
    ints = isinstance(mech, (Poisson, DiscreteLaplace))
    xs = [np.arange(30) * i if ints else np.arange(30.0) * i for i in range(6)]
    ids = [("s", f"v{i}") for i in range(6)]
    together = [chain.open(x) for x in xs]
    for i, st in enumerate(together):  # different caches: some start further down the chain
        if i % 2:
            chain.release([st], 1 + i % 3, [ids[i]], rngs())
    out = chain.release(together, 0, ids, rngs())
    alone = [
        chain.release([chain.open(x)], 0, [i], rngs())[0] for x, i in zip(xs, ids, strict=True)
    ]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(out, alone, strict=True))


def test_sealed_chain_keeps_no_exact_value_and_recomputes_from_a_resend() -> None:
    chain = ReleaseChain(Laplace(1.0, dimension=3), LEVELS, sealed=True)
    st = chain.seal([1.0, 2.0, 3.0], ("v",), rngs())
    assert st.exact is None and set(st.steps) == {3}
    low = chain.release([st], 0, [("v",)], rngs())[0]
    st.drop_cache()
    assert set(st.steps) == {3}  # the root survives a cache drop
    again = chain.seal([1.0, 2.0, 3.0], ("v",), rngs())  # the seller resends the value
    assert chain.release([again], 0, [("v",)], rngs())[0].tobytes() == low.tobytes()
    with pytest.raises(SealedStateError):
        chain.open([1.0])


def test_a_sealed_gaussian_chain_computes_every_step_at_arrival() -> None:
    """The real noise a rounded Gaussian release came from cannot be stored, so a sealed
    Gaussian value keeps every step (pinned: none is dropped), each equal to the open chain's
    rounding of the same real noise... under the sealed chain's own keys."""
    chain = ReleaseChain(Gaussian(1.0), (0.5, 1.0, 2.0), sealed=True)
    st = chain.seal([1.0, 2.0, 3.0], ("v",), rngs())
    assert st.exact is None and st.pinned and set(st.steps) == {0, 1, 2}
    before = [chain.release([st], k, [("v",)], rngs())[0].tobytes() for k in range(3)]
    st.drop_cache()
    st.trim(0)
    assert set(st.steps) == {0, 1, 2}
    back = decode_chain_state(encode_chain_state(st))
    assert (
        back.pinned
        and [chain.release([back], k, [("v",)], rngs())[0].tobytes() for k in range(3)] == before
    )


def test_off_chain_levels_are_refused_with_the_levels_for_sale() -> None:
    chain = ReleaseChain(Laplace(1.0), LEVELS)
    assert chain.step_of(2.0) == 2 and chain.step_of(1 + 1e-16) == 1
    with pytest.raises(LevelNotForSaleError, match=r"0\.5, 1, 2, 4"):
        chain.step_of(3.0)


def test_chain_state_codec_round_trip_and_corruption() -> None:
    for mech, x in (
        (Laplace(1.0, dimension=2000), np.zeros(2000)),
        (Gaussian(1.0), np.zeros(100)),
        (Poisson(1.0), np.arange(100)),
    ):
        for sealed in (False, True):
            chain = ReleaseChain(mech, (0.5, 1.0, 2.0), sealed=sealed)
            st = chain.seal(x, ("v",), rngs()) if sealed else chain.open(x)
            chain.release([st], 0, [("v",)], rngs())
            data = encode_chain_state(st)
            back = decode_chain_state(data)
            assert back.equals(st)
            bad = bytearray(data)
            bad[len(bad) // 2] ^= 1
            with pytest.raises(StateFormatError):
                decode_chain_state(bytes(bad))
    lazy = ReleaseChain(Laplace(1.0, dimension=2000), (1.9, 2.0))  # steps share ~90 %
    st = lazy.open(np.zeros(2000))
    lazy.release([st], 0, [("v",)], rngs())
    assert len(encode_chain_state(st)) < 2000 * 8 * 2.4  # exact + 1.3 vectors


def test_cache_states_are_plain_data() -> None:
    st = ChainState(None, {})
    assert st.nbytes == 0


@pytest.mark.parametrize("mech", [Laplace(1.0, dimension=8), Gaussian(1.0), Poisson(1.0)])
def test_packed_states_hold_the_same_bits_and_behave_as_the_dict_did(mech: object) -> None:
    """A state at rest keeps its steps in one array (memory), with exactly the bits released;
    steps added, dropped, trimmed or cleared afterwards behave as with a plain dict."""
    chain = ReleaseChain(mech, (0.5, 1.0, 2.0, 4.0))  # type: ignore[arg-type]
    x = np.arange(8) if isinstance(mech, Poisson) else np.linspace(-1, 1, 8)
    st = chain.open(x)
    chain.release([st], 1, [("v",)], rngs())
    first = {k: st.steps[k].copy() for k in st.steps}  # the lattice integers of steps 1 … 3
    exact = st.exact.copy()  # type: ignore[union-attr]
    st.pack()
    assert st.exact.tobytes() == exact.tobytes() and not st.exact.flags.writeable  # type: ignore[union-attr]
    assert sorted(st.steps) == sorted(first) and np.int64(1) in st.steps
    for k, y in first.items():
        assert st.steps[k].tobytes() == y.tobytes() and st.steps[np.int64(k)].dtype == np.int64
        assert not st.steps[k].flags.writeable
    low = chain.release([st], 0, [("v",)], rngs())[0]  # a step below packed steps
    fresh = chain.open(x)
    assert low.tobytes() == chain.release([fresh], 0, [("v",)], rngs())[0].tobytes()
    for k in (1, 2, 3):  # a Gaussian chain caches only the steps it rounds
        chain.release([st], k, [("v",)], rngs())
        chain.release([fresh], k, [("v",)], rngs())
    assert sorted(st.steps) == [0, 1, 2, 3] and len(st.steps) == 4
    st.pack()
    assert st.equals(fresh) and decode_chain_state(encode_chain_state(st)).equals(fresh)
    del st.steps[1]
    assert sorted(st.steps) == [0, 2, 3] and st.steps[2].tobytes() == fresh.steps[2].tobytes()
    with pytest.raises(KeyError):
        del st.steps[1]
    st.steps[2] = fresh.steps[2]  # replacing a packed step
    st.pack()
    st.trim(2 * x.nbytes)
    assert sorted(st.steps) == [3]  # keeps the most accurate step longest
    st.drop_cache()  # the exact value survives its steps
    assert len(st.steps) == 0 and st.nbytes == exact.nbytes
    assert st.exact.tobytes() == exact.tobytes()  # type: ignore[union-attr]
    assert "steps={}" in repr(st)


def test_a_state_whose_steps_differ_in_type_is_never_packed_into_one() -> None:
    st = ChainState(None, {0: np.zeros(3, dtype=np.int64), 1: np.full(3, 0.5)})
    st.pack()
    assert st.steps[0].dtype == np.int64 and st.steps[1].dtype == np.float64
    assert sorted(st.steps) == [0, 1] and st.steps[1].tobytes() == np.full(3, 0.5).tobytes()


def test_appended_steps_pack_as_the_general_path_does_and_bounds_match_a_walk() -> None:
    """Steps relaxed on top of packed ones are appended to the rows (no unpacking); the
    result, and the nearest cached steps above and below any k, are what walking the steps
    gives, whether a step is packed or waiting to be."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        ids = sorted(rng.choice(40, size=rng.integers(1, 8), replace=False).tolist())
        cut = int(rng.integers(0, len(ids) + 1))
        vec = {k: np.full(3, float(k)) for k in ids}
        appended = ChainState(np.zeros(3), {k: vec[k] for k in ids[:cut]})
        appended.pack()
        for k in ids[cut:]:
            appended.steps[k] = vec[k]
        if rng.random() < 0.5:
            appended.pack()  # appends: every new step is above the packed ones
        general = ChainState(np.zeros(3), vec)
        general.pack()
        assert appended.equals(general) and sorted(appended.steps) == ids
        assert appended.nbytes == general.nbytes
        for k in range(-1, 42):
            below = [j for j in ids if j <= k]
            above = [j for j in ids if j >= k]
            assert appended.highest_at_most(k) == (max(below) if below else -1)
            assert appended.lowest_at_least(k) == (min(above) if above else None)


def test_the_chains_noise_is_the_constant_the_protocol_states() -> None:
    """Noise format v2 draws the same bytes on every machine, so the market's check is a
    constant of the format, written in docs/protocol.md §1.7: a change that draws other noise
    from the same key (an encoding of the identity, a sampler) fails here first, and markets
    refuse to start on it (streams.worker.identity)."""
    from market.chain import noise_check

    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    stated = re.search(r"noise_check = ([0-9a-f]{64})", doc)
    assert stated is not None
    assert noise_check() == stated.group(1)


@pytest.mark.parametrize("mech", [Laplace(1.0, dimension=50), DiscreteLaplace(2.0), Poisson(1.0)])
def test_a_descent_in_one_pass_draws_what_step_by_step_does(
    mech: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain draws all the steps a value needs in one vectorised pass when its family
    batches them; forcing it step by step (no batching) gives the same integers."""
    chain = ReleaseChain(mech, (0.05, 0.2, 0.5, 1.0, 2.0))  # type: ignore[arg-type]
    ints = isinstance(mech, (Poisson, DiscreteLaplace))
    xs = [np.arange(50) * i if ints else np.linspace(-1, 1, 50) * i for i in range(3)]
    ids = [("s", f"v{i}") for i in range(3)]
    at_once = [chain.open(x) for x in xs]
    chain.release([at_once[1]], 3, [ids[1]], rngs())  # some steps already cached
    chain.release(at_once, 0, ids, rngs())
    monkeypatch.setattr(type(mech), "increments", lambda *a, **k: None)
    one_by_one = [chain.open(x) for x in xs]
    chain.release([one_by_one[1]], 3, [ids[1]], rngs())
    chain.release(one_by_one, 0, ids, rngs())
    for a, b in zip(at_once, one_by_one, strict=True):
        assert a.equals(b)
