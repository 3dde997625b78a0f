"""What every handler of the event path shares: the stores, the secrets, the clock, the rules.

One :class:`Context` is built by :class:`~streams.core.router.MarketCore` and passed down to the
handlers (registrations, values, purchases); they never reach back up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from market import Mechanism, ReleaseChain, mechanism
from market.envelope import Sealer
from market.histogram_chain import HistogramChain
from market.pricing import PriceSchedule, schedule_from_spec, sellable_levels
from market.rng import KeyedRngFactory, NoiseKeys

from ..wire.events import UNIT_OF, StreamRegistration
from ..wire.topics import Topics
from .census import Quota, StreamCensus
from .delivery import Deliveries, release_bytes
from .directory import Directory
from .histograms import histogram_chain
from .horizon import DedupHorizon
from .keys import MarketKeys
from .outputs import Reject, StreamFigures
from .state import Stores, StreamState
from .windows import latest_status

__all__ = ["Context", "Limits", "Terms"]


@dataclass(frozen=True)
class Terms:
    """What a registration fixes for good: the noise family, the prices, the release chain."""

    mechanism: Mechanism
    schedule: PriceSchedule
    chain: ReleaseChain
    #: on a histogram stream, the chain its values are released on (same levels as ``chain``)
    histogram: HistogramChain | None = None


def terms_of(reg: StreamRegistration, *, histogram: bool = True) -> Terms:
    """Build a registration's terms (raises :class:`market.MarketError` if they are invalid);
    with ``histogram`` False, all but a histogram stream's chain, whose survival law is the one
    costly part (a registration checks everything else first)."""
    mech = mechanism(reg.mechanism, reg.release_sensitivity(), reg.dimension)
    chain = ReleaseChain(mech, tuple(sellable_levels(reg.steps, reg.cap)), sealed=reg.sealed)
    return Terms(mech, schedule_from_spec(reg.pricing.model_dump()), chain,
                 histogram_chain(reg, chain.levels) if histogram else None)  # fmt: skip


MAX_CACHED_TERMS = 4096
"""Streams whose terms a worker keeps built at least (a histogram stream's hold its survival law,
about 300 kB at 16 levels, shared by streams with the same parameters); the cache holds
``Limits.max_streams`` if that is more, so a worker holding every stream the market may have
never rebuilds one (a quote on an evicted histogram stream cost a 0.5 s rebuild)."""

VALUE_STEP_OVERHEAD = 2_000
"""Work units one value-step costs beyond its coordinates (see :meth:`Limits.work`)."""


@dataclass(frozen=True)
class Limits:
    """Bounds that keep one event, one message and the whole market finite."""

    #: the broker's maximum message size: no output may exceed it, and inputs above it are
    #: refused before parsing (Kafka's default 1 MiB)
    max_message_bytes: int = 1_048_576
    #: accounts the market will hold (each has an inbox topic)
    max_accounts: int = 100_000
    #: streams the market will hold, and of those histogram streams (each keeps a survival
    #: law of ~300 kB in memory); and both for one seller: split evenly over the input
    #: partitions (core/census.py)
    max_streams: int = 4096
    max_histogram_streams: int = 512
    max_streams_per_seller: int = 1024
    max_histogram_streams_per_seller: int = 128
    #: buyers holding a level on one stream (the stream's record must fit in one message)
    max_holders: int = 2_000
    #: bytes of a refused event's payload kept in its rejection (the rest: size and SHA-256)
    rejection_payload_bytes: int = 4096
    #: most output one event may cause (a value batch reaches every holder): it bounds a
    #: stream's holders by its release size, and a value batch's length by its holders
    max_event_output_bytes: int = 32 * 1024 * 1024
    #: most noise one event may draw, in work units (:meth:`work`, ~40 ns each here): it
    #: bounds a stream's window × steps × dimension, and a value batch's length
    max_event_work: int = 12_000_000

    @staticmethod
    def work(values: int, steps: int, dimension: int) -> int:
        """The cost of walking ``values`` chains ``steps`` steps at ``dimension``: one unit per
        coordinate-step plus :data:`VALUE_STEP_OVERHEAD` per value-step (keying a generator,
        Python overhead), which dominates at small dimensions (measured: 1,000 values of
        dimension 23 up 65 steps take as long as one value of dimension 2·10⁶)."""
        return values * steps * (dimension + VALUE_STEP_OVERHEAD)

    @property
    def stream_quota(self) -> Quota:
        """The bounds on the streams table (:mod:`streams.core.census`)."""
        return Quota(self.max_streams, self.max_histogram_streams, self.max_streams_per_seller,
                     self.max_histogram_streams_per_seller)  # fmt: skip

    def holder_limit(self, dimension: int) -> int:
        """Most holders a stream of ``dimension`` may have: one value reaches them all."""
        per = release_bytes(dimension, sealed=True)  # dimension: a release's width
        return max(1, min(self.max_holders, self.max_event_output_bytes // per))


@dataclass
class Context:
    """The market's state and rules, as the handlers see them."""

    stores: Stores
    keys: MarketKeys
    topics: Topics
    clock: Callable[[], int]
    horizon: DedupHorizon
    deliveries: Deliveries
    directory: Directory
    sealer: Sealer
    limits: Limits = field(default_factory=Limits)
    require_encryption: bool = False
    noise: NoiseKeys = field(init=False)
    rngs: KeyedRngFactory = field(init=False)  # histogram chains' generators
    census: StreamCensus = field(init=False)
    _terms: dict[str, tuple[StreamRegistration, Terms]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.noise = NoiseKeys(self.keys.noise_secret)
        self.rngs = KeyedRngFactory(self.keys.noise_secret)
        self.census = StreamCensus(self.topics, self.stores.streams)

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
        id that another worker registered differently is never served from a stale entry; at
        most :data:`MAX_CACHED_TERMS` (or ``Limits.max_streams``) of them, the least recently
        used dropped.
        """
        cached = self._terms.pop(reg.stream_id, None)
        terms = terms_of(reg) if cached is None or cached[0] != reg else cached[1]
        self.keep_terms(reg, terms)
        return terms

    def keep_terms(self, reg: StreamRegistration, terms: Terms) -> None:
        """Cache a registered stream's terms (only a stored stream's: a refused registration's
        would crowd out the streams the market holds)."""
        self._terms.pop(reg.stream_id, None)
        self._terms[reg.stream_id] = (reg, terms)  # newest last: the least recently used go first
        while len(self._terms) > max(MAX_CACHED_TERMS, self.limits.max_streams):
            del self._terms[next(iter(self._terms))]

    @staticmethod
    def figures(st: StreamState) -> StreamFigures:
        """The stream's ledger figures for the worker's gauges."""
        reg = st.registration
        ws = latest_status(st)
        return StreamFigures(
            reg.stream_id, reg.mechanism, UNIT_OF[reg.mechanism], st.spent, reg.cap, reg.currency,
            None if ws is None else ws.spent, None if ws is None else ws.cap,
        )  # fmt: skip
