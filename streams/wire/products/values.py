"""The wire section of the ``values`` product: each value released; no field of its own."""

from __future__ import annotations

from .base import ProductFields

__all__ = ["ValuesFields"]


class ValuesFields(ProductFields):
    """``values``: what every registration has is all it needs."""

    name = "values"
    noun = "values"
