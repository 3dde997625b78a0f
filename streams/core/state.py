"""The market's state: one record per stream, per value and per purchase, and their stores.

=============  =========================  ===================================================
store          key                        value
=============  =========================  ===================================================
``registered`` ``stream_id``             :class:`Registered`: the seller's signed registration
                                          as accepted (noise secret's fingerprint, time,
                                          catalog entry); written once, never changed
``streams``    ``stream_id``              :class:`StreamRecord`: window, holders, revenue,
                                          privacy spent, watermarks (what changes; rewritten
                                          after every event that changes the stream)
``releases``   ``stream_id/value_id``     the value's :class:`~market.chain.ChainState` (exact
                                          numbers and cached steps; on a histogram stream a
                                          :class:`~market.histogram_chain.HistogramValue`, the
                                          exact counts) while it is in its stream's window,
                                          then an :class:`EvictedValue` marker until the
                                          dedup horizon
``purchases``  ``buyer/stream/purchase``  :class:`PurchaseRecord`: the decision (levels,
                                          price, values covered, digest of the outcome)
``accounts``   ``account_id``             :class:`~streams.wire.events.AccountState`: keys
``holders``    ``stream_id/slot``         :class:`HoldersBase`: a stream's holders as of a
                                          generation, in one of two slots (its record then
                                          carries only the holders changed since)
=============  =========================  ===================================================

Any ``MutableMapping`` works as a store: dicts in tests, write-back Faust tables in the worker.
Handlers always re-assign a record after changing it, so a table sends its changelog.

**A stream in two records.** How a stream was registered never changes, and is most of its
bytes (a registration and its catalog entry: ~2.2 kB of a ~3.3 kB record), while the rest
changes with every value and purchase. So the core holds a stream as one
:class:`StreamState` (a :class:`StreamRecord` that also carries its :class:`Registered`:
handlers read ``state.registration``), and the stores keep the two apart: ``registered`` is
written once (:mod:`streams.core.stream_store`, its one writer), and the codec of ``streams``
never writes the registration (:mod:`.codecs`). Both are keyed by stream id, so they are
partitioned alike and a worker that takes a partition over recovers both. A stream is
registered if and only if its ``streams`` record exists. Both are written in the batch that
registers the stream, and a batch counts wholly or not at all (:mod:`streams.worker.recovery`),
so neither is ever found without the other.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator, with_config

from market import ChainState
from market.histogram_chain import HistogramValue
from market.privacy_units import spend_of

from ..wire.events import AccountState, StreamRegistration
from .holds import HOLD_BYTES, MAX_KEPT, Hold

__all__ = [
    "BATCH_NUMBERS_BYTES",
    "BATCH_WINDOW",
    "PURCHASE_RECORD_BYTES",
    "VALUE_MARK_BYTES",
    "BaseRef",
    "BatchNumbers",
    "EvictedValue",
    "Holder",
    "HoldersBase",
    "InconsistentStream",
    "PurchaseRecord",
    "Registered",
    "Stores",
    "StreamRecord",
    "StreamState",
    "ValueEntry",
    "ValueState",
    "holders_key",
    "record_key",
    "registered_bound",
    "registered_of",
    "stream_record_bound",
    "with_registration",
]


def _empty(counts: dict[int, int]) -> bool:
    """A stream's record leaves out counts it keeps none of (streams without a share)."""
    return not counts


def record_key(*parts: str) -> str:
    """Key of a record that belongs to a stream or a buyer: ``owner/id``."""
    return "/".join(parts)


@with_config(ConfigDict(extra="forbid"))
@dataclass(slots=True)
class ValueEntry:
    """A value in its stream's window (newest last).

    A slotted dataclass, not a model: a stream keeps up to ``retain_last`` of these, and as a
    model each took ~1.2 kB of heap (its ``__dict__`` and fields-set), as much as the rest of
    a small value's state together; slotted, ~0.2 kB. The JSON (changelog) is the same. A
    standard one, not pydantic's: the core makes one per value from numbers it has checked,
    and pydantic checks them where they come in, when a record is read from its store.
    """

    value_id: str
    seq: int
    digest: str
    received_at_ms: int
    published_at_ms: int = 0
    #: the largest level released of the value, to anyone: with lossless release, the value's
    #: whole privacy cost (what a ``window`` stream's windows add up)
    level: float = 0.0


class Holder(BaseModel):
    """What one buyer holds on one stream (releases are sealed for its account's key)."""

    model_config = ConfigDict(extra="forbid")
    level: float
    paid_minor: int = 0
    purchases: int = 0


class BaseRef(BaseModel):
    """Which holders base a stream's record completes: its slot (0 or 1) and generation."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    slot: int
    gen: int


class HoldersBase(BaseModel):
    """Every holder of a stream as of generation ``gen``: what a stream's record with many
    holders refers to, so that the record carries only the holders changed since
    (:mod:`streams.core.stream_store` writes both and puts them together again)."""

    model_config = ConfigDict(extra="forbid")
    gen: int
    holders: dict[str, Holder] = {}


def holders_key(stream_id: str, slot: int) -> str:
    """Key of a stream's holders base in ``slot`` (0 or 1)."""
    return record_key(stream_id, str(slot))


class Registered(BaseModel):
    """A stream as the market accepted it: what never changes once it is registered.

    A stream id is taken for good: the identical registration sent again re-emits the catalog
    entry, any other is refused (:mod:`streams.core.registrations`). So this is written once,
    into its own store, and a stream's record, rewritten after every event, need not carry it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    registration: StreamRegistration
    #: fingerprint of the noise secret the stream's releases are keyed with; a worker with
    #: another secret refuses to serve the stream rather than re-noise it
    secret_fingerprint: str
    accepted_at_ms: int
    #: the catalog entry's JSON, re-emitted byte for byte when the registration is resent
    catalog_payload: str


BATCH_WINDOW = 256
"""How far above the numbers a stream has applied without a gap a seller's batch may be
numbered: the most numbers :attr:`BatchNumbers.above` holds."""
BATCH_NUMBERS_BYTES = 17 * BATCH_WINDOW + 64
"""Upper bound on the JSON of a :class:`BatchNumbers` (numbers below 2⁵³: 16 digits and a
comma each)."""


class BatchNumbers(BaseModel):
    """Which of its seller's numbered value batches a stream has applied
    (:mod:`streams.core.replay.numbers`): every number up to ``through``, and the numbers in
    ``above``, all greater than ``through`` and at most a window beyond it (so the record is
    the same size at any rate)."""

    model_config = ConfigDict(extra="forbid")
    through: int = 0
    above: list[int] = Field(default_factory=list, exclude_if=lambda v: not v)


class StreamRecord(BaseModel):
    """What changes about a stream: the record its store holds, written after every event that
    changes it (how it was registered is in :class:`Registered`, apart)."""

    model_config = ConfigDict(extra="forbid")
    window: list[ValueEntry] = []
    next_seq: int = 0
    #: who holds what: every holder, or in a stored record that names a ``holders_base`` only
    #: those changed since that base (:mod:`streams.core.stream_store`)
    holders: dict[str, Holder] = {}
    #: the holders base the stored record completes (None: ``holders`` is every holder)
    holders_base: BaseRef | None = None
    revenue_minor: int = 0
    #: the largest level released of any of the stream's values, in nano-units rounded up
    #: (:mod:`streams.core.privacy_units`)
    spent_nano: int = 0
    values_ingested: int = 0
    #: newest publication time accepted on the stream; values older than this minus the dedup
    #: horizon are refused, which is what allows forgetting their eviction markers
    watermark_ms: int = 0
    #: the same for purchases: outcomes older than it minus the horizon are forgotten
    purchase_watermark_ms: int = 0
    #: on a ``window`` stream: window index → sum over its values of their largest level,
    #: each in nano-units rounded up (:mod:`streams.core.ledger`); windows no value can join or
    #: be re-released into are dropped, at most ``MAX_RECENT_WINDOWS`` beyond those of the
    #: values in ``window``
    window_spent_nano: dict[int, int] = {}
    #: windows at or below this index without an entry in ``window_spent_nano`` are closed:
    #: their sums were dropped, so a value published into one is refused (-1: none closed)
    window_floor: int = -1
    #: on a ``window`` stream with a ``buyer_share``: window index → values published into it
    #: (:mod:`streams.core.quotas`), kept and dropped with the window's sum by the ledger
    window_values: dict[int, int] = Field(default_factory=dict, exclude_if=_empty)
    #: buyers' reservations: terms and privacy room held for a while (:mod:`.holds`)
    reservations: list[Hold] = []
    #: the seller's numbered value batches applied (absent until the first one: records of
    #: streams that never had one keep their bytes)
    batch_numbers: BatchNumbers | None = Field(None, exclude_if=lambda v: v is None)

    @model_validator(mode="before")
    @classmethod
    def _float_sums(cls, data: object) -> object:
        """Read a record an earlier version wrote, with the stream's spent and its window sums
        as floating-point levels (``spent``, ``window_spent``): each becomes nano-units rounded
        up from its canonical decimal, so what was spent is never counted as less."""
        if not isinstance(data, dict) or not {"spent", "window_spent"} & data.keys():
            return data
        data = dict(data)
        if "spent" in data:
            spent = _legacy_spend(float(data.pop("spent")))
            data["spent_nano"] = max(spent, int(data.get("spent_nano", 0)))
        if "window_spent" in data:
            sums = {k: _legacy_spend(float(v)) for k, v in data.pop("window_spent").items()}
            ints = data.get("window_spent_nano") or {}
            data["window_spent_nano"] = {
                k: max(v, int(ints.get(k, 0))) for k, v in {**ints, **sums}.items()
            }
        return data


LEGACY_MARGIN = 2.0**-30
"""Relative margin on a float sum an earlier version wrote: a sum of n positive doubles is
within n·2⁻⁵³ of the exact sum (each addition rounds by at most half an ulp of a partial sum,
which is at most the total), so this covers 2²³ additions; it over-counts by 10⁻⁹ relative."""


def _legacy_spend(total: float) -> int:
    """An earlier version's float spend or window sum in nano-units, never below the exact sum
    of the levels it added up."""
    return spend_of(total * (1.0 + LEGACY_MARGIN))


class StreamState(StreamRecord):
    """A stream as the core sees it: its record, and how it was registered.

    In memory one object, so handlers read ``state.registration`` and a stream is never
    half there; in the stores two records (the module docstring): the codec of ``streams``
    leaves ``registered`` out, and the stream store writes it, once, to ``registered``.
    """

    registered: Registered

    @property
    def registration(self) -> StreamRegistration:
        """The seller's signed registration (fixed for good)."""
        return self.registered.registration


#: upper bounds on the JSON of one window entry and one holder with 64-character ids, and of
#: one privacy window's sum and count of values
WINDOW_ENTRY_BYTES = 300
HOLDER_BYTES = 160
WINDOW_SUM_BYTES = 48
WINDOW_COUNT_BYTES = 48
#: privacy-window sums a stream keeps besides those of the values it retains
MAX_RECENT_WINDOWS = 256


def stream_record_bound(
    retain_last: int, max_holders: int, *, windowed: bool = False, shared: bool = False
) -> int:
    """Most bytes a stream's record can take: a full window, every holder, every privacy-window
    sum (and, ``shared``: with a per-buyer share, every window's count of values), every
    reservation kept.

    The registration is refused if this (or :func:`registered_bound`) exceeds the message
    limit, so a stream's state can always be written (``tests/streams/core/test_core.py`` checks
    the bound at its extremes).
    """
    return (
        WINDOW_ENTRY_BYTES * retain_last
        + HOLDER_BYTES * max_holders
        + (WINDOW_SUM_BYTES * (retain_last + MAX_RECENT_WINDOWS + 1) if windowed else 0)
        + (WINDOW_COUNT_BYTES * (retain_last + MAX_RECENT_WINDOWS + 1) if shared else 0)
        + HOLD_BYTES * MAX_KEPT
        + BATCH_NUMBERS_BYTES
        + 1024
    )


def registered_bound(catalog_bytes: int) -> int:
    """Most bytes a stream's :class:`Registered` record can take: its catalog entry twice (the
    registration inside it, and the entry as a string, each character escaped at worst)."""
    return 3 * catalog_bytes + 1024


@dataclass(slots=True)
class PurchaseRecord:
    """The decision on one purchase: what a resend must meet again, not the bytes it was sent.

    Noise is a pure function of the request, receipts are deterministic and envelopes are
    sealed with nonces derived from what they seal, so a fulfilment is recomputed from this
    decision and the values it covered (:mod:`streams.core.purchases`); ``digest`` proves the
    recomputed bytes are the ones first sent. Kept for the dedup horizon, so it is small: at
    most :data:`PURCHASE_RECORD_BYTES` in the store's codec (:mod:`.codecs`).

    ``payload`` holds the outcome's bytes only while they may not have been sent yet and a
    replay could not recompute them (the batch that decided it evicted a value it covered:
    :meth:`~.replay.records.Records.evicted`, until :meth:`~.replay.records.Records.settle`),
    and in a record an earlier version stored (its outcome is answered verbatim until the
    horizon).
    """

    fingerprint: str
    status: Literal["fulfilled", "rejected"]
    stream_id: str
    requested_at_ms: int = 0
    price_minor: int = 0
    #: the levels held before and after: what the purchase bought
    level_before: float = 0.0
    level_after: float = 0.0
    #: the values it covered: the window entries numbered ``first_seq … first_seq + count − 1``
    first_seq: int = 0
    count: int = 0
    #: the market's clock when it was decided
    decided_at_ms: int = 0
    #: SHA-256 (hex) of the outcome's bytes (a fulfilment; empty for a refusal)
    digest: str = ""
    #: a refusal's reason code
    reason: str = ""
    payload: str | None = None

    @property
    def seqs(self) -> range:
        """The arrival numbers of the values the purchase covered."""
        return range(self.first_seq, self.first_seq + self.count)


PURCHASE_RECORD_BYTES = 256
"""Most bytes a decided purchase's record takes in its store (64-character ids)."""
VALUE_MARK_BYTES = 64
"""Most bytes a value's eviction mark takes in its store."""


@dataclass(frozen=True, slots=True)
class EvictedValue:
    """What remains of a value that left its stream's window: enough to recognise a resend,
    until the value is older than the dedup horizon (then any resend is refused as too old)."""

    seq: int
    digest: str
    published_at_ms: int = 0

    @classmethod
    def of(cls, entry: ValueEntry) -> EvictedValue:
        """The mark a value leaves when it leaves its stream's window."""
        return cls(entry.seq, entry.digest, entry.published_at_ms)


ValueState = ChainState | HistogramValue | EvictedValue


class InconsistentStream(RuntimeError):
    """A stream's record has no registration: the stream is not served, and its events are
    answered ``internal_error``; scans over every stream (the census, the ledger) skip it.
    (A batch writes both or neither, so only a bug or a state that did not verify leads
    here.)"""


def registered_of(stores: Stores, stream_id: str, record: StreamRecord) -> Registered:
    """How the stream of a stored record was registered: what the record carries (a stream
    loaded in memory), else its ``registered`` record, written in the same batch."""
    if isinstance(record, StreamState):
        return record.registered
    registered = stores.registered.get(stream_id)
    if registered is None:
        raise InconsistentStream(
            f"stream {stream_id!r} has a record but the registered store does not hold its "
            "registration: its state is inconsistent"
        )
    return registered


def with_registration(stores: Stores, stream_id: str, record: StreamRecord) -> StreamState:
    """A stored record with how its stream was registered (the record itself if it carries
    it), to read: its holders are those it stores (:func:`~.stream_store.holders_of`)."""
    if isinstance(record, StreamState):
        return record
    registered = registered_of(stores, stream_id, record)
    return StreamState.model_construct(**dict(record), registered=registered)


class Stores:
    """The stores the core reads and writes (see the module docstring)."""

    #: their names, as attributes here and as tables (each with its changelog) in the worker
    NAMES = ("registered", "streams", "releases", "purchases", "accounts", "holders")

    def __init__(
        self,
        streams: MutableMapping[str, StreamRecord] | None = None,
        releases: MutableMapping[str, ValueState] | None = None,
        purchases: MutableMapping[str, PurchaseRecord] | None = None,
        accounts: MutableMapping[str, AccountState] | None = None,
        holders: MutableMapping[str, HoldersBase] | None = None,
        registered: MutableMapping[str, Registered] | None = None,
    ) -> None:
        self.registered: MutableMapping[str, Registered] = {} if registered is None else registered
        self.streams: MutableMapping[str, StreamRecord] = {} if streams is None else streams
        self.releases: MutableMapping[str, ValueState] = {} if releases is None else releases
        self.purchases: MutableMapping[str, PurchaseRecord] = {} if purchases is None else purchases
        self.accounts: MutableMapping[str, AccountState] = {} if accounts is None else accounts
        self.holders: MutableMapping[str, HoldersBase] = {} if holders is None else holders
