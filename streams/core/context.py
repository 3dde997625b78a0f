"""What every handler of the event path shares: the stores, the secrets, the clock, the rules.

One :class:`Context` is built by :class:`~streams.core.router.MarketCore` and passed down to the
handlers (registrations, values, purchases); they never reach back up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from market import Mechanism, ReleaseChain, mechanism
from market.pricing import PriceSchedule, schedule_from_spec, sellable_levels
from market.rng import KeyedRngFactory

from ..wire.events import UNIT_OF, StreamRegistration
from ..wire.topics import Topics
from .delivery import Deliveries
from .horizon import DedupHorizon
from .keys import MarketKeys
from .outputs import Reject, StreamFigures
from .state import Stores, StreamState

__all__ = ["Context", "Terms"]


@dataclass(frozen=True)
class Terms:
    """What a registration fixes for good: the noise family, the prices, the release chain."""

    mechanism: Mechanism
    schedule: PriceSchedule
    chain: ReleaseChain


def terms_of(reg: StreamRegistration) -> Terms:
    """Build a registration's terms (raises :class:`market.MarketError` if they are invalid)."""
    mech = mechanism(reg.mechanism, reg.sensitivity)
    chain = ReleaseChain(mech, tuple(sellable_levels(reg.steps, reg.cap)), sealed=reg.sealed)
    return Terms(mech, schedule_from_spec(reg.pricing.model_dump()), chain)


@dataclass
class Context:
    """The market's state and rules, as the handlers see them."""

    stores: Stores
    keys: MarketKeys
    topics: Topics
    clock: Callable[[], int]
    horizon: DedupHorizon
    deliveries: Deliveries
    require_encryption: bool = False
    rngs: KeyedRngFactory = field(init=False)
    _terms: dict[str, tuple[StreamRegistration, Terms]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rngs = KeyedRngFactory(self.keys.noise_secret)

    def stream(self, stream_id: str) -> StreamState:
        """The stream's state, or a ``unknown_stream`` rejection."""
        state = self.stores.streams.get(stream_id)
        if state is None:
            raise Reject(
                "unknown_stream",
                f"stream {stream_id!r} is not registered; check the catalog for available streams",
            )
        if state.secret_fingerprint != self.keys.noise_fingerprint:
            raise Reject(
                "market_secret_mismatch",
                f"stream {stream_id!r} was registered by a market whose noise secret has "
                f"fingerprint {state.secret_fingerprint}, but this worker's is "
                f"{self.keys.noise_fingerprint}; serving it would re-noise released levels. "
                "Operators: start the worker with the market's EMARKET_NOISE_SECRET",
            )
        return state

    def terms(self, reg: StreamRegistration) -> Terms:
        """The stream's terms, built once per registration and worker.

        Cached by stream id together with the registration they were built from, so a stream
        id that another worker registered differently is never served from a stale entry.
        """
        cached = self._terms.get(reg.stream_id)
        if cached is None or cached[0] != reg:
            cached = (reg, terms_of(reg))
            self._terms[reg.stream_id] = cached
        return cached[1]

    @staticmethod
    def figures(st: StreamState) -> StreamFigures:
        """The stream's ledger figures for the worker's gauges."""
        reg = st.registration
        return StreamFigures(
            reg.stream_id, reg.mechanism, UNIT_OF[reg.mechanism], st.spent, reg.cap, reg.currency
        )
