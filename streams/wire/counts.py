"""What a counts stream takes: whole numbers of occurrences, never negative, never fractional.

A ``discrete_laplace`` or ``poisson`` stream's values and a histogram stream's counts count
something (visits, sales, people): ``-3`` or ``2.5`` of them is a mistake of the seller's, which
the market would otherwise release as a plausible noisy count (``-8``). The market refuses such
a value (``invalid_count``, docs/protocol.md §6.4 and §9) where it reads it, in its product
(:mod:`streams.core.products`); a client that knows the stream (from the catalog) refuses it
before sending, with the same rule: this module, the one place it is written.

Non-finite numbers and counts beyond 2⁵³ − 1 are not this module's: they are refused as
``invalid_value`` by the value's own checks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .products import section_of

if TYPE_CHECKING:
    from .events import StreamRegistration

__all__ = ["COUNT_MECHANISMS", "count_problem", "sells_counts"]

COUNT_MECHANISMS = frozenset({"discrete_laplace", "poisson"})
"""The mechanisms whose values are counts (they release whole numbers)."""


def sells_counts(registration: StreamRegistration) -> bool:
    """Whether the stream ``registration`` registers takes counts: a counts mechanism's values,
    or a product's whose values are counts (a histogram's,
    :attr:`~streams.wire.products.base.ProductFields.takes_counts`)."""
    return registration.mechanism in COUNT_MECHANISMS or section_of(registration).takes_counts


def count_problem(values: Iterable[float]) -> tuple[int, str] | None:
    """The first number of ``values`` that is not a count: its index (from 0) and what is wrong
    with it (``"is negative"``, ``"is not a whole number"``), or ``None`` if all are counts (or
    not finite: another check's). The number itself is never repeated (a refusal must not quote
    a seller's numbers)."""
    for i, x in enumerate(values):
        if not math.isfinite(x):
            continue
        if x < 0:
            return i, "is negative"
        if x != math.floor(x):
            return i, "is not a whole number"
    return None
