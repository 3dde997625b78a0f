"""The noise step: the keys, keystreams and decisions of many value-steps in one call.

A purchase releases a few values one step down, a value batch releases each value at the levels
held: many *value-steps*, each of a handful of coordinates. Per value-step the work is tiny
(~0.3 µs of ChaCha20 and arithmetic on 8 numbers); what cost 50-100 µs was the set-up around
it in Python: a SHAKE256 sponge, a ChaCha20 ``Cipher`` object and ~30 numpy calls per request.
This module does it once per call for all of them:

* :func:`keyed_draws` derives every request key (SHAKE256, ``docs/protocol.md`` §1.1) and the
  joined main words of all of them (ChaCha20, §1.2) -- the words of each request exactly where
  :meth:`Draws.joined` of the requests' own :class:`~market._draws.Draws` puts them;
* :func:`dlap_segments` is :func:`market._dlap.sample_segments` (the fresh and tightening
  discrete Laplace laws a chain descends through), its float pass over all the coordinates,
  and :func:`dlap_plans` the same for a fine grid's laws (:func:`market._dlap.sample_into`'s
  pass, the geometric drawn in chunks), which the reference draws step by step;
* :func:`normals` is :func:`market._normal.normals` (standard normals and their error bounds),
  and :func:`gaussian_step` a Gaussian chain's step: the normals of every level and value of a
  call, summed (:func:`market._normal.add`) and rounded (:func:`market._normal.snap`) at once;
* :func:`gaussian_release` is a Gaussian release of any size (a :class:`~market.ReleaseState`'s
  conditional step: :func:`market._normal.add_normals` then :func:`market._normal.snap`), one
  loop over the coordinates with no temporaries, which the compiler vectorises;
* :func:`poisson_segments` is :func:`market._poisson.sample` for a chain's Poisson steps (one
  law per value-step, inversion of its table).

Two implementations, one contract. The **compiled** one (``market._cnoise``, portable C built
with the package) runs each call in a single C loop; the **numpy reference** is the code that
ran before it (hashlib, ``cryptography``'s ChaCha20, :mod:`market._dlap`) and stays the
definition the tests and the vectors check the compiled one against. Both decide a coordinate
only where the float pass is clear of its margins (the same expressions in the same order;
libm and numpy may differ by ulps, which the margins cover), and leave the others to the same
exact path, so they release the same bits (``tests/market/test_noise_step.py``).

The compiled one is used when it was built and ``EMARKET_NOISE_STEP`` is not ``numpy``;
:data:`BACKEND` and :data:`REASON` say which runs and why (a worker logs them at start).
Importing it loads a small shared library: no compilation or warm-up ever happens at run time.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType

import numpy as np
from numpy.typing import NDArray

from . import _dlap, _normal, _poisson
from ._draws import KEY_LABEL, Draws
from .rng import NoiseKeys

__all__ = [
    "BACKEND",
    "REASON",
    "compiled",
    "describe",
    "dlap_plans",
    "dlap_segments",
    "draws",
    "gaussian_release",
    "gaussian_step",
    "keyed_draws",
    "normals",
    "poisson_segments",
    "request_keys",
    "using",
]

ENV = "EMARKET_NOISE_STEP"
"""Environment variable: ``numpy`` forces the reference implementation."""


_FUNCTIONS = (
    "request_keys",
    "main_words",
    "keyed_words",
    "dlap_segments",
    "dlap_plans",
    "normals",
    "table_segments",
    "gaussian_snap",
    "gaussian_pass",
    "wide",
)
"""What this module calls in the extension (market/_cnoise.pyi)."""


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(ENV, "").strip().lower() == "numpy":
        return None, f"{ENV}=numpy"
    try:
        from . import _cnoise  # noqa: PLC0415
    except ImportError as exc:
        return None, f"market._cnoise is not built ({exc}); reinstall with a C compiler"
    mod: ModuleType = _cnoise
    missing = [f for f in _FUNCTIONS if not hasattr(mod, f)]
    if missing:  # built from an older market/_cnoise.c: its bits are right, its API short
        return None, f"market._cnoise is out of date (no {', '.join(missing)}); rebuild it"
    return mod, "market._cnoise"


_COMPILED, REASON = _load()
BACKEND = "numpy" if _COMPILED is None else "compiled"
"""Which implementation runs: ``"compiled"`` or ``"numpy"`` (the reference)."""
_ACTIVE: list[ModuleType | None] = [_COMPILED]


def compiled() -> bool:
    """Whether the compiled step runs (rather than the numpy reference)."""
    return _ACTIVE[0] is not None


def describe() -> str:
    """One line for a log: which noise step runs, and why."""
    if _ACTIVE[0] is not None:
        return "noise step: compiled (market._cnoise)"
    return f"noise step: numpy reference ({REASON})"


@contextlib.contextmanager
def using(backend: str) -> Iterator[None]:
    """Run the block with ``"numpy"`` or ``"compiled"`` (tests compare the two).

    Raises
    ------
    RuntimeError
        ``"compiled"`` when the extension is not built.
    """
    if backend not in ("numpy", "compiled"):
        raise ValueError(f"backend must be 'numpy' or 'compiled', not {backend!r}")
    if backend == "compiled" and _COMPILED is None:
        raise RuntimeError(f"the compiled noise step is unavailable: {REASON}")
    old = _ACTIVE[0]
    _ACTIVE[0] = _COMPILED if backend == "compiled" else None
    try:
        yield
    finally:
        _ACTIVE[0] = old


def _head(keys: NoiseKeys) -> bytes:
    """What the request keys' sponge absorbs before the seed (§1.1)."""
    return _head_of(keys.secret)


@functools.lru_cache(maxsize=16)  # a worker has one secret (a few in tests)
def _head_of(secret: bytes) -> bytes:
    return KEY_LABEL + struct.pack(">I", len(secret)) + secret


def request_keys(keys: NoiseKeys, seeds: Sequence[bytes]) -> list[bytes]:
    """The request key of each encoded identity (:meth:`NoiseKeys.of` of each seed)."""
    c = _ACTIVE[0]
    if c is None:
        return [keys.of(seed) for seed in seeds]
    raw: bytes = c.request_keys(_head(keys), seeds)
    return [raw[i : i + 32] for i in range(0, len(raw), 32)]


LONG = 1 << 14
"""Words beyond which a call's keystream comes from OpenSSL's vectorised ChaCha20 (the same
words; portable C runs a few times slower per byte, and only the per-call set-up of short
vectors was worth compiling)."""


def draws(keys: Sequence[bytes], sizes: Sequence[int], slots: int) -> Draws:
    """The joined draws of requests (``sizes[i]`` coordinates for ``keys[i]``): the same words
    as ``Draws.joined([Draws(k, n, slots) ...])``."""
    c = _ACTIVE[0]
    if c is None or not keys or sum(sizes) * slots > LONG:
        return Draws.joined([Draws(k, n, slots) for k, n in zip(keys, sizes, strict=True)])
    if any(len(k) != 32 for k in keys):
        raise ValueError("a request key has 32 bytes")
    raw = c.main_words(b"".join(keys), sizes, slots)
    words = np.frombuffer(raw, dtype=np.uint64).reshape(slots, sum(sizes))
    return Draws.from_words(list(zip(keys, sizes, strict=True)), words)


def keyed_draws(keys: NoiseKeys, seeds: Sequence[bytes], sizes: Sequence[int], slots: int) -> Draws:
    """:func:`draws` of the request keys of ``seeds``: a call's keying and keystream at once."""
    c = _ACTIVE[0]
    if c is None or not seeds or sum(sizes) * slots > LONG:
        return draws(request_keys(keys, seeds), sizes, slots)
    raw, words = c.keyed_words(_head(keys), seeds, sizes, slots)
    segments = [(raw[32 * i : 32 * i + 32], n) for i, n in enumerate(sizes)]
    grid = np.frombuffer(words, dtype=np.uint64).reshape(slots, -1)
    return Draws.from_words(segments, grid)


@functools.lru_cache(maxsize=1024)
def _constants(law: _dlap.Law) -> bytes:
    """The four doubles the compiled pass reads per segment, added as
    :func:`market._dlap.sample_segments` adds them: ``k_l``, ``k_l + k_0``, the total, ``1/s``."""
    cst = _dlap.float_constants(law)
    c2 = cst.k_l + cst.k_0
    return struct.pack("=4d", cst.k_l, c2, c2 + cst.k_l, cst.inv_s_q)


@functools.lru_cache(maxsize=1024)
def _plan_law(law: _dlap.Law) -> bytes:
    """A fresh or tightening law with a chunked plan as :func:`dlap_plans`' pass reads it,
    every float computed as :func:`market._dlap.sample_into` computes it."""
    cst = _dlap.float_constants(law)
    c1 = cst.k_l
    c2 = c1 + cst.k_0
    total = c2 + cst.k_r
    pl = law.plans[0]
    head = [c1 / total, c2 / total, 1.0 / float(pl.top), 2.0 ** (61 - pl.shift), pl.shift]
    chunks: list[float] = []
    for m, b in pl.chunks:
        sigma = pl.s * 2**m
        chunks += [m, b, 1.0 / float(sigma), -math.expm1(-float(sigma * 2**b)), 2.0**b]
    values = [*head, len(pl.chunks), *chunks]
    return struct.pack(f"={len(values)}d", *values)


def dlap_plans(
    laws: Sequence[_dlap.Law],
    sizes: Sequence[int],
    draws: Draws,
    eta: float = _dlap.ETA,
    margin: float = _dlap.MARGIN,
) -> NDArray[np.int64] | None:
    """The noise of fresh and tightening laws whose geometric takes several uniforms (a fine
    grid's), segment ``i`` on ``laws[i]``, in one compiled pass: the integers
    :func:`market._dlap.sample_into` gives each segment alone. ``None`` without the compiled
    step (a chain then goes step by step through the reference)."""
    c = _ACTIVE[0]
    if c is None:
        return None
    if any(law.a_l is not None for law in laws) or draws.n != sum(sizes):
        raise ValueError("dlap_plans needs fresh or tightening laws and their draws")
    packed = [_plan_law(law) for law in laws]
    raw, undecided = c.dlap_plans(draws.words, sizes, packed, margin, eta)
    out: NDArray[np.int64] = np.frombuffer(raw, dtype=np.int64)
    if undecided:
        seg = np.repeat(np.arange(len(laws)), sizes)
        for i in undecided:
            out[i] = _dlap.exact_noise(laws[int(seg[i])], 0, draws, i)
    return out


def dlap_segments(
    laws: Sequence[_dlap.Law],
    sizes: Sequence[int],
    draws: Draws,
    eta: float = _dlap.ETA,
    margin: float = _dlap.MARGIN,
    libm_error: float = 0.0,
) -> NDArray[np.int64]:
    """:func:`market._dlap.sample_segments` (the reference), in one compiled pass when built.

    ``margin`` and ``eta`` are the test hooks that send coordinates to the exact path;
    ``libm_error`` (compiled only) moves every ``log1p`` the pass computes by that relative
    amount, as another platform's libm could."""
    c = _ACTIVE[0]
    if c is None:
        return _dlap.sample_segments(laws, sizes, draws, eta=eta, margin=margin)
    distinct = {id(law): law for law in laws}  # a call's value-steps share a few laws
    if not _dlap.batchable(list(distinct.values())) or draws.slots != 2 or draws.n != sum(sizes):
        raise ValueError("dlap_segments needs batchable laws and their two-slot draws")
    packed = {i: _constants(law) for i, law in distinct.items()}
    consts = b"".join([packed[id(law)] for law in laws])
    raw, undecided = c.dlap_segments(draws.words, consts, sizes, margin, eta, libm_error)
    out: NDArray[np.int64] = np.frombuffer(raw, dtype=np.int64)
    if undecided:
        seg = np.repeat(np.arange(len(laws)), sizes)
        for i in undecided:
            out[i] = _dlap.exact_noise(laws[int(seg[i])], 0, draws, i)
    return out


_NORMAL_CONSTANTS = (
    2.0 * _normal.TAU,
    2.0**-48 + 2.0 * _normal.TAU + 2.0**-53,
    2.0 * math.pi * 2.0**-64,
)
"""The constants of :func:`market._normal.normals`' bounds, computed as it computes them."""


def normals(draws: Draws) -> _normal.Hidden:
    """:func:`market._normal.normals` (the reference), in one compiled pass when built: the
    standard normals of slots 0 and 1 and their rigorous error bounds."""
    c = _ACTIVE[0]
    if c is None or draws.slots != _normal.SLOTS:
        return _normal.normals(draws)
    z, err = c.normals(draws.words, *_NORMAL_CONSTANTS)
    return _normal.Hidden(np.frombuffer(z, dtype=np.float64), np.frombuffer(err, dtype=np.float64))


def _table(tab: _poisson.Table) -> tuple[NDArray[np.float64], int, float]:
    """A law's table as the compiled pass reads it (its CDF read in place, not copied)."""
    return np.ascontiguousarray(tab.cdf, dtype=np.float64), tab.lo, tab.margin


def poisson_segments(
    laws: Sequence[_poisson.Poisson], sizes: Sequence[int], draws: Draws
) -> NDArray[np.int64]:
    """``_poisson.sample(laws, which, draws)`` with ``which`` segment ``i`` (``sizes[i]``
    coordinates) on ``laws[i]``: the reference, or one compiled pass when built."""
    c = _ACTIVE[0]
    if c is None:
        which = np.repeat(np.arange(len(laws), dtype=np.intp), sizes)
        return _poisson.sample(laws, which, draws)
    if draws.slots != 1 or draws.n != sum(sizes):
        raise ValueError("poisson_segments needs one-slot draws of the segments")
    raw, undecided = c.table_segments(draws.words, sizes, [_table(law.table) for law in laws])
    out: NDArray[np.int64] = np.frombuffer(raw, dtype=np.int64)
    if undecided:
        seg = np.repeat(np.arange(len(laws)), sizes)
        for i in undecided:
            out[i] = _poisson.exact_outcome(laws[int(seg[i])], draws.lazy(0, i), int(out[i]))
    return out


def gaussian_step(
    draws: Draws,
    coefficients: Sequence[float],
    base: NDArray[np.float64],
    grid_exp: int,
    settle: Callable[[int], int],
) -> NDArray[np.int64]:
    """``round((x + Z)/2^grid_exp)`` with ``Z = Σ_j coefficients[j]·N_j``: ``draws`` holds
    ``N_j``'s words for every coordinate of ``base`` at ``[j·n, (j + 1)·n)``, top term first.
    The reference adds them with :func:`market._normal.add` and rounds with
    :func:`market._normal.snap`; the compiled pass does the same per coordinate; both leave
    the coordinates they cannot decide to ``settle``.

    Raises
    ------
    OverflowError
        A value too large for its release grid.
    """
    c = _ACTIVE[0]
    n = int(base.shape[0])
    if c is None:
        nz = _normal.normals(draws)
        h = _normal.Hidden(np.zeros(n), np.zeros(n))
        for j, coef in enumerate(coefficients):
            part = _normal.Hidden(nz.z[j * n : (j + 1) * n], nz.err[j * n : (j + 1) * n])
            h = _normal.add(h, coef, part)
        return _normal.snap(base, h, grid_exp, settle)
    terms = [v for coef in coefficients for v in (coef, abs(coef) * (1.0 + 2.0**-49))]
    done = c.gaussian_snap(
        draws.words,
        struct.pack(f"={len(terms)}d", *terms),
        np.ascontiguousarray(base, dtype=np.float64),
        math.ldexp(1.0, -grid_exp),
        _NORMAL_CONSTANTS,
    )
    if done is None:
        raise OverflowError("a value is too large for its release grid")
    raw, undecided = done
    out: NDArray[np.int64] = np.frombuffer(raw, dtype=np.int64)
    for i in undecided:
        out[i] = settle(i)
    return out


_BRIDGE_WEIGHT = 1.0 + 2.0**-50
"""``|w|(1 + 2⁻⁵⁰)``: the bound's weight of a bridge's mixture (:class:`market._normal.Mixed`)."""


def _prior(h: _normal.Hidden | _normal.Mixed | None) -> tuple[object, ...] | None:
    """What :func:`gaussian_release`'s compiled pass adds the new normal to (its ``prior``)."""
    if h is None:
        return None
    if isinstance(h, _normal.Hidden):
        return (_doubles(h.z), _doubles(h.err))
    fa, fb = float(h.wa), float(h.wb)
    az, aerr = (None, None) if h.a is None else (_doubles(h.a.z), _doubles(h.a.err))
    bz, berr = _doubles(h.b.z), _doubles(h.b.err)
    return (az, aerr, fa, abs(fa) * _BRIDGE_WEIGHT, bz, berr, fb, abs(fb) * _BRIDGE_WEIGHT)


def _doubles(a: NDArray[np.float64]) -> NDArray[np.float64]:
    """``a`` as the compiled pass reads it: contiguous doubles (no copy when it already is)."""
    return np.ascontiguousarray(a, dtype=np.float64)


SCALAR_MAX = 1024
"""Coordinates up to which :func:`gaussian_release` runs compiled on any CPU: one loop in C
beats numpy's ~30 calls there even one coordinate at a time; above, only where the loop runs
vectorised (:data:`WIDE`), else numpy's reference is the faster."""
WIDE = _COMPILED is not None and bool(_COMPILED.wide())
"""Whether the compiled Gaussian pass runs vectorised on this CPU (``market._cnoise.wide``)."""


def gaussian_release(
    h: _normal.Hidden | _normal.Mixed | None,
    c: float,
    draws: Draws,
    base: NDArray[np.float64],
    grid_exp: int,
    settle: Callable[[int], int],
) -> tuple[_normal.Hidden, NDArray[np.int64]]:
    """The float pass ``h + c·N`` of a Gaussian release (``N`` the normals of ``draws``, two
    slots) and its integers ``round((base + Z)/2^grid_exp)``: the reference's
    :func:`market._normal.add_normals` then :func:`market._normal.snap`, or one compiled loop
    over the coordinates (the same expressions in the same order, its own ``ln`` within 2⁻⁴⁹
    where the reference trusts numpy's to 2⁻⁴⁶); both leave the coordinates they cannot decide
    to ``settle``, so they give the same integers. Above :data:`SCALAR_MAX` coordinates the
    compiled loop runs only where it is vectorised (:data:`WIDE`).

    Raises
    ------
    OverflowError
        A value too large for its release grid.
    """
    c_mod = _ACTIVE[0]
    if c_mod is None or draws.slots != _normal.SLOTS or (draws.n > SCALAR_MAX and not WIDE):
        hidden = _normal.add_normals(h, c, draws)
        return hidden, _normal.snap(base, hidden, grid_exp, settle)
    n = draws.n
    z, err, out = np.empty(n), np.empty(n), np.empty(n, dtype=np.int64)
    undecided = c_mod.gaussian_pass(
        draws.words,
        (c, abs(c) * (1.0 + 2.0**-49)),
        _doubles(base),
        math.ldexp(1.0, -grid_exp),
        _NORMAL_CONSTANTS,
        _prior(h),
        z,
        err,
        out,
    )
    if undecided is None:
        raise OverflowError("a value is too large for its release grid")
    for i in undecided:
        out[i] = settle(i)
    return _normal.Hidden(z, err), out
