"""A registration's terms: the noise family, the price schedule and the release chain.

They are fixed for good when a stream is registered, and rebuilt from the registration by any
worker (:mod:`streams.core.stream_store` caches them); what a product adds to them (a histogram
stream's survival law) is its product's (:mod:`streams.core.products`).
"""

from __future__ import annotations

from dataclasses import dataclass

from market import Mechanism, ReleaseChain, mechanism
from market.pricing import PriceSchedule, schedule_from_spec, sellable_levels

from ..wire.events import StreamRegistration

__all__ = ["Terms", "terms_of"]


@dataclass(frozen=True)
class Terms:
    """What a registration fixes for good: the noise family, the prices, the release chain."""

    mechanism: Mechanism
    schedule: PriceSchedule
    chain: ReleaseChain

    @property
    def levels(self) -> tuple[float, ...]:
        """The levels for sale (the steps, and the cap if above them), increasing."""
        return self.chain.levels


def terms_of(reg: StreamRegistration) -> Terms:
    """Build a registration's terms (raises :class:`market.MarketError` if they are invalid)."""
    mech = mechanism(reg.mechanism, reg.release_sensitivity(), reg.dimension)
    chain = ReleaseChain(mech, tuple(sellable_levels(reg.steps, reg.cap)), sealed=reg.sealed)
    return Terms(mech, schedule_from_spec(reg.pricing.model_dump()), chain)
