"""Noise-engine benchmark: speed against numpy and OpenDP, accuracy against the baselines, memory.

Run ``python -m bench.noise`` (add ``--quick`` for a smoke run). Every speed number is a ratio
to a baseline measured in the same process, interleaved with our own measurement, so the
table is comparable across machines; each table is followed by the machine, its SIMD level and
the load average. Baselines: numpy's inexact samplers (the speed floor) and, when the optional
``bench`` extra is installed (``pip install '.[bench]'``), OpenDP 0.16's exact samplers (the
exact peer); without it those rows say so.

Goals (issue #42), at 10^6 coordinates against numpy's ``Generator.laplace`` (``normal`` for
Gaussian): fresh and tighten at most 2x for Laplace and Gaussian and 1.5x for the exact
discrete Laplace; relax and bridge at most 3x. Poisson against ``poisson``: fresh and tighten
2x, relax 1.5x (issue #15; it thins through alias tables, :mod:`market._binomial`), bridge 8x.
Per coordinate, our exact samplers at least 100x faster than OpenDP's in the same process.
A histogram release on exact draws against the same law drawn by numpy's samplers: at most 2x
(m = 1) and 8x (m = 300, most of the time in new zero counts). Per
call at 8 numbers (the service's size): our noise per value-step (request key, keystream and
decisions through :class:`ReleaseChain`) at most 10 µs of CPU, beside numpy's and OpenDP's per
call. A histogram stream's release (``HistogramChain``: keyed, recomputed from step 0 for every
request) is timed against the library's stateful ``SparseHistogramRelease`` doing the same
rounds: at most 2x, with and without building the stream's survival law; against a Gaussian
vector of as many numbers: at most 2x; and its cost must not grow with the domain (2^60 keys
against 2^20: at most 1.25x).
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from bench.machine import Machine
from market import (
    DiscreteLaplace,
    Gaussian,
    Laplace,
    Mechanism,
    Poisson,
    ReleaseState,
    _special,
    default_rng,
)
from market.baselines import CompositionRelease, DoublingRelease
from market.chain import ReleaseChain
from market.codec import encode_state
from market.histogram import SparseHistogramRelease, sample_starts
from market.histogram_chain import GRID, HistogramChain
from market.rappor import released_bits
from market.rng import KeyedRngFactory, NoiseKeys


def _median_time(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _prepared(mech: Mechanism, n: int, levels: list[float], seed: int) -> ReleaseState:
    value = np.zeros(n, dtype=mech.dtype)
    st = ReleaseState(mech, value)
    rng = default_rng(seed)
    for lv in levels:
        st.release(lv, rng=rng)
    return st


GOALS = {"fresh": 2.0, "tighten": 2.0, "relax": 3.0, "bridge": 3.0}
"""Goal ratio of each operation to numpy, Laplace and Gaussian (issue #42); the discrete
Laplace and Poisson rows have their own (:data:`MECHANISM_GOALS`)."""
DLAP_GOALS = {"fresh": 1.5, "tighten": 1.5, "relax": 3.0, "bridge": 3.0}
"""Discrete Laplace against numpy's ``laplace`` (issue #42: two comparisons per coordinate
decide its integers, as numpy's one inversion decides a float)."""
POISSON_GOALS = {"fresh": 2.0, "tighten": 2.0, "relax": 1.5, "bridge": 8.0}
"""Poisson against numpy's ``poisson`` (issues #2 and #15; not in issue #42's table)."""
MECHANISM_GOALS = {"discrete_laplace": DLAP_GOALS, "poisson": POISSON_GOALS}


def speed_table(n: int, repeat: int) -> list[tuple[str, str, float, float, float, str]]:
    base = np.random.default_rng(0)
    rng = default_rng(1)
    cases: list[tuple[str, Mechanism, Callable[[], Any], float]] = [
        ("laplace", Laplace(1.0), lambda: base.laplace(0.0, 1.0, n), 1.0),
        ("gaussian", Gaussian(1.0), lambda: base.normal(0.0, 1.0, n), 1.0),
        ("poisson", Poisson(1.0), lambda: base.poisson(20.0, n), 1 / 20),
        ("discrete_laplace", DiscreteLaplace(1), lambda: base.laplace(0.0, 1.0, n), 1.0),
    ]
    rows = []
    for name, mech, baseline, lv in cases:
        goals = MECHANISM_GOALS.get(name, GOALS)
        ops: dict[str, tuple[list[float], float, float]] = {
            # operation: (levels already released, level to release, goal ratio)
            "fresh": ([], lv, goals["fresh"]),
            "relax": ([lv], 2 * lv, goals["relax"]),
            "tighten": ([lv], lv / 2, goals.get("tighten", 0.0)),
            "bridge": ([lv, 4 * lv], 2 * lv, goals.get("bridge", 0.0)),
        }
        for op, (prior, target, goal) in ops.items():
            if not goal:
                continue
            ours, theirs = [], []
            for i in range(repeat):  # interleave so both see the same machine state
                st = _prepared(mech, n, prior, seed=i)
                ours.append(_median_time(functools.partial(st.release, target, rng=rng), 1))
                theirs.append(_median_time(baseline, 1))
            t_ours, t_base = statistics.median(ours), statistics.median(theirs)
            ratio = t_ours / t_base
            rows.append((name, op, t_base * 1e3, t_ours * 1e3, ratio, _met(ratio <= goal)))
    return rows


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def speed_runs(n: int, repeat: int, runs: int) -> list[list[str]]:
    """:func:`speed_table` ``runs`` times: cells with min / median / max; verdict on the median."""
    tables = [speed_table(n, repeat) for _ in range(runs)]
    cells = []
    for i, (name, op, *_rest) in enumerate(tables[0]):
        goals = MECHANISM_GOALS.get(name, GOALS)
        base = [t[i][2] for t in tables]
        ours = [t[i][3] for t in tables]
        ratio = [t[i][4] for t in tables]
        mid = statistics.median(ratio)
        spread = f"{min(ratio):.2f} / {mid:.2f} / {max(ratio):.2f}x" if runs > 1 else f"{mid:.2f}x"
        cells.append(
            [
                name,
                op,
                f"{statistics.median(base):.2f}",
                f"{statistics.median(ours):.2f}",
                spread,
                f"<= {goals[op]:g}x: " + _met(mid <= goals[op]),
            ]
        )
    return cells


SPEED_HEADERS = ["mechanism", "operation", "numpy ms", "ours ms", "ratio", "goal"]


def speed_markdown(n: int, repeat: int, runs: int) -> str:
    """The speed table as `python -m bench.noise` prints it and docs/report.md includes it."""
    what = f"min / median / max over {runs} runs" if runs > 1 else "one run"
    lines = [
        f"Each run times {n:,} coordinates {repeat} times, ours and numpy's interleaved, and keeps "
        f"the medians; ratio = ours / numpy within a run ({what}); ms are medians.",
        "",
        "| " + " | ".join(SPEED_HEADERS) + " |",
        "|" + "|".join("---" for _ in SPEED_HEADERS) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in speed_runs(n, repeat, runs)]
    return "\n".join(lines)


SMALL_DIM = 8
"""Numbers per value in the service's benchmarks: the per-call rows' size."""
GOAL_STEP_US = 10.0
"""Our noise per value-step at :data:`SMALL_DIM` numbers, µs of CPU (issue #42): an absolute
time, read with the load average under the table."""
GOAL_EXACT_X = 100.0
"""Our exact samplers at least this many times faster than OpenDP's, per coordinate, same
process (issue #42)."""
OPENDP_MISSING = "opendp not installed (pip install .[bench])"
EXACT_PEERS = {
    "laplace": "make_laplace on floats",
    "gaussian": "make_gaussian on floats",
    "discrete_laplace": "make_laplace on integers",
}
"""OpenDP's exact sampler each of ours is set against (all of ours decide on integers:
docs/protocol.md §1; OpenDP's float samplers are exact too, rounded to the float grid)."""


def opendp_samplers(dim: int) -> dict[str, Callable[[], Any]] | None:
    """OpenDP's exact samplers adding noise of scale 1 to ``dim`` zeros, one call each, or
    ``None`` when opendp is not installed (it is an optional benchmark extra)."""
    try:
        import opendp.prelude as dp
    except ImportError:
        return None
    dp.enable_features("contrib")
    floats = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    ints = dp.vector_domain(dp.atom_domain(T=int))
    lap = dp.m.make_laplace(floats, dp.l1_distance(T=float), scale=1.0)
    gauss = dp.m.make_gaussian(floats, dp.l2_distance(T=float), scale=1.0)
    dlap = dp.m.make_laplace(ints, dp.l1_distance(T=int), scale=1.0)
    zeros, izeros = [0.0] * dim, [0] * dim
    return {
        "laplace": lambda: lap(zeros),
        "gaussian": lambda: gauss(zeros),
        "discrete_laplace": lambda: dlap(izeros),
    }


_SMALL_CASES: tuple[tuple[str, Mechanism, str], ...] = (
    ("laplace", Laplace(1.0, dimension=SMALL_DIM), "laplace"),
    ("gaussian", Gaussian(1.0), "normal"),
    ("discrete_laplace", DiscreteLaplace(1), "laplace"),
)


def _cpu_round_robin(fns: Sequence[Callable[[], Any]], calls: int) -> list[float]:
    """CPU seconds of this thread per call of each function: the median of ``calls`` calls
    of each, made in turn one call at a time (so all see the same machine state), after one
    call of each to warm up."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(calls):
        for i, fn in enumerate(fns):
            t0 = time.thread_time()
            fn()
            times[i].append(time.thread_time() - t0)
    return [statistics.median(t) for t in times]


PURCHASE_VALUES = 4
"""Retained values a per-call row releases in one call: a purchase's, as in
``python -m bench.noise_step``'s purchase rows (the service releases a purchase's values in
one :meth:`ReleaseChain.release`)."""


_IN_A_ROW = 10
"""Calls of one function timed together in the per-call rows: a service makes the same kind
of call again and again, so each is timed warm, after calls of its own kind (one call at a
time between OpenDP's, whose ~0.3 ms of work evicts the caches, took ours from ~10 to ~16 µs
per value-step and numpy's from ~1 to ~4 µs per call)."""


def _turns(calls: int) -> int:
    """Timed turns of :func:`_cpu_in_turns` for ``calls`` calls (one more warms up)."""
    return max(1, calls // _IN_A_ROW)


def _cpu_in_turns(fns: Sequence[Callable[[], Any]], calls: int) -> list[float]:
    """CPU seconds of this thread per call of each function: :data:`_IN_A_ROW` calls of each
    timed together, the functions in turn (so all see the same machine state), ``calls`` calls
    of each in all; the median over the turns, after one turn to warm up."""
    turns = _turns(calls)
    times: list[list[float]] = [[] for _ in fns]
    for turn in range(turns + 1):
        for i, fn in enumerate(fns):
            t0 = time.thread_time()
            for _ in range(_IN_A_ROW):
                fn()
            if turn:
                times[i].append((time.thread_time() - t0) / _IN_A_ROW)
    return [statistics.median(t) for t in times]


def _value_steps(mech: Mechanism, calls: int) -> Callable[[], Any]:
    """:data:`PURCHASE_VALUES` value-steps as the service makes them, ``calls`` times: values
    of :data:`SMALL_DIM` numbers whose step at level 1 is known (states opened and stepped
    beforehand, as the service holds them), released together at level 0.5 through
    :class:`ReleaseChain` (their request keys, keystream and decisions), each call on new
    values."""
    chain = ReleaseChain(mech, (0.5, 1.0))
    keys = NoiseKeys(b"bench noise step secret 00000000")
    value = np.arange(SMALL_DIM, dtype=mech.dtype)
    groups = []
    for c in range(calls + 1):
        idents = [("s", f"v{c}.{i}") for i in range(PURCHASE_VALUES)]
        states = [chain.open(value) for _ in idents]
        chain.release(states, 1, idents, keys)
        groups.append((states, idents))
    pending = iter(groups)

    def step() -> Any:
        states, idents = next(pending)
        return chain.release(states, 0, idents, keys)

    return step


def small_table(calls: int) -> list[tuple[str, float, float, float | None]]:
    """One run of the per-call rows: µs of CPU per value-step (ours), per call of numpy's
    sampler and of OpenDP's (``None``: not installed), on :data:`SMALL_DIM` numbers."""
    base = np.random.default_rng(0)
    peers = opendp_samplers(SMALL_DIM)
    rows = []
    for name, mech, sampler in _SMALL_CASES:
        ours = _value_steps(mech, (_turns(calls) + 1) * _IN_A_ROW)
        numpy = functools.partial(getattr(base, sampler), 0.0, 1.0, SMALL_DIM)
        fns: list[Callable[[], Any]] = [ours, numpy]
        if peers is not None:
            fns.append(peers[name])
        t = _cpu_in_turns(fns, calls)
        ours_step = t[0] / PURCHASE_VALUES
        rows.append((name, ours_step * 1e6, t[1] * 1e6, t[2] * 1e6 if peers is not None else None))
    return rows


def small_markdown(calls: int, runs: int) -> str:
    """Noise per call at the service's size, against numpy and OpenDP, as ``python -m
    bench.noise`` prints it and docs/report.md includes it."""
    tables = [small_table(calls) for _ in range(runs)]
    what = f"min / median / max over {runs} runs" if runs > 1 else "one run"
    lines = [
        f"{SMALL_DIM} numbers per call, the service's size. Ours: a value-step as the service "
        f"makes it, the CPU of one `ReleaseChain.release` of {PURCHASE_VALUES} retained values "
        "(a purchase's call) ÷ their value-steps: step 0.5 of values whose step 1.0 is known, "
        "states opened beforehand (SHAKE256 request keys, ChaCha20 keystream and decisions, on "
        "new values each call; the definition of `python -m bench.noise_step`'s purchase rows); "
        f"numpy: one call of its inexact sampler on {SMALL_DIM} numbers; OpenDP: one call of "
        f"its exact sampler on {SMALL_DIM} numbers (`opendp` "
        + ("installed" if opendp_samplers(1) is not None else "not installed")
        + f"). CPU time of this thread: {calls} calls of each, {_IN_A_ROW} in a row at a time "
        f"and the functions in turn, after {_IN_A_ROW} to warm up; the median over the turns "
        f"({what}). Ours reads 20-50 % above `bench.noise_step`'s purchase rows, the same "
        "calls: here each turn starts with caches OpenDP's calls have just filled, and each "
        "call takes new values' states, where `bench.noise_step` keeps releasing the same "
        "four down their chain; and "
        "a Gaussian step here sums two levels' normals (its top step there, one). The goal is "
        "an absolute time: read it with the load average below.",
        "",
        "| mechanism | ours µs per value-step | numpy µs per call | ours ÷ numpy | OpenDP µs "
        f"per call | OpenDP ÷ ours | goal: ours <= {GOAL_STEP_US:g} µs |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, (name, *_rest) in enumerate(tables[0]):
        ours = [t[i][1] for t in tables]
        numpy = [t[i][2] for t in tables]
        peer = [t[i][3] for t in tables]
        mid = statistics.median(ours)
        odp, vs = OPENDP_MISSING, "—"
        if all(p is not None for p in peer):
            got = [p for p in peer if p is not None]
            odp = f"{statistics.median(got):,.1f}"
            vs = f"{_spread([p / o for p, o in zip(got, ours, strict=True)], '.1f')}x"
        lines.append(
            f"| {name} | {mid:,.1f} | {statistics.median(numpy):,.2f} | "
            f"{_spread([o / n for o, n in zip(ours, numpy, strict=True)], '.1f')}x | {odp} | "
            f"{vs} | {'met' if mid <= GOAL_STEP_US else 'not met'} |"
        )
    return "\n".join(lines)


def exact_table(n: int, n_peer: int, repeat: int) -> list[tuple[str, float, float, float | None]]:
    """One run of the per-coordinate rows: ns of CPU per coordinate of numpy's sampler and of
    our fresh release at ``n`` coordinates, and of OpenDP's exact sampler at ``n_peer`` (its
    cost per coordinate is flat from 10^3 coordinates on, 7–25 µs here, so 10^6 of its draws
    take minutes); ``None``: not installed. ``repeat`` calls of each, in turn."""
    base = np.random.default_rng(0)
    rng = default_rng(1)
    peers = opendp_samplers(n_peer)
    rows = []
    for name, mech in (
        ("laplace", Laplace(1.0)),
        ("gaussian", Gaussian(1.0)),
        ("discrete_laplace", DiscreteLaplace(1)),
    ):
        sampler = "normal" if name == "gaussian" else "laplace"
        states = iter([_prepared(mech, n, [], seed=i) for i in range(repeat + 1)])

        def fresh(states: Iterator[ReleaseState] = states) -> Any:
            return next(states).release(1.0, rng=rng)

        fns: list[Callable[[], Any]] = [
            functools.partial(getattr(base, sampler), 0.0, 1.0, n),
            fresh,
        ]
        if peers is not None:
            fns.append(peers[name])
        t = _cpu_round_robin(fns, repeat)
        peer = t[2] / n_peer * 1e9 if peers is not None else None
        rows.append((name, t[0] / n * 1e9, t[1] / n * 1e9, peer))
    return rows


def exact_sizes(quick: bool) -> tuple[int, int, int]:
    """Our and numpy's coordinates, OpenDP's, and calls of each per run (``--quick`` or not):
    what ``python -m bench.noise`` and ``python -m bench.report`` both use."""
    return (10_000, 100, 2) if quick else (1_000_000, 10_000, 3)


def small_calls(quick: bool) -> int:
    """Calls of each sampler per run of the per-call rows (``--quick`` or not)."""
    return 30 if quick else 300


def exact_markdown(n: int, n_peer: int, repeat: int, runs: int) -> str:
    """Per coordinate against numpy's inexact samplers and OpenDP's exact ones."""
    tables = [exact_table(n, n_peer, repeat) for _ in range(runs)]
    what = f"min / median / max over {runs} runs" if runs > 1 else "one run"
    installed = opendp_samplers(1) is not None
    lines = [
        f"CPU ns of this thread per coordinate: numpy's inexact sampler and our fresh release "
        f"at {n:,} coordinates, OpenDP's exact sampler (`opendp` "
        + ("installed" if installed else "not installed")
        + f") at {n_peer:,} (its time per coordinate is flat from 10^3 coordinates on; 10^6 of "
        f"its draws take minutes); the median of {repeat} calls of each, made in turn after one "
        f"to warm up ({what}). OpenDP's peers: "
        + "; ".join(f"{k}: `{v}`" for k, v in EXACT_PEERS.items())
        + ".",
        "",
        "| mechanism | numpy ns/coordinate | ours ns/coordinate | ours ÷ numpy | OpenDP "
        f"ns/coordinate | OpenDP ÷ ours | goal: ours >= {GOAL_EXACT_X:g}x faster than OpenDP |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, (name, *_rest) in enumerate(tables[0]):
        numpy = [t[i][1] for t in tables]
        ours = [t[i][2] for t in tables]
        peer = [t[i][3] for t in tables]
        odp, vs, goal = OPENDP_MISSING, "—", OPENDP_MISSING
        if all(p is not None for p in peer):
            got = [p for p in peer if p is not None]
            x = [p / o for p, o in zip(got, ours, strict=True)]
            odp, vs = f"{statistics.median(got):,.0f}", f"{_spread(x, ',.0f')}x"
            goal = "met" if statistics.median(x) >= GOAL_EXACT_X else "not met"
        lines.append(
            f"| {name} | {statistics.median(numpy):,.1f} | {statistics.median(ours):,.1f} | "
            f"{_spread([o / m for o, m in zip(ours, numpy, strict=True)], '.2f')}x | {odp} | "
            f"{vs} | {goal} |"
        )
    return "\n".join(lines)


def _spread(xs: list[float], fmt: str) -> str:
    """``min / median / max`` of several runs (one number for one run)."""
    if len(xs) == 1:
        return format(xs[0], fmt)
    return f"{min(xs):{fmt}} / {statistics.median(xs):{fmt}} / {max(xs):{fmt}}"


HIST_LEVELS = (0.25, 0.5, 1.0, 2.0)
HIST_KEYS = 1_000
HIST_SPARSE = "top of 4 steps vs SparseHistogramRelease, 4 rounds"
HIST_FIRST = "the same, plus building the stream's survival law"
HIST_VECTOR = "vs a Gaussian vector of as many numbers"
HIST_DOMAIN = "domain 2^60 vs 2^20"
HIST_NUMPY = "top of 4 steps vs the same draws from numpy's samplers"
HIST_STARTS = "m = 300: most time in new zero counts, vs numpy's samplers"
HIST_GOALS = {
    HIST_SPARSE: 2.0,
    HIST_FIRST: 2.0,
    HIST_VECTOR: 2.0,
    HIST_DOMAIN: 1.25,
    HIST_NUMPY: 2.0,
    HIST_STARTS: 8.0,
}
"""Goal ratio of each histogram row (the median over the runs must be at most this)."""
_HIST_BATCH = 16
"""Calls per timing sample of a sub-millisecond release (one is too short to time alone on a
busy machine, and whether a zero count first shows in it makes its cost vary); twice as many
for the domain row, which compares two such releases."""


def _round_robin(fns: Sequence[tuple[Callable[[], Any], int]], rounds: int) -> list[float]:
    """Mean seconds per call of each function, called in turn (``n`` calls of each per turn,
    ``rounds`` turns) so that all see the same machine state even when other processes take
    the cores in bursts."""
    gc.collect()
    total = [0.0] * len(fns)
    for _ in range(rounds):
        for i, (fn, n) in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            total[i] += time.perf_counter() - t0
    return [t / (rounds * n) for t, (_, n) in zip(total, fns, strict=True)]


def _histogram_case(domain: int, seed: int) -> tuple[HistogramChain, Any, Any, Any]:
    rng = np.random.default_rng(seed)
    keys = rng.choice(2**20, size=HIST_KEYS, replace=False)
    counts = rng.poisson(20.0, HIST_KEYS).astype(float) + 1.0
    chain = HistogramChain(HIST_LEVELS, sensitivity=1.0, domain=domain, false_keys=1.0)
    return chain, chain.value(keys, counts), keys, counts


def numpy_release(
    chain: HistogramChain, keys: Any, counts: Any, top: int, rng: np.random.Generator
) -> Any:
    """The floor the exact samplers are measured against: the chain's steps with the same law
    drawn by numpy's samplers and scipy's functions in floats (as the chain drew them before
    its noise became exact): ``normal`` for the walk, ``binomial`` for the count, ``integers``
    for the keys, the Newton inversion of ∫Φ for the starts and ``ndtri`` for the last
    increment; the counts on the same grid, rounded in floats."""
    tracked, walk = np.asarray(keys, dtype=np.int64), np.zeros(len(keys))
    base = np.asarray(counts, dtype=np.float64)
    for r in chain._rounds[: top + 1]:
        walk = walk + rng.normal(0.0, r.sd, walk.size)
        q = int(rng.binomial(chain.domain - tracked.size, r.p)) if r.p > 0 else 0
        if q:
            fresh = rng.integers(0, chain.domain, q)
            if r.grid is None or r.cdf is None:
                starts = np.zeros(q)
            else:
                starts = sample_starts(rng, q, r.grid, r.cdf, r.a, r.sd, r.width)
            tail = _special.ndtr(-(r.a - starts) / r.sd)
            steps = -r.sd * _special.ndtri((1.0 - rng.random(q)) * tail)
            tracked = np.concatenate([tracked, fresh])
            walk = np.concatenate([walk, starts + steps])
            base = np.concatenate([base, np.zeros(q)])
    r = chain._rounds[top]
    grain = 2.0**r.grid_exp
    noisy = np.round((base + walk / r.level) / grain) * grain
    keep = noisy > r.tau
    return tracked[keep], noisy[keep]


def histogram_table(repeat: int) -> list[tuple[str, str, float, float, float, str]]:
    """One run of the histogram rows: ``repeat`` samples of each, ours and the baseline in turn.

    * The top of 4 steps of a 1,000-key histogram over 2^40 keys, recomputed from step 0 by
      the keyed :class:`HistogramChain` (a pure function of the request, nothing cached),
      against the library's stateful :class:`SparseHistogramRelease` doing the same 4 rounds
      (same counts, levels and thresholds, the same survival grid for both).
    * The same, plus building the chain (its survival law, once per stream and worker):
      what the first release of a stream costs.
    * Against the vector product's release of as many numbers (a Gaussian ReleaseChain,
      1,000 coordinates, the same 4 levels, recomputed from step 0).
    * The chain at 2^60 keys against 2^20 keys (the same counts).
    """
    rngs = KeyedRngFactory(b"bench histogram secret 000000000")
    noise = NoiseKeys(b"bench histogram secret 000000000")
    calls = iter(range(10**9))
    top = len(HIST_LEVELS) - 1
    chain, value, keys, counts = _histogram_case(2**40, 5)
    vector = ReleaseChain(Gaussian(1.0), HIST_LEVELS)

    def ours(ch: HistogramChain = chain, v: Any = value) -> None:
        ch.release(v, top, ("s", f"v{next(calls)}", "d"), rngs)

    def sparse() -> None:
        m = SparseHistogramRelease(
            keys, counts, dimension=chain.domain, sensitivity=1.0, rng=next(calls), grid=chain.grid
        )
        for lvl, tau in zip(chain.levels, chain.thresholds, strict=True):
            m.release(lvl, tau)

    def first() -> None:
        ch = HistogramChain(HIST_LEVELS, sensitivity=1.0, domain=chain.domain, false_keys=1.0)
        ch.release(ch.value(keys, counts), top, ("s", f"f{next(calls)}", "d"), rngs)

    def dense() -> None:
        vector.release([vector.open(counts)], top, [("s", f"w{next(calls)}")], noise)

    floor_rng = default_rng(11)

    def floor() -> None:
        numpy_release(chain, value.keys, value.counts, top, floor_rng)

    many = HistogramChain(HIST_LEVELS, sensitivity=1.0, domain=2**40, false_keys=300.0)
    v_many = many.value(keys, counts)

    def ours_many() -> None:
        many.release(v_many, top, ("s", f"m{next(calls)}", "d"), rngs)

    def floor_many() -> None:
        numpy_release(many, v_many.keys, v_many.counts, top, floor_rng)

    small, v_small, _, _ = _histogram_case(2**20, 6)
    large, v_large, _, _ = _histogram_case(2**60, 6)
    b = _HIST_BATCH
    groups: list[tuple[list[tuple[Callable[[], Any], int]], int]] = [
        # (function, calls per turn) called in turn, turns per sample
        ([(sparse, 1), (ours, b), (first, 1)], 1),
        ([(dense, 1), (ours, 1)], b),
        (
            [
                (functools.partial(ours, small, v_small), 1),
                (functools.partial(ours, large, v_large), 1),
            ],
            2 * b,
        ),
        ([(floor, b), (ours, b)], 1),
        ([(floor_many, 1), (ours_many, 1)], 1),
    ]
    samples = [[_round_robin(fns, turns) for _ in range(repeat)] for fns, turns in groups]
    cases = [  # comparison, (group, baseline's place, ours' place)
        (HIST_SPARSE, (0, 0, 1)),
        (HIST_FIRST, (0, 0, 2)),
        (HIST_VECTOR, (1, 0, 1)),
        (HIST_DOMAIN, (2, 0, 1)),
        (HIST_NUMPY, (3, 0, 1)),
        (HIST_STARTS, (4, 0, 1)),
    ]
    rows = []
    for op, (g, i_base, i_ours) in cases:
        base_t = [x[i_base] for x in samples[g]]
        ours_t = [x[i_ours] for x in samples[g]]
        t_ours, t_base = statistics.median(ours_t), statistics.median(base_t)
        ratio = t_ours / t_base
        rows.append(
            (
                "histogram",
                op,
                t_base * 1e3,
                t_ours * 1e3,
                ratio,
                "ok" if ratio <= HIST_GOALS[op] else "MISS",
            )
        )
    return rows


def histogram_markdown(repeat: int, runs: int) -> str:
    """The histogram rows as `python -m bench.noise` prints them and docs/report.md includes
    them (min / median / max of the ratio over ``runs``; verdict on the median)."""
    tables = [histogram_table(repeat) for _ in range(runs)]
    what = f"min / median / max over {runs} runs" if runs > 1 else "one run"
    lines = [
        f"{HIST_KEYS:,} keys (counts 1 + Poisson(20)) in a domain of 2^40, {len(HIST_LEVELS)} "
        f"levels ρ = {', '.join(f'{x:g}' for x in HIST_LEVELS)}, false_keys m = 1. Ours = a "
        "release at the top level by HistogramChain: keyed, every step recomputed from step 0, "
        "a pure function of the request (its survival law is the stream's, built beforehand, "
        "except in the second row). Baselines: the library's stateful SparseHistogramRelease "
        f"doing the same 4 rounds (same thresholds, survival grid of {GRID} cells for both: it "
        "propagates its survival law in every round, which is most of its time); a Gaussian "
        "vector of as many numbers released at the top level from scratch; the chain on 2^20 "
        f"keys. Each run takes {repeat} samples of every comparison, ours and the baseline "
        f"called in turn ({_HIST_BATCH} releases under a millisecond per sample, {2 * _HIST_BATCH} "
        "on each domain, the others once), and keeps the medians. Ratio = ours / "
        f"baseline within a run ({what}); ms per release are medians. Against the vector, "
        "much of a histogram release's time goes to placing the zero counts that first exceed "
        "a threshold (about one per value at m = 1: an exact binomial, then Robert's trials "
        "inside a cell, market._histogram_draws), which a vector has no counterpart of. The last "
        "two rows time the exact samplers against numpy's (bench.noise.numpy_release: the same "
        "law drawn by numpy's normal, binomial and integers and scipy's ndtr/ndtri in floats, "
        "as the chain drew it before its noise became exact), at m = 1 and at m = 300 (about "
        "300 new zero counts per value, where the exact count and starts dominate).",
        "",
        "| product | comparison | baseline ms | ours ms | ratio | goal |",
        "|---|---|---|---|---|---|",
    ]
    for i, (name, op, *_rest) in enumerate(tables[0]):
        ratio = [t[i][4] for t in tables]
        mid = statistics.median(ratio)
        spread = f"{min(ratio):.2f} / {mid:.2f} / {max(ratio):.2f}x" if runs > 1 else f"{mid:.2f}x"
        base = statistics.median(t[i][2] for t in tables)
        ours = statistics.median(t[i][3] for t in tables)
        verdict = "ok" if mid <= HIST_GOALS[op] else "MISS"
        lines.append(
            f"| {name} | {op} | {base:.3f} | {ours:.3f} | {spread} | "
            f"<= {HIST_GOALS[op]:g}x: {verdict} |"
        )
    return "\n".join(lines)


RAPPOR_LEVELS = (2.0, 4.0, 8.0)
"""A RAPPOR stream's levels in the rows below (ε; Δ = 2, one bit set per report)."""


def rappor_table(n: int, repeat: int) -> list[tuple[str, float, float, float]]:
    """One run of the RAPPOR rows: ms per release of ``n`` report bits, ours and numpy's in
    turn (``repeat`` turns, :func:`_round_robin`: means per call).

    * *top level*: a new value's bits at the top level (the chain's fresh exact lattice
      Laplace, then ``[y + V > 1/2]``) against numpy's ``y + laplace(Δ/ε) > 1/2``;
    * *lowest level*: its bits at the lowest level, every step computed from the top down (the
      relaxation steps' exact mixtures, what a stream's chain draws for its levels) against the
      same numpy draw at that level.
    """
    chain = ReleaseChain(Laplace(2.0, dimension=n), RAPPOR_LEVELS)
    noise = NoiseKeys(b"bench rappor secret 0000000000000")
    y = (np.arange(n) % 8 == 0).astype(np.float64)
    rng = np.random.default_rng(4)
    counter = iter(range(10**9))

    def ours(step: int) -> Callable[[], Any]:
        def call() -> Any:
            ident = ("s", f"v{next(counter)}", "d")
            return released_bits(chain.release([chain.open(y)], step, [ident], noise)[0])

        return call

    def numpy(level: float) -> Callable[[], Any]:
        return lambda: (y + rng.laplace(0.0, 2.0 / level, n) > 0.5).astype(np.float64)

    rows = []
    for name, step in (("top level", 2), ("lowest level (3 steps)", 0)):
        t_ours, t_np = _round_robin([(ours(step), 1), (numpy(RAPPOR_LEVELS[step]), 1)], repeat)
        rows.append((name, t_np * 1e3, t_ours * 1e3, t_ours / t_np))
    return rows


def rappor_markdown(n: int, repeat: int, runs: int) -> str:
    """The RAPPOR rows as ``python -m bench.noise`` prints them (ratio min / median / max over
    ``runs``; no goal is set: issue #44 asks for the figure)."""
    tables = [rappor_table(n, repeat) for _ in range(runs)]
    what = f"min / median / max over {runs} runs" if runs > 1 else "one run"
    lines = [
        f"{n:,} report bits (Δ = 2, levels ε = {', '.join(f'{x:g}' for x in RAPPOR_LEVELS)}), "
        "released as `[y + V > 1/2]` by the stream's ReleaseChain (exact lattice Laplace, "
        "docs/protocol.md §1.10) against numpy's inexact `y + laplace(Δ/ε) > 1/2`, called in "
        f"turn ({repeat} calls each, mean per call). Ratio = ours / numpy within a run ({what}).",
        "",
        "| release | numpy ms | ours ms | ratio |",
        "|---|---|---|---|",
    ]
    for i, (name, *_rest) in enumerate(tables[0]):
        ratio = [t[i][3] for t in tables]
        mid = statistics.median(ratio)
        spread = f"{min(ratio):.2f} / {mid:.2f} / {max(ratio):.2f}x" if runs > 1 else f"{mid:.2f}x"
        base = statistics.median(t[i][1] for t in tables)
        ours = statistics.median(t[i][2] for t in tables)
        lines.append(f"| {name} | {base:.3f} | {ours:.3f} | {spread} |")
    return "\n".join(lines)


def accuracy_table(n: int, steps: int) -> list[tuple[str, int, float, float, float, float]]:
    """MSE / ideal variance after k equal steps of size level_1 (ideal = one release at k·l1)."""
    rows = []
    for mech, l1 in ((Laplace(1.0), 0.2), (Gaussian(1.0), 0.05)):
        zero = np.zeros(n)
        ladder = ReleaseState(mech, zero)
        comp = CompositionRelease(mech, zero, rng=2)
        comb = CompositionRelease(mech, zero, combine=True, rng=3)
        dbl = DoublingRelease(mech, zero, base=l1, rng=4)
        rng = default_rng(5)
        for k in range(1, steps + 1):
            lv = k * l1
            ideal = mech.variance(lv)
            rows.append(
                (
                    mech.name,
                    k,
                    float(np.mean(np.asarray(ladder.release(lv, rng=rng), dtype=float) ** 2))
                    / ideal,
                    float(np.mean(comp.release(lv) ** 2)) / ideal,
                    float(np.mean(comb.release(lv) ** 2)) / ideal,
                    float(np.mean(dbl.release(lv) ** 2)) / ideal,
                )
            )
    return rows


def memory_table(count: int) -> list[tuple[str, int, int, float, float, float]]:
    """Bytes per stored value after m releases: Python heap (tracemalloc), vectors, codec."""
    rows = []
    for dim in (1, 1000):
        for m in (1, 5, 20):
            levels = list(np.linspace(1.0, 1.5, m))
            k = max(1, count // dim)
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            states = [_prepared(Laplace(1.0), dim, levels, seed=i) for i in range(k)]
            heap = (tracemalloc.get_traced_memory()[0] - before) / k
            tracemalloc.stop()
            vec = statistics.mean(s.nbytes for s in states)
            enc = statistics.mean(len(encode_state(s)) for s in states)
            rows.append(("laplace", dim, m, heap, vec, enc))
    return rows


def _print(headers: list[str], rows: list[tuple[Any, ...]], fmt: list[str]) -> None:
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        print("| " + " | ".join(f.format(v) for f, v in zip(fmt, row, strict=True)) + " |")
    print()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    p.add_argument("--runs", type=int, default=None, help="independent runs (default 3; quick 1)")
    args = p.parse_args(argv)
    n = 10_000 if args.quick else 1_000_000
    repeat = 3 if args.quick else 7
    runs = args.runs or (1 if args.quick else 3)
    machine = Machine.now()
    print(f"## Speed on {n:,} coordinates\n")
    print(speed_markdown(n, repeat, runs) + "\n")
    print(machine.line() + "\n")
    machine = Machine.now()
    print("## Per coordinate: numpy's inexact samplers and OpenDP's exact ones\n")
    print(exact_markdown(*exact_sizes(args.quick), runs) + "\n")
    print(machine.line() + "\n")
    machine = Machine.now()
    print(f"## Per call at {SMALL_DIM} numbers (the service's size)\n")
    print(small_markdown(small_calls(args.quick), runs) + "\n")
    print(machine.line() + "\n")
    machine = Machine.now()
    print("## Histogram releases\n")
    print(histogram_markdown(repeat, runs) + "\n")
    print(machine.line() + "\n")
    machine = Machine.now()
    print("## RAPPOR releases\n")
    print(rappor_markdown(n, repeat, runs) + "\n")
    print(machine.line() + "\n")
    steps = 5 if args.quick else 20
    print(f"## Accuracy: MSE / ideal after k steps ({n // 10:,} samples)\n")
    print("ideal = variance of one release at the final level; 1.00 means no loss.\n")
    _print(
        ["mechanism", "k", "lossless", "composition", "composition+IVW", "doubling"],
        accuracy_table(n // 10, steps),
        ["{}", "{}", "{:.3f}", "{:.3f}", "{:.3f}", "{:.3f}"],
    )
    print("## Memory per stored value (Laplace, levels spaced 1.0..1.5)\n")
    _print(
        ["mechanism", "dimension", "releases", "heap bytes", "vector bytes", "encoded bytes"],
        memory_table(100 if args.quick else 3_000),
        ["{}", "{}", "{}", "{:.0f}", "{:.0f}", "{:.0f}"],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
