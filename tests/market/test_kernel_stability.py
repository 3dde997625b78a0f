"""The noise of a request is pinned to the bit across versions of the kernels.

Noise is a pure function of the request (keyed generator → uniforms → kernel): a worker that
replays a purchase after an upgrade must send the bytes it sold before. A faster kernel must
therefore perform the same floating-point operations in the same order; these hashes were taken
from the kernels before they were optimised (blocks with preallocated scratch, the relaxation
specialisation) and must not move. If a numpy upgrade changes them, its transcendental
functions changed their last bits: replays would differ from what was sold.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

import numpy as np
import pytest

from market import Laplace, default_rng
from market.mechanisms import Anchor

N = 40_000  # two full kernel blocks and a partial one
MECH = Laplace(1.0)
STORED = default_rng(7).laplace(0, 1.0, N)
STORED[::97] = 0.0  # stored noise exactly zero: the k == 0 edge
STEP = np.where(np.arange(N) % 3 == 0, 0.0, 0.7)  # equal neighbours on every third coordinate

CASES: dict[str, tuple[Callable[[np.random.Generator], np.ndarray], str]] = {
    "relax": (
        lambda r: MECH.conditional(2.0, Anchor(math.inf, np.zeros(N)), Anchor(1.0, STORED), r),
        "3b74d0f4d94d2de2d8070b1b153d035ab2fb1672b3765794352dccf79acd1027",
    ),
    "bridge": (
        lambda r: MECH.conditional(2.0, Anchor(3.0, STORED), Anchor(1.0, STORED + STEP), r),
        "4dc515d1c3a6de41cbe6da595a3e0eab811b05a6e717fc3147645958051a1fcb",
    ),
    "tighten": (
        lambda r: MECH.conditional(0.5, Anchor(1.0, STORED), None, r),
        "9fe764d053817330862e435dbbcba8507b15b21581539ff361218e98897e63e3",
    ),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_laplace_kernels_give_the_same_bits_as_before(op: str) -> None:
    fn, expected = CASES[op]
    got = hashlib.sha256(fn(default_rng(42)).tobytes()).hexdigest()
    assert got == expected, f"{op}: the noise for the same request changed bits"
