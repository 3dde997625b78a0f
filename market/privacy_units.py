"""Privacy in whole nano-units: the integers the ledger adds and compares.

A level is signed as a double (docs/protocol.md §2.2), but the seller meant the decimal it wrote:
``0.1`` is one tenth, and the double read from it is 0.1000000000000000055…. Sums of doubles
round at every step, so ten steps of 0.1 do not add up to 1.0 and a cap compared with such a sum
needs a slack, which in turn lets a cap be exceeded and a tiny spend after exhaustion vanish. So
the ledger counts privacy in integers of :data:`NANO` = 10⁻⁹ of the stream's unit (ε, ρ or ω):

* a level is converted from its **canonical decimal** (the shortest decimal that reads back as
  the same double, Python's ``repr``), never from the binary double;
* a **spend is rounded up** (:func:`spend_of`): what is recorded is never below what was
  released, so a guarantee proved on the recorded sums holds for the real ones
  (docs/math.md §9);
* a **cap is rounded down** (:func:`cap_of`): the room is never above the one the seller set.

Integer sums are exact and agree in any order. 10⁻⁹ (not the W3C's micro-ε) because levels of
zCDP streams are routinely 10⁻⁴–10⁻⁶ ρ, and micro would round those up by up to a whole level.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from functools import lru_cache

__all__ = ["NANO", "NANO_DIGITS", "cap_of", "level_of", "spend_of", "whole_nanos"]

NANO_DIGITS = 9
NANO = Decimal(1).scaleb(-NANO_DIGITS)
"""The ledger's unit: 10⁻⁹ of the stream's level unit."""


def _nanos(level: float, rounding: str) -> int:
    if not math.isfinite(level):
        raise ValueError(f"a privacy level must be finite, not {level!r}")
    exact = Decimal(repr(float(level))).scaleb(NANO_DIGITS)  # the canonical decimal, exactly
    return int(exact.to_integral_value(rounding=rounding))


@lru_cache(maxsize=4096)
def spend_of(level: float) -> int:
    """``level`` in nano-units, rounded up: what releasing at it is recorded as spending."""
    return _nanos(level, ROUND_CEILING)


@lru_cache(maxsize=256)
def cap_of(level: float) -> int:
    """A cap in nano-units, rounded down: the most the ledger lets be spent under it."""
    return _nanos(level, ROUND_FLOOR)


def level_of(nanos: int) -> float:
    """Nano-units as a level (the nearest double to the exact decimal): what refusals, window
    statuses and gauges show."""
    return float(Decimal(nanos).scaleb(-NANO_DIGITS))


def whole_nanos(level: float) -> bool:
    """Whether ``level``'s canonical decimal is a whole number of nano-units (at most nine
    decimal places): a window cap must be, so a level equal to it fits it."""
    return cap_of(level) == spend_of(level)
