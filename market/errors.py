"""Typed errors raised by the noise engine and the money side.

Every error carries a machine-readable ``code`` so that the streaming layer can turn it into a
rejection event without parsing messages, and a message written for the person who has to act
on it (what was wrong, what was expected).

::

    MarketError
     ├── InvalidValueError          value is NaN/inf, not numeric, not an integer count, ...
     │    └── DimensionMismatchError  value has the wrong length for its stream
     ├── InvalidLevelError          privacy level is non-positive, non-finite or not a number
     │    └── LevelNotForSaleError  level is not one the seller's schedule sells
     ├── LevelAboveCapError         level exceeds the cap fixed by the seller
     ├── NoHigherStepError          the buyer already holds the seller's top step
     ├── SealedStateError           operation needs the exact value, which a sealed state erased
     ├── StateFormatError           serialised state is corrupt or of an unknown version
     ├── ScheduleError              price schedule is invalid (e.g. not arbitrage-free)
     └── ReceiptError               receipt or release fails signature verification
"""

from __future__ import annotations

__all__ = [
    "DimensionMismatchError",
    "DuplicateLevelError",
    "InvalidLevelError",
    "InvalidValueError",
    "LevelAboveCapError",
    "LevelNotForSaleError",
    "MarketError",
    "NoHigherStepError",
    "ReceiptError",
    "ScheduleError",
    "SealedStateError",
    "StateFormatError",
]


class MarketError(Exception):
    """Base class: every error the library raises on purpose derives from this.

    Attributes
    ----------
    code : str
        Machine-readable reason (the ``reason`` of a market rejection).
    message : str
        What was wrong and what to do, for a person.
    """

    code: str = "market_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidValueError(MarketError, ValueError):
    """The value is not numeric, not finite, not a count, or too long."""

    code = "invalid_value"


class DimensionMismatchError(InvalidValueError):
    """The value has the wrong number of coordinates for its stream."""

    code = "wrong_dimension"


class InvalidLevelError(MarketError, ValueError):
    """The level is not a positive finite number in [1e-9, 1e9]."""

    code = "invalid_level"


class LevelNotForSaleError(InvalidLevelError):
    """The seller's schedule does not sell this level."""

    code = "level_not_for_sale"


class LevelAboveCapError(MarketError, ValueError):
    """The level exceeds the cap the seller fixed."""

    code = "level_above_cap"


class NoHigherStepError(MarketError, ValueError):
    """The buyer already holds the seller's top step."""

    code = "no_higher_step"


class SealedStateError(MarketError):
    """The operation needs the exact value, which a sealed state erased."""

    code = "sealed_state"


class StateFormatError(MarketError, ValueError):
    """Serialised state is corrupt or of an unknown version."""

    code = "bad_state_format"


class ScheduleError(MarketError, ValueError):
    """The price schedule is invalid (e.g. it leaves arbitrage)."""

    code = "invalid_schedule"


class DuplicateLevelError(ScheduleError):
    """A price table names one level twice (two spellings of one number): its price would depend
    on which entry is read last."""

    code = "duplicate_price_level"


class ReceiptError(MarketError):
    """A receipt or the releases it covers fail verification."""

    code = "receipt_invalid"
