"""Histogram values on a release chain: sparse count maps over huge domains, noise keyed by value.

A histogram value is a sparse map ``key → count`` over a domain of ``d`` keys (``d`` up to 2⁶²:
string keys are mapped into it by :func:`string_key`). It is sold at the levels
``ρ_0 < ρ_1 < … < ρ_{K−1}`` (zCDP) of one lossless Gaussian chain, thresholded: the release at
step ``k`` is every key whose noisy count ``H_j + W_j/ρ_k`` exceeds ``τ_k``, with that noisy
count, where ``W`` is the Brownian walk of :mod:`market.histogram` (``Var W_k = Δ²ρ_k/2``, so
the noise of a count at step ``k`` is ``N(0, Δ²/(2ρ_k))``). That is Andersson et al.'s
Algorithm 3 on the whole domain, computed by the exact sparse algorithm of
:class:`~market.histogram.SparseHistogramRelease` in ``O(k + c + G)`` per step.

What makes it a chain the market can sell:

* **Thresholds fixed by the seller's tolerance for false keys.** ``τ_k = z·Δ/√(2ρ_k)`` with
  ``z`` the least multiple of 2⁻³² with ``Φ(−z) ≤ m/(d·K)`` (:func:`z_score`): a key with a zero
  count shows up at step ``k`` with probability at most ``m/(d·K)``, so over all ``K`` steps at
  most ``m`` (``false_keys``) keys with a zero count are expected in all of a value's releases
  together (union bound), whatever the domain.
* **The survival law is the stream's, not the value's.** Which never-released zero count
  exceeds a threshold next depends only on the levels and thresholds, so the survival density
  and the exceedance probability of every step are computed once per chain, from ``+ − × ÷ √``
  only (:mod:`market._gauss`): the same doubles on every platform. A value's state is just its
  exact counts.
* **Noise a pure function of the request.** Step ``s`` of a value reads the draws of the request
  keys ``(DOMAIN, fingerprint, *identity, s, part…)`` and every outcome (the walk's increments,
  how many zero counts first exceed, which keys, where their walks start, the counts on the
  release grid) is the exact outcome of its ideal uniforms (:mod:`market._histogram_draws`,
  ``docs/protocol.md`` §1.9); the release at step ``k`` is recomputed from step 0: the same bytes
  whenever, wherever, on whatever machine and in whatever order it is asked for; nothing cached,
  nothing to lose.
* **Bounded.** At most ``ceil(2m) + 64`` zero counts are ever tracked; more happens with
  probability below 10⁻³⁰ and is refused rather than truncated (truncating would change the law).

The releases at all steps are post-processing of the unthresholded Brownian path, whose joint
law is that of the lossless Gaussian process: a coalition holding several steps learns only what
its most accurate step's ρ allows. The survival density lives on a grid of ``grid`` cells, graded
to be narrowest at the threshold, so the values of zero counts released for the first time follow
its cell-wise approximation of the exact law (``tests/market/test_histogram_chain.py`` compares it
with the dense algorithm and with the exact law). The chance that a zero count first shows at each
step is checked against the exact law (:func:`~market.histogram.first_exceedance`, no grid) when
the chain is built: within :data:`ACCURACY` (relative), on twice the cells if need be, or the
levels are refused.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import struct
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import _gauss as gauss
from ._draws import Draws
from ._histogram_draws import Cell, Part, Start, binomial, fresh_keys, new_start, pick_cell, settle
from ._normal import SLOTS, Hidden, Term, add, grid_exponent, normals, snap
from .errors import InvalidLevelError, InvalidValueError, MarketError
from .histogram import (
    exceed_probability,
    first_exceedance,
    graded_cells,
    propagate,
)
from .levels import canonical_level, step_of
from .rng import Identity, KeyedRngFactory, NoiseKeys, identity_bytes

__all__ = [
    "ACCURACY",
    "DOMAIN",
    "GRID",
    "MAX_DOMAIN",
    "MAX_FALSE_KEYS",
    "MAX_LEVELS",
    "MIN_LEVEL_RATIO",
    "HistogramChain",
    "HistogramRelease",
    "HistogramValue",
    "TooManyFalseKeysError",
    "noise_check_histogram",
    "string_key",
    "threshold",
    "z_score",
]

DOMAIN = b"emarket-histogram-v2"
"""Domain separation of the histogram chain's keyed randomness."""
GRID = 512
"""Cells of the survival density (the stream's, computed once per chain, and on half as many
cells for the Richardson step); twice as many where that is not within :data:`ACCURACY`."""
ACCURACY = 2.5e-3
"""How far (relative) the chance that a never-released zero count first shows at a step may be
from the exact value (:func:`~market.histogram.first_exceedance`): checked for every step when a
chain is built, which refines its grid or refuses the levels otherwise. Half the 0.5 % the
documentation states; the worst registration accepted measures 0.14 %."""
MAX_DOMAIN = 2**62
"""Largest domain: keys are below 2⁶² (string keys are hashed into it)."""
MAX_LEVELS = 16
"""Most levels of one chain: each is a step of the survival law built with it."""
MIN_LEVEL_RATIO = 1.01
"""Consecutive levels at least 1 % apart: at a 1e-5 gap the survival law's cells are far wider
than a step's boundary layer (zero counts first shown 1.3–1.5× too often, measured)."""
MAX_FALSE_KEYS = 1000.0
"""Most false keys a seller may tolerate per value (the expected number, over all steps)."""
_KEY_LABEL = b"emarket-histogram-key-v1\x00"

HistogramRelease = tuple[NDArray[np.int64], NDArray[np.float64]]
"""(keys, noisy counts) above a step's threshold, keys increasing."""


class TooManyFalseKeysError(MarketError):
    """A value's chain would track more zero counts than its bound (probability < 10⁻³⁰)."""


def threshold(
    level: float, sensitivity: float, domain: int, false_keys: float, steps: int
) -> float:
    """τ of a step: ``z·Δ/√(2ρ)`` with ``z`` the least multiple of ``2⁻³²`` with ``Φ(−z) ≤
    m/(d·K)`` (:func:`z_score`), so a zero count exceeds it with probability at most ``m/(d·K)``.

    Public (a function of the registration), so quotes and releases state it exactly.

    Parameters
    ----------
    level : float
        The step's zCDP level ρ (canonical).
    sensitivity : float
        ℓ2 sensitivity Δ.
    domain : int
        Number of keys ``d``.
    false_keys : float
        ``m``, the expected number of zero counts shown over all steps.
    steps : int
        ``K``, the number of levels of the chain.

    Returns
    -------
    float
    """
    return z_score(false_keys / (domain * steps)) * sensitivity / math.sqrt(2.0 * level)


Z_BITS = 32
"""``z`` is a multiple of ``2⁻³²``: the least one whose upper tail is at most the target."""


def z_score(p: float) -> float:
    """The least multiple ``z`` of ``2⁻³²`` with ``Φ(−z) ≤ p`` (``p < 1/2``; ``∞`` for ``p = 0``),
    by bisection
    on the integers with :func:`market._gauss.ndtr`: the same double on every platform, and a
    tail no larger than ``p`` (up to ``Φ``'s 10⁻¹³ relative error), so the false keys stay
    within the seller's bound.

    Raises
    ------
    InvalidValueError
        ``p`` is 1/2 or more.
    """
    if p <= 0.0:
        return math.inf  # the chain refuses an infinite threshold, saying to raise false_keys
    if not p < 0.5:
        raise InvalidValueError(f"a tail probability must be below 1/2, got {p!r}")
    lo, hi = 0, 40 << Z_BITS  # Φ(−0) = 1/2 > p ≥ Φ(−40)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if float(gauss.ndtr(-math.ldexp(mid, -Z_BITS))) <= p:
            hi = mid
        else:
            lo = mid
    return math.ldexp(hi, -Z_BITS)


def string_key(text: str) -> int:
    """The public key of a string in a histogram over strings: 62 bits of the SHA-256 of its
    Unicode NFC form.

    Public and fixed, so a buyer maps the keys of a release back to the strings it knows. The
    string itself is never released: showing it only for keys that are in the data would tell
    those apart from the keys with a zero count that the noise lets through. The text is put in
    Normalization Form C first: "Zürich" typed on one system and read from a file name on
    another (decomposed, ``u`` + U+0308) are one key to the seller, the buyer and the market,
    so a buyer names every key in the form it has at hand.

    Raises
    ------
    UnicodeEncodeError
        ``text`` holds a lone surrogate, which no UTF-8 text does.

    Examples
    --------
    >>> string_key("berlin") == string_key("berlin") != string_key("Berlin")
    True
    >>> string_key("Z\u00fcrich") == string_key("Zu\u0308rich")
    True
    """
    nfc = unicodedata.normalize("NFC", text)
    digest = hashlib.sha256(_KEY_LABEL + nfc.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 2


@dataclass(frozen=True, slots=True)
class HistogramValue:
    """One histogram's exact counts (read-only); build it with :meth:`HistogramChain.value`.

    Attributes
    ----------
    keys : ndarray of int64
        Increasing and distinct.
    counts : ndarray of float64
        Finite, one per key.
    """

    keys: NDArray[np.int64]
    counts: NDArray[np.float64]

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.counts.nbytes)

    def digest(self) -> str:
        """SHA-256 of keys and counts, as stored (what makes a resend identical)."""
        h = hashlib.sha256(struct.pack("<Q", self.keys.size))
        h.update(self.keys.astype("<i8").tobytes())
        h.update(self.counts.astype("<f8").tobytes())
        return h.hexdigest()

    def equals(self, other: HistogramValue) -> bool:
        """Bitwise equality."""
        return bool(
            self.keys.tobytes() == other.keys.tobytes()
            and self.counts.tobytes() == other.counts.tobytes()
        )


@dataclass(frozen=True)
class _Round:
    level: float
    exact_level: Fraction  # rat(ρ)
    var: Fraction  # the walk's increment variance into this step, exactly: Δ²(ρ − ρ_prev)/2
    grid_exp: int  # releases are integers times 2^grid_exp (the Gaussian's grid at this level)
    tau: float
    sd: float  # of the walk's increment into this step
    a: float  # ρ·τ: a zero count is released at this step iff its walk exceeds it
    sigma: float  # the noise of a count at this step, Δ/√(2ρ)
    p: float  # P(a never-released zero count first exceeds at this step)
    grid: NDArray[np.float64] | None  # cells of S_{s−1} of those that do (None: S = 0)
    cdf: NDArray[np.float64] | None
    width: NDArray[np.float64] | None  # of the cells of ``grid``


@dataclass(frozen=True)
class HistogramChain:
    """The steps a histogram stream sells, with their thresholds and survival law.

    Parameters
    ----------
    levels : sequence of float
        The zCDP levels ρ for sale, strictly increasing.
    sensitivity : float
        ℓ2 sensitivity Δ of a histogram (1 when one person changes one count by one).
    domain : int
        Number of keys ``d`` (keys are ``0 … d−1``), at most 2⁶².
    false_keys : float
        ``m``: the expected number of keys with a zero count in all of a value's releases
        together (0 < m ≤ 1000, and below ``d·K/2``).
    grid : int, default GRID
        Cells of the survival density (graded, :func:`~market.histogram.graded_cells`); twice
        as many are used where these are not within :data:`ACCURACY` of the exact law.

    Attributes
    ----------
    cells : int
        The cells the survival density lives on: ``grid`` or ``2·grid``.
    survival_error : float
        The largest relative difference, over the steps, between the chance that a zero count
        first shows at the step as the chain samples it and the exact chance (at most
        :data:`ACCURACY`).

    Raises
    ------
    InvalidValueError, InvalidLevelError
        Parameters out of range; InvalidLevelError also for levels whose survival law the
        grid cannot hold within :data:`ACCURACY` (none the sweep of
        ``tests/market/test_histogram_chain.py`` found).
    """

    levels: tuple[float, ...]
    sensitivity: float
    domain: int
    false_keys: float
    grid: int = GRID
    thresholds: tuple[float, ...] = field(init=False)
    max_false_keys: int = field(init=False)
    cells: int = field(init=False)
    survival_error: float = field(init=False, compare=False)
    fingerprint: bytes = field(init=False, repr=False, compare=False)
    _rounds: tuple[_Round, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lv = tuple(canonical_level(x, name="rho") for x in self.levels)
        if not lv or any(b <= a for a, b in itertools.pairwise(lv)):
            raise InvalidLevelError(f"levels must be strictly increasing, got {lv}")
        if not (math.isfinite(self.sensitivity) and self.sensitivity > 0):
            raise InvalidValueError(f"sensitivity must be positive, got {self.sensitivity!r}")
        if not 1 <= self.domain <= MAX_DOMAIN:
            raise InvalidValueError(f"domain must be 1 … 2**62 keys, got {self.domain}")
        if not 16 <= self.grid <= 4096:
            raise InvalidValueError(f"grid must be 16 … 4096 cells, got {self.grid}")
        m = float(self.false_keys)
        if len(lv) > MAX_LEVELS:
            raise InvalidLevelError(f"a histogram chain has at most {MAX_LEVELS} levels")
        if any(b < MIN_LEVEL_RATIO * a for a, b in itertools.pairwise(lv)):
            raise InvalidLevelError(
                f"consecutive levels of a histogram chain must be at least {MIN_LEVEL_RATIO:g}× "
                f"apart, got {lv}: closer levels move the walk by far less than a cell of the "
                "survival law, which then mis-states when a zero count first shows"
            )
        if not 0 < m <= MAX_FALSE_KEYS or m >= self.domain * len(lv) / 2:
            raise InvalidValueError(
                f"false_keys must be in (0, {MAX_FALSE_KEYS:g}] and below half the domain "
                f"times the levels ({self.domain} × {len(lv)} / 2), got {m:g}"
            )
        taus = tuple(threshold(x, self.sensitivity, self.domain, m, len(lv)) for x in lv)
        if not all(math.isfinite(t) and t > 0 for t in taus):
            raise InvalidValueError(
                f"false_keys {m:g} over {self.domain} keys and {len(lv)} levels gives thresholds "
                f"{taus}: raise false_keys"
            )
        object.__setattr__(self, "levels", lv)
        object.__setattr__(self, "thresholds", taus)
        object.__setattr__(self, "max_false_keys", math.ceil(2 * m) + 64)
        rounds, cells, error = self._survival()
        object.__setattr__(self, "_rounds", rounds)
        object.__setattr__(self, "cells", cells)
        object.__setattr__(self, "survival_error", error)
        # the grid is part of the law a value's noise follows: another grid, other noise
        desc = struct.pack(f"<dQdI{len(lv)}d", self.sensitivity, self.domain, m, self.grid, *lv)
        desc += b"graded-v1" + struct.pack("<I", cells)
        object.__setattr__(self, "fingerprint", hashlib.sha256(DOMAIN + desc).digest()[:16])

    def _survival(self) -> tuple[tuple[_Round, ...], int, float]:
        """Each step's exceedance probability and the law of ``S_{s−1}`` of the zero counts
        that first exceed at it (the same for every value of the stream), the cells used, and
        how far the first-appearance probabilities are from the exact ones.

        A density uniform within cells makes the probabilities wrong by O(h²) (up to 3 % on
        512 graded cells for 16 levels 1.01× apart at 2⁶² keys); the same law on half the
        cells is wrong by four times as much, so ``(4·p_fine − p_coarse)/3`` cancels the
        leading term (Richardson). What is left is measured, step by step, against the exact
        law (:func:`~market.histogram.first_exceedance`, no grid): beyond :data:`ACCURACY`,
        twice the cells (the coarse law is the one just computed); still beyond it, the levels
        are refused. (On equal cells, as before, the Richardson step was far from its
        asymptotic regime at the threshold: 24 % too low at the 16th step of levels 1.01×
        apart, 2⁶² keys.) The starts are drawn from the fine grid.
        """
        sd_s = [self.sensitivity * math.sqrt(x / 2.0) for x in self.levels]
        bounds = [x * t / sd for x, t, sd in zip(self.levels, self.thresholds, sd_s, strict=True)]
        exact = first_exceedance(self.levels, bounds)
        coarse = _survival_law(self.levels, self.thresholds, self.sensitivity, self.grid // 2)
        error = math.inf
        for cells in (self.grid, 2 * self.grid):
            fine = _survival_law(self.levels, self.thresholds, self.sensitivity, cells)
            rounds = _richardson(fine, coarse)
            error = float(np.max(np.abs(_first_appearance(rounds) / exact - 1.0)))
            if error <= ACCURACY:
                return rounds, cells, error
            coarse = fine
        raise InvalidLevelError(
            f"levels {self.levels} over {self.domain} keys with false_keys {self.false_keys:g}: "
            f"the survival law of zero counts on {2 * self.grid} cells is {error:.2%} from the "
            f"exact law (at most {ACCURACY:.2%}); space consecutive levels further apart, "
            "use fewer of them, or raise false_keys"
        )

    def __len__(self) -> int:
        return len(self.levels)

    def first_appearance(self) -> NDArray[np.float64]:
        """The chance that a key with a zero count is first shown at each step, as the chain
        samples it (``p_k·∏_{j<k}(1 − p_j)``, ``p_k`` the chance a never-shown zero count
        exceeds at step ``k``): within :data:`ACCURACY` of the exact law, relative."""
        return _first_appearance(self._rounds)

    def step_of(self, level: float) -> int:
        """The step at which ``level`` is sold.

        Raises
        ------
        LevelNotForSaleError
            ``level`` is not one of the chain's levels.
        """
        return step_of(self.levels, level, unit="rho")

    def value(self, keys: Any, counts: Any) -> HistogramValue:
        """Validate a histogram: distinct keys in ``[0, d)``, finite counts; sorted by key.

        Raises
        ------
        InvalidValueError
            Saying which rule the histogram breaks.
        """
        k = np.asarray(keys, dtype=np.int64)
        c = np.asarray(counts, dtype=np.float64)
        if k.ndim != 1 or k.shape != c.shape:
            raise InvalidValueError("keys and counts must be two lists of the same length")
        if k.size and (int(k.min()) < 0 or int(k.max()) >= self.domain):
            raise InvalidValueError(f"keys must lie in [0, {self.domain})")
        if not np.isfinite(c).all():
            raise InvalidValueError("counts must be finite numbers")
        keep = c != 0  # a key at count 0 is a key not listed (also -0.0): one spelling, one digest
        k, c = k[keep], c[keep]
        order = np.argsort(k, kind="stable")
        k, c = k[order], c[order]
        if k.size > 1 and bool((k[1:] == k[:-1]).any()):
            raise InvalidValueError("a key appears twice in one histogram")
        k.setflags(write=False)
        c.setflags(write=False)
        return HistogramValue(k, c)

    def release(
        self, value: HistogramValue, k: int, identity: Identity, keys: NoiseKeys | KeyedRngFactory
    ) -> HistogramRelease:
        """Step ``k`` of ``value``: the keys above ``τ_k`` and their noisy counts.

        Parameters
        ----------
        value : HistogramValue
            The exact counts.
        k : int
            The step, ``0 <= k < len(self)``.
        identity : tuple
            What the value's randomness is keyed by (stream, value id, digest of its counts).
        keys : NoiseKeys or KeyedRngFactory
            The request keys of the market's noise secret (a factory's, for callers that hold
            one).

        Returns
        -------
        (ndarray of int64, ndarray of float64)
            Keys increasing, read-only; counts on the step's grid (:func:`grid_exponent`).

        Raises
        ------
        TooManyFalseKeysError
            The chain would track more than ``max_false_keys`` zero counts (p < 10⁻³⁰).
        """
        return self.release_steps(value, {k}, identity, keys)[k]

    def release_steps(
        self,
        value: HistogramValue,
        steps: set[int],
        identity: Identity,
        keys: NoiseKeys | KeyedRngFactory,
    ) -> dict[int, HistogramRelease]:
        """:meth:`release` at each of ``steps``, walking the chain once (up to the highest)."""
        if any(not 0 <= k < len(self.levels) for k in steps):
            raise IndexError(f"steps {sorted(steps)} outside a chain of {len(self.levels)} levels")
        noise = keys.keys if isinstance(keys, KeyedRngFactory) else keys
        prefix = identity_bytes(DOMAIN, self.fingerprint, *identity)
        walk = _Walk(value)
        out: dict[int, HistogramRelease] = {}
        for s in range(max(steps, default=-1) + 1):
            r = self._rounds[s]

            def key(*part: str | int, _s: int = s) -> bytes:
                return noise.of(prefix + identity_bytes(_s, *part))

            self._step(r, s, key, walk)
            if s in steps:
                out[s] = walk.release(r, s)
        return out

    def _step(self, r: _Round, s: int, key: Callable[..., bytes], walk: _Walk) -> None:
        """Step ``s``: the tracked keys' increments, then the zero counts that first exceed."""
        walk.advance(Part(key("walk"), len(walk.tracked), r.var))
        n0 = walk.value.keys.size
        limit = self.max_false_keys - (len(walk.tracked) - n0)
        q = binomial(self.domain - len(walk.tracked), r.p, key("count"), limit)
        if q > limit:
            raise TooManyFalseKeysError(
                f"the value would show more than {self.max_false_keys} keys with a zero count "
                "(an event of probability below 1e-30); it is not released"
            )
        if not q:
            return
        fresh = fresh_keys(key("keys"), q, walk.known, self.domain)
        cells = Draws(key("cell"), q, 1) if r.cdf is not None else None
        cdf = r.cdf.tolist() if r.cdf is not None else []
        for e, k in enumerate(fresh):
            cell = Cell(Fraction(0), Fraction(0))
            if cells is not None and r.grid is not None and r.width is not None:
                c = pick_cell(cells, e, cdf)
                width = Fraction(float(r.width[c]))
                cell = Cell(Fraction(float(r.grid[c])) + width / 2, width)

            def trial(t: int, _e: int = e) -> bytes:
                return key("start", _e, t)

            walk.add(k, new_start(trial, s, r.a, r.var, r.sd, cell))


@dataclass
class _Walk:
    """The tracked keys of a value during a release: its own, then the zero counts in the order
    they first exceeded, with the draws of their walks."""

    value: HistogramValue
    tracked: list[int] = field(init=False)
    known: set[int] = field(init=False)
    starts: dict[int, Start] = field(init=False, default_factory=dict)
    parts: list[Part] = field(init=False, default_factory=list)
    _w: Hidden = field(init=False)
    _pending: list[tuple[float, float]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.tracked = self.value.keys.tolist()
        self.known = set(self.tracked)
        n0 = len(self.tracked)
        self._w = Hidden(np.zeros(n0), np.zeros(n0))

    def advance(self, part: Part) -> None:
        """A step's increments ``σ·N`` on the keys tracked when it begins (the float pass of
        the walk ``W``, with its error bounds)."""
        self.parts.append(part)
        nz = normals(Draws(part.key, part.n, SLOTS))
        coef = Term(part.key, Fraction(1), part.var).coefficient()
        w = self._walk()
        seg = add(Hidden(w.z[: part.n], w.err[: part.n]), coef, nz)
        w.z[: part.n], w.err[: part.n] = seg.z, seg.err

    def add(self, key: int, start: Start) -> None:
        """A zero count that first exceeded: its walk is its start ``S``."""
        self.starts[len(self.tracked)] = start
        self.tracked.append(key)
        self.known.add(key)
        self._pending.append(start.float_bounds())

    def _walk(self) -> Hidden:
        """The float pass of the walk, with the starts added since it was last read."""
        if self._pending:
            mid, rad = zip(*self._pending, strict=True)
            self._w = Hidden(np.append(self._w.z, mid), np.append(self._w.err, rad))
            self._pending.clear()
        return self._w

    def release(self, r: _Round, k: int) -> HistogramRelease:
        """The keys whose count on the step's grid exceeds ``τ_k``, increasing, with it."""
        ints = self._counts(r, k)
        bar = math.floor(Fraction(r.tau) * Fraction(2) ** -r.grid_exp)  # shown iff n > bar
        tracked = np.array(self.tracked, dtype=np.int64)
        if isinstance(ints, np.ndarray) and abs(bar) < 2**62:
            n = ints
            at = np.flatnonzero(n > bar)
            at = at[np.argsort(tracked[at], kind="stable")]
            keys = tracked[at]
            # int64 → double rounds to nearest, ties to even; the power of two is exact
            out = np.ldexp(n[at].astype(np.float64), r.grid_exp)
        else:  # a count beyond 2⁶² grid steps: Python integers
            shown = sorted((key, n) for key, n in zip(self.tracked, ints, strict=True) if n > bar)
            keys = np.array([key for key, _ in shown], dtype=np.int64)
            out = np.array([_on_grid(n, r.grid_exp) for _, n in shown], dtype=np.float64)
        keys.setflags(write=False)
        out.setflags(write=False)
        return keys, out

    def _hidden(self, r: _Round) -> Hidden:
        """The float pass of every tracked key's ``W/ρ_k`` with error bounds (the walk as it
        stands after step ``k``)."""
        w = self._walk()
        zero = Hidden(np.zeros(w.z.size), np.zeros(w.z.size))
        return add(zero, float(1 / r.exact_level), w)  # 1/ρ within 2⁻⁵³

    def _counts(self, r: _Round, k: int) -> NDArray[np.int64] | list[int]:
        """Every tracked key's integer on the step's grid: a float pass with error bounds,
        exact where it is unsure (and for counts too large for int64 on the grid)."""
        n0 = self.value.counts.size
        counts = np.concatenate([self.value.counts, np.zeros(len(self.tracked) - n0)])
        h = self._hidden(r)

        def exact(i: int, prec: int = 30) -> int:
            st = self.starts.get(i)
            parts = self.parts[(0 if st is None else st.step + 1) : k + 1]
            c = Fraction(float(counts[i]))
            return settle(c, st, parts, i, r.exact_level, r.grid_exp, prec)

        big = np.abs(counts) >= math.ldexp(1.0, 61 + r.grid_exp)
        if not bool(big.any()):
            return snap(counts, h, r.grid_exp, exact)
        ints: list[int] = [0] * counts.size
        small = np.flatnonzero(~big)
        if small.size:
            got = snap(counts[small], Hidden(h.z[small], h.err[small]), r.grid_exp,
                       lambda m: exact(int(small[m])))  # fmt: skip
            for i, n in zip(small.tolist(), got.tolist(), strict=True):
                ints[i] = n
        for i in np.flatnonzero(big).tolist():
            digits = len(str(int(abs(float(counts[i])) * 2.0**-r.grid_exp)))
            ints[i] = exact(i, digits + 30)
        return ints


def _on_grid(n: int, grid_exp: int) -> float:
    """The double nearest ``n·2^e`` (ties to even)."""
    return float(Fraction(n) * Fraction(2) ** grid_exp)


def _survival_law(
    levels: tuple[float, ...],
    thresholds: tuple[float, ...],
    sensitivity: float,
    cells: int,
    graded: bool = True,
) -> list[_Round]:
    """The survival density of a never-released zero count propagated step by step on
    ``cells`` cells (graded by :func:`~market.histogram.graded_cells`, or equal as before),
    with each step's exceedance probability and the weights its starts are drawn from."""
    rounds: list[_Round] = []
    grid: NDArray[np.float64] | None = None
    width: NDArray[np.float64] | None = None
    density: NDArray[np.float64] | None = None
    prev = 0.0
    for lvl, tau in zip(levels, thresholds, strict=True):
        sd = sensitivity * math.sqrt((lvl - prev) / 2.0)
        total_sd = sensitivity * math.sqrt(lvl / 2.0)
        a = lvl * tau
        p, at, weights = exceed_probability(grid, density, a, sd, width)
        cdf = None
        if at is not None and weights is not None and weights.sum() > 0:
            cdf = np.cumsum(weights)
            cdf /= cdf[-1]
        sigma = sensitivity / math.sqrt(2.0 * lvl)
        kept = cdf is not None
        d2 = Fraction(sensitivity) ** 2
        rounds.append(
            _Round(
                lvl,
                Fraction(lvl),
                d2 * (Fraction(lvl) - Fraction(prev)) / 2,
                grid_exponent(d2 / (2 * Fraction(lvl))),
                tau,
                sd,
                a,
                sigma,
                p,
                at if kept else None,
                cdf,
                width if kept else None,
            )
        )
        if graded:
            edges = graded_cells(a, sd, total_sd, cells)
            grid, density = propagate(grid, density, a, sd, total_sd, edges, width)
            width = np.diff(edges)
        else:
            grid, density = propagate(grid, density, a, sd, total_sd, cells)
        prev = lvl
    return rounds


def _richardson(fine: list[_Round], coarse: list[_Round]) -> tuple[_Round, ...]:
    """The fine law with each step's probability extrapolated, ``(4·p_fine − p_coarse)/3``
    (the fine one where that is not positive)."""
    rounds = []
    for f, c in zip(fine, coarse, strict=True):
        p = (4 * f.p - c.p) / 3
        rounds.append(replace(f, p=min(1.0, p if p > 0 else f.p)))
    return tuple(rounds)


def _first_appearance(rounds: tuple[_Round, ...] | list[_Round]) -> NDArray[np.float64]:
    """The chance that a zero count is first shown at each step, as the chain samples it:
    ``p_k·∏_{j<k}(1 − p_j)``."""
    p = np.array([r.p for r in rounds], dtype=np.float64)
    survive = np.concatenate([[1.0], np.cumprod(1.0 - p)[:-1]])
    return np.asarray(p * survive, dtype=np.float64)


_CHECK_SECRET = b"emarket noise check: a public test key, never used for real noise"


def noise_check_histogram() -> str:
    """A known-answer digest of the histogram chain's releases on this platform.

    Every step of a fixed histogram, for a fixed public test key, on a small domain where zero
    counts are released at every step (so the binomial, the fresh keys, the survival grid and
    the truncated increments all take part). A market records it and refuses a platform on
    which it differs: that platform would re-noise released histograms.

    Returns
    -------
    str
        Hex SHA-256 of the keys and counts released at each step.
    """
    rngs = NoiseKeys(_CHECK_SECRET)
    chain = HistogramChain((0.25, 1.0, 4.0), sensitivity=1.0, domain=1000, false_keys=60.0)
    value = chain.value(np.arange(0, 640, 10), np.linspace(-2.0, 40.0, 64))
    h = hashlib.sha256(DOMAIN)
    steps = chain.release_steps(value, {0, 1, 2}, ("check",), rngs)
    for k, (keys, counts) in sorted(steps.items()):
        h.update(struct.pack("<II", k, keys.size) + keys.tobytes() + counts.tobytes())
    return h.hexdigest()
