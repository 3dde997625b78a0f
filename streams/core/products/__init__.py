"""What a stream can sell: one module per product, behind one small protocol.

================  ===============================================================================
``base``          the :class:`~.base.Product` protocol, and the steps every product shares
``retained``      products whose values keep a state while retained (the two below)
``vectors``       ``values``: each value released as a vector, on a lossless chain of its own
``histograms``    ``histogram``: sparse count maps, released as the keys above a threshold
``totals``        ``running_totals``: increments sold as running sums through a tree of chains
``rappor``        ``rappor``: members' bit reports, released as relaxable randomized responses
================  ===============================================================================

A new product is a new module here, its wire section in :mod:`streams.wire.products` (the
registration fields only it has, their checks and math) and a line in :data:`PRODUCTS` and in
:data:`~streams.wire.products.SECTIONS`; the handlers, the ledger and the replay records are the
same for every product, and nothing outside the two packages branches on the product kind
(``tests/test_product_in_one_place.py``).
"""

from ...wire.events import StreamRegistration
from ..terms import Terms
from .base import Exact, Product
from .histograms import Histograms
from .rappor import Rappor
from .totals import Totals
from .vectors import Vectors

__all__ = ["PRODUCTS", "Exact", "Product", "product_class", "product_for"]

PRODUCTS: dict[str, type[Product]] = {
    Vectors.name: Vectors,
    Histograms.name: Histograms,
    Totals.name: Totals,
    Rappor.name: Rappor,
}
"""Product name on the wire (``StreamRegistration.product``) → its class."""


def product_class(reg: StreamRegistration) -> type[Product]:
    """The class of what ``reg`` sells (its costs are known before anything is built)."""
    return PRODUCTS[reg.product]


def product_for(reg: StreamRegistration, terms: Terms) -> Product:
    """What ``reg`` sells, built (a histogram stream's survival law is computed here)."""
    return product_class(reg)(reg, terms)
