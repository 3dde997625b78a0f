"""The release state of one value: every level released so far and the vector released at each.

``ReleaseState.release(level)`` is the single entry point for every kind of release:

==============================  ================================================================
where ``level`` falls           what happens
==============================  ================================================================
already released                the stored vector is returned, bit for bit (no noise is drawn)
above every release             Markov relaxation from the topmost release and the exact value
                                (Koufogiannis Alg. 1 and its Gaussian/Poisson analogues)
between two releases            lossless bridge between the two neighbours (Andersson Alg. 1,
                                Laplace bridge, Poisson binomial bridge)
below every release             tightening from the most private release; the exact value is
                                not needed (Koufogiannis eq. 25 and analogues)
above the cap                   :class:`~market.errors.LevelAboveCapError`
above the top of a sealed state :class:`~market.errors.SealedStateError` (cannot happen when the
                                state was sealed at its cap, the usual case)
==============================  ================================================================

Because every new release is sampled conditionally on its two closest neighbours, the joint law
of all releases of a value is that of one lossless process (Andersson Lemma 4.2, Lemma A.2): any
set of releases is a post-processing of the most accurate one in the set, so a coalition of
buyers learns no more than its best member, and the seller's privacy loss is the largest level
ever released (:attr:`ReleaseState.spent`), not a sum.

**Sealed mode** (Andersson Lemma A.2): at ingestion the value is released once at the cap and the
exact value is dropped. Everything later is post-processing of that cap-level release, so even a
leaked state is only cap-level private.

Released vectors are returned as read-only arrays: nothing outside this class can change what a
buyer was given, and there is deliberately no way to redraw a level.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .errors import (
    DimensionMismatchError,
    InvalidLevelError,
    LevelAboveCapError,
    SealedStateError,
)
from .levels import canonical_level
from .mechanisms import Anchor, Mechanism
from .rng import RngLike, default_rng

__all__ = ["ReleaseState"]

Vector = NDArray[Any]


def _frozen(arr: Vector) -> Vector:
    arr.setflags(write=False)
    return arr


class ReleaseState:
    """All releases of one value under one mechanism (a "ladder" of privacy levels)."""

    __slots__ = ("_cap", "_dimension", "_exact", "_levels", "_mechanism", "_releases")

    def __init__(
        self,
        mechanism: Mechanism,
        value: Any,
        *,
        cap: float | None = None,
    ) -> None:
        """Open state keeping the exact ``value`` (validated and copied).

        ``cap`` (optional) is the largest level that may ever be released.
        """
        exact = mechanism.validate_value(value)
        self._mechanism = mechanism
        self._dimension = int(exact.shape[0])
        self._exact: Vector | None = _frozen(exact)
        self._cap = None if cap is None else canonical_level(cap, name="cap")
        self._levels: list[float] = []
        self._releases: dict[float, Vector] = {}

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def sealed(
        cls, mechanism: Mechanism, value: Any, *, cap: float, rng: RngLike = None
    ) -> ReleaseState:
        """Release ``value`` once at ``cap`` and erase it: the state is only cap-level private."""
        state = cls(mechanism, value, cap=cap)
        assert state._cap is not None
        state.release(state._cap, rng=rng)
        state._exact = None
        return state

    @classmethod
    def _restore(
        cls,
        mechanism: Mechanism,
        *,
        dimension: int,
        exact: Vector | None,
        cap: float | None,
        releases: dict[float, Vector],
    ) -> ReleaseState:
        """Rebuild a state from trusted parts (used by :mod:`market.codec`)."""
        state = cls.__new__(cls)
        state._mechanism = mechanism
        state._dimension = dimension
        state._exact = None if exact is None else _frozen(exact)
        state._cap = cap
        state._levels = sorted(releases)
        state._releases = {lvl: _frozen(v) for lvl, v in releases.items()}
        return state

    # -- inspection ----------------------------------------------------------------------------
    @property
    def mechanism(self) -> Mechanism:
        return self._mechanism

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def cap(self) -> float | None:
        return self._cap

    @property
    def is_sealed(self) -> bool:
        """True when the exact value is no longer held."""
        return self._exact is None

    @property
    def exact(self) -> Vector | None:
        """The exact value (read-only), or ``None`` for a sealed state."""
        return self._exact

    @property
    def levels(self) -> tuple[float, ...]:
        """Released levels in increasing order."""
        return tuple(self._levels)

    @property
    def spent(self) -> float:
        """Privacy spent on this value: the largest level ever released (0.0 if none)."""
        return self._levels[-1] if self._levels else 0.0

    def __len__(self) -> int:
        return len(self._levels)

    def __contains__(self, level: object) -> bool:
        try:
            return canonical_level(level) in self._releases
        except InvalidLevelError:
            return False

    def __iter__(self) -> Iterator[tuple[float, Vector]]:
        for lvl in self._levels:
            yield lvl, self._releases[lvl]

    def get(self, level: float) -> Vector | None:
        """The stored release at ``level``, or ``None`` if it was never released."""
        return self._releases.get(canonical_level(level))

    @property
    def nbytes(self) -> int:
        """Bytes held by the vectors of this state (exact value plus every release)."""
        total = sum(v.nbytes for v in self._releases.values())
        return total + (0 if self._exact is None else self._exact.nbytes)

    def __repr__(self) -> str:
        kind = "sealed" if self.is_sealed else "open"
        return (
            f"ReleaseState({self._mechanism.name}, dim={self._dimension}, {kind}, "
            f"cap={self._cap}, levels={self._levels})"
        )

    # -- the one operation ---------------------------------------------------------------------
    def check(self, level: Any) -> float:
        """Validate ``level`` for this state without releasing; return it canonicalised.

        Raises the same errors :meth:`release` would, so callers can reject a request before
        doing any work (e.g. for every value of a stream before charging a buyer).
        """
        lvl = canonical_level(level)
        if lvl in self._releases:
            return lvl
        if self._cap is not None and lvl > self._cap:
            raise LevelAboveCapError(
                f"level {lvl:g} exceeds the cap {self._cap:g} set for this value"
            )
        if self._exact is None and (not self._levels or lvl > self._levels[-1]):
            raise SealedStateError(
                f"level {lvl:g} is above the most accurate release ({self.spent:g}) of a "
                "sealed value, whose exact value was erased"
            )
        return lvl

    def release(self, level: Any, *, rng: RngLike = None) -> Vector:
        """The release at ``level``: stored if it exists, otherwise sampled losslessly.

        ``rng`` is only consumed when a new level is sampled. Pass a generator from
        :func:`market.rng.keyed_rng` to make the sample a deterministic function of the request.
        """
        lvl = self.check(level)
        stored = self._releases.get(lvl)
        if stored is not None:
            return stored
        pos, upper, lower = self._anchors(lvl)
        values = self._mechanism.conditional(lvl, upper, lower, default_rng(rng))
        self._insert(pos, lvl, values)
        return values

    @staticmethod
    def release_across(
        states: Sequence[ReleaseState],
        level: Any,
        rng_for: Callable[[int], np.random.Generator],
    ) -> list[Vector]:
        """The release at ``level`` of each of several values, sampled together.

        Equivalent to ``[s.release(level, rng=rng_for(i)) for i, s in enumerate(states)]``, bit
        for bit, but values whose neighbours sit at the same levels share one vectorised kernel
        call: a purchase releases one level on every value of a stream's window, and for short
        vectors the per-call overhead dominates the arithmetic. ``rng_for(i)`` is only called for
        values that need a new sample, once each, in order. Every level is checked (cap, sealing)
        before anything is sampled, so an error leaves all states unchanged.
        """
        lvl = canonical_level(level)
        for st in states:
            st.check(lvl)
        results: list[Vector | None] = [st._releases.get(lvl) for st in states]
        todo = [i for i, r in enumerate(results) if r is None]
        by_mech: dict[Mechanism, list[int]] = {}
        for i in todo:
            by_mech.setdefault(states[i]._mechanism, []).append(i)
        for mech, idx in by_mech.items():
            anchors = [states[i]._anchors(lvl) for i in idx]
            sampled = mech.conditional_many(
                lvl, [a[1:] for a in anchors], functools.partial(_nth, rng_for, idx)
            )
            for i, (pos, _, _), values in zip(idx, anchors, sampled, strict=True):
                states[i]._insert(pos, lvl, values)
                results[i] = states[i]._releases[lvl]
        return [r for r in results if r is not None]

    def _anchors(self, lvl: float) -> tuple[int, Anchor, Anchor | None]:
        """(insertion index, upper neighbour, lower neighbour) of a new level."""
        i = bisect.bisect_left(self._levels, lvl)
        if i < len(self._levels):
            upper = Anchor(self._levels[i], self._releases[self._levels[i]])
        else:
            assert self._exact is not None  # guaranteed by check()
            upper = Anchor(math.inf, self._exact)
        lower = None
        if i > 0:
            lower = Anchor(self._levels[i - 1], self._releases[self._levels[i - 1]])
        return i, upper, lower

    def _insert(self, pos: int, lvl: float, values: Vector) -> None:
        self._levels.insert(pos, lvl)
        self._releases[lvl] = _frozen(values)

    def release_many(self, levels: Any, *, rng: RngLike = None) -> dict[float, Vector]:
        """Release several levels, in the given order, with one generator."""
        gen = default_rng(rng)
        return {canonical_level(lv): self.release(lv, rng=gen) for lv in levels}

    def check_dimension(self, dimension: int) -> None:
        if dimension != self._dimension:
            raise DimensionMismatchError(
                f"state has dimension {self._dimension}, expected {dimension}"
            )

    def equals(self, other: ReleaseState) -> bool:
        """Bitwise equality of everything the state holds (used by tests and replay checks)."""
        if (
            self._mechanism != other._mechanism
            or self._dimension != other._dimension
            or self._cap != other._cap
            or self._levels != other._levels
            or (self._exact is None) != (other._exact is None)
        ):
            return False
        if (
            self._exact is not None
            and other._exact is not None
            and self._exact.tobytes() != other._exact.tobytes()
        ):
            return False
        return all(
            self._releases[lv].tobytes() == other._releases[lv].tobytes() for lv in self._levels
        )


def _nth(
    rng_for: Callable[[int], np.random.Generator], idx: list[int], j: int
) -> np.random.Generator:
    return rng_for(idx[j])
