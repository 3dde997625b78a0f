"""What every product's wire section answers: the registration fields it owns, and their math.

A product's *wire section* is the part of a product kind that a registration needs before
anything is built: which registration field only it has, the checks of its fields, how wide
and how sensitive one release is, the threshold a release states, and the bytes its fields add
to the signed registration (docs/protocol.md §2). It is pure validation and arithmetic of the
registration's public fields, so the wire model (:class:`~streams.wire.events.StreamRegistration`)
validates through it and a client can compute with it; the product's market side (its values,
states and releases) is its module under :mod:`streams.core.products`, which uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from ..events import StreamRegistration
    from .rappor import RandomizedResponse

__all__ = ["Canon", "ProductFields"]


class Canon(Protocol):
    """The canonical-bytes writer of :mod:`streams.wire.signing` (text, integer, float, null)."""

    def s(self, x: str | None) -> Canon: ...
    def i(self, x: int) -> Canon: ...
    def f(self, x: float | None) -> Canon: ...
    def n(self) -> Canon: ...


class ProductFields:
    """The wire section of a product that adds nothing to a registration (``values``); the
    other products override what they add."""

    #: the product's name on the wire (``StreamRegistration.product``)
    name: ClassVar[str]
    #: the registration field only this product has (``None``: none), and its name in a refusal
    field: ClassVar[str | None] = None
    field_noun: ClassVar[str] = ""
    #: what a stream selling it sells, in the words the CLI prints
    noun: ClassVar[str]
    #: its values are counts (whole, never negative), whatever the mechanism
    takes_counts: ClassVar[bool] = False
    #: each stream of it keeps a survival law in every worker's memory, so the market counts
    #: such streams apart (``Limits.max_histogram_streams``)
    counted_apart: ClassVar[bool] = False

    @classmethod
    def check_field(cls, reg: StreamRegistration) -> None:
        """Refuse a registration that sells this product without its field, or has its field
        without selling it."""
        if cls.field is None:
            return
        if (reg.product == cls.name) != (getattr(reg, cls.field) is not None):
            raise ValueError(f"a {cls.name!r} stream needs {cls.field_noun}, and only it has one")

    @classmethod
    def check(cls, reg: StreamRegistration) -> None:
        """Refuse (``ValueError``, the reason) a registration of this product whose fields do
        not fit together; called once :meth:`check_field` passed."""

    @classmethod
    def release_width(cls, reg: StreamRegistration) -> int:
        """Numbers one release takes room for at most: ``dimension``."""
        return reg.dimension

    @classmethod
    def false_key_bound(cls, reg: StreamRegistration) -> int:
        """Most keys with a zero count one release shows: none, but on a keyed product."""
        return 0

    @classmethod
    def release_sensitivity(cls, reg: StreamRegistration) -> float:
        """Sensitivity of what is noised: each value's, ``sensitivity``."""
        return reg.sensitivity

    @classmethod
    def threshold(cls, reg: StreamRegistration, level: float) -> float | None:
        """The threshold a release at ``level`` states (``None``: the product has none)."""
        return None

    @classmethod
    def randomized_response(
        cls, reg: StreamRegistration, level: float
    ) -> RandomizedResponse | None:
        """The randomized response each released bit at ``level`` follows (``None``: the
        product releases numbers, not bits)."""
        return None

    @classmethod
    def sign(cls, c: Canon, reg: StreamRegistration) -> None:
        """Write the bytes this product's fields add to the signed registration (nothing for a
        product with no field: the bytes of its registrations predate the field)."""
