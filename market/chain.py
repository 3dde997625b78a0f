"""The canonical release chain: noise as a pure function of the request.

A market sells each stream at a fixed, increasing set of levels ``l_0 < l_1 < … < l_{K−1}``
(the seller's steps and the cap, fixed at registration). :class:`ReleaseChain` defines the
release of a value at step ``k`` as one path of the lossless process, built **from the top
down**: the release at the most accurate level ``l_{K−1}`` is a fresh release, and each lower
step adds independent noise to the step above it, ``Y_k = Y_{k+1} + W_k`` with
``W_k ~ C(l_{k+1} → l_k)`` (the convolution preorder, ``docs/math.md`` §1). That is the forward
construction of the lossless process (Andersson et al., eq. 1), so its joint law is the one every
relaxation and bridge reproduces, and any set of releases is a post-processing of the most
accurate one: a coalition of buyers learns only its best member's step.

Top-down, every step needs only *unconditional* draws (a fresh release and the tightening
steps), each from its own request key ``keys(DOMAIN, fingerprint, *identity, k)``
(:class:`~market.rng.NoiseKeys`), where the identity names the value (the service uses stream,
value id and a digest of the exact numbers). So the release at a step is a **deterministic
function** of the secret, the chain, the value's identity and numbers, and the step: the same
bytes whatever was released before, in whatever order, by whichever process, on whichever
machine (noise format v2: ``docs/protocol.md``). :class:`ChainState` — the exact value and the
steps computed so far — is therefore only a cache: dropping it costs computation, never privacy.
(Different numbers under one identity must not share noise, or their difference would be
revealed exactly: keep a digest of the numbers in the identity.)

* **Lattice families** (Laplace, discrete Laplace, Poisson): a step is the integer vector
  ``Y_k`` on the family's grid; ``Y_{K−1} = encode(x) + W_{K−1}``.
* **Gaussian**: ``Y_k`` rounds ``x + Z_k`` to its level's grid, where ``Z_k = Σ_{j ≥ k}
  √(v_j − v_{j+1})·N_j`` is the real Brownian noise (``v_K = 0``): the rounding is
  post-processing, decided exactly (:mod:`market._normal`).

A **sealed** chain keeps no exact value: it computes what it needs from it when the value
arrives — the top step (lattice families, whose lower steps follow from it exactly), or every
step (Gaussian: the real noise a rounded release came from cannot be stored) — and erases it.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import operator
import struct
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import _normal, _step
from .errors import InvalidValueError, SealedStateError
from .levels import canonical_level, step_of
from .mechanisms import Anchor, Gaussian, Laplace, Mechanism, check_range
from .rng import Identity, NoiseKeys, identity_bytes

__all__ = [
    "DOMAIN",
    "FORMAT",
    "ChainState",
    "ReleaseChain",
    "noise_check",
    "noise_step",
]

DOMAIN = b"emarket-chain-v2"
"""Domain separation of the chain's request keys (changing it changes every release)."""
FORMAT = 2
"""The noise format this module implements (``docs/protocol.md``)."""

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
        The noise family.
    levels : sequence of float
        The sellable levels, strictly increasing after canonicalisation (at least one).
    sealed : bool, default False
        Compute from the exact value at arrival and keep none of it (see the module docstring).

    Raises
    ------
    InvalidValueError
        No levels, or levels not strictly increasing.
    InvalidLevelError
        A level the family cannot release (:meth:`Mechanism.check_level`).

    Examples
    --------
    >>> from market import Laplace
    >>> from market.rng import NoiseKeys
    >>> chain = ReleaseChain(Laplace(dimension=2), [0.5, 1.0, 2.0])
    >>> keys = NoiseKeys(b"s" * 32)
    >>> a = chain.open([20.1, 19.8])
    >>> y0 = chain.release([a], 0, [("v1",)], keys)[0]          # computes steps 2, 1, 0
    >>> b = chain.open([20.1, 19.8])                              # nothing cached
    >>> bool((chain.release([b], 0, [("v1",)], keys)[0] == y0).all())
    True
    """

    mechanism: Mechanism
    levels: tuple[float, ...]
    sealed: bool = False
    fingerprint: bytes = field(init=False, repr=False, compare=False)
    _prefix: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lv = tuple(canonical_level(x) for x in self.levels)
        if not lv or any(b <= a for a, b in itertools.pairwise(lv)):
            raise InvalidValueError(f"chain levels must be strictly increasing, got {lv}")
        for x in lv:
            self.mechanism.check_level(x)
        object.__setattr__(self, "levels", lv)
        mech = self.mechanism
        dim = mech.dimension if isinstance(mech, Laplace) else 0
        desc = struct.pack(
            f"<BBdI{len(lv)}d", mech.code, int(self.sealed), mech.sensitivity, dim, *lv
        )
        object.__setattr__(self, "fingerprint", hashlib.sha256(DOMAIN + desc).digest()[:16])
        object.__setattr__(self, "_prefix", identity_bytes(DOMAIN, self.fingerprint))

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

    @functools.cached_property
    def value_limit(self) -> float:
        """The largest magnitude a value may have: every level's release must hold it
        (:meth:`Mechanism.value_limit`; the finest grid is the most accurate level's)."""
        return min(self.mechanism.value_limit(x) for x in self.levels)

    @functools.cached_property
    def _plans(self) -> tuple[tuple[tuple[float, float], int], ...]:
        """Per step ``s``: ``(level, upper level)`` of its unconditional draw and the slots it
        reads (public: levels only), worked out once per chain, not per request."""
        mech, lv = self.mechanism, self.levels
        out = []
        for s, level in enumerate(lv):
            upper = lv[s + 1] if s + 1 < len(lv) else math.inf
            out.append(((level, upper), mech.slots(level, upper, None)))
        return tuple(out)

    @functools.cached_property
    def _variance_steps(self) -> tuple[Fraction, ...]:
        """Gaussian: the exact variance each step adds, ``v_j − v_{j+1}`` (``v_K = 0``)."""
        mech = self.mechanism
        assert isinstance(mech, Gaussian)
        v = [mech.exact_variance(x) for x in self.levels] + [Fraction(0)]
        return tuple(v[j] - v[j + 1] for j in range(len(self.levels)))

    @functools.cached_property
    def _coefficients(self) -> tuple[float, ...]:
        """Gaussian: each step's coefficient ``√(v_j − v_{j+1})`` in floats, as
        :meth:`market._normal.Term.coefficient` computes it (worked out once per chain)."""
        one = Fraction(1)
        return tuple(_normal.Term(b"", one, v).coefficient() for v in self._variance_steps)

    def validate(self, value: Any) -> Vector:
        """The exact value checked for this chain (its family's rules and :attr:`value_limit`)."""
        exact = self.mechanism.validate_value(value)
        check_range(exact, self.value_limit)
        return _frozen(exact)

    def key(self, keys: NoiseKeys, identity: Identity, s: int) -> bytes:
        """The request key of step ``s`` of a value: ``keys(DOMAIN, fingerprint, *identity,
        s)``, with the chain's part of the identity encoded once."""
        return keys.of(self._prefix + identity_bytes(*identity, s))

    def _seeds(
        self, identities: Sequence[Identity], pairs: Sequence[tuple[int, int]]
    ) -> list[bytes]:
        """The encoded identities of steps ``s`` of values ``identities[i]`` for each ``(i, s)``
        of ``pairs`` (what :meth:`key` hashes), each value's identity encoded once."""
        values: dict[int, bytes] = {}
        out = []
        for i, s in pairs:
            head = values.get(i)
            if head is None:
                head = values[i] = self._prefix + _encoded(identities[i])
            out.append(head + _step_part(s))
        return out

    # -- states ---------------------------------------------------------------------------
    def open(self, value: Any) -> ChainState:
        """The state of a new value on an open chain: its exact numbers, nothing computed."""
        if self.sealed:
            raise SealedStateError("a sealed chain keeps no exact value: use ReleaseChain.seal")
        return ChainState(self.validate(value), {})

    def seal(self, value: Any, identity: Identity, keys: NoiseKeys) -> ChainState:
        """The state of a new value on a sealed chain: the steps it needs, exact value erased."""
        if not self.sealed:
            raise SealedStateError("ReleaseChain.seal needs a chain declared sealed")
        full = ChainState(self.validate(value), {})
        gauss = isinstance(self.mechanism, Gaussian)
        for k in range(len(self.levels) - 1, -1, -1) if gauss else [len(self.levels) - 1]:
            self._descend([full], k, [identity], keys)
        steps = {k: full.steps[k] for k in full.steps}
        return ChainState(None, steps, pinned=gauss)

    # -- releasing ------------------------------------------------------------------------
    def release(
        self,
        states: Sequence[ChainState],
        k: int,
        identities: Sequence[Identity],
        keys: NoiseKeys,
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
        keys : NoiseKeys
            Request keys from the secret.

        Returns
        -------
        list of ndarray
            Read-only releases in the order of ``states`` (floats on the grid for Laplace and
            Gaussian, integers otherwise). Values that need the same step share one vectorised
            kernel call; each reads exactly the words it would read alone.
        """
        if not 0 <= k < len(self.levels):
            raise IndexError(f"step {k} outside a chain of {len(self.levels)} levels")
        if len(identities) != len(states):
            raise ValueError(f"{len(states)} states but {len(identities)} identities")
        if not states:
            return []
        self._descend(states, k, identities, keys)
        lvl, mech = self.levels[k], self.mechanism
        found: list[Vector] = [st.get(k) for st in states]  # type: ignore[misc]  # all descended
        first = found[0]
        if (
            len(found) > 1
            and type(mech).decode is not Mechanism.decode  # not the identity: decode them at once
            and all(v.shape == first.shape and v.dtype == first.dtype for v in found)
        ):
            return list(_frozen(mech.decode(Anchor(lvl, np.array(found)))))
        return [_frozen(mech.decode(Anchor(lvl, v))) for v in found]

    def new_steps(self, state: ChainState, k: int) -> int:
        """How many steps :meth:`release` would compute to give ``state`` step ``k``."""
        if state.has(k):
            return 0
        return _start(state, k, len(self.levels)) - k

    def _descend(
        self,
        states: Sequence[ChainState],
        k: int,
        identities: Sequence[Identity],
        keys: NoiseKeys,
    ) -> None:
        todo = [i for i, st in enumerate(states) if not st.has(k)]
        if not todo:
            return
        if len(todo) == len(states):  # the usual case: no value has the step yet
            some, idents = list(states), list(identities)
        else:
            some, idents = [states[i] for i in todo], [identities[i] for i in todo]
        if isinstance(self.mechanism, Gaussian):
            self._descend_gaussian(some, k, idents, keys)
            return
        count = len(self.levels)
        starts = [_start(st, k, count) for st in some]
        if self._descend_at_once(some, starts, k, idents, keys):
            return
        for s in range(max(starts) - 1, k - 1, -1):
            batch = [i for i, b in zip(todo, starts, strict=True) if b > s]
            self._lattice_step([states[i] for i in batch], s, [identities[i] for i in batch], keys)

    def _descend_at_once(
        self,
        states: list[ChainState],
        starts: list[int],
        k: int,
        identities: list[Identity],
        keys: NoiseKeys,
    ) -> bool:
        """Every step from each state's ``start − 1`` down to ``k`` in one vectorised draw of
        their noises (independent of the values: ``Y_s = Y_{s+1} + W_s``), when the family
        batches them (:meth:`Mechanism.increments`); the same integers as step by step."""
        mech, count = self.mechanism, len(self.levels)
        pairs = [(i, s) for i, b in enumerate(starts) for s in range(b - 1, k - 1, -1)]
        if len(pairs) < 2 and not _step.compiled():  # numpy's one-law kernel is faster alone
            return False
        bases: list[Vector] = []
        for st, b in zip(states, starts, strict=True):
            exact = st.exact if b == count else None
            base = mech.origin(exact).values if exact is not None else st.get(b)
            if base is None:
                return False
            bases.append(base)
        plans = self._plans
        steps = [plans[s][0] for _, s in pairs]
        m = plans[pairs[0][1]][1]
        if any(plans[s][1] != m for _, s in pairs):
            return False
        sizes = [int(bases[i].shape[0]) for i, _ in pairs]
        draws = _step.keyed_draws(keys, self._seeds(identities, pairs), sizes, m)
        noise = mech.increments(steps, sizes, draws)
        if noise is None:
            return False
        if len(pairs) == len(states) and len(set(sizes)) == 1:  # one step per value: one add
            rows = _frozen((np.concatenate(bases) + noise).reshape(len(pairs), sizes[0]))
            for (i, s), row in zip(pairs, rows, strict=True):
                states[i].put(s, row)
            return True
        at = 0
        for (i, s), n in zip(pairs, sizes, strict=True):
            bases[i] = _frozen(bases[i] + noise[at : at + n])
            states[i].put(s, bases[i])
            at += n
        return True

    def _lattice_step(
        self, states: list[ChainState], s: int, identities: list[Identity], keys: NoiseKeys
    ) -> None:
        """Step ``s`` of every state from step ``s + 1`` (or the exact value at the top)."""
        mech, top = self.mechanism, len(self.levels) - 1
        upper_level = math.inf if s == top else self.levels[s + 1]
        uppers = []
        for st in states:
            if s == top:
                if st.exact is None:
                    raise SealedStateError("a sealed chain state lost its top release")
                uppers.append(mech.origin(st.exact).values)
            else:
                above = st.get(s + 1)
                assert above is not None  # the descent computes the steps in order
                uppers.append(above)
        slots = mech.slots(self.levels[s], upper_level, None)
        seeds = self._seeds(identities, [(i, s) for i in range(len(identities))])
        draws = _step.keyed_draws(keys, seeds, [int(u.shape[0]) for u in uppers], slots)
        upper = Anchor(upper_level, np.concatenate(uppers))
        out = mech.conditional(self.levels[s], upper, None, draws, upper.values).values
        start = 0
        for st, u in zip(states, uppers, strict=True):
            st.put(s, _frozen(out[start : start + u.shape[0]].copy()))
            start += int(u.shape[0])

    def _descend_gaussian(
        self, states: list[ChainState], k: int, identities: list[Identity], keys: NoiseKeys
    ) -> None:
        """Step ``k`` of open Gaussian states: the real noise from the top down, rounded."""
        mech = self.mechanism
        assert isinstance(mech, Gaussian)
        exacts = [st.exact for st in states]
        if any(x is None for x in exacts):
            raise SealedStateError("a sealed Gaussian chain state lost a step")
        found = self._path_keys(identities, k, keys)
        sizes = [int(x.shape[0]) for x in exacts if x is not None]
        depth = len(self.levels) - k  # every step's normals of every value, in one pass
        draws = _step.draws(found, sizes * depth, 2)
        base: Vector = np.concatenate(exacts)  # type: ignore[arg-type]  # none is None
        offsets = list(itertools.accumulate(sizes, initial=0))
        grid = mech.grid_exponent(self.levels[k])
        variances = self._variance_steps[k:][::-1]
        count = len(states)

        def settle(i: int) -> int:  # the rare coordinate the float pass leaves undecided
            v = next(j for j in range(len(sizes)) if offsets[j + 1] > i)
            one = Fraction(1)
            path = tuple(
                _normal.Term(found[d * count + v], one, var) for d, var in enumerate(variances)
            )
            return _normal.exact_snap(float(base[i]), path, sizes[v], i - offsets[v], grid)

        out = _step.gaussian_step(draws, self._coefficients[k:][::-1], base, grid, settle)
        for v, st in enumerate(states):
            st.put(k, _frozen(out[offsets[v] : offsets[v + 1]].copy()))

    def _path_keys(self, identities: Sequence[Identity], k: int, keys: NoiseKeys) -> list[bytes]:
        """The request keys of the normals of step ``k`` of each value (steps ``j >= k``), top
        step first and, within a step, in the order of the values (the order
        :meth:`_descend_gaussian` draws them in): the key of step ``top − d`` of value ``i`` at
        ``d·len(identities) + i``. Every value's keys are derived in one call."""
        js = range(len(self.levels) - 1, k - 1, -1)
        pairs = [(i, j) for j in js for i in range(len(identities))]
        return _step.request_keys(keys, self._seeds(identities, pairs))

    def _paths(
        self, identities: Sequence[Identity], k: int, keys: NoiseKeys
    ) -> list[tuple[_normal.Term, ...]]:
        """The real noise of step ``k`` of each value: ``Σ_{j ≥ k} √(v_j − v_{j+1})·N_j``, top
        term first (:meth:`_path_keys`)."""
        found, count = self._path_keys(identities, k, keys), len(identities)
        var = self._variance_steps[k:][::-1]
        one = Fraction(1)
        return [
            tuple(_normal.Term(found[d * count + i], one, v) for d, v in enumerate(var))
            for i in range(count)
        ]


def _encoded(identity: Identity) -> bytes:
    """A value's identity encoded (:func:`identity_bytes`); one of text parts only (the
    service's) is kept, for the values asked for again and again (a purchase releases the same
    retained values step after step). Other parts are encoded each time: a cache key would take
    ``1``, ``1.0`` and ``True`` for one another."""
    for p in identity:  # a loop, not all(): this runs for every value of every request
        if type(p) is not str:
            return identity_bytes(*identity)
    return _encoded_text(identity)


@functools.lru_cache(maxsize=4096)  # bounded: a value batch's identities are new every time
def _encoded_text(identity: Identity) -> bytes:
    return identity_bytes(*identity)


@functools.lru_cache(maxsize=1024)
def _step_part(s: int) -> bytes:
    """The encoding of a step index, the last part of a step's identity (a chain has few)."""
    return identity_bytes(s)


def _start(st: ChainState, k: int, count: int) -> int:
    """The lowest cached step at or above ``k`` (``count``, the exact value, when none is
    cached): where the descent to ``k`` starts. Walked up from ``k``: the step just above is
    the usual answer (a purchase descends one step at a time)."""
    for j in range(k, count):
        if st.has(j):
            return j
    if st.exact is None:
        raise SealedStateError("a sealed chain state lost its top release")
    return count


class ChainState:
    """What is known of one value's chain: a cache that may be dropped at any time.

    Parameters
    ----------
    exact : ndarray or None
        The exact value (read-only); ``None`` on a sealed chain.
    steps : mapping of int to ndarray, optional
        Steps already computed (read-only int64 lattice vectors).
    pinned : bool, default False
        Every step is a root (a sealed Gaussian value: no step can be recomputed).

    Attributes
    ----------
    exact : ndarray or None
    steps : MutableMapping of int to ndarray
        The steps computed so far (read-only lattice vectors). On a sealed chain the top step is
        the value's root and must be kept (or recomputed from a resend of the exact value).
    pinned : bool

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

    __slots__ = ("_mask", "_new", "_rows", "_x", "_xdtype", "_xrow", "pinned")

    def __init__(
        self,
        exact: Vector | None,
        steps: Mapping[int, Vector] | None = None,
        *,
        pinned: bool = False,
    ) -> None:
        self.pinned = pinned
        self._x = exact  # the exact value, unless it is row 0 of _rows (_xrow)
        self._xrow = False
        self._xdtype: np.dtype[Any] | None = None  # its type in row 0 (floats ride as int64 bits)
        self._rows: Vector | None = None
        self._mask = 0  # bit k set: step k is a row of _rows (rows in increasing k)
        self._new: dict[int, Vector] | None = dict(steps) if steps else None

    def __repr__(self) -> str:
        return f"ChainState(exact={self.exact!r}, steps={dict(self.steps.items())!r})"

    @property
    def exact(self) -> Vector | None:
        if self._xrow:
            assert self._rows is not None
            row: Vector = self._rows[0].view(self._xdtype)  # a read-only view
            return row
        return self._x

    @property
    def steps(self) -> _Steps:
        return _Steps(self)

    @steps.setter
    def steps(self, value: Mapping[int, Vector]) -> None:
        self._forget_rows()
        self._new = dict(value) or None

    def get(self, k: int) -> Vector | None:
        """Step ``k`` (``0 <= k``) if cached, else ``None``: ``steps.get(k)`` without building
        the mapping (the chain asks this for every value of every request)."""
        new = self._new
        if new is not None:
            found = new.get(k)
            if found is not None:
                return found
        mask = self._mask
        if not mask >> k & 1:
            return None
        assert self._rows is not None
        row: Vector = self._rows[self._xrow + (mask & ((1 << k) - 1)).bit_count()]
        return row

    def has(self, k: int) -> bool:
        """Whether step ``k`` (``0 <= k``) is cached (``k in steps``, without the mapping)."""
        return bool(self._mask >> k & 1) or (self._new is not None and k in self._new)

    def put(self, k: int, v: Vector) -> None:
        """Cache step ``k`` (``steps[k] = v``, without building the mapping)."""
        if _has(self._mask, k):
            self._unpacked()
        if self._new is None:
            self._new = {k: v}
        else:
            self._new[k] = v

    def _forget_rows(self) -> None:
        """Drop the packed rows, keeping the exact value (copied out: no view keeps them)."""
        if self._xrow and self._rows is not None:
            self._x = _frozen(self._rows[0].view(self._xdtype).copy())
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
        rows = vectors if exact is None else [_row_of(exact, vectors[0]), *vectors]
        if len({(v.dtype, v.shape) for v in rows}) > 1:  # never converted to a common type:
            rows, exact = vectors, None  # the bits stay as released (exact kept apart)
            if len({(v.dtype, v.shape) for v in rows}) > 1:
                return
        mask = sum(1 << k for k in ids)  # a small int: cached by Python up to 256 (steps 0-7)
        self._rows, self._mask, self._new = _frozen(np.stack(rows)), mask, None
        if exact is not None:
            self._x, self._xrow, self._xdtype = None, True, exact.dtype

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
                self._x = _frozen(self._rows[0].view(self._xdtype).copy())
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
        if self.nbytes <= max_bytes or self.pinned:  # the usual case: nothing to walk
            return
        droppable = sorted(self.steps)
        if self.exact is None and droppable:
            droppable = droppable[:-1]  # a sealed chain's top step is its root
        while self.nbytes > max_bytes and droppable:
            del self.steps[droppable.pop(0)]

    def drop_cache(self) -> None:
        """Forget every step that can be recomputed (all of them on an open chain)."""
        if self.pinned:
            return
        if self.exact is not None:
            self.steps.clear()
        elif len(self.steps):
            top = max(self.steps)
            self.steps = {top: self.steps[top]}

    def equals(self, other: ChainState) -> bool:
        """Bitwise equality of the exact value and every cached step."""
        if (self.exact is None) != (other.exact is None) or set(self.steps) != set(other.steps):
            return False
        if self.pinned != other.pinned:
            return False
        if (
            self.exact is not None
            and other.exact is not None
            and self.exact.tobytes() != other.exact.tobytes()
        ):
            return False
        return all(self.steps[k].tobytes() == other.steps[k].tobytes() for k in self.steps)


def _row_of(exact: Vector, step: Vector) -> Vector:
    """The exact value as a row beside the (int64) steps: float64 numbers ride as their bits,
    so one array holds them all, bit for bit (a value's heap shrinks by an object)."""
    if exact.dtype != step.dtype and exact.dtype.itemsize == step.dtype.itemsize:
        return exact.view(step.dtype)
    return exact


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
        if _has(st._mask, k):
            row = st.get(operator.index(k))  # a read-only view of its row
            assert row is not None
            return row
        raise KeyError(k)

    def __setitem__(self, k: int, v: Vector) -> None:
        self._st.put(k, v)

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


def noise_step() -> tuple[bool, str]:
    """Whether the compiled noise step runs, and one line saying which runs and why.

    Returns
    -------
    tuple of (bool, str)
        ``True`` for the compiled step (``market._cnoise``), ``False`` for the numpy reference
        it falls back to when the extension was not built or ``EMARKET_NOISE_STEP=numpy``
        (the same releases, slower); and the line a worker logs at start.
    """
    return _step.compiled(), _step.describe()


_CHECK_SECRET = b"emarket noise check: a public test key, never used for real noise"


def noise_check() -> str:
    """A known-answer digest of the chains' noise (noise format v2).

    Releases every step of open and sealed chains of every family for a fixed, public test key
    and hashes them. Noise format v2 draws the same bytes on every platform, so this digest is
    a constant of the format (``docs/protocol.md`` lists it, and a test recomputes it with an
    independent implementation): a worker that computed another would re-noise released levels,
    and refuses to start.
    """
    from .mechanisms import DiscreteLaplace, Gaussian, Laplace, Poisson  # noqa: PLC0415

    keys = NoiseKeys(_CHECK_SECRET)
    h = hashlib.sha256(DOMAIN)
    grid = (np.arange(16) * 3 - 24) / 8.0  # −3 + 3i/8: exact doubles
    cases: list[tuple[Mechanism, tuple[float, ...], Vector]] = [
        (Laplace(1.0, dimension=16), (0.5, 1.0, 2.0), grid),
        (Gaussian(1.0), (0.5, 1.0, 2.0), grid),
        (Poisson(1.0), (0.01, 0.1, 1.0), np.arange(16, dtype=np.int64)),
        (DiscreteLaplace(1.0), (0.25, 1.0, 4.0), np.arange(-8, 8, dtype=np.int64)),
    ]
    for mech, levels, x in cases:
        for sealed in (False, True):
            chain = ReleaseChain(mech, levels, sealed=sealed)
            ident = ("check",)
            st = chain.seal(x, ident, keys) if sealed else chain.open(x)
            for k in range(len(levels)):
                y = chain.release([st], k, [ident], keys)[0]
                h.update(y.astype(y.dtype.newbyteorder("<")).tobytes())
    return h.hexdigest()
