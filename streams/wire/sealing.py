"""What is sealed, for whom and under which AAD: releases for one buyer, values for the market.

A buyer who names an X25519 key gets its releases as an envelope (:mod:`market.envelope`)
instead of plain numbers. The envelope's plaintext is the JSON list of :class:`ReleasedValue`
and its associated data (AAD) binds the envelope to the event carrying it, so an envelope cannot
be moved from one event to another without failing to open:

==========================  ===========================================
event                       AAD
==========================  ===========================================
``purchase_fulfilled``      ``purchase_id``
``value_released``          ``stream_id/buyer_id``
==========================  ===========================================

The worker seals with :func:`seal_releases`, clients open with :func:`open_event`; both use
:func:`aad_of`, so the rule cannot drift between them.

The other way, a seller seals the numbers of a value batch to the market's X25519 key
(``market_sealing_key`` in every catalog entry) with :func:`seal_values` and signs the batch
with the envelope in it (seal, then sign: the signature is over ciphertext, so it tells nothing
of the numbers, and it is checked before anything is decrypted). The market opens it with
:func:`open_values` at one place, the router, so every handler sees plain numbers. The envelope's
AAD (:func:`values_aad`) binds the market (its topic prefix and its key), the stream, the seller
and every value id and publication time of the batch: sealed numbers moved into another batch,
stream or market do not open. The bytes are defined in ``docs/protocol.md`` §4.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from pydantic import BaseModel, TypeAdapter

from market.envelope import EnvelopeError, Opener, Sealer, open_envelope, seal

from .events import Envelope, PurchaseFulfilled, ReleasedValue, ValueBatch, ValueItem, ValueReleased
from .trusted import trusted

__all__ = [
    "VALUES_LABEL",
    "aad_of",
    "delivery_aad",
    "open_event",
    "open_values",
    "padded",
    "padded_length",
    "purchase_aad",
    "releases_json",
    "seal_releases",
    "seal_values",
    "values_aad",
    "values_padded_length",
    "values_plaintext",
]

E = TypeVar("E", bound=BaseModel)
_RELEASES: TypeAdapter[list[ReleasedValue]] = TypeAdapter(list[ReleasedValue])
_PURCHASE: TypeAdapter[dict[str, str | list[ReleasedValue]]] = TypeAdapter(
    dict[str, str | list[ReleasedValue]]
)


def purchase_aad(purchase_id: str) -> bytes:
    """AAD of the envelope in a ``purchase_fulfilled`` event."""
    return purchase_id.encode()


def delivery_aad(stream_id: str, buyer_id: str) -> bytes:
    """AAD of the envelope in a ``value_released`` event."""
    return f"{stream_id}/{buyer_id}".encode()


def aad_of(event: PurchaseFulfilled | ValueReleased) -> bytes:
    """The associated data an envelope carried by ``event`` is sealed under."""
    if isinstance(event, PurchaseFulfilled):
        return purchase_aad(event.purchase_id)
    return delivery_aad(event.stream_id, event.buyer_id)


def releases_json(releases: Sequence[ReleasedValue], opening: bytes | None = None) -> bytes:
    """The plaintext of an envelope: the releases as a JSON list, or with an ``opening`` (a
    purchase's, which opens its receipt's commitment) ``{"opening": hex, "releases": [...]}``."""
    if opening is None:
        return _RELEASES.dump_json(list(releases))
    return _PURCHASE.dump_json({"opening": opening.hex(), "releases": list(releases)})


PAD_MIN = 1024
NUMBER_WIDTH = 24
"""The most characters a released number takes in JSON (``-2.2250738585072014e-308``): every
number is padded as if it took that many, so the plaintext's length says nothing of them."""
KEY_WIDTH = 20
"""The most digits of a histogram key (a key is below 2⁶⁴)."""
_VALUES = b'"values":['


def padded_length(plaintext: bytes, releases: Sequence[ReleasedValue]) -> int:
    """The length ``plaintext`` (:func:`releases_json` of ``releases``) is padded to.

    Each number counts :data:`NUMBER_WIDTH` characters and each histogram key
    :data:`KEY_WIDTH` digits, whatever they are: the length then follows from the value ids,
    arrival numbers, levels and the count of numbers and keys alone, never from the numbers'
    signs, digits or exponents (docs/protocol.md §11.5). A histogram release's
    is then rounded up to the next power of two, at least :data:`PAD_MIN`: how many keys show
    (which depends on the counts) is seen only to within a factor of two.

    The numbers are measured as ``plaintext`` spells them, not written again: each release's
    ``"values":[…]`` is found in it (ids, keys and the opening cannot hold that text, nor a
    number a ``]``), one per release, in order.
    """
    size = len(plaintext)
    at = 0
    for r in releases:  # "[a,b,c]": the numbers' characters are the rest less n + 1
        start = plaintext.index(_VALUES, at) + len(_VALUES) - 1
        at = plaintext.index(b"]", start) + 1
        if r.values:
            size += (NUMBER_WIDTH + 1) * len(r.values) + 1 - (at - start)
        if r.keys:
            size += KEY_WIDTH * len(r.keys) - sum(map(len, r.keys))
    if any(r.keys is not None for r in releases):
        size = max(PAD_MIN, 1 << (size - 1).bit_length())
    return size


def padded(plaintext: bytes, size: int) -> bytes:
    """``plaintext`` followed by spaces (valid trailing JSON whitespace) up to ``size`` bytes."""
    if len(plaintext) > size:
        raise ValueError(f"a plaintext of {len(plaintext)} bytes does not fit {size}")
    return plaintext + b" " * (size - len(plaintext))


def seal_releases(
    sealer: Sealer,
    public_key_b64: str,
    releases: Sequence[ReleasedValue],
    aad: bytes,
    opening: bytes | None = None,
) -> Envelope:
    """Seal ``releases`` (and a purchase's ``opening``) for the holder of ``public_key_b64``
    under ``aad`` (see :func:`aad_of`).

    The plaintext is :func:`padded` to :func:`padded_length`, which depends only on what the
    numbers are not: their count, the ids, the levels. The ``sealer``
    (:class:`market.envelope.Sealer`, over the market's noise secret) keeps a sender key per
    buyer and derives each envelope's nonce from the buyer, the AAD and the plaintext: the same
    message is sealed into the same bytes every time it is produced (replays stay
    byte-identical), and two different messages never share a nonce.
    """
    plaintext = releases_json(releases, opening)
    plaintext = padded(plaintext, padded_length(plaintext, releases))
    return trusted(Envelope, **sealer.seal(public_key_b64, plaintext, aad))


def open_event(event: E, key: X25519PrivateKey) -> E:
    """``event`` with its sealed releases opened (any other event is returned unchanged); a
    purchase's opening, sealed beside its releases, is set as the event's ``opening``.

    Raises :class:`market.envelope.EnvelopeError` if ``key`` cannot open it.
    """
    if not isinstance(event, PurchaseFulfilled | ValueReleased) or event.sealed is None:
        return event
    plain = json.loads(open_envelope(key, event.sealed.model_dump(), aad=aad_of(event)))
    update: dict[str, Any] = {}
    if isinstance(plain, dict) and isinstance(event, PurchaseFulfilled):
        update["opening"] = plain.get("opening")
        plain = plain.get("releases")
        if not isinstance(update["opening"], str):
            raise EnvelopeError("the envelope opens, but holds no opening beside the releases")
    if not isinstance(plain, list):
        raise EnvelopeError("the envelope opens, but holds no list of releases")
    update["releases"] = [ReleasedValue.model_validate(r) for r in plain]
    return event.model_copy(update=update)


VALUES_LABEL = b"emarket values v1\x00"
"""The first bytes of a value batch's AAD: no release's AAD (an id, or ``stream/buyer``)
contains a NUL, so the two never coincide."""


def _sized(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def values_aad(market: str, market_key_b64: str, batch: ValueBatch) -> bytes:
    """The AAD of a value batch's sealed numbers (``docs/protocol.md`` §4.1).

    ``VALUES_LABEL ‖ sized(market) ‖ sized(market key) ‖ sized(stream_id) ‖ sized(seller_id) ‖
    u32be(n) ‖`` then for each item ``sized(value_id) ‖ u64be(published_at_ms)``, where
    ``sized(x) = u32be(len(x)) ‖ x`` and texts are UTF-8.
    """
    head = [
        market.encode(),
        base64.b64decode(market_key_b64, validate=True),
        batch.stream_id.encode(),
        batch.seller_id.encode(),
    ]
    items = [
        _sized(i.value_id.encode()) + i.published_at_ms.to_bytes(8, "big") for i in batch.items
    ]
    return (
        VALUES_LABEL + b"".join(map(_sized, head)) + len(items).to_bytes(4, "big") + b"".join(items)
    )


def values_plaintext(items: Sequence[ValueItem]) -> bytes:
    """What is sealed: a JSON array with one object per item, in order, ``{"values": [...]}``
    and on a histogram item also ``"keys": [...]``, then spaces up to
    :func:`values_padded_length` (``docs/protocol.md`` §4.2)."""
    rows = [
        {"values": list(i.values), **({} if i.keys is None else {"keys": list(i.keys)})}
        for i in items
    ]
    plain = json.dumps(rows, separators=(",", ":"), allow_nan=True).encode()
    return padded(plain, values_padded_length(plain, items))


def values_padded_length(plaintext: bytes, items: Sequence[ValueItem]) -> int:
    """The length a seller's sealed plaintext is padded to: each number as if it took
    :data:`NUMBER_WIDTH` characters, so the envelope's size says nothing of the numbers' signs,
    digits or exponents, only how many there are; a histogram batch's (whose keys are text of
    any length) then rounded up to the next power of two, at least :data:`PAD_MIN`."""
    size = len(plaintext)
    for i in items:
        if i.values:
            spelled = json.dumps(list(i.values), separators=(",", ":"), allow_nan=True)
            size += (NUMBER_WIDTH + 1) * len(i.values) + 1 - len(spelled)
    if any(i.keys is not None for i in items):
        size = max(PAD_MIN, 1 << (size - 1).bit_length())
    return size


def seal_values(
    batch: ValueBatch, market: str, market_key_b64: str, *, seed: bytes | None = None
) -> ValueBatch:
    """``batch`` with its numbers sealed to the market's key (its signature is not redone:
    sign the result, whose canonical bytes hold the envelope). ``seed``: see
    :func:`market.envelope.seal` (tests; a seller leaves it out, for a fresh key and nonce)."""
    if batch.sealed is not None:
        raise ValueError("this batch is sealed already")
    draft = batch.model_copy(
        update={"items": [i.model_copy(update={"values": [], "keys": None}) for i in batch.items]}
    )
    envelope = seal(
        market_key_b64,
        values_plaintext(batch.items),
        values_aad(market, market_key_b64, draft),
        seed=seed,
    )
    return ValueBatch.model_validate({**draft.model_dump(), "sealed": envelope})


def open_values(batch: ValueBatch, market: str, key: X25519PrivateKey | Opener) -> ValueBatch:
    """``batch`` with its sealed numbers opened into its items (a clear batch unchanged).

    Raises
    ------
    market.envelope.EnvelopeError
        The numbers do not open with ``key`` under this batch's AAD: sealed for another market,
        stream, seller or batch, or altered.
    ValueError
        They open, but are not one well-formed entry per item (pydantic's ``ValidationError``
        for an entry that is not a valid value).
    """
    if batch.sealed is None:
        return batch
    opener = key if isinstance(key, Opener) else Opener(key)
    aad = values_aad(market, opener.public_b64, batch)
    plain = opener.open(dict(batch.sealed), aad)
    rows = _rows(plain, len(batch.items))
    items = [
        ValueItem.model_validate(
            {"value_id": i.value_id, "published_at_ms": i.published_at_ms, **row}
        )
        for i, row in zip(batch.items, rows, strict=True)
    ]
    given = {k: getattr(batch, k) for k in batch.model_fields_set}
    return trusted(ValueBatch, **{**given, "items": items, "sealed": None})


def _rows(plain: bytes, n: int) -> list[dict[str, Any]]:
    """The entries of opened numbers: ``n`` objects with ``values`` and at most ``keys``."""
    try:
        rows = json.loads(plain)
    except (ValueError, RecursionError):
        raise ValueError("the sealed numbers are not JSON") from None
    if not isinstance(rows, list) or len(rows) != n:
        raise ValueError(f"the sealed numbers must be a JSON array of {n} entries, one per item")
    for k, row in enumerate(rows):
        if not isinstance(row, dict) or "values" not in row or set(row) - {"values", "keys"}:
            raise ValueError(
                f"sealed entry {k} must be an object with `values` (and `keys` "
                "on a histogram stream) only"
            )
    return rows
