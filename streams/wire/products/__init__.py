"""Each product's wire section: the registration fields only it has, their checks and math.

==============  ============================================================================
``base``        :class:`~.base.ProductFields`, what a section answers (and ``values``' default)
``values``      ``values``: no field of its own
``totals``      ``running_totals``: ``tree_height``, a tree node's sensitivity and range
``histogram``   ``histogram``: the ``histogram`` spec, its checks and the levels' thresholds
``rappor``      ``rappor``: ``rappor_ones``, its checks and each level's randomized response
==============  ============================================================================

A product kind is its module under :mod:`streams.core.products` plus its section here (a line
in :data:`SECTIONS`); :class:`~streams.wire.events.StreamRegistration` validates through the
section, and the market's product uses it. Nothing outside the two compares product names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Canon, ProductFields
from .histogram import HistogramFields
from .rappor import RapporFields
from .totals import TotalsFields
from .values import ValuesFields

if TYPE_CHECKING:
    from ..events import StreamRegistration

__all__ = ["SECTIONS", "Canon", "ProductFields", "check", "section_of"]

SECTIONS: dict[str, type[ProductFields]] = {
    s.name: s for s in (ValuesFields, TotalsFields, HistogramFields, RapporFields)
}
"""Product name on the wire → its wire section, in the order registrations are checked."""


def section_of(reg: StreamRegistration) -> type[ProductFields]:
    """The wire section of the product ``reg`` sells."""
    return SECTIONS[reg.product]


def check(reg: StreamRegistration) -> None:
    """Refuse (``ValueError``, the reason) a registration whose product fields do not fit: a
    field of another product's, a missing one, or fields its product refuses."""
    for section in SECTIONS.values():
        section.check_field(reg)
        if section is section_of(reg):
            section.check(reg)
