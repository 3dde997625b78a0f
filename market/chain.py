"""The canonical release chain: noise as a pure function of the request.

A market sells each stream at a fixed, increasing set of levels ``l_0 < l_1 < … < l_{K−1}``
(the seller's steps and the cap, fixed at registration). :class:`ReleaseChain` defines the
release of a value at step ``k`` as one path of the lossless process, computed step by step:

* **open chain** (the exact value is kept): ``y_0`` is a fresh release at ``l_0`` and each
  ``y_k`` is one Markov relaxation of ``y_{k−1}`` towards the exact value (Koufogiannis et al.
  Alg. 1 for Laplace, the Brownian and binomial analogues for Gaussian and Poisson);
* **sealed chain** (Andersson et al. Lemma A.2): ``y_{K−1}`` is a fresh release at the top and
  each ``y_k`` a tightening of ``y_{k+1}``; the exact value is erased once ``y_{K−1}`` exists.

Step ``k`` draws its randomness from ``rngs(domain, chain fingerprint, *identity, k)``, where the
identity names the value (the service uses stream, value id and a digest of the exact numbers).
So the release at a step is a **deterministic function** of the secret behind ``rngs``, the
chain, the value's identity and numbers, and the step: the same bytes whatever was released
before, in whatever order, by whichever process, and whether or not anything was stored.
:class:`ChainState` — the exact value and the steps computed so far — is therefore only a
cache: dropping it costs computation, never privacy. (Different numbers under one identity
must not share noise, or their difference would be revealed exactly: keep a digest of the
numbers in the identity.)

The joint law of ``(y_0, …, y_{K−1})`` is that of the lossless process (each step is the exact
conditional law), so any set of releases is a post-processing of the most accurate one: a
coalition of buyers learns only its best member's step.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import operator
import struct
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .errors import InvalidValueError, SealedStateError
from .levels import canonical_level, step_of
from .mechanisms import Anchor, Mechanism
from .rng import Identity, KeyedRngFactory

__all__ = ["DOMAIN", "ChainState", "ReleaseChain", "noise_check", "noise_check_discrete"]

DOMAIN = b"emarket-chain-v1"
"""Domain separation of the chain's keyed randomness (changing it changes every release)."""

Vector = NDArray[Any]


def _frozen(arr: Vector) -> Vector:
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True)
class ReleaseChain:
    """The levels a stream sells, as one lossless chain.

    Parameters
    ----------
    mechanism : Mechanism
        The noise family; the chain keeps its :meth:`~market.Mechanism.stable` form, whose
        draws never change between versions of this package.
    levels : sequence of float
        The sellable levels, strictly increasing after canonicalisation (at least one).
    sealed : bool, default False
        Chain downward from the top level and keep no exact value (see the module docstring).

    Raises
    ------
    InvalidValueError
        No levels, or levels not strictly increasing.

    Examples
    --------
    >>> from market import Laplace
    >>> from market.rng import KeyedRngFactory
    >>> chain = ReleaseChain(Laplace(), [0.5, 1.0, 2.0])
    >>> rngs = KeyedRngFactory(b"s" * 32)
    >>> a = chain.open([20.1, 19.8])
    >>> y2 = chain.release([a], 2, [("v1",)], rngs)[0]          # computes steps 0, 1, 2
    >>> b = chain.open([20.1, 19.8])                              # nothing cached
    >>> bool((chain.release([b], 2, [("v1",)], rngs)[0] == y2).all())
    True
    """

    mechanism: Mechanism
    levels: tuple[float, ...]
    sealed: bool = False
    fingerprint: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lv = tuple(canonical_level(x) for x in self.levels)
        if not lv or any(b <= a for a, b in itertools.pairwise(lv)):
            raise InvalidValueError(f"chain levels must be strictly increasing, got {lv}")
        object.__setattr__(self, "levels", lv)
        # the chain's noise is a pure function of its key across versions: stable samplers only
        object.__setattr__(self, "mechanism", self.mechanism.stable())
        mech = self.mechanism
        desc = struct.pack(f"<BBd{len(lv)}d", mech.code, int(self.sealed), mech.sensitivity, *lv)
        object.__setattr__(self, "fingerprint", hashlib.sha256(DOMAIN + desc).digest()[:16])

    def __len__(self) -> int:
        return len(self.levels)

    def step_of(self, level: float) -> int:
        """The step at which ``level`` is sold.

        Raises
        ------
        LevelNotForSaleError
            ``level`` is not one of the chain's levels (the message lists them).
        """
        return step_of(self.levels, level, unit=self.mechanism.level_unit)

    # -- states ---------------------------------------------------------------------------
    def open(self, value: Any) -> ChainState:
        """The state of a new value on an open chain: its exact numbers, nothing computed."""
        if self.sealed:
            raise SealedStateError("a sealed chain keeps no exact value: use ReleaseChain.seal")
        return ChainState(_frozen(self.mechanism.validate_value(value)), {})

    def seal(self, value: Any, identity: Identity, rngs: KeyedRngFactory) -> ChainState:
        """The state of a new value on a sealed chain: its top release only (exact erased)."""
        if not self.sealed:
            raise SealedStateError("ReleaseChain.seal needs a chain declared sealed")
        exact = _frozen(self.mechanism.validate_value(value))
        top = len(self.levels) - 1
        y = self.mechanism.conditional(
            self.levels[top], Anchor(math.inf, exact), None, self._rng(rngs, identity, top)
        )
        return ChainState(None, {top: _frozen(y)})

    # -- releasing ------------------------------------------------------------------------
    def release(
        self,
        states: Sequence[ChainState],
        k: int,
        identities: Sequence[Identity],
        rngs: KeyedRngFactory,
    ) -> list[Vector]:
        """Step ``k`` of each value, computing (and caching) the steps it depends on.

        Parameters
        ----------
        states : sequence of ChainState
            The values' states; missing steps are added to them.
        k : int
            The step, ``0 <= k < len(self)``.
        identities : sequence of tuple
            One identity per value: its randomness is keyed by it (see the module docstring).
        rngs : KeyedRngFactory
            Keyed randomness holding the secret.

        Returns
        -------
        list of ndarray
            Read-only releases in the order of ``states``. Values that need the same step share
            one vectorised kernel call; each draws exactly what it would draw alone.
        """
        if not 0 <= k < len(self.levels):
            raise IndexError(f"step {k} outside a chain of {len(self.levels)} levels")
        if len(identities) != len(states):
            raise ValueError(f"{len(states)} states but {len(identities)} identities")
        if not states:
            return []
        if self.sealed:
            self._tighten_to(states, k, identities, rngs)
        else:
            self._relax_to(states, k, identities, rngs)
        return [st.steps[k] for st in states]

    def new_steps(self, state: ChainState, k: int) -> int:
        """How many steps :meth:`release` would compute to give ``state`` step ``k``."""
        if k in state.steps:
            return 0
        if self.sealed:
            return _bottom_above(state, k) - k
        return k - _top_below(state, k)

    def _relax_to(
        self,
        states: Sequence[ChainState],
        k: int,
        identities: Sequence[Identity],
        rngs: KeyedRngFactory,
    ) -> None:
        tops = [_top_below(st, k) for st in states]
        for s in range(min(tops) + 1, k + 1):
            todo = [i for i, t in enumerate(tops) if t < s]
            if not todo:
                continue
            anchors: list[tuple[Anchor, Anchor | None]] = []
            for i in todo:
                exact = states[i].exact
                if exact is None:
                    raise SealedStateError("an open chain state lost its exact value")
                prev = states[i].steps.get(s - 1) if s > 0 else None
                lower = None if prev is None else Anchor(self.levels[s - 1], prev)
                anchors.append((Anchor(math.inf, exact), lower))
            self._sample(states, todo, s, anchors, identities, rngs)

    def _tighten_to(
        self,
        states: Sequence[ChainState],
        k: int,
        identities: Sequence[Identity],
        rngs: KeyedRngFactory,
    ) -> None:
        bottoms = [_bottom_above(st, k) for st in states]
        for s in range(max(bottoms) - 1, k - 1, -1):
            todo = [i for i, b in enumerate(bottoms) if b > s]
            if not todo:
                continue
            anchors: list[tuple[Anchor, Anchor | None]] = [
                (Anchor(self.levels[s + 1], states[i].steps[s + 1]), None) for i in todo
            ]
            self._sample(states, todo, s, anchors, identities, rngs)

    def _sample(
        self,
        states: Sequence[ChainState],
        todo: list[int],
        s: int,
        anchors: list[tuple[Anchor, Anchor | None]],
        identities: Sequence[Identity],
        rngs: KeyedRngFactory,
    ) -> None:
        keyed = [(DOMAIN, self.fingerprint, *identities[i], s) for i in todo]
        out = self.mechanism.conditional_many(self.levels[s], anchors, keyed, rngs)
        for i, y in zip(todo, out, strict=True):
            states[i].steps[s] = _frozen(y)

    def _rng(self, rngs: KeyedRngFactory, identity: Identity, s: int) -> np.random.Generator:
        return rngs(DOMAIN, self.fingerprint, *identity, s)


def _top_below(st: ChainState, k: int) -> int:
    """The highest cached step at or below ``k`` (−1 for none): where relaxation restarts."""
    return st.highest_at_most(k)


def _bottom_above(st: ChainState, k: int) -> int:
    """The lowest cached step at or above ``k``: where tightening restarts."""
    low = st.lowest_at_least(k)
    if low is None:
        raise SealedStateError("a sealed chain state lost its top release")
    return low


class ChainState:
    """What is known of one value's chain: a cache that may be dropped at any time.

    Parameters
    ----------
    exact : ndarray or None
        The exact value (read-only); ``None`` on a sealed chain.
    steps : mapping of int to ndarray, optional
        Steps already computed (read-only vectors).

    Attributes
    ----------
    exact : ndarray or None
    steps : MutableMapping of int to ndarray
        The steps computed so far (read-only vectors). On a sealed chain the top step is the
        value's only root and must be kept (or recomputed from a resend of the exact value).

    Notes
    -----
    A market keeps one of these per retained value, so its size at rest is what a worker's
    memory grows with. :meth:`pack` moves the exact value and the steps into one read-only 2-D
    array (exact first, then the steps in order): separate small vectors in a dict took ~1 kB
    of heap for an exact value and 3 steps of 8 numbers, the packed rows ~0.4 kB. Steps added
    later wait in a small dict until the next :meth:`pack` (appending to the packed rows would
    copy them on every step). The bits never change: vectors of different types are never
    packed together.
    """

    __slots__ = ("_mask", "_new", "_rows", "_x", "_xrow")

    def __init__(self, exact: Vector | None, steps: Mapping[int, Vector] | None = None) -> None:
        self._x = exact  # the exact value, unless it is row 0 of _rows (_xrow)
        self._xrow = False
        self._rows: Vector | None = None
        self._mask = 0  # bit k set: step k is a row of _rows (rows in increasing k)
        self._new: dict[int, Vector] | None = dict(steps) if steps else None

    def __repr__(self) -> str:
        return f"ChainState(exact={self.exact!r}, steps={dict(self.steps.items())!r})"

    @property
    def exact(self) -> Vector | None:
        if self._xrow:
            assert self._rows is not None
            row: Vector = self._rows[0]  # a read-only view
            return row
        return self._x

    @property
    def steps(self) -> _Steps:
        return _Steps(self)

    @steps.setter
    def steps(self, value: Mapping[int, Vector]) -> None:
        self._forget_rows()
        self._new = dict(value) or None

    def _forget_rows(self) -> None:
        """Drop the packed rows, keeping the exact value (copied out: no view keeps them)."""
        if self._xrow and self._rows is not None:
            self._x = _frozen(self._rows[0].copy())
        self._rows, self._mask, self._xrow = None, 0, False

    def highest_at_most(self, k: int) -> int:
        """The highest cached step at or below ``k`` (−1 for none), without walking the steps."""
        packed = self._mask & ((2 << k) - 1) if k >= 0 else 0
        best = packed.bit_length() - 1
        if self._new:
            best = max(best, *(j for j in self._new if j <= k), -1)
        return best

    def lowest_at_least(self, k: int) -> int | None:
        """The lowest cached step at or above ``k`` (``None`` for none)."""
        packed = self._mask >> max(k, 0) << max(k, 0)
        low = (packed & -packed).bit_length() - 1 if packed else None
        if self._new:
            above = [j for j in self._new if j >= k]
            if above:
                low = min(above) if low is None else min(low, *above)
        return low

    def pack(self) -> None:
        """Store the exact value and every step in one read-only 2-D array (the state at rest;
        see Notes)."""
        if not self._new:
            return
        if self._append():
            return
        merged = self._unpacked()
        ids = tuple(sorted(merged))
        if not 0 <= ids[0] <= ids[-1] < 1024:
            return
        vectors = [merged[k] for k in ids]
        exact = self._x
        rows = vectors if exact is None else [exact, *vectors]
        if len({(v.dtype, v.shape) for v in rows}) > 1:  # never converted to a common type:
            rows, exact = vectors, None  # the bits stay as released (exact kept apart)
            if len({(v.dtype, v.shape) for v in rows}) > 1:
                return
        mask = sum(1 << k for k in ids)  # a small int: cached by Python up to 256 (steps 0-7)
        self._rows, self._mask, self._new = _frozen(np.stack(rows)), mask, None
        if exact is not None:
            self._x, self._xrow = None, True

    def _append(self) -> bool:
        """Pack new steps that all follow the packed ones (a relaxation's case) by appending
        their rows, without unpacking; ``False`` when they do not (the general path)."""
        rows, new = self._rows, self._new
        if rows is None or not new:
            return False
        ids = sorted(new)
        if ids[0] <= self._mask.bit_length() - 1 or ids[-1] >= 1024:
            return False
        vectors = [new[k] for k in ids]
        if any(v.dtype != rows.dtype or v.shape != rows.shape[1:] for v in vectors):
            return False
        self._rows = _frozen(np.concatenate([rows, np.stack(vectors)]))
        self._mask |= sum(1 << k for k in ids)
        self._new = None
        return True

    def _unpacked(self) -> dict[int, Vector]:
        """Every step in a dict (packed rows as views), after which nothing is packed."""
        out: dict[int, Vector] = {}
        if self._rows is not None:
            first = 1 if self._xrow else 0
            if self._xrow:  # copied out: a view would keep every old row alive
                self._x = _frozen(self._rows[0].copy())
            out = {k: self._rows[first + j] for j, k in enumerate(_bits(self._mask))}
        out.update(self._new or {})
        self._rows, self._mask, self._xrow, self._new = None, 0, False, (out or None)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes held by the vectors of this state."""
        packed = 0 if self._rows is None else self._rows.nbytes
        new = sum(v.nbytes for v in (self._new or {}).values())
        apart = 0 if self._xrow or self._x is None else self._x.nbytes
        return packed + new + apart

    def trim(self, max_bytes: int) -> None:
        """Drop cached steps until the vectors take at most ``max_bytes`` (roots are kept).

        Keeps the most accurate cached step longest: it is where the next relaxation starts.
        """
        if self.nbytes <= max_bytes:  # the usual case: nothing to walk
            return
        droppable = sorted(self.steps)
        if self.exact is None and droppable:
            droppable = droppable[:-1]  # a sealed chain's top step is its root
        while self.nbytes > max_bytes and droppable:
            del self.steps[droppable.pop(0)]

    def drop_cache(self) -> None:
        """Forget every step that can be recomputed (all of them on an open chain)."""
        if self.exact is not None:
            self.steps.clear()
        elif len(self.steps):
            top = max(self.steps)
            self.steps = {top: self.steps[top]}

    def equals(self, other: ChainState) -> bool:
        """Bitwise equality of the exact value and every cached step."""
        if (self.exact is None) != (other.exact is None) or set(self.steps) != set(other.steps):
            return False
        if (
            self.exact is not None
            and other.exact is not None
            and self.exact.tobytes() != other.exact.tobytes()
        ):
            return False
        return all(self.steps[k].tobytes() == other.steps[k].tobytes() for k in self.steps)


def _bits(mask: int) -> Iterator[int]:
    """The positions of the set bits of ``mask``, increasing (one turn per set bit: a chain
    holds a few steps, often high ones)."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _has(mask: int, k: object) -> bool:
    """Whether step ``k`` (any integer type, as a dict key would match) is a bit of ``mask``."""
    try:
        i = operator.index(k)  # type: ignore[arg-type]
    except TypeError:
        return False
    return 0 <= i < 1024 and bool(mask >> i & 1)


class _Steps(MutableMapping[int, Vector]):
    """The steps of a :class:`ChainState` as a mapping, over its packed rows and new steps."""

    __slots__ = ("_st",)

    def __init__(self, state: ChainState) -> None:
        self._st = state

    def __getitem__(self, k: int) -> Vector:
        st = self._st
        if st._new is not None and k in st._new:
            return st._new[k]
        if st._rows is not None and _has(st._mask, k):
            below = st._mask & ((1 << operator.index(k)) - 1)
            row: Vector = st._rows[st._xrow + below.bit_count()]  # a read-only view of its row
            return row
        raise KeyError(k)

    def __setitem__(self, k: int, v: Vector) -> None:
        st = self._st
        if _has(st._mask, k):
            st._unpacked()
        if st._new is None:
            st._new = {}
        st._new[k] = v

    def __delitem__(self, k: int) -> None:
        st = self._st
        if k not in self:
            raise KeyError(k)
        steps = st._unpacked()
        del steps[k]
        st._new = steps or None

    def __contains__(self, k: object) -> bool:
        st = self._st
        return _has(st._mask, k) or (st._new is not None and k in st._new)

    def __iter__(self) -> Iterator[int]:
        st = self._st
        yield from _bits(st._mask)
        if st._new is not None:
            yield from list(st._new)

    def __len__(self) -> int:
        st = self._st
        return st._mask.bit_count() + len(st._new or {})

    def clear(self) -> None:
        st = self._st
        st._forget_rows()
        st._new = None


_CHECK_SECRET = b"emarket noise check: a public test key, never used for real noise"


def noise_check() -> str:
    """A known-answer digest of the chain's noise on this platform.

    Releases every step of open and sealed chains of all three mechanisms for a fixed, public
    test key and hashes them. The result changes exactly when this platform derives different
    noise from the same key (e.g. a numpy release that changed its normal or Poisson sampler):
    a market compares it with the digest its state was made with and refuses to run on a
    platform that would re-noise released levels.
    """
    from .mechanisms import Gaussian, Laplace, Poisson  # noqa: PLC0415

    rngs = KeyedRngFactory(_CHECK_SECRET)
    h = hashlib.sha256(DOMAIN)
    cases: list[tuple[Mechanism, tuple[float, ...], Vector]] = [
        (Laplace(1.0), (0.5, 1.0, 2.0), np.linspace(-3.0, 3.0, 64)),
        (Gaussian(1.0), (0.5, 1.0, 2.0), np.linspace(-3.0, 3.0, 64)),
        (Poisson(1.0), (0.01, 0.1, 1.0), np.arange(64, dtype=np.int64)),
    ]
    for mech, levels, x in cases:
        for sealed in (False, True):
            chain = ReleaseChain(mech, levels, sealed=sealed)
            ident = ("check",)
            st = chain.seal(x, ident, rngs) if sealed else chain.open(x)
            for k in range(len(levels)):
                h.update(chain.release([st], k, [ident], rngs)[0].tobytes())
    return h.hexdigest()


def noise_check_discrete() -> str:
    """The same known-answer digest for the discrete Laplace chains (open and sealed).

    Kept apart from :func:`noise_check`, whose value markets made before the mechanism existed
    have recorded: a market compares this one when its record has it.
    """
    from .mechanisms import DiscreteLaplace  # noqa: PLC0415

    rngs = KeyedRngFactory(_CHECK_SECRET)
    h = hashlib.sha256(DOMAIN + b"discrete_laplace")
    x = np.arange(-32, 32, dtype=np.int64)
    for sealed in (False, True):
        chain = ReleaseChain(DiscreteLaplace(1.0), (0.25, 1.0, 4.0), sealed=sealed)
        ident = ("check",)
        st = chain.seal(x, ident, rngs) if sealed else chain.open(x)
        for k in range(len(chain.levels)):
            h.update(chain.release([st], k, [ident], rngs)[0].tobytes())
    return h.hexdigest()
