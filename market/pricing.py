"""Price schedules for privacy levels: arbitrage-free by construction, exact in minor units.

A seller attaches a schedule ``P(level)`` (absolute price of *holding* a release at ``level``)
and a cap. Buyers pay for steps: moving from level ``a`` to ``b`` costs exactly
``P_minor(b) - P_minor(a)``, where ``P_minor`` is the absolute price already rounded to integer
minor units (cents). Because the step price is a difference of rounded absolute prices, buying in
k steps costs exactly what buying directly costs, to the cent.

**Arbitrage-freeness.** Prices are functions of the release's *precision* x = 1/variance
(ε²/(2Δ²) for Laplace, 2ρ/Δ² for Gaussian, ω/Δ² for Poisson). A schedule is valid when P is
non-decreasing and subadditive in x: ``P(x + y) <= P(x) + P(y)``, so nobody can assemble a given
accuracy more cheaply from several cheaper releases (independent releases add precisions). We
enforce the standard sufficient condition that the *unit price* P(x)/x never increases with x
(together with P(0) = 0 this implies subadditivity) and monotonicity, and we round absolute prices
**up** to minor units: ``ceil`` keeps both properties (``ceil(a + b) <= ceil(a) + ceil(b)``),
``round`` and ``floor`` do not. (With lossless release a coalition learns only its best member's
release anyway; the condition protects sellers who also sell independent releases elsewhere.)

Ready shapes:

* :class:`LinearInPrecision` ``P = rate · x``: additive, the boundary case.
* :class:`LinearInLevel` ``P = rate · level``: concave in x for Laplace (x ∝ ε²), linear for
  Gaussian and Poisson.
* :class:`PriceTable` explicit ``{level: price_minor}``: only listed levels can be bought; the
  table is checked for the two properties and rejected with the offending pair otherwise.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import (
    DuplicateLevelError,
    InvalidLevelError,
    LevelAboveCapError,
    LevelNotForSaleError,
    MarketError,
    NoHigherStepError,
    ScheduleError,
)
from .levels import canonical_level
from .mechanisms import Mechanism

__all__ = [
    "LinearInLevel",
    "LinearInPrecision",
    "PricePoint",
    "PriceSchedule",
    "PriceTable",
    "StepPlan",
    "plan_step",
    "price_list",
    "schedule_from_spec",
    "sellable_levels",
    "table_levels",
]

MAX_PRICE_MINOR = 10**15  # beyond this, float arithmetic could no longer be exact to the cent


class PriceSchedule(ABC):
    """Absolute price, in integer minor units, of holding a release at a level.

    Subclasses give the unrounded price (:meth:`_raw`); this class rounds it up to minor units
    (:meth:`price`), prices steps as differences (:meth:`step_price`) and checks that a schedule
    leaves no arbitrage (:meth:`validate`).

    Attributes
    ----------
    kind : str
        The schedule's name in its JSON form (:meth:`spec`).
    """

    kind: str

    @abstractmethod
    def _raw(self, mechanism: Mechanism, level: float) -> float:
        """Unrounded price (minor units) of ``level``."""

    def check_level(self, level: float) -> None:  # noqa: B027 - optional hook, default: any
        """Raise InvalidLevelError if ``level`` cannot be priced (only tables restrict)."""

    def price(self, mechanism: Mechanism, level: float) -> int:
        """``P_minor(level)``, the absolute price of holding ``level``.

        Parameters
        ----------
        mechanism : Mechanism
            The stream's noise family (prices may depend on the precision of a level).
        level : float
            A level, or 0 for holding nothing.

        Returns
        -------
        int
            0 for level 0, otherwise the schedule's price rounded up to minor units.

        Raises
        ------
        LevelNotForSaleError
            A price table that does not list ``level``.
        ScheduleError
            A price that is negative, not finite or above 10**15 minor units.
        """
        if level == 0:
            return 0
        lvl = canonical_level(level)
        self.check_level(lvl)
        raw = self._raw(mechanism, lvl)
        if not math.isfinite(raw) or raw < 0 or raw > MAX_PRICE_MINOR:
            raise ScheduleError(f"price {raw!r} at level {lvl:g} is out of range")
        return math.ceil(raw - 1e-9 * max(1.0, raw))  # absorb float noise of exact integers

    def step_price(self, mechanism: Mechanism, held: float, target: float) -> int:
        """What a buyer holding ``held`` pays for ``target``.

        Returns
        -------
        int
            ``P_minor(target) − P_minor(held)``, or 0 if ``target`` is not an upgrade. Because
            both terms are rounded absolute prices, k steps cost exactly the direct price.
        """
        if target <= held:
            return 0
        return self.price(mechanism, target) - self.price(mechanism, held)

    @abstractmethod
    def spec(self) -> dict[str, Any]:
        """JSON-able description (the inverse of :func:`schedule_from_spec`)."""

    def validate(self, mechanism: Mechanism, levels: list[float], cap: float) -> None:
        """Check monotonicity and non-increasing unit price on the steps and the cap.

        Closed-form shapes satisfy both algebraically; checking the points the market will
        actually sell also rejects tables that violate them, naming the offending pair. The
        check runs on unrounded prices: rounding up to minor units preserves both properties.
        """
        points = sorted({canonical_level(lv) for lv in (*levels, cap)})
        prev_x = prev_p = 0.0
        prev_lvl = 0.0
        for lvl in points:
            self.check_level(lvl)
            x = mechanism.precision(lvl)
            p = self._raw(mechanism, lvl)
            if not math.isfinite(p) or p < 0 or p > MAX_PRICE_MINOR:
                raise ScheduleError(f"price {p!r} at level {lvl:g} is negative or out of range")
            if p < prev_p:
                raise ScheduleError(
                    f"price decreases from {prev_p:g} at level {prev_lvl:g} to {p:g} at "
                    f"level {lvl:g}: prices must not decrease as accuracy increases"
                )
            if prev_x > 0 and p * prev_x > prev_p * x * (1 + 1e-12):
                raise ScheduleError(
                    f"unit price rises from {prev_p / prev_x:.6g} per unit of precision at level "
                    f"{prev_lvl:g} to {p / x:.6g} at level {lvl:g}: the schedule is superadditive "
                    "there, so several cheaper releases would undercut one accurate release"
                )
            prev_x, prev_p, prev_lvl = x, p, lvl


def _rate(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScheduleError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ScheduleError(f"{name} must be finite and >= 0, got {value!r}")
    return v


@dataclass(frozen=True)
class LinearInPrecision(PriceSchedule):
    """``P = rate_per_precision · precision(level)`` minor units: additive, no discount.

    Parameters
    ----------
    rate_per_precision : float
        Minor units per unit of precision (1 / variance); ≥ 0.
    """

    rate_per_precision: float
    kind: str = field(default="linear_precision", init=False)

    def __post_init__(self) -> None:
        _rate(self.rate_per_precision, "rate_per_precision")

    def _raw(self, mechanism: Mechanism, level: float) -> float:
        return self.rate_per_precision * mechanism.precision(level)

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "rate_per_precision": self.rate_per_precision}


@dataclass(frozen=True)
class LinearInLevel(PriceSchedule):
    """``P = rate_per_level · level`` minor units (e.g. cents per unit of ε).

    Parameters
    ----------
    rate_per_level : float
        Minor units per unit of level; ≥ 0. Concave in precision for Laplace (x ∝ ε²), linear
        for Gaussian and Poisson: subadditive either way.
    """

    rate_per_level: float
    kind: str = field(default="linear_level", init=False)

    def __post_init__(self) -> None:
        _rate(self.rate_per_level, "rate_per_level")

    def _raw(self, mechanism: Mechanism, level: float) -> float:
        return self.rate_per_level * level

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "rate_per_level": self.rate_per_level}


def table_levels(prices: Mapping[Any, Any]) -> dict[float, Any]:
    """A price table's entries keyed by the level each key names, each level once.

    Parameters
    ----------
    prices : mapping
        Level → price; a level is a number or its decimal text (``"0.5"``, ``"5e-1"``).

    Returns
    -------
    dict of float to the prices
        Keyed by :func:`~market.levels.canonical_level`, the one float each level is compared
        as: a table is read the same way whatever the order of its entries.

    Raises
    ------
    DuplicateLevelError
        Two keys name one level (``"1"`` and ``"1.0"``): which price would be meant depends on
        which entry is read last, which no signature covers.
    ScheduleError
        A key is not a level.
    """
    out: dict[float, Any] = {}
    spelled: dict[float, Any] = {}
    for key, price in prices.items():
        try:
            level = canonical_level(float(key) if isinstance(key, str) else key)
        except (InvalidLevelError, ValueError) as exc:
            why = exc.message if isinstance(exc, InvalidLevelError) else f"{key!r} is no number"
            raise ScheduleError(f"price table level: {why}") from None
        if level in out:
            raise DuplicateLevelError(
                f"the price table prices level {level:g} twice (as {spelled[level]!r} and "
                f"{key!r}); give each level once"
            )
        out[level], spelled[level] = price, key
    return out


@dataclass(frozen=True)
class PriceTable(PriceSchedule):
    """Explicit prices for a finite set of levels; nothing else can be bought.

    Parameters
    ----------
    prices : mapping of float to int
        Level → absolute price in minor units (integers ≥ 0). :meth:`validate` refuses tables
        that would sell a more accurate level for less, or leave arbitrage.
    """

    prices: Mapping[float, int]
    kind: str = field(default="table", init=False)

    def __post_init__(self) -> None:
        if not self.prices:
            raise ScheduleError("a price table needs at least one level")
        clean = table_levels(self.prices)
        for key, price in clean.items():
            if isinstance(price, bool) or not isinstance(price, int) or price < 0:
                raise ScheduleError(
                    f"price table prices must be integers >= 0 (minor units), got {price!r} "
                    f"at level {key:g}"
                )
        object.__setattr__(self, "prices", dict(sorted(clean.items())))

    def check_level(self, level: float) -> None:
        if level not in self.prices:
            raise LevelNotForSaleError(
                f"level {level:g} is not for sale; this stream sells levels "
                f"{', '.join(f'{lv:g}' for lv in self.prices)}"
            )

    def _raw(self, mechanism: Mechanism, level: float) -> float:
        return float(self.prices[level])

    def validate(self, mechanism: Mechanism, levels: list[float], cap: float) -> None:
        """As :meth:`PriceSchedule.validate`, and every priced level must be for sale."""
        sellable = sellable_levels(levels, cap)
        extra = [lv for lv in self.prices if lv not in set(sellable)]
        if extra:
            raise ScheduleError(
                "the price table prices level(s) "
                + ", ".join(f"{x:g}" for x in extra)
                + " that are neither a step nor the cap; only steps and the cap are sold"
            )
        missing = [lv for lv in sellable if lv not in self.prices]
        if missing:
            raise ScheduleError(
                "the price table has no price for level(s) "
                + ", ".join(f"{x:g}" for x in missing)
                + "; a table must price every step and the cap"
            )
        super().validate(mechanism, levels, cap)

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "prices": {repr(k): v for k, v in self.prices.items()}}


def schedule_from_spec(spec: Mapping[str, Any]) -> PriceSchedule:
    """Build a schedule from its JSON form (the inverse of :meth:`PriceSchedule.spec`).

    Parameters
    ----------
    spec : mapping
        ``{"kind": "linear_precision", "rate_per_precision": r}``,
        ``{"kind": "linear_level", "rate_per_level": r}`` or
        ``{"kind": "table", "prices": {"<level>": price_minor, ...}}``.

    Returns
    -------
    PriceSchedule

    Raises
    ------
    ScheduleError
        Unknown kind, missing or malformed fields; the message says which.
    """
    kind = spec.get("kind")
    try:
        if kind == "linear_precision":
            return LinearInPrecision(spec["rate_per_precision"])
        if kind == "linear_level":
            return LinearInLevel(spec["rate_per_level"])
        if kind == "table":
            raw = spec["prices"]
            if not isinstance(raw, Mapping):
                raise ScheduleError("price table 'prices' must map levels to prices")
            return PriceTable(table_levels(raw))
    except KeyError as exc:
        raise ScheduleError(f"price schedule {kind!r} is missing {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ScheduleError):
            raise
        raise ScheduleError(f"price schedule {kind!r} is malformed: {exc}") from None
    raise ScheduleError(
        f"unknown price schedule kind {kind!r}; use 'linear_precision', 'linear_level' or 'table'"
    )


@dataclass(frozen=True)
class StepPlan:
    """What a purchase would do, before anything is released or charged.

    Attributes
    ----------
    held : float
        Level the buyer holds (0.0 for nothing).
    target : float
        Level asked for (the next step when the buyer named none).
    after : float
        Level held afterwards: ``max(held, target)`` (asking for less is free and returns the
        held release, because the market never releases a less accurate copy twice).
    price_minor : int
        ``P(after) − P(held)`` in minor units: 0 unless it is an upgrade.
    """

    held: float
    target: float
    after: float
    price_minor: int


def plan_step(
    schedule: PriceSchedule,
    mechanism: Mechanism,
    steps: list[float],
    cap: float,
    held: float,
    target: float | None = None,
    *,
    stream: str = "",
) -> StepPlan:
    """Plan a purchase: which level it buys and what it costs.

    Parameters
    ----------
    schedule, mechanism : PriceSchedule, Mechanism
        The stream's prices and noise family.
    steps : list of float
        The seller's steps, increasing; ``target=None`` buys the first one above ``held``.
    cap : float
        The most accurate level the seller will ever release.
    held : float
        The level the buyer holds (0.0 for nothing).
    target : float, optional
        An explicit level.
    stream : str, optional
        The stream's id, for messages.

    Returns
    -------
    StepPlan

    Raises
    ------
    NoHigherStepError
        No target and the buyer holds the top step.
    LevelAboveCapError
        The target exceeds the cap.
    LevelNotForSaleError
        The schedule does not sell the target (price tables sell only their levels).
    """
    cap = canonical_level(cap, name="cap")
    if target is None:
        top = canonical_level(max(steps))
        above = [lv for lv in sellable_levels(steps, cap) if held < lv <= top]
        if not above:
            raise NoHigherStepError(
                f"you already hold level {held:g}, the top step of this stream; name an explicit "
                f"target_level up to the cap {cap:g}"
            )
        lvl = canonical_level(above[0])
    else:
        lvl = canonical_level(target)
    if lvl > held or target is not None:  # an explicit level must be for sale, held or not
        _check_for_sale(schedule, mechanism, steps, cap, lvl, stream)
    return StepPlan(held, lvl, max(held, lvl), schedule.step_price(mechanism, held, lvl))


def _check_for_sale(
    schedule: PriceSchedule,
    mechanism: Mechanism,
    steps: list[float],
    cap: float,
    lvl: float,
    stream: str,
) -> None:
    if lvl > cap:
        where = f" for stream {stream!r}" if stream else ""
        raise LevelAboveCapError(
            f"level {lvl:g} exceeds the cap {cap:g} the seller set{where}; the most accurate "
            f"level for sale is {cap:g}"
        )
    sellable = sellable_levels(steps, cap)
    if lvl not in sellable:
        raise LevelNotForSaleError(
            f"level {lvl:g} is not sold; the levels for sale ({mechanism.level_unit}) are "
            + ", ".join(f"{x:g}" for x in sellable)
        )
    schedule.check_level(lvl)


def sellable_levels(steps: Sequence[float], cap: float) -> list[float]:
    """The levels a stream sells: its steps and its cap.

    Parameters
    ----------
    steps : sequence of float
        The seller's steps.
    cap : float
        The most accurate level for sale.

    Returns
    -------
    list of float
        Canonical, increasing, without repeats. They are the links of the stream's release
        chain (:class:`market.chain.ReleaseChain`): a level between two of them is not for
        sale, so that every release is one step of one chain.
    """
    return list(_sellable(tuple(steps), cap))


@functools.lru_cache(maxsize=4096)
def _sellable(steps: tuple[float, ...], cap: float) -> tuple[float, ...]:
    # every purchase asks three times for its stream's levels: canonicalising 17 numbers each
    # time was a tenth of a purchase's CPU (the arguments are hashable and a stream's are fixed)
    return tuple(sorted({canonical_level(x) for x in (*steps, cap)}))


@dataclass(frozen=True)
class PricePoint:
    """One line of a catalog: a level, its absolute price and the ε it is worth.

    Attributes
    ----------
    level : float
        In the mechanism's unit.
    price_minor : int
        Absolute price of holding the level, minor units.
    epsilon : float or None
        ε of one release at that level (at the δ asked for); ``None`` where the mechanism
        gives no (ε, δ) guarantee.
    """

    level: float
    price_minor: int
    epsilon: float | None


def price_list(
    schedule: PriceSchedule,
    mechanism: Mechanism,
    steps: list[float],
    cap: float,
    *,
    dimension: int,
    delta: float,
) -> list[PricePoint]:
    """Absolute prices of the steps and the cap, with the ε of each at ``delta``.

    Parameters
    ----------
    schedule, mechanism : PriceSchedule, Mechanism
        The stream's prices and noise family.
    steps : list of float
        The seller's steps.
    cap : float
        The most accurate level for sale.
    dimension : int
        Coordinates of each value: the Poisson guarantee weakens with it, and a catalog must
        state the guarantee of the vectors it really sells.
    delta : float
        δ of the stated (ε, δ) for Gaussian and Poisson.

    Returns
    -------
    list of PricePoint
        One per distinct level of ``steps`` and ``cap``, increasing.
    """
    out = []
    for lv in sellable_levels(steps, cap):
        try:
            eps: float | None = mechanism.epsilon(lv, delta, dimension)
        except MarketError:
            eps = None
        if eps is not None and not math.isfinite(eps):
            eps = None
        out.append(PricePoint(lv, schedule.price(mechanism, lv), eps))
    return out
