"""epsilon-market's noise engine: lossless gradual and multiple release of private values.

This package is pure numpy/scipy: it knows nothing of Kafka. The streaming service (`streams`)
uses it through :class:`ReleaseState` and the mechanisms.
"""

from .chain import ChainState, ReleaseChain
from .errors import (
    DimensionMismatchError,
    DuplicateLevelError,
    InvalidLevelError,
    InvalidValueError,
    LevelAboveCapError,
    MarketError,
    ReceiptError,
    ScheduleError,
    SealedStateError,
    StateFormatError,
)
from .levels import canonical_level
from .mechanisms import Anchor, DiscreteLaplace, Gaussian, Laplace, Mechanism, Poisson, mechanism
from .release_state import ReleaseState
from .rng import default_rng, keyed_rng, secure_rng

__all__ = [
    "Anchor",
    "ChainState",
    "DimensionMismatchError",
    "DiscreteLaplace",
    "DuplicateLevelError",
    "Gaussian",
    "InvalidLevelError",
    "InvalidValueError",
    "Laplace",
    "LevelAboveCapError",
    "MarketError",
    "Mechanism",
    "Poisson",
    "ReceiptError",
    "ReleaseChain",
    "ReleaseState",
    "ScheduleError",
    "SealedStateError",
    "StateFormatError",
    "canonical_level",
    "default_rng",
    "keyed_rng",
    "mechanism",
    "secure_rng",
]
