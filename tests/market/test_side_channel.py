"""The noise samplers do the same work whichever outcome each coordinate takes (format v2).

Timing itself is too noisy to assert on; instead these tests pin down the two things that would
make timing depend on the data: the random words read, and the sequence of operations.

* **Words.** A sampler reads the words of its :class:`~market._draws.Draws`, whose count per
  coordinate (:meth:`Mechanism.slots`) is a function of the levels alone, so the words cannot
  depend on the data; what could is *which* of them a kernel touches. A recording ``Draws``
  checks that every input reads the same slots, in the same order, and no extension stream.
* **Operations.** For inputs that drive coordinates into different parts of the law (keep the
  upper release, take the lower one, the left / middle / right geometric pieces; a Gaussian
  noise near or far from a rounding boundary; a Poisson count anywhere), the kernels must
  execute exactly the same lines in the same order: each line applies whole-array numpy
  operations, so a data-dependent Python branch would show up as a different sequence.

The one documented exception is the exact path, taken by a coordinate whose outcome the float
pass cannot decide (about one in 10⁹ for the lattice Laplace, 10⁷ for the Gaussian, 10⁸ for
the Poisson): it reads extension words in a data-dependent loop. The inputs here take it
nowhere, and the recording says so. (The Poisson *bridge* is not covered: it builds one exact
binomial law per distinct count ``L − U``, so its work depends on those counts by design.)
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from market import DiscreteLaplace, Gaussian, Laplace, Poisson, default_rng
from market._draws import Draws, LazyUniform, key_from
from market.mechanisms import Anchor, Mechanism, _LatticeLaplace

from .stats import dlap_numpy

N = 50_000  # several kernel blocks
KEY = key_from(default_rng(42))


class RecordingDraws(Draws):
    """Draws that log every access: whole slots, and extension streams (the exact path)."""

    def __init__(self, key: bytes, n: int, slots: int) -> None:
        super().__init__(key, n, slots)
        self.log: list[tuple[Any, ...]] = []

    def slot(self, s: int) -> NDArray[np.uint64]:
        self.log.append(("slot", s))
        return super().slot(s)

    def lazy(self, s: int, i: int) -> LazyUniform:
        self.log.append(("lazy", s, i))
        return super().lazy(s, i)


def trace_lines(fn: Callable[[], Any], watched: tuple[str, ...]) -> list[tuple[str, int]]:
    """Every line executed in the ``watched`` noise modules, in order."""
    lines: list[tuple[str, int]] = []

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


def _call_into(box: list[Any], run: Callable[[Any, Any], Any], case: Any, d: Draws) -> None:
    box.append(run(case, d))


def assert_same_work(
    run: Callable[[Any, RecordingDraws], Any],
    cases: dict[str, Any],
    slots: int,
    watched: tuple[str, ...],
    label: str,
) -> dict[str, Any]:
    """Run ``run(case, draws)`` for every case with the same key: identical lines executed,
    identical words read, no exact path. Returns the outcomes."""
    run(next(iter(cases.values())), RecordingDraws(KEY, N, slots))  # warm the caches
    traces, logs, outs = {}, {}, {}
    for name, case in cases.items():
        d = RecordingDraws(KEY, N, slots)
        box: list[Any] = []
        traces[name] = trace_lines(functools.partial(_call_into, box, run, case, d), watched)
        logs[name], outs[name] = d.log, box[0]
    first = next(iter(cases))
    assert len(traces[first]) > 20
    for name in cases:
        assert not [e for e in logs[name] if e[0] == "lazy"], f"{label}/{name}: exact path taken"
        assert logs[name] == logs[first], f"{label}: different words read for {name}"
        t, t0 = traces[name], traces[first]
        diff = [(i, a, b) for i, (a, b) in enumerate(zip(t0, t, strict=False)) if a != b][:3]
        assert t == t0, f"{label}: different operations for {name}: {diff} {len(t0)} {len(t)}"
    return outs


# ---------------------------------------------------------------------- lattice Laplace
FINE = Laplace(1.0, dimension=10**6)  # at ε ~ 1e-4 its geometrics take chunked plans
LATTICE: dict[str, _LatticeLaplace] = {
    "laplace": Laplace(1.0),
    "fine": FINE,
    "discrete": DiscreteLaplace(1),
}


def _lattice_cases(mech: _LatticeLaplace, scale: float) -> dict[str, Any]:
    """Stored lattice noise: all zero (every coordinate at the atom-atom boundary), far out
    (the keep atom essentially impossible, the right piece dominant), and typical."""
    a = float(mech.ratio(scale))
    sd = math.sqrt(mech.lattice_variance(scale))
    g = default_rng(1)
    return {
        "zeros": np.zeros(N, dtype=np.int64),
        "far": np.full(N, round(50 * sd), dtype=np.int64),
        "negative": np.full(N, -round(3 * sd), dtype=np.int64),
        "mixed": dlap_numpy(g, a, N),
    }


def _lattice_op(mech: _LatticeLaplace, op: str, s: float) -> tuple[Any, int]:
    """``(run, slots)`` of one operation with stored noise ``stored`` (levels scaled by s)."""
    base = dlap_numpy(default_rng(2), float(mech.ratio(3.0 * s)), N)
    if op == "relax":
        upper, lower_level, level = (math.inf, 1.0 * s, 2.0 * s)
    elif op == "bridge":
        upper, lower_level, level = (3.0 * s, 1.0 * s, 2.0 * s)
    else:
        upper, lower_level, level = (1.0 * s, None, 0.5 * s)

    def run(stored: NDArray[np.int64], d: Draws) -> NDArray[np.int64]:
        if op == "relax":
            up, lo = Anchor(math.inf, np.zeros(N, np.int64)), Anchor(1.0 * s, stored)
        elif op == "bridge":
            up, lo = Anchor(3.0 * s, base), Anchor(1.0 * s, base + stored)
        else:
            up, lo = Anchor(1.0 * s, stored), None
        return np.asarray(mech.conditional(level, up, lo, d, up.values).values)

    return run, mech.slots(level, upper, lower_level)


@pytest.mark.parametrize("name", sorted(LATTICE))
@pytest.mark.parametrize("op", ["relax", "bridge", "tighten"])
def test_lattice_kernels_do_identical_work(name: str, op: str) -> None:
    """Lattice Laplace (direct and chunked geometric plans) and discrete Laplace: the same
    lines and the same words for every stored noise."""
    mech = LATTICE[name]
    s = 1e-4 if mech is FINE else 1.0
    run, slots = _lattice_op(mech, op, s)
    watched = ("_dlap.py", "mechanisms.py", "_draws.py")
    assert_same_work(run, _lattice_cases(mech, s), slots, watched, f"{name}/{op}")


@pytest.mark.parametrize("name", sorted(LATTICE))
def test_branch_outcomes_really_differ(name: str) -> None:
    """Sanity check that the inputs above do send coordinates down different parts: the keep
    atom's frequency differs between them, and the typical bridge hits all five parts
    (left of 0, keep U, between, take L, beyond L)."""
    mech = LATTICE[name]
    s = 1e-4 if mech is FINE else 1.0
    cases = _lattice_cases(mech, s)
    run, slots = _lattice_op(mech, "relax", s)
    kept = {c: float(np.mean(run(v, Draws(KEY, N, slots)) == v)) for c, v in cases.items()}
    assert kept["far"] < 0.01 < kept["mixed"] < kept["zeros"]
    run, slots = _lattice_op(mech, "bridge", s)
    stored = cases["mixed"]
    base = dlap_numpy(default_rng(2), float(mech.ratio(3.0 * s)), N)
    j = run(stored, Draws(KEY, N, slots)) - base
    t = np.abs(stored)
    j = np.where(stored < 0, -j, j)  # mirrored: 0 ≤ t
    moving = t > 1
    parts = [j < 0, j == 0, (j > 0) & (j < t), (j == t) & (t > 0), j > t]
    assert all(int((p & moving).sum()) > 20 for p in parts), [int(p.sum()) for p in parts]


# -------------------------------------------------------------------------------- Gaussian
@pytest.mark.parametrize("op", ["relax", "bridge", "tighten"])
def test_gaussian_does_identical_work(op: str) -> None:
    """The same lines and the same words (slots 0 and 1: one Box–Muller normal per
    coordinate) whatever the value and the stored real noise."""
    m = Gaussian(1.0)
    g = default_rng(3)
    values = {"zeros": np.zeros(N), "large": np.full(N, 1e6), "mixed": g.normal(0, 50, N)}
    cases = {}
    for name, x in values.items():
        top = m.conditional(3.0, m.origin(x), None, Draws(key_from(g), N, 2), x)
        low = m.conditional(1.0, top, None, Draws(key_from(g), N, 2), x)
        cases[name] = (x, top, low)

    def run(case: tuple[NDArray[np.float64], Anchor, Anchor], d: Draws) -> Anchor:
        x, top, low = case
        if op == "relax":
            return m.conditional(2.0, m.origin(x), low, d, x)
        if op == "bridge":
            return m.conditional(2.0, top, low, d, x)
        return m.conditional(0.5, low, None, d, x)

    assert_same_work(run, cases, 2, ("_normal.py", "mechanisms.py", "_draws.py"), op)


# --------------------------------------------------------------------------------- Poisson
@pytest.mark.parametrize("op", ["fresh", "tighten"])
def test_poisson_does_identical_work(op: str) -> None:
    """Poisson noise from one exact law: the same lines and the same word per coordinate
    whatever the counts (the bridge is excluded: see the module docstring)."""
    m: Mechanism = Poisson(2.0)
    g = default_rng(4)
    counts = {
        "zeros": np.zeros(N, dtype=np.int64),
        "large": np.full(N, 10**9, dtype=np.int64),
        "mixed": g.integers(0, 1000, N),
    }

    def run(c: NDArray[np.int64], d: Draws) -> Anchor:
        if op == "fresh":
            return m.conditional(0.5, m.origin(c), None, d, c)
        return m.conditional(0.5, Anchor(2.0, c), None, d, c)

    outs = assert_same_work(run, counts, 1, ("_poisson.py", "mechanisms.py", "_draws.py"), op)
    noise = {k: np.asarray(v.values) - counts[k] for k, v in outs.items()}
    assert np.array_equal(noise["zeros"], noise["large"])  # one law: the data only shifts


def test_the_tracer_sees_a_data_dependent_loop() -> None:
    """Power check: the Poisson bridge builds one binomial law per distinct count ``L − U``
    (a loop whose length is the data's), and the same comparison reports it."""
    m = Poisson(2.0)
    g = default_rng(5)
    u = np.zeros(N, dtype=np.int64)
    cases = {"one count": np.full(N, 30, dtype=np.int64), "many": g.integers(0, 60, N)}

    def run(diff: NDArray[np.int64], d: Draws) -> Anchor:
        return m.conditional(0.5, Anchor(2.0, u), Anchor(0.1, u + diff), d, u)

    with pytest.raises(AssertionError, match="different operations"):
        assert_same_work(run, cases, 1, ("_poisson.py", "mechanisms.py"), "poisson bridge")
