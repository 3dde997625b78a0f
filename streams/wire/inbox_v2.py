"""The v2 inbox record: routed by a pseudonym, sealed whole to the account, signed once.

A market with v2 inboxes (docs/protocol.md §8.5) writes everything it says to an account to one
partitioned topic, ``<p>.inbox``, instead of a topic per account. Anyone who may read a
partition sees its records, so a record shows only what the reader needs to find its own:

* its **key**, the account's *route*: 16 bytes of HKDF over the X25519 secret of the market's
  and the account's sealing keys (:func:`route_keys`), so only those two can compute it; the
  partition is Kafka's default one for that key (:func:`partition_of`);
* its **value**, ``u8(2) ‖ nonce ‖ ChaCha20-Poly1305(seal key, plaintext, AAD = key)``: the
  plaintext is the market's Ed25519 signature followed by the signed bytes
  (:func:`body`), which name the market and the account and hold every message of the record
  (request digest, key and value each), padded with zero bytes to a size bucket
  (:func:`padded_length`).

One record carries every message of one event's outcome (or of one batch's deliveries) for one
account: one seal and one signature where v1 made one record and one signature per message.
The worker seals with :func:`seal_record`; a client opens with :func:`open_record`, which
checks the signature and that the bytes name its market and account before it returns
anything.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .topics import murmur2

__all__ = [
    "FORMAT",
    "HEAD",
    "ROUTE_LABEL",
    "SEAL_LABEL",
    "InboxError",
    "InboxMessage",
    "RouteKeys",
    "body",
    "open_record",
    "padded_length",
    "parse_body",
    "partition_of",
    "route_keys",
    "seal_record",
]

FORMAT = 2
"""The first byte of a v2 record's value (a v1 inbox message is JSON: ``{``)."""
HEAD = b"emarket-inbox-v2\x00"
"""How the signed bytes begin: no other signed bytes of the protocol begin so (§2)."""
ROUTE_LABEL = b"emarket inbox route v2"
SEAL_LABEL = b"emarket inbox seal v2"
_SIG = 64
_NONCE = 12
_SMALLEST = 256
_STEP = 65_536


class InboxError(ValueError):
    """A v2 record that is not a genuine message of the market to this account."""


@dataclass(frozen=True)
class InboxMessage:
    """One message of a record: what a v1 inbox record held (key, value) and the hex SHA-256
    of the event it answers (None for a message that answers no single event)."""

    request: str | None
    key: bytes
    value: bytes


@dataclass(frozen=True)
class RouteKeys:
    """What the market and one account derive from their sealing keys: the record key
    (``route``, 32 lower-case hex digits) and the 32-byte key that seals its records."""

    route: str
    seal_key: bytes


def _s(data: bytes) -> bytes:
    return b"s" + struct.pack(">I", len(data)) + data


def _raw(key: X25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _hkdf(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    prk = hmac.digest(salt, ikm, "sha256")
    return hmac.digest(prk, info + b"\x01", "sha256")[:length]


def route_keys(
    own: X25519PrivateKey, peer: X25519PublicKey, market: str, account_id: str, *, market_side: bool
) -> RouteKeys:
    """The route and seal key of ``account_id``'s records in ``market``: the market computes
    them with its sealing key and the account's public one (``market_side``), the account with
    its own sealing key and the market's public one; both get the same.

    ``salt`` is the market's public key then the account's (32 raw bytes each), ``info`` a
    label, a zero byte and the market prefix and account id as §2's text items."""
    shared = own.exchange(peer)
    mine, theirs = _raw(own.public_key()), _raw(peer)
    salt = mine + theirs if market_side else theirs + mine
    who = b"\x00" + _s(market.encode()) + _s(account_id.encode())
    route = _hkdf(shared, salt, ROUTE_LABEL + who, 16).hex()
    return RouteKeys(route, _hkdf(shared, salt, SEAL_LABEL + who, 32))


def partition_of(route: str, partitions: int) -> int:
    """The partition of ``<p>.inbox`` holding the records keyed ``route`` (§8.2's rule)."""
    return (murmur2(route.encode()) & 0x7FFFFFFF) % partitions


def body(market: str, account_id: str, messages: Sequence[InboxMessage]) -> bytes:
    """The bytes the market signs: its head, the market prefix, the account, then each
    message as ``[s(hex R) | n] ‖ s(key) ‖ s(value)`` after ``i(count)`` (§2's items)."""
    parts = [HEAD, _s(market.encode()), _s(account_id.encode())]
    parts.append(b"i" + struct.pack(">q", len(messages)))
    for m in messages:
        parts.append(b"n" if m.request is None else _s(m.request.encode()))
        parts.append(_s(m.key))
        parts.append(_s(m.value))
    return b"".join(parts)


def padded_length(n: int) -> int:
    """The plaintext's length once padded: a power of two from 256 bytes to 64 KiB, then a
    multiple of 64 KiB, so a record's size says little more than its size bucket."""
    if n <= _STEP:
        return max(_SMALLEST, 1 << (n - 1).bit_length())
    return -(-n // _STEP) * _STEP


def _nonce(seal_key: bytes, plaintext: bytes) -> bytes:
    """A nonce that is a function of the plaintext: a replayed record is the same bytes, and
    two records share a nonce only if they are the same record."""
    return hmac.digest(seal_key, plaintext, "sha256")[:_NONCE]


def seal_record(
    keys: RouteKeys,
    signer: Ed25519PrivateKey,
    market: str,
    account_id: str,
    messages: Sequence[InboxMessage],
) -> bytes:
    """The value of the record that carries ``messages`` to ``account_id``."""
    signed = body(market, account_id, messages)
    plain = signer.sign(signed) + signed
    plain += bytes(padded_length(len(plain)) - len(plain))
    nonce = _nonce(keys.seal_key, plain)
    sealed = ChaCha20Poly1305(keys.seal_key).encrypt(nonce, plain, keys.route.encode())
    return bytes([FORMAT]) + nonce + sealed


def _item(data: bytes, at: int, tag: bytes) -> tuple[bytes, int]:
    if data[at : at + 1] != tag:
        raise InboxError(f"expected item {tag!r} at byte {at}")
    if tag == b"i":
        return data[at + 1 : at + 9], at + 9
    (size,) = struct.unpack(">I", data[at + 1 : at + 5])
    end = at + 5 + size
    if end > len(data):
        raise InboxError(f"an item at byte {at} runs past the end")
    return data[at + 5 : end], end


def parse_body(data: bytes) -> tuple[str, str, list[InboxMessage], int]:
    """Market prefix, account id and messages of signed bytes at the start of ``data``, and
    where they end (padding may follow)."""
    if not data.startswith(HEAD):
        raise InboxError("not the signed bytes of a v2 inbox record")
    market, at = _item(data, len(HEAD), b"s")
    account, at = _item(data, at, b"s")
    count_raw, at = _item(data, at, b"i")
    (count,) = struct.unpack(">q", count_raw)
    if count < 1 or count > len(data):
        raise InboxError(f"a record of {count} messages")
    messages = []
    for _ in range(count):
        request: str | None = None
        if data[at : at + 1] == b"n":
            at += 1
        else:
            raw, at = _item(data, at, b"s")
            request = raw.decode()
        key, at = _item(data, at, b"s")
        value, at = _item(data, at, b"s")
        messages.append(InboxMessage(request, key, value))
    return market.decode(), account.decode(), messages, at


def open_record(
    keys: RouteKeys,
    market_key: Ed25519PublicKey,
    market: str,
    account_id: str,
    value: bytes,
) -> list[InboxMessage]:
    """The messages of a record keyed ``keys.route``; raise :class:`InboxError` unless it
    opens with ``keys``, its signature verifies under ``market_key`` and it names ``market``
    and ``account_id``, with nothing but zero bytes after the signed bytes."""
    if len(value) < 1 + _NONCE + 16 or value[0] != FORMAT:
        raise InboxError("not a v2 inbox record (its first byte is not 2)")
    try:
        plain = ChaCha20Poly1305(keys.seal_key).decrypt(
            value[1 : 1 + _NONCE], value[1 + _NONCE :], keys.route.encode()
        )
    except InvalidTag:
        raise InboxError("does not open with this account's seal key") from None
    signature, rest = plain[:_SIG], plain[_SIG:]
    named_market, named_account, messages, end = parse_body(rest)
    if any(rest[end:]):
        raise InboxError("bytes other than zero after the signed bytes")
    try:
        market_key.verify(signature, rest[:end])
    except InvalidSignature:
        raise InboxError("the market's signature does not verify") from None
    if (named_market, named_account) != (market, account_id):
        raise InboxError(f"written for {named_account!r} in {named_market!r}, not this account")
    return messages
