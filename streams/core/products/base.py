"""What every product shares: the protocol a product implements, and the steps all take.

A *product* is what a stream sells of its values (:mod:`streams.core.products`). The handlers
drive every product through the same few calls — read a value, recognise a resend, ingest,
re-release, release the window for a purchase — and the steps every product takes in the same
way (a value's identity, retiring old values, storing a state, delivering) live here once.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from market import ChainState
from market.accuracy import AccuracyNotForSaleError
from market.histogram_chain import HistogramValue
from market.mechanisms import check_range
from market.receipts import RECEIPT_VERSION, ReleaseTriple

from ...wire.counts import count_problem, sells_counts
from ...wire.events import ReleasedValue, StreamRegistration, ValueItem
from ...wire.products import ProductFields, section_of
from ..context import Context
from ..delivery import Listed, Release
from ..ledger import Level
from ..outputs import Reject
from ..replay.watermarks import cap_values
from ..state import EvictedValue, ValueEntry, ValueState, record_key
from ..stream import Stream
from ..terms import Terms

__all__ = [
    "Exact",
    "Product",
    "check_counts",
    "deliver",
    "digest_values",
    "drop_state",
    "numbers",
    "retire",
    "store_state",
    "value_identity",
]

Identity = tuple[str, str, str]


def digest_values(arr: np.ndarray[Any, Any]) -> str:
    """SHA-256 of a value's exact numbers as little-endian f64 or i64 (what makes a resend
    identical, and part of its noise's identity: ``docs/protocol.md`` §1.3)."""
    little = np.ascontiguousarray(arr, arr.dtype.newbyteorder("<"))
    return hashlib.sha256(little.tobytes()).hexdigest()


def value_identity(stream_id: str, value_id: str, digest: str) -> Identity:
    """What a value's noise is keyed by: other numbers under the same id get other noise."""
    return (stream_id, value_id, digest)


@dataclass(frozen=True)
class Exact:
    """A value as published, checked: its exact numbers (or counts) and their digest."""

    value: NDArray[Any] | HistogramValue
    digest: str


class Product(ABC):
    """What one kind of stream sells: how its values are read, kept and released.

    One instance per registered stream (built with its terms, cached with them); the class
    methods answer what a registration costs before anything is built.
    """

    name: ClassVar[str]
    #: its wire section: the registration fields only it has, their checks and math
    fields: ClassVar[type[ProductFields]]
    #: the receipt format of a purchase (a keyed product's digest covers its keys)
    receipt_version: ClassVar[int] = RECEIPT_VERSION

    def __init__(self, reg: StreamRegistration, terms: Terms) -> None:
        self.reg = reg
        self.terms = terms

    # -- what a registration costs --------------------------------------------------------------
    @classmethod
    def chains_walked(cls, reg: StreamRegistration, values: int) -> int:
        """How many chains releasing ``values`` consecutive values walks at most."""
        return values

    @classmethod
    def work_width(cls, reg: StreamRegistration) -> int:
        """Work units per value-step beyond the fixed overhead: the numbers a release carries."""
        return reg.release_width()

    @classmethod
    def error_factor(cls, reg: StreamRegistration) -> float:
        """What one chain's error is multiplied by in the least accurate release sold."""
        return 1.0

    @classmethod
    def accuracy_refusal(cls, reg: StreamRegistration, exc: AccuracyNotForSaleError) -> str:
        """What a buyer whose accuracy target no level meets is told: the best level for sale,
        and how to buy it."""
        return f"{exc}; buy that level with target_level {exc.best:g}"

    # -- values ---------------------------------------------------------------------------------
    @abstractmethod
    def exact(self, item: ValueItem) -> Exact:
        """The value's exact numbers and digest, or a refusal saying what is wrong with it."""

    def known(self, ctx: Context, stream: Stream[Any], value_id: str) -> ValueState | None:
        """What the market keeps of a value it has seen (its state or mark), ``None`` if it is
        new."""
        return ctx.records.value(record_key(stream.id, value_id))

    def prepare(  # noqa: B027 - optional hook, default: nothing
        self, ctx: Context, stream: Stream[Any], values: Sequence[tuple[ValueItem, Exact]]
    ) -> None:
        """Before a batch's values are ingested one by one, do at once what each would do
        alone (nothing by default; what is prepared is forgotten by :meth:`prepared_done`).
        ``values``: the batch's values :meth:`exact` did not refuse, with their numbers."""

    def prepared_done(self) -> None:  # noqa: B027 - optional hook, default: nothing
        """Forget what :meth:`prepare` did for the batch."""

    @abstractmethod
    def ingest(
        self, ctx: Context, stream: Stream[Any], item: ValueItem, exact: Exact
    ) -> tuple[int, int]:
        """Keep a new value and release it to the holders; return (releases queued, new chain
        steps computed)."""

    @abstractmethod
    def resend(
        self, ctx: Context, stream: Stream[Any], value_id: str, known: ValueState
    ) -> tuple[int, int]:
        """A value sent again with the same numbers: its releases again (the same bytes), to
        the holders it is still retained for; return (releases queued, new steps computed)."""

    @staticmethod
    def listed(release: Release) -> Listed:
        """A release as JSON-ready lists: its numbers (a keyed product lists its keys too)."""
        assert not isinstance(release, tuple)  # a keyed product's: listed by its own method
        return release.tolist(), None

    # -- purchases ------------------------------------------------------------------------------
    @staticmethod
    def committed(release: ReleasedValue) -> ReleaseTriple:
        """What a purchase receipt's commitment covers of one release: its value id, level and
        numbers (a keyed product's adds its keys, in its :attr:`receipt_version`)."""
        return (release.value_id, release.level, release.values)

    @abstractmethod
    def release_window(
        self, ctx: Context, stream: Stream[Any], level: float
    ) -> tuple[list[ReleasedValue], int]:
        """Every retained value released at ``level`` (what a purchase returns), and the new
        chain steps computed."""


def numbers(
    terms: Terms, reg: StreamRegistration, item: ValueItem, *, bounded: bool = True
) -> Exact:
    """A value of numbers (not keys), checked for the stream's noise family; ``bounded``: its
    magnitude within what the release grids hold (a running total bounds its nodes instead)."""
    if item.keys is not None:
        raise Reject(
            "invalid_value",
            f"value {item.value_id!r} has keys, but stream {reg.stream_id!r} is not a histogram "
            "stream: send its numbers in `values` only",
        )
    check_counts(reg, item)
    exact = terms.mechanism.validate_value(item.values, dimension=reg.dimension)
    if bounded:
        check_range(exact, terms.chain.value_limit)
    return Exact(exact, digest_values(exact))


def check_counts(reg: StreamRegistration, item: ValueItem) -> None:
    """Refuse (``invalid_count``) a value of a counts stream holding a negative or fractional
    number (:mod:`streams.wire.counts`); any other stream takes any finite number. The refusal
    names a number of a product whose values are counts (a histogram's) a ``count``, and the
    product after the mechanism."""
    if not sells_counts(reg):
        return
    bad = count_problem(item.values)
    if bad is not None:
        section = section_of(reg)
        what, kind = ("count", f" {section.noun}") if section.takes_counts else ("coordinate", "")
        raise Reject(
            "invalid_count",
            f"value {item.value_id!r}: {what} {bad[0]} (counting from 0) {bad[1]}; stream "
            f"{reg.stream_id!r} takes counts ({reg.mechanism}{kind}): whole numbers, 0 or more",
        )


def retire(ctx: Context, stream: Stream[Any]) -> None:
    """Keep the newest ``retain_last`` values: an older one leaves a mark until the horizon
    (or the stream's cap on marks); forget the marks and window sums no longer needed."""
    sid = stream.id
    gone = stream.evict()
    for old in gone:
        ctx.records.mark_value(
            sid, record_key(sid, old.value_id), EvictedValue.of(old), expires=True
        )
    if gone:
        ctx.records.evicted(sid, gone[-1].seq)
    ctx.records.forget_values(sid, stream.state.watermark_ms)
    cap_values(ctx.records, stream)
    stream.ledger.prune(ctx.records.horizon_ms)


def store_state(ctx: Context, key: str, state: ChainState | HistogramValue) -> None:
    """Store a value's state: a chain state with its cache trimmed so the record fits in one
    message, and packed (a histogram value is only its counts)."""
    if isinstance(state, ChainState):
        state.trim(ctx.limits.max_message_bytes // 2)
        state.pack()  # at rest: one array for its steps (market.chain.ChainState, Notes)
    ctx.stores.releases[key] = state


def drop_state(ctx: Context, key: str) -> None:
    """Forget a state no release needs any more (a running total's merged tree node)."""
    ctx.stores.releases.pop(key, None)


def deliver(
    ctx: Context,
    stream: Stream[Any],
    entry: ValueEntry,
    by_level: Mapping[float, Release],
    held: set[Level],
) -> int:
    """Queue the value's releases for the holders whose level is in ``by_level``; tell the
    others (only a privacy window, or a buyer's share of it, withholds) it is withheld, and
    why. Return the releases queued."""
    product = stream.product
    listed = {lv: product.listed(r) for lv, r in by_level.items()}
    released = ctx.deliveries.queue(stream.state, entry.value_id, entry.seq, listed)
    missing = {lv for lv in held if lv.value not in by_level}
    if missing:
        ledger = stream.ledger
        assert ledger.windowed, f"levels held but not released: {missing}"
        window = ledger.window_of(entry.published_at_ms)
        ctx.deliveries.withhold(
            stream.state,
            entry.value_id,
            window,
            set(by_level),
            lambda level: ledger.over_share(level, window),
        )
    return released
