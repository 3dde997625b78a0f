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
  ``z = Φ⁻¹(1 − m/(d·K))``: a key with a zero count shows up at step ``k`` with probability
  ``m/(d·K)``, so over all ``K`` steps at most ``m`` (``false_keys``) keys with a zero count are
  expected in all of a value's releases together (union bound), whatever the domain.
* **The survival law is the stream's, not the value's.** Which never-released zero count
  exceeds a threshold next depends only on the levels and thresholds, so the survival density
  and the exceedance probability of every step are computed once per chain; a value's state is
  just its exact counts.
* **Noise a pure function of the request.** Step ``s`` of a value draws everything (the walk's
  increments, how many zero counts first exceed, which keys, their walks) from
  ``rngs(DOMAIN, fingerprint, *identity, s)``, and the release at step ``k`` is recomputed from
  step 0: the same bytes whenever, wherever and in whatever order it is asked for; nothing
  cached, nothing to lose.
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
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import _gauss as gauss
from .errors import InvalidLevelError, InvalidValueError, MarketError
from .histogram import (
    exceed_probability,
    first_exceedance,
    graded_cells,
    propagate,
    sample_starts,
)
from .levels import canonical_level, step_of
from .rng import Identity, KeyedRngFactory

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
    "snap",
    "string_key",
    "threshold",
    "z_score",
]

DOMAIN = b"emarket-histogram-v1"
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
        self, value: HistogramValue, k: int, identity: Identity, rngs: KeyedRngFactory
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
        rngs : KeyedRngFactory
            Keyed randomness holding the secret.

        Returns
        -------
        (ndarray of int64, ndarray of float64)
            Keys increasing, read-only.

        Raises
        ------
        TooManyFalseKeysError
            The chain would track more than ``max_false_keys`` zero counts (p < 10⁻³⁰).
        """
        return self.release_steps(value, {k}, identity, rngs)[k]

    def release_steps(
        self, value: HistogramValue, steps: set[int], identity: Identity, rngs: KeyedRngFactory
    ) -> dict[int, HistogramRelease]:
        """:meth:`release` at each of ``steps``, walking the chain once (up to the highest)."""
        if any(not 0 <= k < len(self.levels) for k in steps):
            raise IndexError(f"steps {sorted(steps)} outside a chain of {len(self.levels)} levels")
        out: dict[int, HistogramRelease] = {}
        tracked, counts = value.keys, value.counts
        walk = np.zeros(tracked.size)
        for s in range(max(steps, default=-1) + 1):
            rng = rngs(DOMAIN, self.fingerprint, *identity, s)
            tracked, counts, walk = self._step(self._rounds[s], rng, value, tracked, counts, walk)
            if s in steps:
                out[s] = _above(self._rounds[s], tracked, counts, walk)
        return out

    def _step(
        self,
        r: _Round,
        rng: np.random.Generator,
        value: HistogramValue,
        tracked: NDArray[np.int64],
        counts: NDArray[np.float64],
        walk: NDArray[np.float64],
    ) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
        """One step of :class:`~market.histogram.SparseHistogramRelease`, in its draw order."""
        walk = walk + rng.normal(0.0, r.sd, walk.size)
        untracked = self.domain - tracked.size
        q = int(rng.binomial(untracked, r.p)) if untracked > 0 and r.p > 0 else 0
        if not q:
            return tracked, counts, walk
        if tracked.size - value.keys.size + q > self.max_false_keys:
            raise TooManyFalseKeysError(
                f"the value would show more than {self.max_false_keys} keys with a zero count "
                "(an event of probability below 1e-30); it is not released"
            )
        fresh = _fresh_keys(rng, q, tracked, self.domain)
        if r.grid is None or r.cdf is None:
            starts = np.zeros(q)
        else:
            starts = sample_starts(rng, q, r.grid, r.cdf, r.a, r.sd, r.width)
        tail = gauss.ndtr(-(r.a - starts) / r.sd)
        u = 1.0 - rng.random(q)  # (0, 1]
        steps = -r.sd * gauss.ndtri(u * tail)  # N(0, sd) truncated to starts + step > a
        return (
            np.concatenate([tracked, fresh]),
            np.concatenate([counts, np.zeros(q)]),
            np.concatenate([walk, starts + steps]),
        )


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
        rounds.append(
            _Round(lvl, tau, sd, a, sigma, p, at if kept else None, cdf, width if kept else None)
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


def _above(
    r: _Round, tracked: NDArray[np.int64], counts: NDArray[np.float64], walk: NDArray[np.float64]
) -> HistogramRelease:
    """The keys whose noisy count exceeds the step's threshold, increasing, with the counts
    rounded to the step's public grid (:func:`snap`)."""
    noisy = snap(counts + walk / r.level, r.sigma)  # snapped first: every count shown is > τ
    keep = np.flatnonzero(noisy > r.tau)
    order = keep[np.argsort(tracked[keep], kind="stable")]
    keys, out = tracked[order], noisy[order]
    keys.setflags(write=False)
    out.setflags(write=False)
    return keys, out


SNAP_BITS = 32
"""Released counts are multiples of ``2^(⌊log₂ σ⌋ − SNAP_BITS)``: a billionth of the noise."""


def snap(values: NDArray[np.float64], sigma: float) -> NDArray[np.float64]:
    """Round noisy counts to a public grid far below the noise (``σ·2⁻³²`` or finer).

    A count's noise is drawn by ``normal`` when its key is tracked and by inverting a normal
    tail (``ndtri``) when a zero count is released for the first time: both have the right law
    to ~1e-16, but their low bits differ in structure (an inverted uniform sits on a lattice).
    Rounding every released count to one grid, much coarser than that lattice and much finer
    than the noise, leaves the law alone and the low bits saying nothing of where a key came
    from (post-processing: no privacy cost).

    Parameters
    ----------
    values : ndarray of float64
        Noisy counts.
    sigma : float
        The step's noise standard deviation ``Δ/√(2ρ)``.

    Returns
    -------
    ndarray of float64
    """
    grain = 2.0 ** (math.floor(math.log2(sigma)) - SNAP_BITS)
    # beyond 2**52 grains a double is already a multiple of the grain (and dividing by the grain
    # could overflow to inf): left as it is
    out = np.array(values, dtype=np.float64)
    small = np.abs(out) < 2.0**52 * grain
    out[small] = np.round(out[small] / grain) * grain
    return out


def _fresh_keys(
    rng: np.random.Generator, q: int, tracked: NDArray[np.int64], domain: int
) -> NDArray[np.int64]:
    """``q`` distinct uniformly random keys of ``[0, domain)`` outside ``tracked`` (rejection)."""
    known = set(tracked.tolist())
    out: list[int] = []
    while len(out) < q:
        for j in rng.integers(0, domain, size=2 * (q - len(out)) + 8).tolist():
            if j not in known:
                known.add(j)
                out.append(j)
                if len(out) == q:
                    break
    return np.asarray(out, dtype=np.int64)


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
    rngs = KeyedRngFactory(_CHECK_SECRET)
    chain = HistogramChain((0.25, 1.0, 4.0), sensitivity=1.0, domain=1000, false_keys=60.0)
    value = chain.value(np.arange(0, 640, 10), np.linspace(-2.0, 40.0, 64))
    h = hashlib.sha256(DOMAIN)
    steps = chain.release_steps(value, {0, 1, 2}, ("check",), rngs)
    for k, (keys, counts) in sorted(steps.items()):
        h.update(struct.pack("<II", k, keys.size) + keys.tobytes() + counts.tobytes())
    return h.hexdigest()
