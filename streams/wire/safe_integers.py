"""The integers a party may sign: those every JSON reader reads as the same number."""

from __future__ import annotations

from pydantic_core import PydanticCustomError

from market.levels import MAX_EXACT_INTEGER

__all__ = ["MAX_SAFE_INTEGER", "safe_integer"]

MAX_SAFE_INTEGER = MAX_EXACT_INTEGER
"""The largest integer a party may sign. Beyond it two integers share one double, so a JSON
reader that keeps integers exactly and one that reads every number as a double (JavaScript's)
would read different numbers from one signed text (docs/protocol.md §2.2)."""


def safe_integer(n: int) -> int:
    """``n``, if every JSON reader reads the number that names it as ``n``."""
    if abs(n) > MAX_SAFE_INTEGER:
        raise PydanticCustomError(
            "unsafe_integer",
            "an integer a party signs must be at most 2**53 - 1 in magnitude however it is "
            "written (beyond, distinct integers read as one double)",
        )
    return n
