"""epsilon-market's noise engine: lossless gradual and multiple release of private values.

This package is pure numpy/scipy: it knows nothing of Kafka. The streaming service (`streams`)
uses it through :class:`ReleaseState` and the mechanisms.

The names below are imported on first use (PEP 562), not when the package is: a light module
such as :mod:`market.envelope` or :mod:`market.errors` is then imported without numpy, so a
command that only makes keys (``epsilon-market keygen``) starts in a fraction of the time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .chain import ChainState, ReleaseChain
    from .levels import canonical_level
    from .mechanisms import (
        Anchor,
        DiscreteLaplace,
        Gaussian,
        Laplace,
        Mechanism,
        Poisson,
        mechanism,
    )
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

_LAZY = {
    "ChainState": "chain",
    "ReleaseChain": "chain",
    "canonical_level": "levels",
    "Anchor": "mechanisms",
    "DiscreteLaplace": "mechanisms",
    "Gaussian": "mechanisms",
    "Laplace": "mechanisms",
    "Mechanism": "mechanisms",
    "Poisson": "mechanisms",
    "mechanism": "mechanisms",
    "ReleaseState": "release_state",
    "default_rng": "rng",
    "keyed_rng": "rng",
    "secure_rng": "rng",
}
"""Public name → the module (of this package) that defines it, imported on first use."""


def __getattr__(name: str) -> Any:
    """``market.X`` (and ``from market import X``) for a name of :data:`_LAZY`: import its
    module once, then keep the name here so later lookups are plain attribute reads."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
