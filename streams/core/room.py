"""The room a reservation holds: what its purchase would add to each privacy window, if the
ledger's gate would let that purchase through now.

The one place a reservation asks the ledger (:mod:`.ledger`) anything: a reservation is granted
exactly when the purchase it reserves would pass every check of the gate now
(:meth:`~.ledger.PrivacyLedger.hold`), and holds what that purchase would add to each window,
in the ledger's integer unit.
"""

from __future__ import annotations

from typing import Any

from market.privacy_units import level_of

from .stream import Stream

__all__ = ["level_of", "room_for"]


def room_for(stream: Stream[Any], buyer_id: str, level: float, price_minor: int) -> dict[int, int]:
    """Window index → what ``buyer_id`` buying ``level`` for ``price_minor`` now would add to
    it (nano-units); the purchase's refusal (``privacy_window_full``: what fits and when) if the
    gate would not let it through."""
    ledger = stream.ledger
    return ledger.hold(buyer_id, ledger.level(level), price_minor)
