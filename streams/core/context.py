"""What every handler of the event path shares: the stores, the secrets, the clock, the rules.

One :class:`Context` is built by :class:`~streams.core.router.MarketCore` and passed down to the
handlers (registrations, values, purchases); they never reach back up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from market.envelope import Sealer
from market.rng import KeyedRngFactory, NoiseKeys

from ..wire.signing import MarketRef
from ..wire.topics import Topics
from .allowance import Allowance
from .census import Quota, StreamCensus
from .delivery import Deliveries, release_bytes
from .directory import Directory
from .inbox_records import InboxRecords
from .keys import MarketKeys
from .refusal_budget import RefusalBounds
from .replay import Admission, Records
from .replay.quotes import AnsweredQuotes
from .replay.records import Caps
from .sales import SaleNotices
from .state import Stores

__all__ = ["Context", "Limits"]


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
    max_streams_per_seller: int = 64
    max_histogram_streams_per_seller: int = 16
    #: accounts opened a minute in the whole market, split evenly over the input partitions,
    #: and quotes one account may ask a minute: what anyone may create for free
    #: (core/allowance.py)
    max_openings_per_minute: int = 600
    max_quotes_per_minute: int = 60
    #: "invite": an opening needs the operators' invitation (docs/protocol.md §6.1.1), the
    #: deployment's default; "open": anyone may open an account (local use), within the
    #: openings allowance (core/allowance.py)
    openings: Literal["invite", "open"] = "open"
    #: in an open market, the proof of work an opening carries, in bits (wire/work.py; 0: none)
    opening_work: int = 0
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
    #: records one stream keeps at most for the dedup horizon (purchases, eviction marks)
    record_caps: Caps = field(default_factory=Caps)
    #: answers to events no account was proven to send, per input partition and interval
    refusals: RefusalBounds = field(default_factory=RefusalBounds)

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
        return Quota(
            self.max_streams,
            self.max_histogram_streams,
            self.max_streams_per_seller,
            self.max_histogram_streams_per_seller,
        )

    def holder_limit(self, dimension: int) -> int:
        """Most holders a stream of ``dimension`` may have: one value reaches them all."""
        per = release_bytes(dimension, sealed=True)  # dimension: a release's width
        return max(1, min(self.max_holders, self.max_event_output_bytes // per))


@dataclass
class Context:
    """The market's services, as the handlers and products see them: the stores, the secrets,
    the clock, the rules, the replay records and the deliveries."""

    stores: Stores
    keys: MarketKeys
    topics: Topics
    clock: Callable[[], int]
    records: Records
    admission: Admission
    deliveries: Deliveries
    directory: Directory
    sealer: Sealer
    limits: Limits = field(default_factory=Limits)
    require_encryption: bool = False
    noise: NoiseKeys = field(init=False)
    rngs: KeyedRngFactory = field(init=False)  # histogram chains' generators
    census: StreamCensus = field(init=False)
    allowance: Allowance = field(init=False)
    quotes: AnsweredQuotes = field(init=False)
    sold: SaleNotices = field(init=False)  # the batch's sales, told per seller
    market: MarketRef = field(init=False)
    """What every signature the market accepts names: its prefix and its key id (§2)."""
    inbox_records: InboxRecords = field(init=False)
    """Seals inbox messages into v2 records (a market with v2 inboxes, §8.5)."""

    def __post_init__(self) -> None:
        self.market = MarketRef(self.topics.prefix, self.keys.key_id)
        self.noise = NoiseKeys(self.keys.noise_secret)
        self.rngs = KeyedRngFactory(self.keys.noise_secret)
        self.census = StreamCensus(self.topics, self.stores)
        self.allowance = Allowance(
            self.limits.max_openings_per_minute,
            self.limits.max_quotes_per_minute,
            self.topics.partitions,
            self.clock,
        )
        self.quotes = AnsweredQuotes(self.clock)
        self.sold = SaleNotices(self.topics)
        self.inbox_records = InboxRecords(
            self.topics, self.keys, self._sealing_key_of, self.limits.max_message_bytes
        )

    def _sealing_key_of(self, account_id: str) -> str | None:
        state = self.directory.get(account_id)
        return state.sealing_key if state is not None else None
