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

Noise format v2: every new release reads the random words of one request key
(:mod:`market._draws`), drawn from the caller's generator (``rng``) or given (``key``), and is
decided exactly, so a release is a function of the state and that key on every machine. A
:class:`~market.Laplace` mechanism is calibrated to the value's dimension (its grid depends on
it): the state keeps ``Laplace(Δ, dimension=len(value))``. A Gaussian state keeps, for each
release, the real noise it rounds (as a linear form in keyed normals), and conditions later
releases on it; a *sealed* Gaussian state cannot (the exact value is gone), so it tightens from
the rounded cap-level release: still post-processing of it, but its law differs from a fresh
release's by that rounding (at most 2⁻¹⁷ standard deviations).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import _normal
from ._draws import Draws, key_from
from .errors import (
    DimensionMismatchError,
    InvalidLevelError,
    LevelAboveCapError,
    SealedStateError,
)
from .levels import canonical_level
from .mechanisms import Anchor, Gaussian, Mechanism, calibrated, check_range
from .rng import Identity, NoiseKeys, RngLike, default_rng

__all__ = ["ReleaseState"]

Vector = NDArray[Any]


def _frozen(arr: Vector) -> Vector:
    arr.setflags(write=False)
    return arr


class ReleaseState:
    """All releases of one value under one mechanism, at any levels, in any order.

    Parameters
    ----------
    mechanism : Mechanism
        The noise family (a :class:`~market.Laplace` is calibrated to the value's dimension).
    value : array_like
        The exact value, validated and copied (see :meth:`Mechanism.validate_value`).
    cap : float, optional
        The largest level that may ever be released (in the mechanism's unit).

    See Also
    --------
    ReleaseState.sealed : a state that keeps only the release at the cap.

    Examples
    --------
    >>> from market import Laplace, ReleaseState
    >>> state = ReleaseState(Laplace(), [20.1, 19.8], cap=4.0)
    >>> y1 = state.release(0.5, rng=1)
    >>> y2 = state.release(2.0, rng=2)   # relaxation: only ε = 2 is spent, not 2.5
    >>> state.spent
    2.0
    >>> state.release(0.5) is y1         # a released level is never drawn again
    True
    """

    __slots__ = (
        "_base",
        "_cap",
        "_dimension",
        "_exact",
        "_levels",
        "_mechanism",
        "_points",
        "_releases",
    )

    def __init__(
        self,
        mechanism: Mechanism,
        value: Any,
        *,
        cap: float | None = None,
    ) -> None:
        """Open state keeping the exact ``value`` (see the class docstring)."""
        self._mechanism = calibrated(mechanism, value)
        exact = _frozen(self._mechanism.validate_value(value))
        self._dimension = int(exact.shape[0])
        self._exact: Vector | None = exact
        self._base: Vector = exact
        self._cap = None if cap is None else canonical_level(cap, name="cap")
        if self._cap is not None:
            self._mechanism.check_level(self._cap)
        self._levels: list[float] = []
        self._points: dict[float, Anchor] = {}
        self._releases: dict[float, Vector] = {}

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def sealed(
        cls, mechanism: Mechanism, value: Any, *, cap: float, rng: RngLike = None
    ) -> ReleaseState:
        """Release ``value`` once at ``cap`` and erase it (Andersson et al. Lemma A.2).

        Everything released later is post-processing of that cap-level release, so even a leaked
        state is only cap-level private.

        Parameters
        ----------
        mechanism : Mechanism
            The noise family.
        value : array_like
            The exact value; it is not kept.
        cap : float
            The only level released from the exact value, and the most accurate ever.
        rng : Generator, int or None
            Draws the request key of the cap-level release (:func:`market.rng.default_rng`).

        Returns
        -------
        ReleaseState
            A sealed state holding one release, at ``cap``.
        """
        state = cls(mechanism, value, cap=cap)
        assert state._cap is not None
        top = state.release(state._cap, rng=rng)
        state._exact = None
        if isinstance(state._mechanism, Gaussian):  # re-rooted at the rounded release
            state._base = top
            point = state._points[state._cap]
            n = state._dimension
            zero = _normal.Hidden(np.zeros(n), np.zeros(n))
            state._points[state._cap] = Anchor(point.level, point.values, (), zero)
        return state

    @classmethod
    def _restore(
        cls,
        mechanism: Mechanism,
        *,
        dimension: int,
        exact: Vector | None,
        base: Vector | None,
        cap: float | None,
        points: dict[float, Anchor],
    ) -> ReleaseState:
        """Rebuild a state from trusted parts (used by :mod:`market.codec`)."""
        state = cls.__new__(cls)
        state._mechanism = calibrated(mechanism, np.zeros(dimension))
        state._dimension = dimension
        state._exact = None if exact is None else _frozen(exact)
        state._cap = cap
        state._levels = sorted(points)
        state._points = dict(points)
        state._releases = {}
        if base is not None:
            state._base = base
        elif state._exact is not None:
            state._base = state._exact
        else:  # a sealed state: its base (Gaussian) is the rounded cap release
            top = state._levels[-1]
            state._base = state._mechanism.decode(points[top])
        for lvl, point in points.items():
            state._releases[lvl] = _frozen(state._mechanism.decode(point))
        return state

    # -- inspection ----------------------------------------------------------------------------
    @property
    def mechanism(self) -> Mechanism:
        """The noise family."""
        return self._mechanism

    @property
    def dimension(self) -> int:
        """Number of coordinates of the value."""
        return self._dimension

    @property
    def cap(self) -> float | None:
        """The largest level that may ever be released, if one was set."""
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
        """Validate ``level`` for this state without releasing anything.

        Parameters
        ----------
        level : float
            The level a caller wants to release.

        Returns
        -------
        float
            ``level`` canonicalised (:func:`market.levels.canonical_level`).

        Raises
        ------
        InvalidLevelError, LevelAboveCapError, SealedStateError
            Exactly what :meth:`release` would raise, so a caller can refuse a request before
            doing any work (e.g. for every value of a stream before charging a buyer).
        """
        lvl = canonical_level(level)
        if lvl in self._releases:
            return lvl
        if self._cap is not None and lvl > self._cap:
            raise LevelAboveCapError(
                f"level {lvl:g} exceeds the cap {self._cap:g} set for this value"
            )
        self._mechanism.check_level(lvl)
        check_range(self._base, self._mechanism.value_limit(lvl))  # before any state changes
        if self._exact is None and (not self._levels or lvl > self._levels[-1]):
            raise SealedStateError(
                f"level {lvl:g} is above the most accurate release ({self.spent:g}) of a "
                "sealed value, whose exact value was erased"
            )
        return lvl

    def release(self, level: Any, *, rng: RngLike = None, key: bytes | None = None) -> Vector:
        """The release at ``level``: the stored one if it exists, else sampled losslessly.

        Parameters
        ----------
        level : float
            The level, in the mechanism's unit.
        rng : Generator, int or None
            Draws the request key of a new level (32 bytes). A generator from
            :func:`market.rng.keyed_rng` makes the sample a function of the request.
        key : bytes, optional
            The request key itself (32 bytes), instead of ``rng``.

        Returns
        -------
        ndarray
            The release, read-only. A new level is sampled conditionally on its two closest
            released neighbours (relaxation above the top, bridge in between, tightening below),
            so all releases of the value keep the joint law of one lossless process.

        Raises
        ------
        InvalidLevelError, LevelAboveCapError, SealedStateError
            See :meth:`check`.
        """
        lvl = self.check(level)
        stored = self._releases.get(lvl)
        if stored is not None:
            return stored
        pos, upper, lower = self._anchors(lvl)
        if key is None:
            key = key_from(default_rng(rng))
        slots = self._mechanism.slots(lvl, upper.level, None if lower is None else lower.level)
        point = self._mechanism.conditional(
            lvl, upper, lower, Draws(key, self._dimension, slots), self._base
        )
        self._insert(pos, lvl, point)
        return self._releases[lvl]

    @staticmethod
    def release_across(
        states: Sequence[ReleaseState],
        level: Any,
        identities: Sequence[Identity],
        keys: NoiseKeys,
    ) -> list[Vector]:
        """The release at ``level`` of each of several values.

        Parameters
        ----------
        states : sequence of ReleaseState
            The values' release states (any mix of mechanisms and released levels).
        level : float
            The level to release on every value.
        identities : sequence of tuple
            One request identity per state: a new sample of ``states[i]`` reads the draws of
            ``keys(*identities[i])``, so it is a deterministic function of that identity.
        keys : NoiseKeys
            Request keys from the secret (callers hand over only identities).

        Returns
        -------
        list of ndarray
            The read-only releases, in the order of ``states``; equal bit for bit to
            ``[s.release(level, key=keys(*identities[i])) ...]``.

        Notes
        -----
        Every state is checked (cap, sealing) before anything is sampled, so an error leaves
        all states unchanged.
        """
        lvl = canonical_level(level)
        if len(identities) != len(states):
            raise ValueError(f"{len(states)} states but {len(identities)} identities")
        for st in states:
            st.check(lvl)
        return [
            st.release(lvl, key=keys(*ident)) for st, ident in zip(states, identities, strict=True)
        ]

    def _anchors(self, lvl: float) -> tuple[int, Anchor, Anchor | None]:
        """(insertion index, upper neighbour, lower neighbour) of a new level."""
        i = bisect.bisect_left(self._levels, lvl)
        if i < len(self._levels):
            upper = self._points[self._levels[i]]
        else:
            assert self._exact is not None  # guaranteed by check()
            upper = self._mechanism.origin(self._exact)
        lower = self._points[self._levels[i - 1]] if i > 0 else None
        return i, upper, lower

    def _insert(self, pos: int, lvl: float, point: Anchor) -> None:
        self._levels.insert(pos, lvl)
        self._points[lvl] = dataclasses.replace(point, values=_frozen(point.values))
        self._releases[lvl] = _frozen(self._mechanism.decode(point))

    def point(self, level: float) -> Anchor:
        """The stored point of a released level: its lattice integers (and, for the Gaussian,
        the real noise it rounds). Used by :mod:`market.codec`."""
        return self._points[canonical_level(level)]

    @property
    def base(self) -> Vector:
        """What Gaussian noise is added to: the exact value, or a sealed state's rounded root."""
        return self._base

    def check_dimension(self, dimension: int) -> None:
        """Raise :class:`DimensionMismatchError` unless the value has ``dimension`` coordinates."""
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
        mine, theirs = self._points, other._points
        return all(
            mine[lv].values.tobytes() == theirs[lv].values.tobytes()
            and mine[lv].path == theirs[lv].path
            for lv in self._levels
        )
