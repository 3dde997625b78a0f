"""Every event on every topic, as versioned pydantic models.

Each model carries ``schema_version`` (currently 1) and a ``type`` discriminator, forbids unknown
fields and is frozen. ``python -m streams schemas`` exports their JSON Schemas to
``docs/schemas/`` so a client in any language can produce and consume them. Floats are JSON
numbers written with the shortest round-trip representation, so a release survives a JSON round
trip bit for bit in any language that parses doubles correctly.

Topic → payload:

==========================  ==================================================================
``<p>.registrations``       :class:`StreamRegistration` (seller → market)
``<p>.catalog``             :class:`CatalogEntry` (market → everyone, compacted)
``<p>.values``              :class:`ValueEvent` (seller → market)
``<p>.purchases``           :class:`PurchaseRequest` or :class:`QuoteRequest` (buyer → market)
``<p>.buyer.<buyer_id>``    :class:`PurchaseFulfilled`, :class:`ValueReleased`,
                            :class:`QuoteAnswer` or :class:`Rejection` (market → one buyer)
``<p>.rejections``          :class:`Rejection` (dead letters, market → operators)
==========================  ==================================================================
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    field_validator,
    model_validator,
)

__all__ = [
    "BUYER_EVENT",
    "PURCHASES_EVENT",
    "SCHEMAS",
    "BuyerEvent",
    "CatalogEntry",
    "Identifier",
    "MarketIdentity",
    "PriceLevel",
    "PricingSpec",
    "PurchaseFulfilled",
    "PurchaseRequest",
    "PurchasesEvent",
    "QuoteAnswer",
    "QuoteRequest",
    "ReceiptModel",
    "Rejection",
    "ReleasedValue",
    "StreamRegistration",
    "ValueEvent",
    "ValueReleased",
]

SCHEMA_VERSION = 1
MAX_DIMENSION = 100_000
MAX_CELLS = 1_000_000  # dimension × retained values: bounds the size of one purchase outcome
MAX_STEPS = 64

Identifier = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", strict=True)
]
"""Stream, seller, buyer, value and request ids: 1–64 chars of ``[A-Za-z0-9._-]``; they appear in
topic names and keys, so nothing else is allowed."""

Level = Annotated[float, Field(gt=0, allow_inf_nan=False)]
LevelUnit = Literal["epsilon", "rho", "omega"]
"""What a level measures: ε (Laplace, pure DP), ρ (Gaussian, zCDP) or ω = Δ²/λ (Poisson)."""
UNIT_OF: dict[str, LevelUnit] = {"laplace": "epsilon", "gaussian": "rho", "poisson": "omega"}
PublicKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9+/]{43}=$")]
Currency = Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]
MinorUnits = Annotated[int, Field(ge=0, le=10**15)]
Millis = Annotated[int, Field(ge=0)]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: Literal[1] = 1


# ------------------------------------------------------------------------ pricing specs
class LinearPrecisionSpec(BaseModel):
    """``P(level) = rate_per_precision × precision(level)`` minor units."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["linear_precision"] = "linear_precision"
    rate_per_precision: Annotated[float, Field(ge=0, allow_inf_nan=False)]


class LinearLevelSpec(BaseModel):
    """``P(level) = rate_per_level × level`` minor units (e.g. cents per unit of ε)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["linear_level"] = "linear_level"
    rate_per_level: Annotated[float, Field(ge=0, allow_inf_nan=False)]


class TableSpec(BaseModel):
    """Explicit prices in minor units; keys are levels written as decimal strings."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["table"] = "table"
    prices: dict[str, MinorUnits] = Field(min_length=1, max_length=MAX_STEPS)


PricingSpec = Annotated[
    LinearPrecisionSpec | LinearLevelSpec | TableSpec, Field(discriminator="kind")
]


# ---------------------------------------------------------------------- seller → market
class StreamRegistration(_Event):
    """A seller offers a stream of values for sale (``<p>.registrations``, key: stream_id)."""

    type: Literal["register_stream"] = "register_stream"
    stream_id: Identifier
    seller_id: Identifier
    mechanism: Literal["laplace", "gaussian", "poisson"]
    sensitivity: Level = Field(description="ℓ1 (Laplace, Poisson) or ℓ2 (Gaussian) sensitivity")
    dimension: Annotated[int, Field(ge=1, le=MAX_DIMENSION)]
    steps: list[Level] = Field(
        min_length=1,
        max_length=MAX_STEPS,
        description="levels offered as steps, increasing; a purchase without an explicit "
        "target buys the next one above what the buyer holds",
    )
    cap: Level = Field(description="largest level that will ever be released, to anyone")
    retain_last: Annotated[int, Field(ge=1, le=10_000)] = Field(
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

    @model_validator(mode="after")
    def _consistent(self) -> StreamRegistration:
        if any(b <= a for a, b in zip(self.steps, self.steps[1:], strict=False)):
            raise ValueError("steps must be strictly increasing")
        if self.cap < self.steps[-1]:
            raise ValueError(f"cap {self.cap:g} is below the top step {self.steps[-1]:g}")
        if self.dimension * self.retain_last > MAX_CELLS:
            raise ValueError(
                f"dimension × retain_last = {self.dimension * self.retain_last} exceeds "
                f"{MAX_CELLS}; a purchase outcome would be too large for one message"
            )
        return self


class ValueEvent(_Event):
    """One new value of a stream (``<p>.values``, key: stream_id)."""

    type: Literal["value"] = "value"
    stream_id: Identifier
    value_id: Identifier = Field(description="unique per stream; a resend is deduplicated")
    values: list[float] = Field(min_length=1, max_length=MAX_DIMENSION)
    published_at_ms: Millis = Field(
        description="when the seller published the value (Unix ms); values older than the "
        "stream's newest minus the dedup horizon (7 days) are refused, so replays of old "
        "values can never be re-noised"
    )


# ----------------------------------------------------------------------- buyer → market
class PurchaseRequest(_Event):
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
    max_price_minor: MinorUnits = Field(description="most the buyer will pay, minor units")
    currency: Currency = "EUR"
    requested_at_ms: Millis = Field(
        description="when the buyer made the request (Unix ms; keep it when resending): "
        "requests older than the stream's newest minus the dedup horizon are refused"
    )
    buyer_public_key: PublicKey | None = Field(
        None,
        description="X25519 public key (base64, 32 bytes): releases to this buyer on this stream "
        "are then sealed for it (market.envelope); the latest key given is used",
    )


class QuoteRequest(_Event):
    """Ask the price of a purchase without buying (``<p>.purchases``, key: stream_id)."""

    type: Literal["quote"] = "quote"
    quote_id: Identifier
    buyer_id: Identifier
    stream_id: Identifier
    target_level: Level | None = None


PurchasesEvent = Annotated[PurchaseRequest | QuoteRequest, Field(discriminator="type")]


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


class CatalogEntry(_Event):
    """An accepted stream registration (``<p>.catalog``, compacted, key: stream_id)."""

    type: Literal["catalog_entry"] = "catalog_entry"
    registration: StreamRegistration
    level_unit: LevelUnit
    accepted_at_ms: Millis
    market_key_id: str
    market_public_key: str = Field(description="Ed25519 public key, base64 of the raw 32 bytes")
    prices: list[PriceLevel]


# ---------------------------------------------------------------------- market → buyer
class ReleasedValue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    value_id: Identifier
    seq: int = Field(description="arrival order of the value within its stream")
    level: float
    values: list[float]

    @field_validator("values")
    @classmethod
    def _finite(cls, v: list[float]) -> list[float]:
        if not all(math.isfinite(x) for x in v):
            raise ValueError("released values are finite")
        return v


class ReceiptModel(BaseModel):
    """Wire form of :class:`market.receipts.Receipt` plus its Ed25519 signature."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    receipt_version: int
    purchase_id: str
    buyer_id: str
    stream_id: str
    seller_id: str
    mechanism: str
    value_ids: list[str]
    level_before: float
    level_after: float
    price_minor: int
    currency: str
    release_digest: str
    requested_at_ms: int
    market_key_id: str
    ciphertext_digest: str = ""
    signature: str


class Envelope(BaseModel):
    """Releases sealed for the buyer's X25519 key (see :mod:`market.envelope`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    alg: Literal["x25519-hkdf-sha256-chacha20poly1305"]
    epk: str
    nonce: str
    ciphertext: str


class PurchaseFulfilled(_Event):
    """The single successful outcome of a purchase (``<p>.buyer.<buyer_id>``)."""

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
        None, description="the releases (a JSON list) sealed for the buyer's key"
    )
    receipt: ReceiptModel


class ValueReleased(_Event):
    """New values delivered at the level the buyer holds (subscription), in arrival order.

    The market groups the values that arrive together into one event per buyer and stream."""

    type: Literal["value_released"] = "value_released"
    buyer_id: Identifier
    stream_id: Identifier
    level_unit: LevelUnit
    releases: list[ReleasedValue] = Field(
        default_factory=list, description="empty when the releases are sealed"
    )
    sealed: Envelope | None = None


class QuoteAnswer(_Event):
    """The price of a purchase, without buying (``<p>.buyer.<buyer_id>``)."""

    type: Literal["quote"] = "quote"
    quote_id: Identifier
    buyer_id: Identifier
    stream_id: Identifier
    level_unit: LevelUnit
    level_before: float
    level_after: float
    price_minor: int
    currency: str


class Rejection(_Event):
    """Why an event was not accepted; the original bytes are kept so nothing is lost."""

    type: Literal["rejection"] = "rejection"
    reason: str = Field(description="machine-readable code, e.g. 'invalid_event', 'price_too_low'")
    message: str = Field(description="what was wrong and what to do about it")
    source_topic: str
    source_partition: int | None = None
    source_offset: int | None = None
    request_id: str | None = Field(None, description="purchase_id, quote_id or value_id if known")
    buyer_id: str | None = None
    stream_id: str | None = None
    payload: str = Field(description="the original event (UTF-8 text, or base64 if binary)")
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    details: dict[str, Any] = Field(default_factory=dict)


class MarketIdentity(_Event):
    """Which noise secret a market's state is made with (``<p>.market``, first record wins).

    A worker whose secret has another fingerprint, or whose platform computes other noise for
    the same key (a numpy or randomgen upgrade that changed a sampler), refuses to start: it
    would re-noise levels already released.
    """

    type: Literal["market_identity"] = "market_identity"
    noise_secret_fingerprint: str = Field(description="HMAC of a fixed label under the secret")
    noise_derivation: str = Field(description="version of the keyed chain derivation")
    noise_check: str = Field(
        description="SHA-256 of releases computed for a fixed test key on this platform"
    )
    market_key_id: str
    created_at_ms: Millis


BuyerEvent = Annotated[
    PurchaseFulfilled | ValueReleased | QuoteAnswer | Rejection, Field(discriminator="type")
]

PURCHASES_EVENT: TypeAdapter[PurchaseRequest | QuoteRequest] = TypeAdapter(PurchasesEvent)
BUYER_EVENT: TypeAdapter[PurchaseFulfilled | ValueReleased | QuoteAnswer | Rejection] = TypeAdapter(
    BuyerEvent
)

SCHEMAS: dict[str, TypeAdapter[Any]] = {
    "registrations": TypeAdapter(StreamRegistration),
    "catalog": TypeAdapter(CatalogEntry),
    "values": TypeAdapter(ValueEvent),
    "purchases": PURCHASES_EVENT,
    "buyer": BUYER_EVENT,
    "rejections": TypeAdapter(Rejection),
    "market": TypeAdapter(MarketIdentity),
}
"""Topic family → adapter; ``SCHEMAS[name].json_schema()`` is the published schema."""
