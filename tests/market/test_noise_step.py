"""The compiled noise step (``market._cnoise``) against its numpy reference (:mod:`market._step`).

The compiled step must release the bits the reference releases: the same request keys (FIPS 202
SHAKE256), the same main words (RFC 8439 ChaCha20), the same discrete Laplace decisions with
the same coordinates left to the exact path; and the market must fall back to the reference,
saying so, where the extension is absent or disabled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from market import (
    DiscreteLaplace,
    Gaussian,
    Laplace,
    Mechanism,
    Poisson,
    _dlap,
    _normal,
    _poisson,
    _step,
)
from market._draws import Draws
from market.chain import ReleaseChain, noise_check, noise_step
from market.rng import NoiseKeys

from .protocol_vectors import generate
from .test_protocol_vectors import documented

ROOT = Path(__file__).resolve().parents[2]
COMPILED = _step.BACKEND == "compiled"
needs_compiled = pytest.mark.skipif(not COMPILED, reason=f"no compiled step: {_step.REASON}")
BOTH = ["numpy", pytest.param("compiled", marks=needs_compiled)]
BOTH_NAMES = ["numpy", "compiled"] if COMPILED else ["numpy"]
NOISE_CHECK = "ff5a3fafa5fb836324e826c8c9133dc2a70fe4daba3dd8b3c699b2298eaa55ec"


def test_the_extension_is_built_wherever_a_c_compiler_is() -> None:
    """A silent build failure would quietly run the slow path everywhere: where the install
    had a compiler, the compiled step must be the one in use (unless disabled on purpose)."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None or os.environ.get(_step.ENV) == "numpy":
        pytest.skip(f"no C compiler ({cc}) or the compiled step disabled")
    assert COMPILED, _step.REASON


@needs_compiled
def test_keys_follow_fips_202_and_the_reference() -> None:
    from market import _cnoise

    # FIPS 202 SHAKE256 of the empty message, and of 200 bytes 0xA3 (NIST's example message)
    empty = "46b9dd2b0ba88d13233b3feb743eeb243fcd52ea62b81b82b50c27646ed5762f"
    assert _cnoise.request_keys(b"", [b""]).hex() == empty
    a3 = hashlib.shake_256(b"\xa3" * 200).digest(32)
    assert _cnoise.request_keys(b"\xa3" * 100, [b"\xa3" * 100]) == a3
    g = np.random.default_rng(1)
    for trial in range(300):  # every alignment and both sides of the 136-byte block
        keys = NoiseKeys(g.bytes(16 + trial % 50))
        seeds = [g.bytes(int(n)) for n in g.integers(0, 420, 4)]
        with _step.using("compiled"):
            got = _step.request_keys(keys, seeds)
        with _step.using("numpy"):
            assert got == _step.request_keys(keys, seeds), trial


@needs_compiled
def test_words_follow_rfc_8439_and_the_reference() -> None:
    from market import _cnoise

    # RFC 8439 A.1 test vectors 1 and 2: zero key and nonce, block counters 0 and 1
    raw = bytes(_cnoise.main_words(bytes(32), [16], 1))
    assert raw[:16].hex() == "76b8e0ada0f13d90405d6ae55386bd28"
    assert raw[64:80].hex() == "9f07e7be5551387a98ba977c732d080d"
    g = np.random.default_rng(2)
    for trial in range(300):
        sizes = [int(n) for n in g.integers(0 if trial % 7 else 1, 40, 1 + trial % 6)]
        keys = [g.bytes(32) for _ in sizes]
        slots = 1 + trial % 5
        with _step.using("compiled"):
            got = _step.draws(keys, sizes, slots)
        ref = Draws.joined([Draws(k, n, slots) for k, n in zip(keys, sizes, strict=True)])
        assert np.array_equal(got.words, ref.words), trial
        for i in range(0, got.n, 7):
            assert got.locate(i) == ref.locate(i)
    sizes = [_step.LONG // 3 + 5, 17]  # past LONG words: OpenSSL's keystream, the same words
    keys = [g.bytes(32) for _ in sizes]
    with _step.using("compiled"):
        long = _step.draws(keys, sizes, 3)
    assert np.array_equal(
        long.words,
        np.frombuffer(_cnoise.main_words(b"".join(keys), sizes, 3), dtype=np.uint64).reshape(3, -1),
    )


def _laws(g: np.random.Generator, count: int) -> list[_dlap.Law]:
    """Fresh and tightening laws whose geometrics take one uniform (the batchable ones)."""
    out = []
    while len(out) < count:
        a = Fraction(float(g.uniform(2.0**-20, 40.0)))
        up = None if g.random() < 0.3 else a + Fraction(float(g.uniform(1e-6, 20.0)))
        law = _dlap.Law(a, up, None)
        if _dlap.batchable([law]):
            out.append(law)
    return out


def _segments(laws: list[_dlap.Law], sizes: list[int], draws: Draws, **kw: float) -> Any:
    with _step.using("compiled"):
        got = _step.dlap_segments(laws, sizes, draws, **kw)
    with _step.using("numpy"):
        want = _step.dlap_segments(laws, sizes, draws, **kw)
    return got, want


@needs_compiled
def test_discrete_laplace_decisions_equal_the_reference_on_thousands_of_steps() -> None:
    g = np.random.default_rng(3)
    for trial in range(60):
        laws = _laws(g, 50)  # 50 value-steps of 1-16 coordinates per call: 3,000 in all
        sizes = [int(n) for n in g.integers(1, 17, len(laws))]
        draws = _step.draws([g.bytes(32) for _ in laws], sizes, 2)
        got, want = _segments(laws, sizes, draws)
        assert got.dtype == np.int64 and np.array_equal(got, want), trial


@needs_compiled
def test_a_libm_off_by_an_ulp_changes_no_compiled_decision_and_a_gross_error_shows() -> None:
    """The compiled pass calls the C library's ``log1p``, not numpy's: its decisions must not
    depend on the last bits of it (the margins), and the check has power."""
    g = np.random.default_rng(5)
    laws = _laws(g, 200)
    sizes = [8] * len(laws)
    draws = _step.draws([g.bytes(32) for _ in laws], sizes, 2)
    with _step.using("numpy"):
        want = _step.dlap_segments(laws, sizes, draws)
    with _step.using("compiled"):
        for err in (2.0**-52, -(2.0**-52), 2.0**-50, -(2.0**-50)):
            assert np.array_equal(_step.dlap_segments(laws, sizes, draws, libm_error=err), want)
        gross = _step.dlap_segments(laws, sizes, draws, libm_error=1e-3)
    assert not np.array_equal(gross, want)


def _fine_laws(g: np.random.Generator, chunks: int, count: int) -> list[_dlap.Law]:
    """Fresh and tightening laws of a fine grid whose geometric takes ``chunks`` digits."""
    out: list[_dlap.Law] = []
    while len(out) < count:
        a = Fraction(float(2.0 ** -g.uniform(21.0, 48.0)))
        up = None if g.random() < 0.3 else a * 2 + Fraction(float(g.uniform(0.0, 1e-4)))
        law = _dlap.Law(a, up, None)
        if len(law.plans[0].chunks) == chunks:
            out.append(law)
    return out


@needs_compiled
@pytest.mark.parametrize("chunks", [1, 2])
def test_a_fine_grids_laws_in_one_pass_equal_the_reference_one_by_one(chunks: int) -> None:
    """Each segment's integers are :func:`_dlap.sample_into`'s for it alone, with the float
    pass and with every coordinate forced through the exact path."""
    g = np.random.default_rng(9 + chunks)
    laws = _fine_laws(g, chunks, 40)
    sizes = [int(n) for n in g.integers(1, 12, len(laws))]
    slots = _dlap.slots(laws[0])
    draws = _step.draws([g.bytes(32) for _ in laws], sizes, slots)
    with _step.using("compiled"):
        got = _step.dlap_plans(laws, sizes, draws)
        forced = _step.dlap_plans(laws[:6], sizes[:6], _part(draws, 6), margin=1.0, eta=1.0)
    assert got is not None and forced is not None
    at = 0
    for i, (law, n) in enumerate(zip(laws, sizes, strict=True)):
        alone = np.empty(n, np.int64)
        _dlap.sample_into(alone, np.zeros(n, np.int64), None, law, _part(draws, i, i + 1))
        assert np.array_equal(got[at : at + n], alone), i
        if i < 6:
            assert np.array_equal(forced[at : at + n], alone), i
        at += n
    with _step.using("numpy"):
        assert _step.dlap_plans(laws, sizes, draws) is None  # the chain goes step by step


def _part(draws: Draws, start: int, stop: int | None = None) -> Draws:
    """Segments ``start`` to ``stop`` of joined draws, as draws of their own."""
    if stop is None:
        start, stop = 0, start
    segs = draws._segments[start:stop]
    first = sum(n for _, n in draws._segments[:start])
    cols = slice(first, first + sum(n for _, n in segs))
    return Draws.from_words(list(segs), np.ascontiguousarray(draws.words[:, cols]))


@needs_compiled
def test_forcing_the_exact_path_changes_no_decision_on_either_path() -> None:
    g = np.random.default_rng(4)
    laws = _laws(g, 12)
    sizes = [int(n) for n in g.integers(1, 9, len(laws))]
    draws = _step.draws([g.bytes(32) for _ in laws], sizes, 2)
    fast, fast_ref = _segments(laws, sizes, draws)
    forced, forced_ref = _segments(laws, sizes, draws, margin=1.0, eta=1.0)
    assert np.array_equal(fast, fast_ref)
    assert np.array_equal(forced, fast) and np.array_equal(forced_ref, fast)


@needs_compiled
def test_uniforms_on_a_threshold_go_to_the_exact_path_on_both() -> None:
    """Words placed on the part thresholds and on the geometric's integer boundaries: the
    float pass cannot decide them, and both implementations hand them to the same exact
    path (extension words read)."""
    law = _dlap.Law(Fraction(0.75), Fraction(2.0), None)
    cst = _dlap.float_constants(law)
    total = 2 * cst.k_l + cst.k_0
    on_part = [int(c / total * 2.0**64) for c in (cst.k_l, cst.k_l + cst.k_0)]
    s = float(law.s_q)
    on_geo = [int(-math.expm1(-s * k) * 2.0**64) for k in (1, 2, 5)]
    w1 = np.array([*on_part, *on_part, 2**63, 2**62, 2**63], dtype=np.uint64)
    w2 = np.array([2**60, 2**61, 2**62, 2**63, *on_geo], dtype=np.uint64)
    sizes = [2, 2, 3]
    keys = [bytes([i]) * 32 for i in range(3)]
    draws = Draws.from_words(list(zip(keys, sizes, strict=True)), np.stack([w1, w2]))
    laws = [law] * 3
    with _step.using("numpy"):
        ref = _step.dlap_segments(laws, sizes, draws)
    from market import _cnoise

    consts = struct.pack("=4d", cst.k_l, cst.k_l + cst.k_0, total, cst.inv_s_q) * 3
    _, undecided = _cnoise.dlap_segments(draws.words, consts, sizes, _dlap.MARGIN, _dlap.ETA)
    assert set(undecided) >= {0, 1, 2, 3}, undecided  # every straddling part uniform
    got, want = _segments(laws, sizes, draws)
    assert np.array_equal(got, want) and np.array_equal(got, ref)


@needs_compiled
def test_compiled_normals_bound_the_same_ideal_normals_as_the_reference() -> None:
    """libm's log, sqrt and cos are not numpy's: the floats may differ in their last bits,
    but each bound must hold the ideal normal, so the two enclosures overlap, and be as tight
    as the reference's. Words of 0 (U1 = 0) and near 2^64 (U1 rounding to 1) go to the exact
    path on both."""
    g = np.random.default_rng(6)
    keys = [g.bytes(32) for _ in range(40)]
    draws = _step.draws(keys, [250] * len(keys), 2)
    words = draws.words.copy()
    words[0, :3] = [0, 2**64 - 1, 2**64 - 2**9]
    draws = Draws.from_words([(k, 250) for k in keys], words)
    with _step.using("compiled"):
        got = _step.normals(draws)
    want = _normal.normals(draws)
    bad = ~np.isfinite(want.err)
    assert bad[:2].all() and np.array_equal(bad, ~np.isfinite(got.err))
    assert np.all(got.z[bad] == 0.0)
    ok = ~bad
    assert np.all(np.abs(got.z[ok] - want.z[ok]) <= got.err[ok] + want.err[ok])
    assert np.allclose(got.err[ok], want.err[ok], rtol=1e-6, atol=0.0)


@needs_compiled
def test_gaussian_steps_equal_the_reference_and_settle_the_same_coordinates() -> None:
    """Random values and terms; values on half-grid points under negligible noise (every
    coordinate undecided, settled exactly); and a value too large for its grid, refused by
    both."""
    g = np.random.default_rng(8)
    n, depth, grid = 64, 3, -10
    draws = _step.draws([g.bytes(32) for _ in range(depth)], [n] * depth, 2)
    cases = [
        (g.normal(0.0, 100.0, n), [0.7, 1e-3, 2.5]),
        (g.normal(0.0, 1e6, n), [3e4, 0.0, 1e-9]),
        ((np.arange(n) - n / 2 + 0.5) * 2.0**grid, [2.0**-80] * depth),
    ]
    for base, coefs in cases:
        outs, settled = [], []
        for backend in ("compiled", "numpy"):
            asked: list[int] = []

            def settle(i: int, asked: list[int] = asked) -> int:
                asked.append(i)
                return -(10**9) - i

            with _step.using(backend):
                outs.append(_step.gaussian_step(draws, coefs, base, grid, settle))
            settled.append(sorted(asked))
        assert np.array_equal(outs[0], outs[1]) and settled[0] == settled[1]
    assert settled[0] == list(range(n))  # the half-grid case: nothing decided in floats
    for backend in ("compiled", "numpy"):
        with _step.using(backend), pytest.raises(OverflowError, match="too large"):
            _step.gaussian_step(draws, [1.0] * depth, np.full(n, 2.0**70), grid, lambda i: 0)


@pytest.mark.parametrize("backend", BOTH)
def test_gaussian_releases_forced_through_the_exact_path_are_the_same(backend: str) -> None:
    """Every coordinate of a Gaussian step settled in interval arithmetic gives the integers
    the float pass of either step decides."""
    chain = ReleaseChain(Gaussian(1.0), (0.5, 2.0))
    keys = NoiseKeys(bytes(range(32)))
    x = np.linspace(-3.0, 3.0, 6)
    path = chain._paths([("v",)], 0, keys)[0]
    with _step.using(backend):
        parts = [_step.normals(_step.draws([t.key], [6], 2)) for t in path]
        y = chain.release([chain.open(x)], 0, [("v",)], keys)[0]
    h = _normal.Hidden(np.zeros(6), np.zeros(6))
    for t, nz in zip(path, parts, strict=True):
        h = _normal.add(h, t.coefficient(), nz)
    grid = chain.mechanism.grid_exponent(0.5)  # type: ignore[attr-defined]

    def settle(i: int) -> int:
        return _normal.exact_snap(float(x[i]), path, 6, i, grid)

    forced = _normal.snap(x, _normal.Hidden(h.z, np.full(6, np.inf)), grid, settle)
    assert np.array_equal(_normal.snap(x, h, grid, settle), forced)
    assert np.array_equal(np.ldexp(forced.astype(np.float64), grid), y)


def _poisson_laws(g: np.random.Generator, count: int) -> list[_poisson.Poisson]:
    return [
        _poisson.poisson(Fraction(float(g.choice([0.3, 2.5, 40.0, 9000.0])))) for _ in range(count)
    ]


@needs_compiled
def test_poisson_inversions_equal_the_reference_and_the_forced_exact_path() -> None:
    """Thousands of value-steps; words on the table's thresholds; and every coordinate sent to
    the exact path (a table margin of 1) on either step."""
    g = np.random.default_rng(7)
    laws = _poisson_laws(g, 400)
    sizes = [int(n) for n in g.integers(1, 12, len(laws))]
    draws = _step.draws([g.bytes(32) for _ in laws], sizes, 1)
    words = draws.words.copy()
    cdf = laws[0].table.cdf
    on = [int(c * 2.0**64) for c in cdf[len(cdf) // 2 - 2 : len(cdf) // 2 + 2]]
    words[0, : len(on)] = on  # laws[0]'s first coordinates sit on its thresholds
    draws = Draws.from_words(list(draws._segments), words)
    with _step.using("compiled"):
        got = _step.poisson_segments(laws, sizes, draws)
    with _step.using("numpy"):
        want = _step.poisson_segments(laws, sizes, draws)
    assert np.array_equal(got, want)
    forced = []
    for law in laws[:10]:
        copy = _poisson.Poisson(law.mu)
        copy.__dict__["table"] = dataclasses.replace(law.table, margin=1.0)
        forced.append(copy)
    cut = sum(sizes[:10])
    small = Draws.from_words(list(draws._segments[:10]), words[:, :cut].copy())
    for backend in BOTH_NAMES:
        with _step.using(backend):
            assert np.array_equal(_step.poisson_segments(forced, sizes[:10], small), want[:cut])


FAMILIES: list[tuple[Mechanism, tuple[float, ...], bool]] = [
    (Laplace(1.0, dimension=8), tuple(0.25 * (k + 1) for k in range(6)), False),
    (Laplace(1.0, dimension=8), tuple(0.25 * (k + 1) for k in range(6)), True),
    (Laplace(1.0, dimension=8), (1e-6, 1e-3, 0.5), False),  # chunked geometrics
    (Laplace(1.0, dimension=8), (1e-6, 2e-6, 4e-6, 1e-5), False),  # the same chunks: at once
    (Laplace(1.0, dimension=8), (1e-6, 2e-6, 4e-6, 1e-5), True),
    (DiscreteLaplace(3.0), (0.1, 0.5, 1.0, 4.0), False),
    (Poisson(2.0), (0.05, 0.2, 1.0), False),
    (Gaussian(1.0), (0.5, 1.0, 2.0, 8.0), False),
    (Gaussian(2.0), (0.5, 1.0, 2.0), True),
]


def _releases(mech: Mechanism, levels: tuple[float, ...], sealed: bool, seed: int) -> list[Any]:
    """Many values released at random steps in random orders (one call per purchase-like
    group), every release's bytes."""
    g = np.random.default_rng(seed)
    chain = ReleaseChain(mech, levels, sealed=sealed)
    keys = NoiseKeys(g.bytes(32))
    out = []
    for group in range(12):
        n = int(g.integers(1, 9))
        idents = [("s", f"v{group}.{i}", "d" * 64) for i in range(n)]
        values = [
            g.integers(0, 50, 8) if mech.dtype is np.int64 else g.normal(0, 9, 8) for _ in idents
        ]
        if isinstance(mech, Poisson | DiscreteLaplace):
            values = [np.abs(v).astype(np.int64) for v in values]
        states = [
            chain.seal(v, i, keys) if sealed else chain.open(v)
            for v, i in zip(values, idents, strict=True)
        ]
        for k in g.permutation(len(levels))[: int(g.integers(1, len(levels) + 1))]:
            for y in chain.release(states, int(k), idents, keys):
                out.append(y.tobytes())
    return out


@needs_compiled
@pytest.mark.parametrize(("mech", "levels", "sealed"), FAMILIES)
def test_chains_release_the_same_bits_with_either_step(
    mech: Mechanism, levels: tuple[float, ...], sealed: bool
) -> None:
    for seed in range(3):
        with _step.using("compiled"):
            got = _releases(mech, levels, sealed, seed)
        with _step.using("numpy"):
            want = _releases(mech, levels, sealed, seed)
        assert got == want, (mech, seed)


@pytest.mark.parametrize("backend", BOTH)
def test_the_documented_vectors_on_either_step(backend: str) -> None:
    with _step.using(backend):
        assert generate() == documented()
        assert noise_check() == NOISE_CHECK


def _python(code: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


_REPORT = (
    "from market import _step; from market.chain import noise_check, noise_step; "
    "print(_step.BACKEND); print(noise_step()[1]); print(noise_check())"
)


def test_disabled_by_the_environment_the_reference_runs_and_says_so() -> None:
    backend, line, check = _python(_REPORT, {_step.ENV: "numpy"}).splitlines()
    assert backend == "numpy" and check == NOISE_CHECK
    assert line == f"noise step: numpy reference ({_step.ENV}=numpy)"


def test_without_the_extension_the_reference_runs_and_says_why() -> None:
    """An install without a C compiler: the import fails, the market still draws the
    documented noise, and the log line names the cause and the remedy."""
    hide = "import sys; sys.modules['market._cnoise'] = None\n"
    backend, line, check = _python(hide + _REPORT, {}).splitlines()
    assert backend == "numpy" and check == NOISE_CHECK
    assert line.startswith("noise step: numpy reference (market._cnoise is not built")
    assert "C compiler" in line


def test_asking_for_an_unbuilt_or_unknown_step_is_refused() -> None:
    with pytest.raises(ValueError, match="'numpy' or 'compiled'"), _step.using("fast"):
        pass
    if not COMPILED:
        with pytest.raises(RuntimeError, match="unavailable"), _step.using("compiled"):
            pass


@pytest.mark.parametrize("backend", BOTH)
def test_a_worker_is_told_which_step_runs(backend: str) -> None:
    with _step.using(backend):
        compiled, line = noise_step()
    assert compiled == (backend == "compiled")
    assert line.startswith(f"noise step: {'compiled' if compiled else 'numpy reference'}")


def test_identities_that_compare_equal_keep_their_own_keys() -> None:
    """``("v", 1)`` and ``("v", 1.0)`` are equal tuples with different encodings (§1.1): a
    value's step keys must follow the encoding, whatever was released before."""
    chain = ReleaseChain(Laplace(1.0, dimension=2), (0.5, 1.0))
    keys = NoiseKeys(bytes(range(32)))
    got = []
    for ident in (("v", 1), ("v", 1.0), ("v", 1), ("v", "1")):
        st = [chain.open([1.0, 2.0]), chain.open([1.0, 2.0])]
        chain.release(st, 0, [ident, ident], keys)
        got.append(st[0].steps[0].tobytes() + st[0].steps[1].tobytes())
        assert st[0].steps[0].tobytes() == st[1].steps[0].tobytes()
    assert got[0] == got[2] and len({got[0], got[1], got[3]}) == 3
