"""Randomness sources and the comparison baselines."""

from __future__ import annotations

import numpy as np
import pytest

from market import Gaussian, Laplace, ReleaseState, default_rng, keyed_rng, secure_rng
from market.baselines import CompositionRelease, DoublingRelease
from market.errors import InvalidLevelError
from market.rng import identity_bytes


def test_secure_rng_is_fresh_each_time() -> None:
    assert not np.array_equal(secure_rng().random(4), secure_rng().random(4))


def test_default_rng_normalises() -> None:
    g = default_rng(5)
    assert default_rng(g) is g
    assert np.array_equal(default_rng(5).random(3), default_rng(5).random(3))
    with pytest.raises(TypeError):
        default_rng("seed")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        default_rng(True)


def test_identity_encoding_is_unambiguous() -> None:
    assert identity_bytes("ab", "c") != identity_bytes("a", "bc")
    assert identity_bytes(1) != identity_bytes("1") != identity_bytes(1.0)
    with pytest.raises(ValueError):
        identity_bytes(float("nan"))


def test_keyed_rng_depends_on_secret_and_identity() -> None:
    a = keyed_rng(b"s" * 16, "x", 1.0).random(4)
    assert np.array_equal(a, keyed_rng(b"s" * 16, "x", 1.0).random(4))
    assert not np.array_equal(a, keyed_rng(b"t" * 16, "x", 1.0).random(4))
    assert not np.array_equal(a, keyed_rng(b"s" * 16, "x", 2.0).random(4))
    with pytest.raises(ValueError, match="16 bytes"):
        keyed_rng(b"short", "x")


@pytest.mark.slow
def test_lossless_beats_composition_and_doubling_for_laplace() -> None:
    """After k equal steps, lossless MSE is that of one release at the final level; composition
    (latest increment) and doubling are strictly worse."""
    n, steps = 100_000, [0.5 * k for k in range(1, 9)]
    mech = Laplace(1.0)
    ladder = ReleaseState(mech, np.zeros(n))
    comp = CompositionRelease(mech, np.zeros(n), rng=1)
    comb = CompositionRelease(mech, np.zeros(n), combine=True, rng=2)
    dbl = DoublingRelease(mech, np.zeros(n), base=0.5, rng=3)
    rng = default_rng(4)
    for lv in steps:
        y = np.asarray(ladder.release(lv, rng=rng))
        ideal = mech.variance(lv)
        assert abs(np.mean(y**2) / ideal - 1) < 0.03
        mse = {
            name: float(np.mean(b.release(lv) ** 2))
            for name, b in (("comp", comp), ("comb", comb), ("dbl", dbl))
        }
        if lv > 0.5:  # the first step is a single release for every scheme
            assert mse["comp"] > 1.5 * ideal
            assert mse["comb"] > 1.1 * ideal
            assert mse["dbl"] > 1.5 * ideal
    assert comp.spent == steps[-1]


def test_gaussian_composition_with_inverse_variance_weights_is_lossless() -> None:
    """Andersson §1.2: for zCDP Gaussians, averaging independent increments loses nothing."""
    n = 200_000
    comb = CompositionRelease(Gaussian(1.0), np.zeros(n), combine=True, rng=1)
    for lv in (0.2, 0.5, 1.0):
        y = comb.release(lv)
    assert abs(np.mean(y**2) / Gaussian(1.0).variance(1.0) - 1) < 0.02


def test_baselines_move_up_only() -> None:
    comp = CompositionRelease(Laplace(), [0.0], rng=1)
    comp.release(1.0)
    with pytest.raises(InvalidLevelError):
        comp.release(0.5)
    dbl = DoublingRelease(Laplace(), [0.0], base=1.0, rng=1)
    with pytest.raises(InvalidLevelError):
        dbl.release(0.5)
    assert dbl.affordable_level(3.0) == 2.0
    assert dbl.affordable_level(2.9) == 1.0
