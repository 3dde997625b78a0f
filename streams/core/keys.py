"""The market's own secrets, as the core sees them: a receipt-signing key and a noise secret.

Loading them from files or the environment is the worker's job
(:mod:`streams.worker.secrets`); the core only signs with one and derives noise from the other,
and from the noise secret also the key sellers seal their values to, the key receipts'
openings are derived under and the key buyers' pseudonyms in sellers' sale notices are.
"""

from __future__ import annotations

import base64
import hmac
from dataclasses import dataclass, field
from functools import cached_property

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from market.envelope import Opener
from market.receipts import key_id, opening_key

from ..wire.sales import pseudonym_key
from ..wire.signing import SodiumSigningKey

__all__ = ["MarketKeys", "public_key_from_b64"]


@dataclass(frozen=True)
class MarketKeys:
    """The Ed25519 receipt key and the noise secret; ``repr`` never shows either. The key
    signs with libsodium (:class:`~streams.wire.signing.SodiumSigningKey`: the same bytes)."""

    signing_key: Ed25519PrivateKey = field(repr=False)
    noise_secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.signing_key, SodiumSigningKey):
            object.__setattr__(self, "signing_key", SodiumSigningKey(self.signing_key))

    # cached: every receipt names the key id, and OpenSSL derives the public key anew on each
    # call (two derivations and a hash per purchase, ~15 µs)
    @cached_property
    def public_key(self) -> Ed25519PublicKey:
        return self.signing_key.public_key()

    @cached_property
    def key_id(self) -> str:
        return key_id(self.public_key)

    @cached_property
    def opening_key(self) -> bytes:
        """The key receipts' openings are derived under (:func:`market.receipts.opening_key`):
        from the noise secret, so every worker of a market, and a replay, gives a purchase the
        same opening."""
        return opening_key(self.noise_secret)

    @cached_property
    def pseudonym_key(self) -> bytes:
        """The key sellers' names for their buyers are derived under
        (:func:`streams.wire.sales.buyer_ref`): from the noise secret, so every worker of a
        market, and a replay, names a buyer alike."""
        return pseudonym_key(self.noise_secret)

    @cached_property
    def sealing_key(self) -> X25519PrivateKey:
        """The market's X25519 key: sellers seal their values to its public half.

        Derived from the noise secret, so every worker of a market holds the same one and no
        other secret needs distributing; whoever holds the noise secret runs the market, which
        reads the exact values anyway.
        """
        seed = hmac.digest(self.noise_secret, b"emarket market sealing key v1", "sha256")
        return X25519PrivateKey.from_private_bytes(seed)

    @cached_property
    def opener(self) -> Opener:
        """Opens what sellers seal to :attr:`sealing_key`, its public half computed once."""
        return Opener(self.sealing_key)

    @property
    def sealing_public_b64(self) -> str:
        """Base64 of the sealing key's 32 raw public bytes (``market_sealing_key``)."""
        return self.opener.public_b64

    @property
    def noise_fingerprint(self) -> str:
        """A public name for the noise secret (HMAC of a fixed label; reveals nothing of it).

        The market stores it with its state: a worker started with another secret would
        compute different noise for levels already released, so it refuses to serve them.
        """
        tag = hmac.new(self.noise_secret, b"emarket noise-secret fingerprint v1", "sha256")
        return tag.hexdigest()[:32]

    @property
    def operator_token(self) -> str:
        """The operators' bearer credential for per-buyer pages (``/ledger`` in detail).

        Derived from the noise secret, so every worker of a market accepts the same one without
        another secret to distribute; whoever holds the noise secret can already read every
        value, so it grants nothing more. It reveals nothing of the secret (an HMAC of a label).
        """
        tag = hmac.new(self.noise_secret, b"emarket operator token v1", "sha256").digest()
        return base64.urlsafe_b64encode(tag).decode("ascii").rstrip("=")

    @property
    def public_key_b64(self) -> str:
        raw = self.public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
        return base64.b64encode(raw).decode("ascii")

    def __repr__(self) -> str:
        return f"MarketKeys(key_id={self.key_id}, secrets=<redacted>)"


def public_key_from_b64(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from base64 of its 32 raw bytes."""
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))
