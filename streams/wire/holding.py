"""How long a reservation may hold a purchase's terms (docs/protocol.md §6.9).

Apart from :mod:`.events` so that the command line reads it without the service's packages.
"""

from __future__ import annotations

__all__ = ["MAX_HOLD_MS", "MIN_HOLD_MS"]

MIN_HOLD_MS = 1_000
MAX_HOLD_MS = 120_000
"""Longest a reservation holds its terms: a short limit, so that reserving cannot block a
privacy window for free."""
