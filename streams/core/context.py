"""What every handler of the event path shares: the stores, the secrets, the clock, the rules.

One :class:`Context` is built by :class:`~streams.core.router.MarketCore` and passed down to the
handlers (registrations, values, purchases); they never reach back up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from market import Mechanism, mechanism
from market.pricing import PriceSchedule, schedule_from_spec
from market.rng import KeyedRngFactory

from ..wire.events import UNIT_OF, StreamRegistration
from ..wire.topics import Topics
from .delivery import Deliveries
from .horizon import DedupHorizon
from .keys import MarketKeys
from .outputs import Reject, StreamFigures
from .state import Stores, StreamState

__all__ = ["Context"]


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
    _pricing: dict[str, tuple[StreamRegistration, Mechanism, PriceSchedule]] = field(
        default_factory=dict
    )

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
        return state

    def pricing(self, reg: StreamRegistration) -> tuple[Mechanism, PriceSchedule]:
        """The stream's mechanism and price schedule, built once per registration and worker.

        Cached by stream id together with the registration they were built from, so a stream
        id that another worker registered differently is never priced from a stale entry.
        """
        cached = self._pricing.get(reg.stream_id)
        if cached is None or cached[0] != reg:
            cached = (
                reg,
                mechanism(reg.mechanism, reg.sensitivity),
                schedule_from_spec(reg.pricing.model_dump()),
            )
            self._pricing[reg.stream_id] = cached
        return cached[1], cached[2]

    @staticmethod
    def figures(st: StreamState) -> StreamFigures:
        """The stream's ledger figures for the worker's gauges."""
        reg = st.registration
        return StreamFigures(
            reg.stream_id, reg.mechanism, UNIT_OF[reg.mechanism], st.spent, reg.cap, reg.currency
        )
