"""Sealed envelopes: releases readable only by the buyer they were sold to.

A buyer holds an X25519 key pair and sends the public half with its purchases. The market seals
each release message for that key (ECIES-style): a fresh ephemeral X25519 key, HKDF-SHA256 over
the shared secret (salt = ephemeral public key ‖ recipient public key, info = ``context``) giving a
256-bit key, and ChaCha20-Poly1305 with a random 96-bit nonce and the ``aad`` bound in. Anyone
else who reads the buyer's topic (a misconfigured ACL, a leaked backup) learns nothing; a
tampered envelope fails to open. Receipts carry the SHA-256 of the ciphertext, so the receipt
binds exactly what was delivered.

Wire form (JSON): ``{"alg": "x25519-hkdf-sha256-chacha20poly1305", "epk": b64, "nonce": b64,
"ciphertext": b64}``.

A service that seals many messages for the same recipients uses a :class:`Sealer`: one sender
key per recipient, derived from the service's secret and cached, so a message costs an HMAC
and the cipher instead of two X25519 operations; its envelopes have the same wire form and
open with the same :func:`open_envelope`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections import OrderedDict
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .errors import MarketError

__all__ = [
    "ALGORITHM",
    "EnvelopeError",
    "Opener",
    "Sealer",
    "ciphertext_digest",
    "generate_keypair",
    "open_envelope",
    "public_key_b64",
    "seal",
    "validate_public_key",
]

ALGORITHM = "x25519-hkdf-sha256-chacha20poly1305"
CONTEXT = b"epsilon-market release v1"


class EnvelopeError(MarketError, ValueError):
    """An envelope that cannot be opened, or a key that is not an X25519 key."""

    code = "bad_envelope"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise EnvelopeError(f"{what} is not valid base64") from None


def generate_keypair() -> tuple[X25519PrivateKey, str]:
    """A new buyer key pair.

    Returns
    -------
    (X25519PrivateKey, str)
        The private key, and the public key as base64 of its 32 raw bytes (what a purchase
        names as ``buyer_public_key``).
    """
    key = X25519PrivateKey.generate()
    return key, public_key_b64(key)


def public_key_b64(key: X25519PrivateKey) -> str:
    """Base64 of the 32 raw bytes of ``key``'s public half."""
    return _b64(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def parse_public_key(text: str) -> X25519PublicKey:
    """An X25519 public key from base64; raise :class:`EnvelopeError` if it is not one."""
    raw = _unb64(text, "public key")
    if len(raw) != 32:
        raise EnvelopeError(f"an X25519 public key is 32 bytes, got {len(raw)}")
    return X25519PublicKey.from_public_bytes(raw)


_PROBE = X25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
_P25519 = 2**255 - 19


def validate_public_key(text: str) -> X25519PublicKey:
    """:func:`parse_public_key`, and refuse a key nothing can be sealed for.

    A low-order point (all zeros, and a handful of others) makes every shared secret zero:
    ``cryptography`` refuses the exchange, so such a key would make every seal for it fail
    (and sealing with it would not be secret anyway). Check keys when they are accepted, not
    when something is first sealed for them. A key is also written in its one canonical
    encoding (RFC 7748: the u-coordinate below 2²⁵⁵ − 19, the top bit clear): the other spelling
    of a key is refused, not read as the key it reduces to.
    """
    key = parse_public_key(text)
    if int.from_bytes(base64.b64decode(text), "little") >= _P25519:
        raise EnvelopeError(
            "this X25519 public key is not canonically encoded (its u-coordinate is 2^255 - 19 "
            "or more, or its top bit is set)"
        )
    try:
        _PROBE.exchange(key)
    except ValueError as exc:
        raise EnvelopeError(
            "this X25519 public key is a low-order point: nothing can be sealed for it"
        ) from exc
    return key


def _key(shared: bytes, epk: bytes, rpk: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``shared``, salt ``epk ‖ rpk``, info :data:`CONTEXT`, 32 bytes.

    One output block, so extract and expand are one HMAC each; written out with
    :func:`hmac.digest` because the library's HKDF object costs ~10 µs of setup a message
    (``tests/market/test_envelope.py`` checks it against that object).
    """
    prk = hmac.digest(epk + rpk, shared, "sha256")
    return hmac.digest(prk, CONTEXT + b"\x01", "sha256")


def seal(
    recipient_b64: str, plaintext: bytes, aad: bytes = b"", *, seed: bytes | None = None
) -> dict[str, str]:
    """Encrypt ``plaintext`` for the holder of the private key matching ``recipient_b64``.

    Parameters
    ----------
    recipient_b64 : str
        The recipient's X25519 public key, base64.
    plaintext : bytes
        What to seal.
    aad : bytes, optional
        Associated data bound into the tag: opening with other ``aad`` fails.
    seed : bytes, optional
        At least 32 secret bytes that determine the ephemeral key and the nonce, making the
        envelope a function of its inputs (a replayed message is sealed into the same bytes).
        It must be unique per plaintext: derive it from a secret and a hash of everything
        sealed. Without it, both are fresh random. (A service sealing many messages for the
        same recipients uses a :class:`Sealer`, one sender key per recipient.)

    Returns
    -------
    dict
        The envelope's wire form (``alg``, ``epk``, ``nonce``, ``ciphertext``, base64).
    """
    recipient = parse_public_key(recipient_b64)
    if seed is None:
        eph, nonce = X25519PrivateKey.generate(), os.urandom(12)
    else:
        if len(seed) < 32:
            raise EnvelopeError("a sealing seed must be at least 32 bytes")
        eph = X25519PrivateKey.from_private_bytes(hmac.digest(seed, b"ephemeral key", "sha256"))
        nonce = hmac.digest(seed, b"nonce", "sha256")[:12]
    epk = eph.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    rpk = recipient.public_bytes(Encoding.Raw, PublicFormat.Raw)
    ct = ChaCha20Poly1305(_key(eph.exchange(recipient), epk, rpk)).encrypt(nonce, plaintext, aad)
    return {"alg": ALGORITHM, "epk": _b64(epk), "nonce": _b64(nonce), "ciphertext": _b64(ct)}


class Sealer:
    """Seals for many recipients under one secret: a sender key per recipient, cached.

    Parameters
    ----------
    secret : bytes
        At least 32 secret bytes (the service's noise secret): whoever holds it can open every
        envelope this sealer made, as whoever holds it can already recompute every release.
    maxsize : int, optional
        Recipients whose keys are kept (least recently used dropped first; 4,096 by default,
        ~1 MiB).

    Notes
    -----
    :func:`seal` with a ``seed`` derives a new sender ("ephemeral") key per message from the
    seed: two X25519 operations (~65 µs here) per message. A sealer derives the sender key of a
    recipient once, ``HMAC-SHA256(secret, "emarket sender key v1" ‖ rpk)``, and keeps the
    cipher keyed with ``HKDF(X25519(sender, recipient), salt = epk ‖ rpk)``: a message then
    costs its nonce and the cipher (~5 µs). Every message to a recipient shares that key, so
    the nonce carries the uniqueness: ``HMAC-SHA256(secret, "emarket nonce v1" ‖ rpk ‖ aad ‖
    SHA-256(plaintext))``, truncated to 96 bits. The same message is sealed into the same bytes
    (a replay is byte-identical); two different messages to one recipient share a nonce with
    probability 2^-96 a pair (2^-33 after 2^32 messages to one key). Nothing is lost against
    the per-message key: that key came from the same secret, and the recipient's topic already
    says who the envelopes are for (the ``epk`` now says it too). A recipient who rotates
    their key gets a new sender key.
    """

    def __init__(self, secret: bytes, maxsize: int = 4096) -> None:
        if len(secret) < 32:
            raise EnvelopeError("a sealer's secret must be at least 32 bytes")
        self._secret = secret
        self._maxsize = maxsize
        self._keys: OrderedDict[str, tuple[bytes, bytes, ChaCha20Poly1305]] = OrderedDict()

    def _recipient(self, recipient_b64: str) -> tuple[bytes, bytes, ChaCha20Poly1305]:
        hit = self._keys.get(recipient_b64)
        if hit is not None:
            self._keys.move_to_end(recipient_b64)
            return hit
        recipient = parse_public_key(recipient_b64)
        rpk = recipient.public_bytes(Encoding.Raw, PublicFormat.Raw)
        sender = X25519PrivateKey.from_private_bytes(
            hmac.digest(self._secret, b"emarket sender key v1" + rpk, "sha256")
        )
        epk = sender.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        try:
            shared = sender.exchange(recipient)
        except ValueError as exc:  # a low-order point: every shared secret would be zero
            raise EnvelopeError("nothing can be sealed for a low-order X25519 key") from exc
        cipher = ChaCha20Poly1305(_key(shared, epk, rpk))
        entry = (rpk, epk, cipher)
        self._keys[recipient_b64] = entry
        if len(self._keys) > self._maxsize:
            self._keys.popitem(last=False)
        return entry

    def seal(self, recipient_b64: str, plaintext: bytes, aad: bytes = b"") -> dict[str, str]:
        """Encrypt ``plaintext`` for ``recipient_b64`` under ``aad`` (see the class notes).

        Returns
        -------
        dict
            The envelope's wire form, as :func:`seal` returns it.

        Raises
        ------
        EnvelopeError
            The recipient is not an X25519 public key (or a low-order point: the exchange
            fails, as :func:`validate_public_key` says).
        """
        rpk, epk, cipher = self._recipient(recipient_b64)
        material = b"".join(
            len(p).to_bytes(4, "big") + p for p in (rpk, aad, hashlib.sha256(plaintext).digest())
        )
        nonce = hmac.digest(self._secret, b"emarket nonce v1" + material, "sha256")[:12]
        ct = cipher.encrypt(nonce, plaintext, aad)
        return {"alg": ALGORITHM, "epk": _b64(epk), "nonce": _b64(nonce), "ciphertext": _b64(ct)}


def open_envelope(key: X25519PrivateKey, envelope: dict[str, Any], aad: bytes = b"") -> bytes:
    """Decrypt an envelope made by :func:`seal` (:meth:`Opener.open` for a key used often).

    Parameters
    ----------
    key : X25519PrivateKey
        The recipient's private key.
    envelope : dict
        The envelope's wire form.
    aad : bytes, optional
        The associated data it was sealed under.

    Returns
    -------
    bytes
        The plaintext.

    Raises
    ------
    EnvelopeError
        Malformed, sealed for another key, or tampered with.
    """
    return Opener(key).open(envelope, aad)


class Opener:
    """Opens many envelopes sealed to one key (the market's, for sellers' values).

    Parameters
    ----------
    key : X25519PrivateKey
        The recipient's private key.

    Notes
    -----
    The key's public half, which the HKDF salt and the values' AAD name, is computed once
    here, not per envelope (an X25519 base-point multiplication, ~12 µs, twice a batch).
    Each envelope still costs its own exchange: senders draw a fresh key per envelope.
    """

    __slots__ = ("_key", "public_b64", "public_bytes")

    def __init__(self, key: X25519PrivateKey) -> None:
        self._key = key
        self.public_bytes = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public_b64 = _b64(self.public_bytes)

    def open(self, envelope: dict[str, Any], aad: bytes = b"") -> bytes:
        """The plaintext of ``envelope`` sealed under ``aad`` (see :func:`open_envelope`)."""
        if envelope.get("alg") != ALGORITHM:
            raise EnvelopeError(f"unsupported envelope algorithm {envelope.get('alg')!r}")
        epk = _unb64(str(envelope.get("epk", "")), "epk")
        nonce = _unb64(str(envelope.get("nonce", "")), "nonce")
        ct = _unb64(str(envelope.get("ciphertext", "")), "ciphertext")
        if len(epk) != 32 or len(nonce) != 12:
            raise EnvelopeError("envelope has a malformed ephemeral key or nonce")
        try:
            shared = self._key.exchange(X25519PublicKey.from_public_bytes(epk))
        except ValueError:  # a low-order point: no shared secret, nothing sealed to us
            raise EnvelopeError("envelope has a low-order ephemeral key") from None
        try:
            return ChaCha20Poly1305(_key(shared, epk, self.public_bytes)).decrypt(nonce, ct, aad)
        except InvalidTag:
            raise EnvelopeError(
                "envelope cannot be opened with this key (sealed for someone else, or tampered)"
            ) from None


def ciphertext_digest(envelope: dict[str, Any]) -> str:
    """Hex SHA-256 of the envelope's ciphertext bytes: what a receipt binds.

    Raises
    ------
    EnvelopeError
        ``envelope`` is not a JSON object or its ciphertext is not base64.
    """
    if not isinstance(envelope, dict):
        raise EnvelopeError(f"a sealed envelope is a JSON object, not {type(envelope).__name__}")
    return hashlib.sha256(_unb64(str(envelope.get("ciphertext", "")), "ciphertext")).hexdigest()
