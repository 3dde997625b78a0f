"""The room a reservation holds: what its purchase would add to each privacy window, if the
ledger's gate would let that purchase through now.

The one place a reservation asks the ledger (:mod:`.ledger`) anything: a reservation is granted
exactly when the purchase it reserves would pass every check of the gate now, and holds what
that purchase would add to each window, in the ledger's integer unit.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal
from typing import Any

from .stream import Stream

__all__ = ["level_of", "room_for"]


def _spend_of(level: float) -> int:
    if not math.isfinite(level):
        raise ValueError(f"a privacy level must be finite, not {level!r}")
    exact = Decimal(repr(float(level))).scaleb(9)
    return int(exact.to_integral_value(rounding=ROUND_CEILING))


def level_of(nanos: int) -> float:
    """Nano-units as a level (what an answer shows)."""
    return float(Decimal(nanos).scaleb(-9))


def room_for(stream: Stream[Any], buyer_id: str, level: float, price_minor: int) -> dict[int, int]:
    """Window index → what ``buyer_id`` buying ``level`` for ``price_minor`` now would add to
    it (nano-units); a refusal (``privacy_window_full``, what fits and when) if the gate would
    not let that purchase through."""
    ledger = stream.ledger
    ledger.check_purchase(ledger.level(level))
    if not ledger.windowed:
        return {}
    out: dict[int, int] = {}
    for e in stream.state.window:
        k = ledger.window_of(e.published_at_ms)
        if (a := max(0, _spend_of(level) - _spend_of(e.level))) > 0:
            out[k] = out.get(k, 0) + a
    return out
