"""The names on the wire a party makes for itself: its account id and its public keys.

Kept apart from :mod:`.events` (pydantic models) and :mod:`.signing` (canonical bytes, numpy)
so that making a key file (``epsilon-market keygen``) needs nothing but the standard library
and ``cryptography``.
"""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = ["ID_PATTERN", "public_b64"]

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
"""The one id grammar: accounts (buyers, sellers), streams, values, purchases, quotes."""


def public_b64(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """Base64 of an Ed25519 public key's 32 raw bytes."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return base64.b64encode(pub.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode("ascii")
