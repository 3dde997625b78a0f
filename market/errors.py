"""Typed errors raised by the noise engine and the money side.

Every error carries a machine-readable ``code`` so that the streaming layer can turn it into a
rejection event without parsing messages, and a message written for the person who has to act
on it (what was wrong, what was expected).

::

    MarketError
     ├── InvalidValueError          value is NaN/inf, not numeric, not an integer count, ...
     │    └── DimensionMismatchError  value has the wrong length for its stream
     ├── InvalidLevelError          privacy level is non-positive, non-finite or not a number
     ├── LevelAboveCapError         level exceeds the cap fixed by the seller
     ├── SealedStateError           operation needs the exact value, which a sealed state erased
     ├── StateFormatError           serialised state is corrupt or of an unknown version
     ├── ScheduleError              price schedule is invalid (e.g. not arbitrage-free)
     └── ReceiptError               receipt or release fails signature verification
"""

from __future__ import annotations

__all__ = [
    "DimensionMismatchError",
    "InvalidLevelError",
    "InvalidValueError",
    "LevelAboveCapError",
    "MarketError",
    "ReceiptError",
    "ScheduleError",
    "SealedStateError",
    "StateFormatError",
]


class MarketError(Exception):
    """Base class: every error the library raises on purpose derives from this."""

    code: str = "market_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidValueError(MarketError, ValueError):
    code = "invalid_value"


class DimensionMismatchError(InvalidValueError):
    code = "wrong_dimension"


class InvalidLevelError(MarketError, ValueError):
    code = "invalid_level"


class LevelAboveCapError(MarketError, ValueError):
    code = "level_above_cap"


class SealedStateError(MarketError):
    code = "sealed_state"


class StateFormatError(MarketError, ValueError):
    code = "bad_state_format"


class ScheduleError(MarketError, ValueError):
    code = "invalid_schedule"


class ReceiptError(MarketError):
    code = "receipt_invalid"
