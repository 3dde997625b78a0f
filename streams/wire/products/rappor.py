"""The wire section of ``rappor``: its ``rappor_ones`` (the most bits one member's report sets),
the checks of a RAPPOR registration, and the randomized response a level releases
(:mod:`market.rappor`, docs/protocol.md §1.10).

A value is one population member's report input: the ``dimension`` bits of a Bloom filter
(``rappor_ones`` hash functions), or a category as one set bit (``rappor_ones`` 1). Two members'
reports differ in at most ``2·rappor_ones`` bits, so the registration's ℓ1 ``sensitivity`` must be
exactly that: the market's ε is then the guarantee per member, and the per-bit randomized
response each level releases follows from it and from nothing a seller could misstate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from market.rappor import MarketResponse, market_response

from .base import Canon, ProductFields

if TYPE_CHECKING:
    from ..events import StreamRegistration

__all__ = ["MAX_RAPPOR_ONES", "RandomizedResponse", "RapporFields"]

MAX_RAPPOR_ONES = 64
"""The most bits a report may set (a Bloom filter's hash functions)."""


class RandomizedResponse(BaseModel):
    """The randomized response of each released bit at one level, in RAPPOR's terms: a released
    bit is 1 with probability ``p_if_1`` where the member's bit is 1, ``p_if_0`` where it is 0,
    independently per bit and per value (exact for the lattice noise, docs/protocol.md §1.10)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    p_if_0: float = Field(description="P(released bit = 1 | the member's bit is 0)")
    p_if_1: float = Field(description="P(released bit = 1 | the member's bit is 1)")
    f: float = Field(
        description="RAPPOR's f for the permanent response, 1 − (p_if_1 − p_if_0): the chance "
        "a bit is replaced by a fair coin"
    )

    @classmethod
    def of(cls, r: MarketResponse) -> RandomizedResponse:
        """The wire form of :func:`market.rappor.market_response`."""
        return cls.model_construct(p_if_0=r.p_if_0, p_if_1=r.p_if_1, f=r.f)


class RapporFields(ProductFields):
    """``rappor``: members' bit reports, released as permanent randomized responses that a buyer
    relaxes step by step (a Laplace relaxation of the stored noise)."""

    name = "rappor"
    field = "rappor_ones"
    field_noun = "rappor_ones"
    noun = "RAPPOR reports"

    @classmethod
    def check(cls, reg: StreamRegistration) -> None:
        ones = _ones(reg)
        if reg.mechanism != "laplace":
            raise ValueError(
                "RAPPOR reports are released as thresholded Laplace noise: register them with "
                "mechanism 'laplace' (levels in ε)"
            )
        if ones > reg.dimension:
            raise ValueError(
                f"rappor_ones {ones} exceeds the dimension {reg.dimension}: a report of "
                f"{reg.dimension} bits sets at most {reg.dimension}"
            )
        if reg.sensitivity != 2 * ones:
            raise ValueError(
                f"a RAPPOR stream's sensitivity is 2 × rappor_ones = {2 * ones} (two members' "
                f"reports differ in at most that many bits); got {reg.sensitivity:g}: register "
                f"it with sensitivity {2 * ones}"
            )

    @classmethod
    def randomized_response(cls, reg: StreamRegistration, level: float) -> RandomizedResponse:
        return RandomizedResponse.of(market_response(reg.sensitivity, reg.dimension, level))

    @classmethod
    def sign(cls, c: Canon, reg: StreamRegistration) -> None:
        c.s(reg.product).i(_ones(reg))


def _ones(reg: StreamRegistration) -> int:
    assert reg.rappor_ones is not None  # a rappor registration has one
    return reg.rappor_ones
