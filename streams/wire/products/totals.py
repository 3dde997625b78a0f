"""The wire section of ``running_totals``: its ``tree_height``, and what a tree node's release
needs of it (its sensitivity and the magnitude a node may reach; docs/math.md §10)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .base import Canon, ProductFields

if TYPE_CHECKING:
    from ..events import StreamRegistration

__all__ = ["MAX_TREE_HEIGHT", "TotalsFields"]

MAX_TREE_HEIGHT = 40
"""The highest tree a stream may register: 2⁴⁰ increments."""


class TotalsFields(ProductFields):
    """``running_totals``: increments sold as running sums through a tree of height
    ``tree_height``."""

    name = "running_totals"
    field = "tree_height"
    field_noun = "a tree_height"
    noun = "running totals"

    @classmethod
    def check(cls, reg: StreamRegistration) -> None:
        if reg.mechanism != "gaussian":
            raise ValueError(
                "running totals are released through a tree of Gaussian releases: register "
                "them with mechanism 'gaussian' (levels in ρ)"
            )
        if reg.sealed or reg.window is not None:
            raise ValueError("running totals are neither sealed nor 'window' streams")

    @classmethod
    def release_sensitivity(cls, reg: StreamRegistration) -> float:
        """One tree node's: the vector of all nodes changes by ``sensitivity ×
        sqrt(tree_height + 1)`` in ℓ2 when one increment does (it is in one node per tree
        level), times ``1 + 2⁻¹²`` for the rounding of the nodes' float sums (bounded by
        :meth:`totals_limit`)."""
        return reg.sensitivity * math.sqrt(_height(reg) + 1) * (1.0 + 2.0**-12)

    @classmethod
    def totals_limit(cls, reg: StreamRegistration) -> float:
        """The largest magnitude a node (a sum of increments) may reach, ``2⁴⁰·Δ/((h + 1)·√d)``:
        each float addition of a node rounds by at most 2⁻⁵³ of it, so two neighbours'
        computed nodes differ by at most ``Δ(1 + 2⁻¹²)`` in ℓ2 below it."""
        return math.ldexp(reg.sensitivity, 40) / ((_height(reg) + 1) * math.sqrt(reg.dimension))

    @classmethod
    def sign(cls, c: Canon, reg: StreamRegistration) -> None:
        c.s(reg.product).i(_height(reg))


def _height(reg: StreamRegistration) -> int:
    assert reg.tree_height is not None  # a running_totals registration has one
    return reg.tree_height
