"""The noise step does the same work whichever branch each coordinate takes.

Timing itself is too noisy to assert on; instead these tests pin down the two things that would
make timing depend on the data: the number of random draws, and the sequence of operations. For
inputs that drive coordinates into different mixture branches (kept sample vs moved, left /
middle / right exponential piece), the kernels must draw exactly the same number of uniforms and
call exactly the same numpy operations in the same order.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from market import Gaussian, Laplace, default_rng
from market.mechanisms import Anchor

N = 50_000  # several kernel blocks


def trace_calls(fn: Callable[[], Any]) -> list[tuple[str, int]]:
    """Every line executed in the noise code (mechanisms and kernels), in order.

    Each line of the kernels applies whole-array numpy operations; a data-dependent Python branch
    would show up here as a different sequence of lines.
    """
    lines: list[tuple[str, int]] = []
    watched = ("_kernels.py", "mechanisms.py")

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        if not name.endswith(watched):
            return None
        if event == "line":
            lines.append((name.rsplit("/", 1)[-1], frame.f_lineno))
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return lines


CASES = {
    # stored noise exactly 0 everywhere: every coordinate sits at the atom boundary
    "zeros": np.zeros(N),
    # huge stored noise: the atom (keep) is essentially impossible, right piece dominates
    "far": np.full(N, 50.0),
    # typical mixture
    "mixed": default_rng(1).laplace(0, 1.0, N),
}


def _run(op: str, stored: Any, rng: np.random.Generator) -> Any:
    mech, exact = Laplace(1.0), np.zeros(N)
    if op == "relax":
        return mech.conditional(2.0, Anchor(math.inf, exact), Anchor(1.0, stored), rng)
    if op == "bridge":
        return mech.conditional(2.0, Anchor(3.0, stored), Anchor(1.0, stored + 1.0), rng)
    return mech.conditional(0.5, Anchor(1.0, stored), None, rng)


@pytest.mark.parametrize("op", ["relax", "bridge", "tighten"])
def test_laplace_kernels_do_identical_work(op: str) -> None:
    traces, states = {}, {}
    for name, stored in CASES.items():
        rng = default_rng(42)
        traces[name] = trace_calls(functools.partial(_run, op, stored, rng))
        states[name] = rng.random(4)  # the generator advanced by exactly the same amount
    first = traces["zeros"]
    assert len(first) > 20
    for name, t in traces.items():
        diff = [(i, a, b) for i, (a, b) in enumerate(zip(first, t, strict=False)) if a != b][:3]
        assert t == first, f"{op}: different operations for {name}: {diff} {len(first)} {len(t)}"
        assert np.array_equal(states[name], states["zeros"]), f"{op}: different draws for {name}"


def test_branch_outcomes_really_differ() -> None:
    """Sanity check that the inputs above do send coordinates down different branches."""
    mech = Laplace(1.0)
    kept = {}
    for name, stored in CASES.items():
        out = mech.conditional(2.0, Anchor(math.inf, np.zeros(N)), Anchor(1.0, stored),
                               default_rng(42))  # fmt: skip
        kept[name] = float(np.mean(out == stored))
    assert kept["far"] < 0.01 < kept["mixed"] < kept["zeros"]


def test_gaussian_draws_do_not_depend_on_data() -> None:
    mech = Gaussian(1.0)
    states = []
    for stored in (np.zeros(N), np.full(N, 1e6)):
        rng = default_rng(3)
        mech.conditional(2.0, Anchor(math.inf, np.zeros(N)), Anchor(1.0, stored), rng)
        states.append(rng.random(4))
    assert np.array_equal(states[0], states[1])
