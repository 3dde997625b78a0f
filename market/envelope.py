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
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .errors import MarketError

__all__ = [
    "ALGORITHM",
    "EnvelopeError",
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


def validate_public_key(text: str) -> X25519PublicKey:
    """:func:`parse_public_key`, and refuse a key nothing can be sealed for.

    A low-order point (all zeros, and a handful of others) makes every shared secret zero:
    ``cryptography`` refuses the exchange, so such a key would make every seal for it fail
    (and sealing with it would not be secret anyway). Check keys when they are accepted, not
    when something is first sealed for them.
    """
    key = parse_public_key(text)
    try:
        _PROBE.exchange(key)
    except ValueError as exc:
        raise EnvelopeError(
            "this X25519 public key is a low-order point: nothing can be sealed for it"
        ) from exc
    return key


def _key(shared: bytes, epk: bytes, rpk: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=epk + rpk, info=CONTEXT).derive(shared)


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
        sealed (:func:`streams.wire.sealing.seal_releases` does). Without it, both are fresh
        random.

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


def open_envelope(key: X25519PrivateKey, envelope: dict[str, Any], aad: bytes = b"") -> bytes:
    """Decrypt an envelope made by :func:`seal`.

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
    if envelope.get("alg") != ALGORITHM:
        raise EnvelopeError(f"unsupported envelope algorithm {envelope.get('alg')!r}")
    epk = _unb64(str(envelope.get("epk", "")), "epk")
    nonce = _unb64(str(envelope.get("nonce", "")), "nonce")
    ct = _unb64(str(envelope.get("ciphertext", "")), "ciphertext")
    if len(epk) != 32 or len(nonce) != 12:
        raise EnvelopeError("envelope has a malformed ephemeral key or nonce")
    rpk = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    shared = key.exchange(X25519PublicKey.from_public_bytes(epk))
    try:
        return ChaCha20Poly1305(_key(shared, epk, rpk)).decrypt(nonce, ct, aad)
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
