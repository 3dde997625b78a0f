"""Every event on every topic, as versioned pydantic models.

Each model carries ``schema_version`` (currently 1) and a ``type`` discriminator, forbids unknown
fields and is frozen. ``python -m streams schemas`` exports their JSON Schemas to
``docs/schemas/`` so a client in any language can produce and consume them. Floats are JSON
numbers written with the shortest round-trip representation, so a release survives a JSON round
trip bit for bit in any language that parses doubles correctly.

Every event a seller or buyer sends is **signed** with its account's Ed25519 key: ``key_id`` names
the key and ``signature`` covers the canonical bytes of every field that matters, defined in
:mod:`streams.wire.signing` (not the JSON text, so any language can reproduce them).

Topic → payload:

==========================  ==================================================================
``<p>.accounts``            :class:`OpenAccount` or :class:`RotateKeys` (party → market)
``<p>.registrations``       :class:`StreamRegistration` (seller → market)
``<p>.catalog``             :class:`CatalogEntry` (market → everyone, compacted)
``<p>.values``              :class:`ValueBatch` (seller → market)
``<p>.purchases``           :class:`PurchaseRequest`, :class:`QuoteRequest` or
                            :class:`ReserveRequest` (buyer → market)
``<p>.inbox.<account_id>``  :class:`AccountState`, :class:`ValuesAccepted`,
                            :class:`PurchaseFulfilled`, :class:`ValueReleased`,
                            :class:`DeliveriesWithheld`, :class:`QuoteAnswer`,
                            :class:`Reservation` or :class:`Rejection` (market → one party)
``<p>.rejections``          :class:`Rejection` (every refused event, for operators)
``<p>.deadletters``         :class:`DeadLetter` (outputs the broker refused for good)
``<p>.market``              :class:`MarketIdentity` (which noise secret made the state)
==========================  ==================================================================
"""

from __future__ import annotations

import itertools
import math
from dataclasses import fields
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from market.errors import DuplicateLevelError, ScheduleError
from market.pricing import table_levels
from market.privacy_units import NANO_DIGITS, cap_of, level_of, whole_nanos
from market.receipts import Receipt

from .holding import MAX_HOLD_MS, MIN_HOLD_MS
from .ids import ID_PATTERN
from .products import check as check_product
from .products import section_of
from .products.histogram import HistogramSpec, KeySpace
from .products.rappor import MAX_RAPPOR_ONES, RandomizedResponse
from .products.totals import MAX_TREE_HEIGHT, TotalsFields
from .safe_integers import MAX_SAFE_INTEGER, safe_integer
from .trusted import trusted

__all__ = [
    "ACCOUNTS_EVENT",
    "ID_PATTERN",
    "INBOX_EVENT",
    "MAX_HOLD_MS",
    "MAX_RETIRED_KEYS",
    "MAX_SAFE_INTEGER",
    "PURCHASES_EVENT",
    "REFUSAL_CODES",
    "SALES_PER_MESSAGE",
    "SCHEMAS",
    "UNIT_OF",
    "AccountEvent",
    "AccountState",
    "AccuracyTarget",
    "CatalogEntry",
    "DeadLetter",
    "DeliveriesWithheld",
    "Envelope",
    "ErrorModelInfo",
    "HeldRoom",
    "HistogramKey",
    "HistogramSpec",
    "Identifier",
    "InboxEvent",
    "InboxPayload",
    "Invitation",
    "KeySpace",
    "LevelUnit",
    "LinearLevelSpec",
    "LinearPrecisionSpec",
    "MarketIdentity",
    "MechanismName",
    "Offer",
    "OpenAccount",
    "PriceLevel",
    "PricingSpec",
    "PrivacyUnit",
    "PrivacyWindow",
    "Product",
    "PurchaseFulfilled",
    "PurchaseRequest",
    "PurchasesEvent",
    "QuoteAnswer",
    "QuoteRequest",
    "ReceiptModel",
    "Refusal",
    "Rejection",
    "ReleasedValue",
    "Reservation",
    "ReserveRequest",
    "RetiredKey",
    "RotateKeys",
    "Sale",
    "SaleItem",
    "Sales",
    "StreamRegistration",
    "TableSpec",
    "ValueBatch",
    "ValueItem",
    "ValueOutcome",
    "ValueReleased",
    "ValuesAccepted",
    "WindowStatus",
    "published_schema",
]

SCHEMA_VERSION = 1
MAX_DIMENSION = 100_000
MAX_STEPS = 64
MAX_BATCH = 1_000

Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN, strict=True)]
"""1–64 of ``[A-Za-z0-9_-]``: ids appear in topic names and keys, and no id contains the ``.``
that separates the parts of a topic name, so distinct ids always name distinct topics."""

Level = Annotated[float, Field(gt=0, allow_inf_nan=False)]
LevelUnit = Literal["epsilon", "rho", "omega"]
MechanismName = Literal["laplace", "gaussian", "poisson", "discrete_laplace"]
"""What a level measures: ε (Laplace and discrete Laplace, pure DP), ρ (Gaussian, zCDP) or
ω = Δ²/λ (Poisson)."""
UNIT_OF: dict[str, LevelUnit] = {
    "laplace": "epsilon",
    "gaussian": "rho",
    "poisson": "omega",
    "discrete_laplace": "epsilon",
}
PublicKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9+/]{43}=$", strict=True)]
"""An Ed25519 or X25519 public key: base64 of its 32 raw bytes."""
KeyId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$", strict=True)]
"""First 16 hex digits of SHA-256 of a raw public key (:func:`market.receipts.key_id`)."""
Signature = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9+/]{86}==$", strict=True)]
"""An Ed25519 signature: base64 of 64 bytes."""
Currency = Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
"""Standard base64 (RFC 4648 §4: ``+`` and ``/``) with its ``=`` padding, no line breaks."""
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$", strict=True)]
"""A SHA-256 digest in lower-case hex."""

REFUSAL_CODES = frozenset({"duplicate_price_level", "unsafe_integer"})
"""The codes the wire models refuse with besides ``invalid_event``: the rejection of a payload
that breaks one of these rules carries the code as its ``reason``."""


def _no_negative_zero(x: float) -> float:
    """``x`` with ``-0.0`` read as ``0.0``: the signed bytes hold ``0.0`` for both
    (docs/protocol.md §2.5), so the market uses the number that was signed (a value's numbers
    are read so by :func:`market.levels.as_float_vector`)."""
    return x + 0.0


Rate = Annotated[float, Field(ge=0, allow_inf_nan=False), AfterValidator(_no_negative_zero)]
MinorUnits = Annotated[int, Field(ge=0, le=10**15)]
Millis = Annotated[
    int, Field(ge=0, json_schema_extra={"maximum": MAX_SAFE_INTEGER}), AfterValidator(safe_integer)
]
BatchSeq = Annotated[
    int, Field(ge=0, json_schema_extra={"maximum": MAX_SAFE_INTEGER}), AfterValidator(safe_integer)
]
"""A value batch's number in its seller's numbering of one stream (docs/protocol.md §6.4.1)."""
PrivacyUnit = Literal["event", "window"]
"""Whose privacy a stream's levels protect: each value's own (``event``), or the people present
in every value of a time window (``window``: the levels of a window's values add up)."""
Product = Literal["values", "running_totals", "histogram", "rappor"]
"""What a stream sells: each value (``values``), the running sums of its values
(``running_totals``: continual counting through a binary tree of lossless Gaussian releases), or
sparse count maps over a huge domain (``histogram``: the keys whose noisy count exceeds a
threshold, with their noisy counts)."""
HistogramKey = Annotated[str, StringConstraints(max_length=256, strict=True)]
"""A key of a published histogram: the decimal digits of a whole number (``integers``), or any
text up to 256 characters (``strings``)."""
MIN_WINDOW_MS = 60_000
MAX_WINDOW_MS = 366 * 86_400_000


def _is_none(v: Any) -> bool:
    return v is None


def _unset(default: Any) -> Any:
    """``exclude_if`` of a field added after version 1 went out: leave it out of the JSON at its
    default, so a message that does not use it reads as it did for earlier clients."""
    return lambda v: v == default


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: Literal[1] = 1


class _Signed(_Event):
    """An event sent by a party: signed with its account's current key."""

    key_id: KeyId = Field(description="the signing key (its account's current key)")
    signature: Signature = Field(
        description="Ed25519 signature, base64 of 64 bytes, of the event's canonical bytes "
        "(docs/protocol.md §2, §6)"
    )


class PrivacyWindow(BaseModel):
    """The privacy window of a ``window`` stream: windows are ``[k·W, (k+1)·W)`` in Unix ms of
    the values' publication times, and in each the sum over values of the largest level
    released of each value stays at most ``cap`` (see ``docs/math.md`` §9)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    duration_ms: Annotated[int, Field(ge=MIN_WINDOW_MS, le=MAX_WINDOW_MS)] = Field(
        description="W, from one minute to 366 days; windows start at multiples of W since "
        "the Unix epoch (UTC)"
    )
    cap: Level = Field(
        description="most privacy the values of one window may spend together, "
        "in the stream's level unit"
    )


# ----------------------------------------------------------------------- party → market
Work = Annotated[str, StringConstraints(pattern=r"^[0-9A-Za-z_-]{1,32}$", strict=True)]

BuyerShare = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
"""A fraction of a cap one buyer may use: above 0, at most 1."""


class Invitation(BaseModel):
    """The operators' leave to open one account, signed with the market's key
    (docs/protocol.md §6.1.1): a market that opens accounts by invitation only refuses an
    opening without a valid one."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    account_id: Identifier
    signing_key: PublicKey | None = Field(
        None, description="the one signing key the account may pin (null: any key)"
    )
    expires_at_ms: Millis = Field(description="no opening is accepted with it after this time")
    market_key_id: KeyId = Field(description="the key id of the market key that signed it")
    signature: Signature = Field(description="Ed25519 signature by the market's key, base64")


class OpenAccount(_Signed):
    """Open an account: pins its signing key (and sealing key) to the id (``<p>.accounts``).

    The first valid ``open_account`` for an id wins; its inbox topic is created then. Signed with
    the key it pins, which proves the sender holds it. A market that opens accounts by
    invitation only also wants the operators' ``invitation`` for the id (not itself signed by
    the account: the market's signature on it binds the id).
    """

    type: Literal["open_account"] = "open_account"
    account_id: Identifier
    signing_key: PublicKey = Field(description="Ed25519: every event of the account is signed")
    sealing_key: PublicKey | None = Field(
        None, description="X25519: releases to the account are sealed for it (buyers need one)"
    )
    opened_at_ms: Millis
    invitation: Invitation | None = Field(
        None,
        exclude_if=_is_none,
        description="the operators' invitation (markets that open accounts by invitation only)",
    )
    work: Work | None = Field(
        None,
        exclude_if=_is_none,
        description="proof of work for this opening (open markets: docs/protocol.md §6.1.2); "
        "not signed by the account",
    )


class RotateKeys(_Signed):
    """Replace an account's keys: signed by the current key, and by the new one.

    ``version`` must be the account's version + 1, so an old rotation cannot be replayed; every
    later event of the account is signed at it (docs/protocol.md §2.3), so nothing signed
    at an earlier version is applied again, even after a rotation back to an earlier key.
    """

    type: Literal["rotate_keys"] = "rotate_keys"
    account_id: Identifier
    version: Annotated[int, Field(ge=2, le=2**31 - 1)]
    signing_key: PublicKey
    sealing_key: PublicKey | None = None
    rotated_at_ms: Millis
    new_key_signature: Signature = Field(description="the same bytes signed with the new key")


AccountEvent = Annotated[OpenAccount | RotateKeys, Field(discriminator="type")]


# ------------------------------------------------------------------------ pricing specs
class LinearPrecisionSpec(BaseModel):
    """``P(level) = rate_per_precision × precision(level)`` minor units."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["linear_precision"] = "linear_precision"
    rate_per_precision: Rate


class LinearLevelSpec(BaseModel):
    """``P(level) = rate_per_level × level`` minor units (e.g. cents per unit of ε)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["linear_level"] = "linear_level"
    rate_per_level: Rate


LevelKey = Annotated[
    str, StringConstraints(pattern=r"^[0-9]{1,20}(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?$")
]
"""A level written as a plain ASCII decimal (``"0.5"``, ``"2"``, ``"1e-3"``): one spelling per
number, no signs, spaces, underscores or other digits, so a table key cannot be rewritten."""


class TableSpec(BaseModel):
    """Explicit prices in minor units; keys are levels written as decimal strings."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["table"] = "table"
    prices: dict[LevelKey, MinorUnits] = Field(
        min_length=1,
        max_length=MAX_STEPS,
        description='one key per level: two spellings of one level ("1" and "1.0") are '
        "refused, as their price would depend on the order of the keys",
    )

    @field_validator("prices")
    @classmethod
    def _one_key_per_level(cls, prices: dict[str, int]) -> dict[str, int]:
        """Refuse two keys naming one level; the signature covers both texts, and which price
        applied would be the one read last (a level that is no level is the schedule's to
        refuse, with the registration's other checks)."""
        try:
            table_levels(prices)
        except DuplicateLevelError as exc:
            raise PydanticCustomError("duplicate_price_level", exc.message) from None
        except ScheduleError:
            pass
        return prices


PricingSpec = Annotated[
    LinearPrecisionSpec | LinearLevelSpec | TableSpec, Field(discriminator="kind")
]


# ---------------------------------------------------------------------- seller → market
class StreamRegistration(_Signed):
    """A seller offers a stream of values for sale (``<p>.registrations``, key: stream_id).

    Signed by the seller's account: only ``seller_id`` can publish into the stream.
    """

    type: Literal["register_stream"] = "register_stream"
    stream_id: Identifier
    seller_id: Identifier
    mechanism: MechanismName
    sensitivity: Level = Field(description="ℓ1 (Laplace, Poisson) or ℓ2 (Gaussian) sensitivity")
    dimension: Annotated[int, Field(ge=1, le=MAX_DIMENSION)]
    steps: list[Level] = Field(
        min_length=1,
        max_length=MAX_STEPS,
        description="levels offered as steps, increasing; a purchase without an explicit "
        "target buys the next one above what the buyer holds",
    )
    cap: Level = Field(description="largest level that will ever be released, to anyone")
    retain_last: Annotated[int, Field(ge=1, le=1_000)] = Field(
        16, description="how many of the newest values a purchase covers"
    )
    sealed: bool = Field(
        False,
        description="release each value once at the cap on arrival and erase the exact value "
        "(every later release is post-processing; the stored state is only cap-level private)",
    )
    pricing: PricingSpec
    currency: Currency = "EUR"
    description: Annotated[str, StringConstraints(max_length=500)] = ""
    privacy_unit: PrivacyUnit = Field(
        "event",
        exclude_if=_unset("event"),
        description="'event': each value is about different people, and a stream's loss is "
        "its largest level; 'window': the same people are in every value, and the levels of a "
        "window's values add up (needs `window`)",
    )
    window: PrivacyWindow | None = Field(
        None, description="for privacy_unit 'window' only", exclude_if=_is_none
    )
    product: Product = Field(
        "values",
        exclude_if=_unset("values"),
        description="'values': each value is released; 'running_totals': the values are "
        "increments and what is released after each is the running sum of all so far",
    )
    tree_height: Annotated[int, Field(ge=1, le=MAX_TREE_HEIGHT)] | None = Field(
        None,
        exclude_if=_is_none,
        description="running_totals only: the stream takes at most 2**tree_height increments; "
        "each increment is in tree_height + 1 noisy tree nodes, so a node's sensitivity is "
        "sensitivity × sqrt(tree_height + 1)",
    )
    histogram: HistogramSpec | None = Field(
        None,
        exclude_if=_is_none,
        description="histogram only: the keys of its values; `dimension` is then the most keys "
        "one value may have (each release also shows up to 2·false_keys + 64 keys with a zero "
        "count), and `sensitivity` the ℓ2 sensitivity of the counts",
    )
    rappor_ones: Annotated[int, Field(ge=1, le=MAX_RAPPOR_ONES)] | None = Field(
        None,
        exclude_if=_is_none,
        description="rappor only: the most bits one member's report sets (a Bloom filter's "
        "hash functions; 1 for a category); each value is `dimension` bits (0 or 1), "
        "`sensitivity` must be 2 × rappor_ones, and each release is the bits [y + Laplace "
        "noise > 1/2] (docs/protocol.md §1.10)",
    )
    buyer_share: BuyerShare | None = Field(
        None,
        exclude_if=_is_none,
        description="the most of the stream's cap, and of each privacy window's cap, that one "
        "buyer may use, as a fraction in (0, 1] (null: no per-buyer limit); docs/protocol.md "
        "§6.3.1",
    )

    @model_validator(mode="after")
    def _consistent(self) -> StreamRegistration:
        if any(b <= a for a, b in itertools.pairwise(self.steps)):
            raise ValueError("steps must be strictly increasing")
        if self.cap < self.steps[-1]:
            raise ValueError(f"cap {self.cap:g} is below the top step {self.steps[-1]:g}")
        if (self.privacy_unit == "window") != (self.window is not None):
            raise ValueError("a 'window' stream needs a window, and only it has one")
        if self.window is not None:
            self._check_window(self.window)
        check_product(self)
        return self

    def release_width(self) -> int:
        """Numbers one release takes room for at most, counting a histogram key as one:
        ``dimension``, or what the product's wire section says
        (:meth:`~streams.wire.products.base.ProductFields.release_width`)."""
        return section_of(self).release_width(self)

    def false_key_bound(self) -> int:
        """Most keys with a zero count a value ever shows (none but on a keyed product)."""
        return section_of(self).false_key_bound(self)

    def release_sensitivity(self) -> float:
        """Sensitivity of what is noised: each value; on ``running_totals`` one tree node
        (:mod:`streams.wire.products.totals`; docs/math.md §10)."""
        return section_of(self).release_sensitivity(self)

    def totals_limit(self) -> float:
        """On ``running_totals``: the largest magnitude a tree node may reach
        (:meth:`~streams.wire.products.totals.TotalsFields.totals_limit`)."""
        return TotalsFields.totals_limit(self)

    def _check_window(self, window: PrivacyWindow) -> None:
        if self.mechanism == "poisson":
            raise ValueError(
                "privacy_unit 'window' needs levels that add up: ε (laplace, discrete_laplace) "
                "or ρ (gaussian); the Poisson ω does not compose additively with a guarantee "
                "we can state"
            )
        if self.sealed:
            raise ValueError(
                "a sealed stream releases every value at the cap on arrival, so each value "
                "would spend the cap; register 'window' streams unsealed"
            )
        if window.cap < self.cap:
            raise ValueError(
                f"the window cap {window.cap:g} is below the stream's cap {self.cap:g}: one value "
                "released at the cap would overspend its window alone, so levels above the "
                "window cap could be sold but never delivered; lower the cap or raise the "
                "window cap"
            )
        if not whole_nanos(window.cap):
            suggested = max(cap_of(window.cap), 1)
            raise ValueError(
                f"the window cap {window.cap!r} has more than {NANO_DIGITS} decimal places: the "
                f"market accounts privacy windows in whole 10^-{NANO_DIGITS} of the level unit "
                f"(docs/protocol.md §6.3); give the window cap as {level_of(suggested)!r}, or "
                f"another with at most {NANO_DIGITS} decimals"
            )


class ValueItem(BaseModel):
    """One value of a batch."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value_id: Identifier = Field(description="unique per stream; a resend is deduplicated")
    values: list[float] = Field(
        default_factory=list,
        max_length=MAX_DIMENSION,
        exclude_if=lambda v: not v,
        description="the value's numbers (as many as the stream's dimension); on a histogram "
        "stream the counts of `keys`, in the same order; absent when the batch is sealed",
    )
    keys: list[HistogramKey] | None = Field(
        None,
        exclude_if=_is_none,
        max_length=MAX_DIMENSION,
        description="histogram streams only: the keys of the counts in `values` (distinct); a "
        "key not listed has count 0",
    )
    published_at_ms: Millis = Field(
        description="when the seller first published the value (Unix ms; keep it when "
        "resending): values older than the stream's newest minus the dedup horizon are refused"
    )


class ValueBatch(_Signed):
    """New values of one stream, signed once (``<p>.values``, key: stream_id).

    One Ed25519 verification covers the whole batch; each value is accepted or refused on its
    own, and the seller is told which in a ``values_accepted`` event.
    """

    type: Literal["values"] = "values"
    stream_id: Identifier
    seller_id: Identifier
    items: list[ValueItem] = Field(min_length=1, max_length=MAX_BATCH)
    sealed: Envelope | None = Field(
        None,
        exclude_if=_is_none,
        description="the items' numbers (and keys) sealed to the market's key "
        "(market_sealing_key in the catalog; docs/protocol.md §4); the items then carry none",
    )
    batch_seq: BatchSeq | None = Field(
        None,
        exclude_if=_is_none,
        description="the batch's number in its seller's numbering of the stream: 1, 2, 3, … "
        "(0: not numbered, and the answer says where the numbering stands); a batch sent "
        "again keeps its number, and the market answers it as it answered the first "
        "(docs/protocol.md §6.4.1)",
    )

    @model_validator(mode="after")
    def _numbers_in_one_place(self) -> ValueBatch:
        if self.sealed is not None and any(i.values or i.keys is not None for i in self.items):
            raise ValueError("a sealed batch carries its numbers and keys in `sealed` only")
        return self


# ----------------------------------------------------------------------- buyer → market
class AccuracyTarget(BaseModel):
    """An accuracy a buyer wants, in the value's own units: exactly one of an RMS error per
    coordinate, or the half-width of a ``confidence`` interval. The market sells the cheapest
    level for sale that meets it (docs/protocol.md §6.6)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    rmse: float | None = Field(None, gt=0, allow_inf_nan=False)
    half_width: float | None = Field(None, gt=0, allow_inf_nan=False)
    confidence: float = Field(0.95, gt=0, le=0.9999, description="at most 99.99 %")

    @model_validator(mode="after")
    def _one(self) -> AccuracyTarget:
        if (self.rmse is None) == (self.half_width is None):
            raise ValueError("an accuracy target is exactly one of rmse and half_width")
        return self


class PurchaseRequest(_Signed):
    """Buy a level on a stream (``<p>.purchases``, key: stream_id)."""

    type: Literal["purchase"] = "purchase"
    purchase_id: Identifier = Field(
        description="idempotency key, unique per buyer: a resend returns the same outcome"
    )
    buyer_id: Identifier
    stream_id: Identifier
    target_level: Level | None = Field(
        None, description="explicit level; default: the seller's next step above the level held"
    )
    accuracy: AccuracyTarget | None = Field(
        None, description="instead of a level: the cheapest level for sale this accurate"
    )
    most_accurate: bool = Field(
        False, description="instead of a level: the most accurate level max_price_minor buys"
    )
    max_price_minor: MinorUnits = Field(description="most the buyer will pay, minor units")
    currency: Currency = "EUR"
    requested_at_ms: Millis = Field(
        description="when the buyer made the request (Unix ms; keep it when resending): "
        "requests older than the stream's newest minus the dedup horizon are refused"
    )
    reservation_id: Identifier | None = Field(
        None,
        exclude_if=_is_none,
        description="buy on the terms of this live reservation of the buyer's (its level and "
        "price, in the room it holds); with it, name no accuracy and no most_accurate, and "
        "a target_level only if it is the reservation's level",
    )

    @model_validator(mode="after")
    def _one_target(self) -> PurchaseRequest:
        if (self.target_level is not None) + (self.accuracy is not None) + self.most_accurate > 1:
            raise ValueError("name at most one of target_level, accuracy and most_accurate")
        if self.reservation_id is not None and (self.accuracy is not None or self.most_accurate):
            raise ValueError(
                "a purchase naming a reservation buys the reservation's level: name no "
                "accuracy and no most_accurate beside reservation_id"
            )
        return self


class QuoteRequest(_Signed):
    """Ask the price of a purchase without buying (``<p>.purchases``, key: stream_id)."""

    type: Literal["quote"] = "quote"
    quote_id: Identifier
    buyer_id: Identifier
    stream_id: Identifier
    target_level: Level | None = None
    accuracy: AccuracyTarget | None = None
    requested_at_ms: Millis

    @model_validator(mode="after")
    def _one_target(self) -> QuoteRequest:
        if self.target_level is not None and self.accuracy is not None:
            raise ValueError("name at most one of target_level and accuracy")
        return self


class ReserveRequest(_Signed):
    """Hold the terms of a purchase for a while (``<p>.purchases``, key: stream_id): its level,
    its price and the privacy room it needs, for this buyer alone (docs/protocol.md §6.9)."""

    type: Literal["reserve"] = "reserve"
    reservation_id: Identifier = Field(
        description="names the reservation: unique per buyer; a purchase names it"
    )
    buyer_id: Identifier
    stream_id: Identifier
    target_level: Level | None = Field(
        None, description="as in a purchase; default: the next step above the level held"
    )
    accuracy: AccuracyTarget | None = None
    hold_ms: Annotated[int, Field(ge=MIN_HOLD_MS, le=MAX_HOLD_MS)] = Field(
        description="how long to hold the terms, from requested_at_ms (1 s to 120 s)"
    )
    requested_at_ms: Millis

    @model_validator(mode="after")
    def _one_target(self) -> ReserveRequest:
        if self.target_level is not None and self.accuracy is not None:
            raise ValueError("name at most one of target_level and accuracy")
        return self


PurchasesEvent = Annotated[
    PurchaseRequest | QuoteRequest | ReserveRequest, Field(discriminator="type")
]


# ------------------------------------------------------------------- market → everyone
class PriceLevel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    level: float = Field(description="in the stream's level_unit")
    price_minor: int
    epsilon: float | None = Field(
        None,
        description="ε of a release at this level (Gaussian/Poisson at δ = 1e-6, for the "
        "stream's dimension); null where the mechanism gives no guarantee",
    )
    randomized_response: RandomizedResponse | None = Field(
        None,
        exclude_if=_is_none,
        description="on a rappor stream: each released bit's law at this level",
    )


class CatalogEntry(_Event):
    """An accepted stream registration (``<p>.catalog``, compacted, key: stream_id)."""

    type: Literal["catalog_entry"] = "catalog_entry"
    registration: StreamRegistration
    level_unit: LevelUnit
    accepted_at_ms: Millis
    market_key_id: KeyId
    market_public_key: PublicKey = Field(
        description="Ed25519 public key, base64 of the raw 32 bytes"
    )
    market_sealing_key: PublicKey | None = Field(
        None,
        exclude_if=_is_none,
        description="X25519 public key, base64 of the raw 32 bytes: sellers seal their values "
        "to it (absent in entries made before markets sealed values)",
    )
    prices: list[PriceLevel]


# ---------------------------------------------------------------------- market → buyer
class ReleasedValue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    value_id: Identifier
    seq: int = Field(description="arrival order of the value within its stream")
    level: float
    values: list[float]
    terms: int | None = Field(
        None,
        exclude_if=_is_none,
        description="running totals: the release is the running sum after this increment, "
        "the sum of `terms` independent tree-node releases each with the event's error_model "
        "(so its standard deviation and half-widths are the model's × sqrt(terms))",
    )
    keys: list[str] | None = Field(
        None,
        exclude_if=_is_none,
        description="histogram streams: the keys (decimal digits; on a 'strings' stream the "
        "public 62-bit hash of the string) whose noisy count exceeded the level's threshold, "
        "increasing, with their noisy counts in `values`; every other key is not shown",
    )

    @field_validator("values")
    @classmethod
    def _finite(cls, v: list[float]) -> list[float]:
        if not all(math.isfinite(x) for x in v):
            raise ValueError("released values are finite")
        return v


_RECEIPT_ON_THE_WIRE: dict[str, Any] = {
    "receipt_version": (int, ...),
    "value_ids": (list[str], ...),
    "market_key_id": (KeyId, ...),
    "ciphertext_digest": (
        Annotated[str, StringConstraints(pattern=r"^([0-9a-f]{64})?$")],
        "",
    ),
    "commitment": (
        Sha256Hex | None,
        Field(
            None,
            exclude_if=_is_none,
            description="receipt versions 4 and 5: HMAC-SHA256 commitment to the released "
            "numbers (64 lower-case hex digits), opened by the outcome's `opening` "
            "(docs/protocol.md §11)",
        ),
    ),
    "release_digest": (
        Sha256Hex | None,
        Field(
            None,
            exclude_if=_is_none,
            description="receipt versions 2 and 3 only: SHA-256 of the released numbers",
        ),
    ),
}
"""What the wire checks of a receipt's fields beyond their types in :class:`Receipt`: the
version and the value ids required, the key id's and digests' spellings, and a version's
absent commitment or digest left out rather than written empty."""


def _receipt_fields() -> type[BaseModel]:
    """The fields of :class:`market.receipts.Receipt`, the one definition of a receipt, as a
    model of the wire: in its order but with the version first (as the market writes it), each
    typed as the dataclass types it unless :data:`_RECEIPT_ON_THE_WIRE` refines it."""
    names = [f.name for f in fields(Receipt)]
    unknown = set(_RECEIPT_ON_THE_WIRE) - set(names)
    if unknown:  # a field renamed or removed in Receipt: its wire checks must follow
        raise TypeError(f"the wire refines fields market.receipts.Receipt lacks: {unknown}")
    hints = get_type_hints(Receipt)
    order = ["receipt_version", *(n for n in names if n != "receipt_version")]
    return create_model(
        "ReceiptFields",
        __config__=ConfigDict(extra="forbid", frozen=True),
        **{n: _RECEIPT_ON_THE_WIRE.get(n, (hints[n], ...)) for n in order},
    )


class ReceiptModel(_receipt_fields()):  # type: ignore[misc]  # its fields are Receipt's
    """A purchase's receipt with the market's Ed25519 signature (docs/protocol.md §11)."""

    signature: Signature


class Envelope(BaseModel):
    """Numbers sealed to an X25519 key: a seller's values to the market's key, a buyer's
    releases to the buyer's (docs/protocol.md §4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    alg: Literal["x25519-hkdf-sha256-chacha20poly1305"]
    epk: PublicKey = Field(description="the sender's X25519 public key, base64 of 32 bytes")
    nonce: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9+/]{16}$", strict=True)] = Field(
        description="the ChaCha20-Poly1305 nonce, base64 of 12 bytes"
    )
    ciphertext: Annotated[
        str, StringConstraints(min_length=24, pattern=BASE64_PATTERN, strict=True)
    ] = Field(description="base64 of the ciphertext followed by its 16-byte tag")


class ErrorModelInfo(BaseModel):
    """The noise of every coordinate of a release at ``level`` (exact for the mechanism):
    subtract ``offset`` for an unbiased estimate; its RMS error is ``std``; the true value lies
    within ``half_widths[c]`` of the estimate with probability at least c % ("90", "95", "99").
    ``scale`` is the Laplace b, the Gaussian σ or the Poisson λ; ``grid`` the release's grid
    (Laplace and Gaussian releases are multiples of it; 0 for the integer mechanisms)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    mechanism: MechanismName
    level: float
    unit: LevelUnit
    scale: float
    std: float
    offset: float
    half_widths: dict[str, float]
    grid: float = Field(
        0.0,
        description="Laplace: the value is rounded to this power of two before the noise (a "
        "multiple of it) is added; Gaussian: the noisy value is rounded to it; 0: integers",
    )
    threshold: float | None = Field(
        None,
        exclude_if=_is_none,
        description="histogram streams: only keys whose noisy count exceeds it are released "
        "(the noise of a released count is the model's; selection by the threshold biases "
        "small counts upwards)",
    )
    randomized_response: RandomizedResponse | None = Field(
        None,
        exclude_if=_is_none,
        description="on a rappor stream: the released numbers are the bits "
        "[y + noise > 1/2] of this model's noise, each following this law",
    )


class Offer(BaseModel):
    """One level for sale, as a quote lists it for the buyer who asked."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    level: float
    rmse: float = Field(description="RMS error per coordinate, value units")
    half_width_95: float = Field(description="95 % interval half-width, value units")
    price_minor: int = Field(description="what moving to this level costs this buyer now")
    held: bool = Field(description="the buyer already holds this level or a higher one")
    fits_window: bool | None = Field(
        None,
        exclude_if=_is_none,
        description="on a 'window' stream: a purchase of this level fits the privacy "
        "windows' headroom now (absent on 'event' streams)",
    )
    fits_share: bool | None = Field(
        None,
        exclude_if=_is_none,
        description="on a stream with a buyer_share: a purchase of this level stays within "
        "one buyer's share of the caps now (absent on streams without one)",
    )
    threshold: float | None = Field(
        None,
        exclude_if=_is_none,
        description="on a histogram stream: the keys released at this level are those whose "
        "noisy count exceeds it",
    )
    randomized_response: RandomizedResponse | None = Field(
        None,
        exclude_if=_is_none,
        description="on a rappor stream: each released bit's law at this level",
    )


class WindowStatus(BaseModel):
    """One privacy window of a ``window`` stream, as the market accounts it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    start_ms: int = Field(description="first millisecond of the window (Unix ms)")
    end_ms: int = Field(
        description="first millisecond after it: new values from then on "
        "count against the next window"
    )
    unit: LevelUnit
    cap: float
    spent: float = Field(
        description="sum over the window's values of the largest level released of each"
    )
    headroom: float = Field(description="cap − spent")


class PurchaseFulfilled(_Event):
    """The single successful outcome of a purchase (``<p>.inbox.<buyer_id>``)."""

    type: Literal["purchase_fulfilled"] = "purchase_fulfilled"
    purchase_id: Identifier
    buyer_id: Identifier
    stream_id: Identifier
    level_unit: LevelUnit
    level_before: float
    level_after: float
    price_minor: int
    currency: str
    releases: list[ReleasedValue] = Field(
        default_factory=list, description="empty when the releases are sealed"
    )
    sealed: Envelope | None = Field(
        None,
        description="the releases and the opening (a JSON object, `releases` and `opening`) "
        "sealed for the buyer's key",
    )
    opening: str | None = Field(
        None,
        exclude_if=_is_none,
        pattern="^[0-9a-f]{64}$",
        description="beside releases in clear (unsealed, or opened by the buyer): the 32 bytes "
        "(hex) that open the receipt's commitment; absent while the releases are sealed",
    )
    receipt: ReceiptModel
    error_model: ErrorModelInfo | None = None


class SaleItem(BaseModel):
    """One purchase fulfilled on a seller's stream, as its sale notice lists it: a ``sale``'s
    members but the seller's (docs/protocol.md §8.4). The buyer is named by a pseudonym:
    sellers learn how many buyers they have and who comes back, not which accounts they are; a
    buyer who shows its receipt proves which sale is its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    stream_id: Identifier
    buyer_ref: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$", strict=True)] = Field(
        description="the buyer as a pseudonym (32 lower-case hex digits): the same in every "
        "sale of this seller to that buyer, unrelated between sellers"
    )
    level_unit: LevelUnit
    level_before: float = Field(ge=0, description="the level the buyer held (0: none)")
    level_after: float = Field(gt=0, description="the level it bought")
    price_minor: MinorUnits = Field(
        description="what the buyer paid, in minor units of `currency`: all of it is the seller's"
    )
    currency: Currency
    value_count: int = Field(ge=0, description="the values released by the purchase")
    receipt_sha256: Sha256Hex = Field(
        description="SHA-256 of the signed bytes of the buyer's receipt (§11.2): the sale's id, "
        "and what matches it to the receipt its buyer may show"
    )
    requested_at_ms: Millis = Field(description="the purchase's request time (its receipt's)")
    sold_at_ms: Millis = Field(description="the market's clock when it decided the purchase")


class Sale(_Event, SaleItem):
    """One purchase fulfilled on one of the seller's streams (``<p>.inbox.<seller_id>``), as a
    reader sees it: from a ``sales`` notice (:meth:`Sales.each`), or as the one-sale message
    markets sent before notices were grouped (still read, never sent any more).

    A reader counts a sale once per ``receipt_sha256``: a batch lost before its outputs were
    sent sends its sales again, perhaps grouped otherwise (docs/protocol.md §8.4).
    """

    type: Literal["sale"] = "sale"
    seller_id: Identifier


SALES_PER_MESSAGE = 64
"""Most sales one ``sales`` notice lists: a batch's sales of one seller beyond it take more
notices (bounded: :data:`streams.wire.sales.SALES_BYTES`)."""


class Sales(_Event):
    """The purchases a batch of the market fulfilled on one seller's streams
    (``<p>.inbox.<seller_id>``), signed once for them all: one notice per seller and batch, in
    as many as it takes to list at most :data:`SALES_PER_MESSAGE` each (docs/protocol.md §8.4).
    """

    type: Literal["sales"] = "sales"
    seller_id: Identifier
    sales: list[SaleItem] = Field(
        min_length=1,
        max_length=SALES_PER_MESSAGE,
        description="the sales, in the order the market decided them; each counted once per "
        "`receipt_sha256` however many notices list it",
    )

    def each(self) -> list[Sale]:
        """The sales listed, each as a :class:`Sale` of this seller."""
        return [trusted(Sale, seller_id=self.seller_id, **dict(item)) for item in self.sales]


class ValueReleased(_Event):
    """New values delivered at the level the buyer holds (subscription), in arrival order.

    The market groups the values that arrive together into one event per buyer and stream, in
    as many events as it takes to keep each under the broker's message size."""

    type: Literal["value_released"] = "value_released"
    buyer_id: Identifier
    stream_id: Identifier
    level_unit: LevelUnit
    releases: list[ReleasedValue] = Field(
        default_factory=list, description="empty when the releases are sealed"
    )
    sealed: Envelope | None = None
    error_model: ErrorModelInfo | None = None


class QuoteAnswer(_Event):
    """The price of a purchase, without buying (``<p>.inbox.<buyer_id>``)."""

    type: Literal["quote"] = "quote"
    quote_id: Identifier
    buyer_id: Identifier
    stream_id: Identifier
    level_unit: LevelUnit
    level_before: float
    level_after: float
    price_minor: int
    currency: str
    error_model: ErrorModelInfo | None = Field(
        None,
        description="of a release at level_after; on running totals, of one tree node (a total "
        "of `terms` nodes has its std and half-widths times sqrt(terms); the offers are for the "
        "least accurate total)",
    )
    offers: list[Offer] = Field(default_factory=list, description="every level for sale")
    privacy_window: WindowStatus | None = Field(
        None,
        description="on a 'window' stream: the window of the newest value",
        exclude_if=_is_none,
    )


class HeldRoom(BaseModel):
    """The privacy room a reservation holds in one window, for its buyer's purchase."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    start_ms: int = Field(description="first millisecond of the window (Unix ms)")
    end_ms: int = Field(description="first millisecond after it")
    room: float = Field(
        description="what the reserved purchase adds to the window's sum, in the stream's "
        "level unit: other buyers see the window's headroom less this until the reservation "
        "is used or expires"
    )


class Reservation(_Event):
    """The terms the market holds for one buyer until ``expires_at_ms``
    (``<p>.inbox.<buyer_id>``, key: reservation_id; signed like every answer, §12)."""

    type: Literal["reservation"] = "reservation"
    reservation_id: Identifier
    buyer_id: Identifier
    stream_id: Identifier
    level_unit: LevelUnit
    level_before: float = Field(description="the level the buyer held when it reserved")
    level_after: float = Field(description="the level a purchase naming it buys")
    price_minor: int = Field(description="what that purchase costs, whatever happens meanwhile")
    currency: str
    expires_at_ms: int = Field(
        description="the market's clock (Unix ms) from which the reservation no longer holds"
    )
    held: list[HeldRoom] = Field(
        default_factory=list,
        description="on a 'window' stream: the room held in each window the purchase adds to",
    )
    error_model: ErrorModelInfo | None = None


class DeliveriesWithheld(_Event):
    """Values a buyer's subscription did not deliver, and why (``<p>.inbox.<buyer_id>``).

    On a ``window`` stream a value reaches a holder only if releasing it at the holder's level
    keeps its privacy window within the cap, and (on a stream with a ``buyer_share``) within one
    buyer's share of that cap; otherwise the market withholds it and says so here, once per
    buyer, stream, window and level held in each batch (split to stay under the message size).
    Withheld values are not released to the buyer later at that level: the seller's budget for
    their window (or the buyer's share of it) is spent.
    """

    type: Literal["deliveries_withheld"] = "deliveries_withheld"
    buyer_id: Identifier
    stream_id: Identifier
    reason: Literal["privacy_window_full", "buyer_quota_exceeded"] = Field(
        "privacy_window_full",
        description="'privacy_window_full': the window has no room left at this level; "
        "'buyer_quota_exceeded': one buyer's share of the window's cap has none",
    )
    level: float = Field(description="the level the buyer holds")
    value_ids: list[Identifier]
    window: WindowStatus
    message: str


class Rejection(_Event):
    """Why an event was not accepted, with what is needed to act on it.

    The original bytes are kept when they are small (``payload``); a large payload keeps a
    bounded prefix, and always its size and SHA-256, so a rejection never exceeds the broker's
    message size. ``sender_id`` is the account whose signature the event carried — the only
    party, besides the operators, the rejection is shown to; ``claimed_id`` is whoever the
    payload claimed to act for, if that differs or could not be proved.
    """

    type: Literal["rejection"] = "rejection"
    reason: str = Field(description="machine-readable code, e.g. 'invalid_event', 'price_too_high'")
    message: str = Field(description="what was wrong and what to do about it")
    source_topic: str
    source_partition: int | None = None
    source_offset: int | None = None
    request_id: str | None = Field(None, description="purchase_id, quote_id or value_id if known")
    sender_id: str | None = Field(None, description="the account that signed the event")
    claimed_id: str | None = Field(None, description="the account the payload claimed to be")
    stream_id: str | None = None
    payload: str = Field(
        description="the original event (UTF-8 text, or base64 if binary); "
        "empty for an event on the values topic (its numbers are never quoted)"
    )
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    payload_bytes: int = Field(description="size of the original event")
    payload_sha256: Sha256Hex
    payload_truncated: bool = False
    details: dict[str, Any] = Field(default_factory=dict)


MAX_RETIRED_KEYS = 8
"""How many of its past keys an account's record keeps (:class:`RetiredKey`), newest last."""


class RetiredKey(BaseModel):
    """A signing key an account rotated away from, and the key version it signed at.

    Kept only to tell the sender what happened to an event it signed before a rotation
    (``key_rotated``): such an event is never applied, as its bytes name the version it was
    signed at (docs/protocol.md §2.3), kept or not.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    version: int
    signing_key: PublicKey


class AccountState(_Event):
    """An account as the market knows it: sent to its inbox when opened or its keys change."""

    type: Literal["account"] = "account"
    account_id: Identifier
    version: int
    signing_key: PublicKey
    sealing_key: PublicKey | None = None
    key_id: KeyId
    opened_at_ms: Millis
    updated_at_ms: Millis
    retired: list[RetiredKey] = Field(
        default_factory=list,
        max_length=MAX_RETIRED_KEYS,
        exclude_if=lambda v: not v,
        description="the newest past signing keys, oldest first (at most 8): events they signed "
        "are refused as `key_rotated`, with what to do",
    )


class ValueOutcome(BaseModel):
    """What happened to one value of a batch."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value_id: str
    status: Literal["accepted", "duplicate", "rejected"]
    reason: str | None = None
    message: str | None = None


class ValuesAccepted(_Event):
    """The market's answer to a value batch (``<p>.inbox.<seller_id>``): one line per value."""

    type: Literal["values_accepted"] = "values_accepted"
    stream_id: Identifier
    seller_id: Identifier
    outcomes: list[ValueOutcome]
    batch_seq: int | None = Field(
        None, exclude_if=_is_none, description="the number of the batch answered, if it had one"
    )
    next_batch_seq: int | None = Field(
        None,
        exclude_if=_is_none,
        description="to a batch numbered 0: the number after the highest the stream applied",
    )
    missing_batch_seqs: list[int] | None = Field(
        None,
        exclude_if=_is_none,
        description="to a batch numbered 0: the numbers below next_batch_seq no batch took",
    )


class DeadLetter(_Event):
    """An output the broker refused for good (too large, not authorised, no such topic).

    Kept on ``<p>.deadletters`` so the operators see it; the market goes on with the next
    message. Only a bounded prefix of the message is kept.
    """

    type: Literal["dead_letter"] = "dead_letter"
    topic: str
    key: str | None = None
    reason: str
    error: str
    value_bytes: int
    value_sha256: Sha256Hex
    value_prefix: str = Field(description="the first bytes, UTF-8 with replacement")
    failed_at_ms: Millis


class MarketIdentity(_Event):
    """Which noise secret a market's state is made with (``<p>.market``, first record wins).

    A worker whose secret has another fingerprint, or which implements another noise format, or
    computes other noise for the same key under the same format, refuses to start: it would
    re-noise levels already released. So does one whose market's state records carry no
    authenticator, or another format of it: it could not tell the market's state from forgeries.
    """

    type: Literal["market_identity"] = "market_identity"
    noise_secret_fingerprint: Annotated[
        str, StringConstraints(pattern=r"^[0-9a-f]{32}$", strict=True)
    ] = Field(description="HMAC of a fixed label under the secret, 32 lower-case hex digits")
    noise_derivation: str = Field(description="version of the keyed chain derivation")
    noise_format: int | None = Field(
        None,
        exclude_if=_is_none,
        description="the noise format (docs/protocol.md §1); absent in markets made with v1",
    )
    noise_check: Sha256Hex = Field(
        description="SHA-256 of releases computed for a fixed test key (docs/protocol.md §1.7)"
    )
    noise_check_discrete: Sha256Hex | None = Field(
        None,
        exclude_if=_is_none,
        description="noise format v1 only: the same for discrete Laplace chains",
    )
    noise_check_histogram: Sha256Hex | None = Field(
        None,
        exclude_if=_is_none,
        description="the same for histogram chains (absent in markets made before them)",
    )
    state_format: int | None = Field(
        None,
        exclude_if=_is_none,
        description="the format of the state records (docs/protocol.md §3: 2, sealed, stamped "
        "and committed by checkpoints; 1, authenticated only); absent in markets whose "
        "changelogs carry no authenticator",
    )
    market_key_id: KeyId
    market_public_key: PublicKey | None = Field(
        None,
        exclude_if=_is_none,
        description="the Ed25519 key that signs receipts and every answer, base64 of the raw 32 "
        "bytes (docs/protocol.md §12); absent in markets made before",
    )
    inboxes: Literal[2] | None = Field(
        None,
        exclude_if=_is_none,
        description="2: one partitioned inbox topic, records sealed to their account "
        "(docs/protocol.md §8.5); absent: a topic per account (v1)",
    )
    inbox_partitions: Annotated[int, Field(ge=1, le=1024, strict=True)] | None = Field(
        None, exclude_if=_is_none, description="v2 inboxes: the partitions of <p>.inbox"
    )
    market_sealing_key: PublicKey | None = Field(
        None,
        exclude_if=_is_none,
        description="v2 inboxes: the market's X25519 key, base64 of the raw 32 bytes, with "
        "which each account's inbox route is computed (docs/protocol.md §8.5.3)",
    )
    created_at_ms: Millis

    @model_validator(mode="after")
    def _one_inbox_layout(self) -> MarketIdentity:
        """The three v2 fields come together or not at all (docs/protocol.md §8.5.1).

        A reader that took ``inboxes: 2`` without its partitions for a v1 market would wait
        forever for inbox topics nobody makes; one without the sealing key could compute no
        route. Such an identity is malformed, not read as v1.
        """
        v2 = (self.inbox_partitions, self.market_sealing_key)
        if self.inboxes == 2 and None in v2:
            raise ValueError("inboxes 2 needs inbox_partitions and market_sealing_key")
        if self.inboxes is None and v2 != (None, None):
            raise ValueError("inbox_partitions and market_sealing_key need inboxes 2")
        return self


class Refusal(_Event):
    """Why the market refused an event, for whoever sent its bytes (``<p>.refusals``).

    Keyed by the SHA-256 of the refused event's exact bytes and signed by the market, so a
    sender the market could not prove (no account yet, a bad signature) learns the reason at
    once. It holds a reason code and a fixed text for that code, and which record was refused
    (topic, partition, offset: a copy of the bytes written elsewhere by someone else is refused
    under the same key, and its sender must not take that for its own): nothing of the event,
    no number, no id, nothing its sender chose (the record is public).
    """

    type: Literal["refusal"] = "refusal"
    reason: str = Field(description="machine-readable code, as in the rejection")
    message: str = Field(description="what the code means and what to do (a fixed text per code)")
    source_topic: str = Field(
        description="the topic the refused bytes were read from: a sender "
        "takes only the refusal of the topic it sent to"
    )
    source_partition: int | None = Field(
        default=None,
        ge=0,
        description="the partition they were read from (the sender's, or a copy's elsewhere)",
    )
    source_offset: int | None = Field(
        default=None,
        ge=0,
        description="their offset there: a sender takes only the refusal of a record it wrote",
    )


InboxPayload = (
    AccountState
    | ValuesAccepted
    | PurchaseFulfilled
    | ValueReleased
    | DeliveriesWithheld
    | QuoteAnswer
    | Reservation
    | Rejection
    | Sale
    | Sales
)
"""Every event the market sends to one party's inbox (the one list of them)."""
InboxEvent = Annotated[InboxPayload, Field(discriminator="type")]

PURCHASES_EVENT: TypeAdapter[PurchaseRequest | QuoteRequest | ReserveRequest] = TypeAdapter(
    PurchasesEvent
)
ACCOUNTS_EVENT: TypeAdapter[OpenAccount | RotateKeys] = TypeAdapter(AccountEvent)
INBOX_EVENT: TypeAdapter[InboxPayload] = TypeAdapter(InboxEvent)

SCHEMAS: dict[str, TypeAdapter[Any]] = {
    "accounts": ACCOUNTS_EVENT,
    "registrations": TypeAdapter(StreamRegistration),
    "catalog": TypeAdapter(CatalogEntry),
    "values": TypeAdapter(ValueBatch),
    "purchases": PURCHASES_EVENT,
    "inbox": INBOX_EVENT,
    "rejections": TypeAdapter(Rejection),
    "deadletters": TypeAdapter(DeadLetter),
    "market": TypeAdapter(MarketIdentity),
    "refusals": TypeAdapter(Refusal),
}
"""Topic family → adapter; :func:`published_schema` is the published schema of each."""

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def published_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the events of topic family ``name``, as published in
    ``docs/schemas``: pydantic's, less its ``discriminator`` keyword (an OpenAPI extension a
    strict validator refuses; each alternative of a ``oneOf`` fixes its ``type`` or ``kind``
    with a ``const``, which already tells them apart)."""
    raw = SCHEMAS[name].json_schema()
    _require_discriminators(raw, raw.get("$defs", {}))
    schema = _without_discriminators(raw)
    assert isinstance(schema, dict)
    schema["$schema"] = SCHEMA_DIALECT
    schema["$id"] = f"https://epsilon-market.example/schemas/{name}.schema.json"
    return schema


def _require_discriminators(node: Any, defs: dict[str, Any]) -> None:
    """Mark each alternative's ``type`` or ``kind`` required: the market reads a union's
    member by it, so a payload without it is refused."""
    if isinstance(node, dict):
        if "discriminator" in node:
            name = node["discriminator"]["propertyName"]
            for ref in node["discriminator"]["mapping"].values():
                branch = defs[ref.removeprefix("#/$defs/")]
                required = branch.setdefault("required", [])
                if name not in required:
                    required.append(name)
        for v in node.values():
            _require_discriminators(v, defs)
    elif isinstance(node, list):
        for v in node:
            _require_discriminators(v, defs)


def _without_discriminators(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_discriminators(v) for k, v in node.items() if k != "discriminator"}
    if isinstance(node, list):
        return [_without_discriminators(v) for v in node]
    return node
