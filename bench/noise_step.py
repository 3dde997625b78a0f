"""The noise step per value-step at 8 numbers: compiled against the numpy reference.

Run ``python -m bench.noise_step`` (``--quick`` for a smoke run). A *value-step* is one value
released one step down its chain (what a purchase does for each retained value, and a value
batch for each value and level held). Each case releases its values' steps through
:meth:`ReleaseChain.release` as the service does: on states opened beforehand, untimed (the
service opens a value's state when the value arrives, not when it is released), one call per
step for all the values of the case (a purchase releases its retained values together). This is
also what ``python -m bench.noise``'s per-call rows time. Each runs with the compiled noise
step and with the
numpy reference (:mod:`market._step`), interleaved round by round in the same process, beside
numpy's own per-call cost at 8 numbers (``Generator.laplace(size=8)``: what one call into numpy
costs, the floor of any per-request numpy code). The last rows time the noise step alone
(keys, keystream and decisions, :mod:`market._step`) without the chain's bookkeeping. Figures
are CPU µs of this thread per value-step, and ratios to that floor; the machine, SIMD level and
load are printed beside.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from bench.machine import Machine
from market import DiscreteLaplace, Gaussian, Laplace, Mechanism, Poisson, _step
from market.chain import ChainState, ReleaseChain
from market.rng import NoiseKeys

DIM = 8
STEPS = 16
GOAL_US = 10.0
"""Goal (issue 42): the noise of one value-step at 8 numbers, compiled (CPU µs)."""

CASES: list[tuple[str, Mechanism, list[float], int]] = [
    ("laplace, purchase (4 values, 1 step)", Laplace(1.0, dimension=DIM), [], 4),
    ("laplace, batch (16 values, 1 step)", Laplace(1.0, dimension=DIM), [], 16),
    ("laplace fine grid, purchase", Laplace(1.0, dimension=DIM), [0.001], 4),
    ("discrete_laplace, purchase", DiscreteLaplace(1.0), [], 4),
    ("poisson, purchase", Poisson(1.0), [], 4),
    ("gaussian, purchase (top step)", Gaussian(1.0), [], 4),
]


def _levels(scale: list[float]) -> list[float]:
    unit = scale[0] if scale else 0.25
    return [round(unit * (k + 1), 6) for k in range(STEPS)]


class Rounds:
    """The rounds of one case: every value released at each step from the top down (a
    Gaussian's top step only: its lower steps are a sum of all the normals above), on states
    opened beforehand by :meth:`prepare` (untimed, as the service opens a value's state when
    the value arrives). A call runs one round and returns its value-steps."""

    def __init__(self, mech: Mechanism, scale: list[float], values: int) -> None:
        self.chain = ReleaseChain(mech, tuple(_levels(scale)))
        self.keys = NoiseKeys(os.urandom(32))
        ints = mech.dtype is np.int64
        self.x = np.arange(DIM) if ints else np.linspace(-3.0, 3.0, DIM)
        self.idents = [("s", f"v{i}", "d" * 64) for i in range(values)]
        self.steps = [STEPS - 1] if isinstance(mech, Gaussian) else list(range(STEPS - 1, -1, -1))
        self._ready: list[list[ChainState]] = []

    def prepare(self, rounds: int) -> None:
        """Open the states of the next ``rounds`` rounds."""
        chain, x, n = self.chain, self.x, len(self.idents)
        self._ready = [[chain.open(x) for _ in range(n)] for _ in range(rounds)]

    def __call__(self) -> int:
        if not self._ready:
            raise RuntimeError("Rounds.prepare was not called for this many rounds")
        states = self._ready.pop()
        for k in self.steps:
            self.chain.release(states, k, self.idents, self.keys)
        return len(self.steps) * len(states)


def _cpu_per(fn: Callable[[], int], rounds: int) -> float:
    """CPU µs of this thread per value-step over ``rounds`` calls (a :class:`Rounds` case
    prepares its states first, outside the timing)."""
    if isinstance(fn, Rounds):
        fn.prepare(rounds)
    t0 = time.thread_time()
    n = sum(fn() for _ in range(rounds))
    return (time.thread_time() - t0) / n * 1e6


def measure(rounds: int, runs: int) -> list[tuple[str, float, float, float]]:
    """Per case: median over ``runs`` of (numpy reference µs, compiled µs, numpy floor µs)."""
    gen = np.random.default_rng(0)

    def floor() -> int:
        gen.laplace(0.0, 1.0, DIM)
        return 1

    rows = []
    for name, mech, scale, values in CASES:
        run = Rounds(mech, scale, values)
        ref, comp, flo = [], [], []
        for _ in range(runs):
            with _step.using("numpy"):
                ref.append(_cpu_per(run, rounds))
            with _step.using("compiled"):
                comp.append(_cpu_per(run, rounds))
            flo.append(_cpu_per(floor, rounds * 50))
        rows.append((name, statistics.median(ref), statistics.median(comp), statistics.median(flo)))
    return rows


def _step_alone(values: int) -> Callable[[], int]:
    """The noise step alone for ``values`` Laplace value-steps (8 numbers, one step down):
    the seeds, the keys and words (:func:`market._step.keyed_draws`) and the decisions
    (:meth:`Mechanism.increments`), without the chain's bookkeeping around them."""
    chain = ReleaseChain(Laplace(1.0, dimension=DIM), tuple(_levels([])))
    keys = NoiseKeys(os.urandom(32))
    idents = [("s", f"v{i}", "d" * 64) for i in range(values)]
    pairs = [(i, 5) for i in range(values)]
    steps = [(chain.levels[5], chain.levels[6])] * values
    sizes = [DIM] * values

    def run() -> int:
        draws = _step.keyed_draws(keys, chain._seeds(idents, pairs), sizes, 2)
        chain.mechanism.increments(steps, sizes, draws)
        return values

    return run


def measure_alone(rounds: int, runs: int) -> list[tuple[str, float, float, float]]:
    """As :func:`measure`, for the noise step alone at 1, 4 and 16 value-steps per call."""
    gen = np.random.default_rng(0)

    def floor() -> int:
        gen.laplace(0.0, 1.0, DIM)
        return 1

    rows = []
    for values in (1, 4, 16):
        run = _step_alone(values)
        ref, comp, flo = [], [], []
        for _ in range(runs):
            with _step.using("numpy"):
                ref.append(_cpu_per(run, rounds * 16))
            with _step.using("compiled"):
                comp.append(_cpu_per(run, rounds * 16))
            flo.append(_cpu_per(floor, rounds * 50))
        name = f"laplace, noise step alone, {values} per call"
        rows.append((name, statistics.median(ref), statistics.median(comp), statistics.median(flo)))
    return rows


def markdown(rows: list[tuple[str, float, float, float]]) -> str:
    head = (
        "| case (8 numbers per value) | numpy reference µs | compiled µs | compiled ÷ reference "
        "| compiled ÷ numpy call |\n|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {name} | {ref:.1f} | {comp:.1f} | {comp / ref:.2f}× | {comp / flo:.1f}× |\n"
        for name, ref, comp, flo in rows
    )
    return head + body


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (few rounds)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    if _step.BACKEND != "compiled":
        print(f"the compiled noise step is not available ({_step.REASON}): nothing to compare")
        return 0
    rounds = 3 if args.quick else 40
    machine = Machine.now()
    runs = 1 if args.quick else args.runs
    rows = measure(rounds, runs) + measure_alone(rounds, runs)
    print(f"numpy call floor: Generator.laplace(size={DIM}); goal ≤ {GOAL_US:g} µs per value-step")
    print(markdown(rows))
    print(machine.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
