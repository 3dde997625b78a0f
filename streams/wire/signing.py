"""What a party signs: canonical bytes of every event it sends, and their Ed25519 signatures.

The signature does not cover JSON text (float formatting differs between languages) but these
bytes, which any language can reproduce::

    b"emarket-sig-v2\\x00" · market prefix · market key id · event type · [generation] · fields

where ``[generation]`` is, for an account past its first keys, ``i`` + its key version (nothing
at version 1, and never in account events, which carry their version themselves). Each item is
tagged and sized: ``s`` + u32 length + UTF-8 for text, ``i`` + i64 for integers, ``f`` + f64
(IEEE-754 bits) for levels and prices, ``n`` for a null, ``b`` + one byte for booleans, and
``v`` + u32 count + little-endian f64s for the numbers of a value (all big-endian but those).
The bytes are those of the event *as read*: a field the JSON leaves out is signed as its
default (``n`` where the default is null), so leaving a field out and sending its default are
one event. A double is signed with ``-0.0`` read as ``0.0``: a JSON writer that prints negative
zero as ``0`` (JavaScript's) sends the number that was signed. The market is named by its prefix
*and* the key id of its Ed25519 key (:class:`MarketRef`): markets started with the same defaults
share a prefix, never a key, so nothing signed for one verifies in another. Bytes of the first
version (``emarket-sig-v1``, the prefix alone) verify nowhere; :func:`signed_v1` only tells
their sender why (``old_signature_format``). An ``accuracy`` target is ``n``
when absent, else ``b`` 1 then its rmse, half_width and confidence. The generation makes bytes
signed before a rotation verify under no later key
version, even after a rotation back to their key. The fields are every one that matters:

===================  ================================================================
``open_account``     account_id, signing_key, sealing_key, opened_at_ms
``rotate_keys``      account_id, version, signing_key, sealing_key, rotated_at_ms
``register_stream``  stream_id, seller_id, mechanism, sensitivity, dimension, steps, cap,
                     retain_last, sealed, pricing (kind and its numbers), currency,
                     description, and on a ``window`` stream only: privacy_unit,
                     window duration_ms, window cap; on a ``running_totals`` stream
                     only: product, tree_height; on a ``histogram`` stream only:
                     product, key_space, domain_size (``n`` for strings), false_keys;
                     on a ``rappor`` stream only: product, rappor_ones;
                     with a per-buyer share only: the text ``buyer_share``, buyer_share
``values``           stream_id, seller_id, number of items, then per item: value_id,
                     published_at_ms, values, and on a histogram item only: number of
                     keys, then each key as text; on a sealed batch only (its items'
                     values are then empty), the envelope's alg, epk, nonce and
                     ciphertext as text (base64, as sent)
``purchase``         purchase_id, buyer_id, stream_id, target_level, max_price_minor,
                     currency, requested_at_ms, accuracy, most_accurate, and when it names
                     one only: reservation_id
``quote``            quote_id, buyer_id, stream_id, target_level, requested_at_ms, accuracy
``reserve``          reservation_id, buyer_id, stream_id, target_level, hold_ms,
                     requested_at_ms, accuracy
===================  ================================================================
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import nacl.bindings
import nacl.exceptions
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel

from market.receipts import key_id

from .events import (
    OpenAccount,
    PurchaseRequest,
    QuoteRequest,
    ReserveRequest,
    RotateKeys,
    StreamRegistration,
    ValueBatch,
)
from .ids import public_b64
from .products import section_of

__all__ = [
    "MarketRef",
    "SodiumSigningKey",
    "answer_bytes",
    "canonical_bytes",
    "ed25519_verify",
    "key_id_of",
    "parse_signing_key",
    "public_b64",
    "sign",
    "signed",
    "signed_v1",
    "valid_signing_key",
    "verify",
]

DOMAIN = b"emarket-sig-v2\x00"
"""The head of every byte string a party signs (docs/protocol.md §2)."""
DOMAIN_V1 = b"emarket-sig-v1\x00"
"""The head of the first version's bytes, which named no market key; the market's answers
keep it (§12.2): the market's own key signs them, which binds them to the market already."""
_KEY_ID = re.compile(r"[0-9a-f]{16}")
_PLACEHOLDER = "A" * 86 + "=="
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class MarketRef:
    """The market a party signs for: its topic prefix and the key id of its Ed25519 key (the
    ``market_key_id`` of its identity record, docs/protocol.md §2). The key id is what makes
    the market one: every market started with defaults is ``emarket``."""

    prefix: str
    key_id: str

    def __post_init__(self) -> None:
        if not _KEY_ID.fullmatch(self.key_id):
            raise ValueError(
                f"a market key id is 16 lower-case hex digits, got {self.key_id!r}: pass the "
                "market's key id (market_key_id of its <prefix>.market record)"
            )

    @classmethod
    def of(cls, prefix: str, market_public_key: str) -> MarketRef:
        """The market whose Ed25519 public key (base64) is ``market_public_key``."""
        return cls(prefix, key_id_of(market_public_key))


class _Canon:
    def __init__(self, head: bytes, names: Sequence[str], kind: str) -> None:
        self.parts: list[bytes] = [head]
        for name in names:
            self.s(name)
        self.s(kind)

    def s(self, x: str | None) -> _Canon:
        if x is None:
            return self.n()
        data = x.encode("utf-8")
        self.parts.append(b"s" + struct.pack(">I", len(data)) + data)
        return self

    def i(self, x: int) -> _Canon:
        self.parts.append(b"i" + struct.pack(">q", x))
        return self

    def f(self, x: float | None) -> _Canon:
        if x is None:
            return self.n()
        self.parts.append(b"f" + struct.pack(">d", float(x) + 0.0))  # -0.0 is signed as 0.0
        return self

    def b(self, x: bool) -> _Canon:
        self.parts.append(b"b" + bytes([int(x)]))
        return self

    def n(self) -> _Canon:
        self.parts.append(b"n")
        return self

    def v(self, values: Sequence[float]) -> _Canon:
        arr = np.asarray(values, dtype="<f8") + 0.0  # -0.0 is signed as 0.0, as for `f`
        self.parts.append(b"v" + struct.pack(">I", arr.size) + arr.tobytes())
        return self

    def done(self) -> bytes:
        return b"".join(self.parts)


def _account(c: _Canon, e: Any) -> None:
    c.s(e.account_id)
    if isinstance(e, RotateKeys):
        c.i(e.version)
    c.s(e.signing_key).s(e.sealing_key)
    c.i(e.opened_at_ms if isinstance(e, OpenAccount) else e.rotated_at_ms)


def _registration(c: _Canon, e: StreamRegistration) -> None:
    c.s(e.stream_id).s(e.seller_id).s(e.mechanism).f(e.sensitivity).i(e.dimension).v(e.steps)
    c.f(e.cap).i(e.retain_last).b(e.sealed).s(e.pricing.kind)
    spec = e.pricing.model_dump()
    if e.pricing.kind == "table":
        prices = spec["prices"]
        c.i(len(prices))
        for level in sorted(prices):  # the keys' exact text: no other spelling verifies
            c.s(level).i(prices[level])
    else:
        c.f(spec.get("rate_per_precision", spec.get("rate_per_level")))
    c.s(e.currency).s(e.description)
    if e.window is not None:  # nothing for 'event' streams: their bytes predate the field
        c.s(e.privacy_unit).i(e.window.duration_ms).f(e.window.cap)
    section_of(e).sign(c, e)  # likewise nothing for streams of values
    if e.buyer_share is not None:  # nothing without a per-buyer share: earlier bytes stand
        c.s("buyer_share").f(e.buyer_share)


def _values(c: _Canon, e: ValueBatch) -> None:
    c.s(e.stream_id).s(e.seller_id).i(len(e.items))
    for item in e.items:
        c.s(item.value_id).i(item.published_at_ms).v(item.values)
        if item.keys is not None:  # histogram items only: plain items' bytes are unchanged
            c.i(len(item.keys))
            for key in item.keys:
                c.s(key)
    if e.sealed is not None:  # seal, then sign: the signature covers the ciphertext
        c.s(e.sealed.alg).s(e.sealed.epk).s(e.sealed.nonce).s(e.sealed.ciphertext)
    if e.batch_seq is not None:  # numbered batches only: unnumbered ones keep their bytes
        c.i(e.batch_seq)


def _accuracy(c: _Canon, a: Any) -> None:
    if a is None:
        c.n()
    else:
        c.b(True).f(a.rmse).f(a.half_width).f(a.confidence)


def _purchase(c: _Canon, e: PurchaseRequest) -> None:
    c.s(e.purchase_id).s(e.buyer_id).s(e.stream_id).f(e.target_level).i(e.max_price_minor)
    c.s(e.currency).i(e.requested_at_ms)
    _accuracy(c, e.accuracy)
    c.b(e.most_accurate)
    if e.reservation_id is not None:  # only when named: other purchases' bytes are unchanged
        c.s(e.reservation_id)


def _quote(c: _Canon, e: QuoteRequest) -> None:
    c.s(e.quote_id).s(e.buyer_id).s(e.stream_id).f(e.target_level).i(e.requested_at_ms)
    _accuracy(c, e.accuracy)


def _reserve(c: _Canon, e: ReserveRequest) -> None:
    c.s(e.reservation_id).s(e.buyer_id).s(e.stream_id).f(e.target_level).i(e.hold_ms)
    c.i(e.requested_at_ms)
    _accuracy(c, e.accuracy)


_FIELDS: dict[str, Callable[[_Canon, Any], None]] = {
    "open_account": _account,
    "rotate_keys": _account,
    "register_stream": _registration,
    "values": _values,
    "purchase": _purchase,
    "quote": _quote,
    "reserve": _reserve,
}


_ACCOUNT_EVENTS = frozenset({"open_account", "rotate_keys"})


def canonical_bytes(market: MarketRef, event: Any, generation: int = 1) -> bytes:
    """The bytes ``event`` (or a dict-like stand-in with its fields) is signed over for
    ``market``, by an account at key version ``generation`` (account events carry their version
    themselves)."""
    if not isinstance(market, MarketRef):
        raise TypeError(f"a signature names the market by a MarketRef, not {market!r}")
    return _bytes(_Canon(DOMAIN, (market.prefix, market.key_id), event.type), event, generation)


def _v1_bytes(prefix: str, event: Any, generation: int) -> bytes:
    """The first version's bytes of ``event``: no market key id (never accepted)."""
    return _bytes(_Canon(DOMAIN_V1, (prefix,), event.type), event, generation)


def _bytes(c: _Canon, event: Any, generation: int) -> bytes:
    kind = event.type
    if generation < 1:
        raise ValueError(f"a key version is at least 1, got {generation}")
    if generation > 1 and kind not in _ACCOUNT_EVENTS:
        c.i(generation)  # version 1's bytes are those every signature before versions had
    _FIELDS[kind](c, event)
    return c.done()


def answer_bytes(market: str, topic: str, request_sha256: str | None, value: bytes) -> bytes:
    """The bytes the market signs for a message it writes to an inbox or to the refusals
    record (docs/protocol.md §12): the same tagged form as a party's
    events, of kind ``answer``, over the topic written, the hex SHA-256 of the event answered
    (``n`` for a message that answers no single event: a batch's deliveries) and the hex
    SHA-256 of the message's exact value bytes. The topic binds it to one inbox, the request
    to one event: neither can be moved to another."""
    c = _Canon(DOMAIN_V1, (market,), "answer").s(topic).s(request_sha256)
    return c.s(hashlib.sha256(value).hexdigest()).done()


@lru_cache(maxsize=65_536)
def parse_signing_key(b64: str) -> Ed25519PublicKey:
    """An Ed25519 public key from base64 (cached: accounts sign many events)."""
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(b64, validate=True))


def key_id_of(b64: str) -> str:
    """The key id (16 hex digits) of an Ed25519 public key given as base64."""
    return key_id(parse_signing_key(b64))


def sign(market: MarketRef, event: Any, key: Ed25519PrivateKey, *, generation: int = 1) -> str:
    """Base64 signature of ``event``'s canonical bytes, by an account at key version
    ``generation``."""
    data = canonical_bytes(market, event, generation)
    return base64.b64encode(key.sign(data)).decode("ascii")


def signed(
    model: type[M], market: MarketRef, key: Ed25519PrivateKey, *, generation: int = 1, **fields: Any
) -> M:
    """Build a signed event of type ``model`` from its fields (``key_id`` and ``signature`` are
    filled in), by an account at key version ``generation``."""
    draft = model.model_validate(
        {**fields, "key_id": key_id(key.public_key()), "signature": _PLACEHOLDER}
    )
    return draft.model_copy(update={"signature": sign(market, draft, key, generation=generation)})


def ed25519_verify(public_key_b64: str, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``message`` by the key (base64), as
    libsodium's strict verification (``crypto_sign_open``) says: the one verification of the
    event path, and the fastest here (about half OpenSSL's CPU time).

    RFC 8032 lets a verifier accept public keys and ``R`` of small order and keys in
    non-canonical encoding; libsodium refuses them, and so does the market. OpenSSL accepts
    them: with the identity point as the key, ``R`` = identity and ``S`` = 0 is a valid
    signature of every message, i.e. a signature by nobody
    (``tests/streams/wire/test_signing_strictness.py``). A key that is not 32 bytes of base64
    verifies nothing.
    """
    try:
        raw = _raw_public(public_key_b64)
    except ValueError:
        return False
    if len(signature) != nacl.bindings.crypto_sign_BYTES:
        return False
    try:
        nacl.bindings.crypto_sign_open(signature + message, raw)
    except (nacl.exceptions.BadSignatureError, ValueError):
        return False
    return True


def valid_signing_key(public_key_b64: str) -> bool:
    """Whether the Ed25519 public key (base64) is a key someone holds the secret of: 32 bytes
    encoding, canonically, a point of the prime-order subgroup other than the identity
    (libsodium's ``crypto_core_ed25519_is_valid_point``). Every key made from a seed is one;
    the identity, the other small-order points, mixed-order points and a second spelling of a
    point (y ≥ p) are not, and an account pinning one could be signed for by anybody
    (docs/protocol.md §5)."""
    try:
        raw = _raw_public(public_key_b64)
    except ValueError:
        return False
    return bool(nacl.bindings.crypto_core_ed25519_is_valid_point(raw))


class SodiumSigningKey(Ed25519PrivateKey):
    """An Ed25519 private key that signs with libsodium: the market's own key, which signs
    every receipt and every answer (28 µs of CPU a signature against OpenSSL's 42 µs here).

    Ed25519 signatures are deterministic (RFC 8032), so the bytes are those OpenSSL makes
    (``tests/streams/wire/test_signing_strictness.py``); everything but signing is the wrapped
    key's.
    """

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        _, self._secret = nacl.bindings.crypto_sign_seed_keypair(key.private_bytes_raw())

    def sign(self, data: bytes | bytearray | memoryview) -> bytes:
        signed: bytes = nacl.bindings.crypto_sign(bytes(data), self._secret)
        return signed[: nacl.bindings.crypto_sign_BYTES]

    def public_key(self) -> Ed25519PublicKey:
        return self._key.public_key()

    def private_bytes(self, encoding: Any, format: Any, encryption_algorithm: Any) -> bytes:
        return self._key.private_bytes(encoding, format, encryption_algorithm)

    def private_bytes_raw(self) -> bytes:
        return self._key.private_bytes_raw()

    def __copy__(self) -> SodiumSigningKey:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> SodiumSigningKey:
        return self


@lru_cache(maxsize=65_536)
def _raw_public(b64: str) -> bytes:
    """The 32 raw bytes of a public key :func:`parse_signing_key` accepted (cached with it)."""
    return parse_signing_key(b64).public_bytes_raw()


def verify(
    market: MarketRef,
    event: Any,
    public_key_b64: str,
    signature: str | None = None,
    *,
    generation: int = 1,
) -> bool:
    """True if ``signature`` (default: the event's) is the key's signature of the event for
    ``market``, made at key version ``generation``."""
    try:
        raw = base64.b64decode(signature or event.signature, validate=True)
        return ed25519_verify(public_key_b64, raw, canonical_bytes(market, event, generation))
    except (ValueError, OverflowError, struct.error):
        return False


def signed_v1(
    market: MarketRef,
    event: Any,
    public_key_b64: str,
    signature: str | None = None,
    *,
    generation: int = 1,
) -> bool:
    """True if the signature is the key's over the event's *first-version* bytes (which name
    the market by its prefix only): such an event is never applied, and this only names the
    reason (``old_signature_format``) for a sender whose client signs that way."""
    try:
        raw = base64.b64decode(signature or event.signature, validate=True)
        return ed25519_verify(public_key_b64, raw, _v1_bytes(market.prefix, event, generation))
    except (ValueError, OverflowError, struct.error):
        return False
