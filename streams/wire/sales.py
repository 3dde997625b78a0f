"""A seller's sale notice: how its buyer is named, how it names the receipt, its bound
(docs/protocol.md §8.4).

When the market fulfils a purchase it tells the stream's seller in the seller's inbox
(:class:`~streams.wire.events.Sale`). Two of its fields are derived here, once for the worker,
the vectors and any reader:

* ``buyer_ref``, the buyer as a pseudonym: ``HMAC-SHA256(K, s(seller_id) ‖ s(buyer_id))``, its
  first 16 bytes in hex, under a key ``K`` derived from the market's noise secret. A seller sees
  how many buyers it has and which come back; it does not learn their account ids (the market
  shows them to no one but the operators), and two sellers cannot match their buyers. Only the
  market can compute it: it is opaque to every party.
* ``receipt_sha256``, SHA-256 of the signed bytes of the buyer's receipt (§11.2): the sale's
  id (its record key; a reader counts a sale once per id) and what a buyer's receipt, if the
  buyer shows it, is matched with. The receipt's commitment is keyed, so the digest cannot be
  guessed from the purchase's public fields.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Mapping
from typing import Any

from market.receipts import Receipt

from .events import UNIT_OF, Sale
from .trusted import trusted

__all__ = [
    "PSEUDONYM_LABEL",
    "SALE_BYTES",
    "buyer_ref",
    "pseudonym_key",
    "pseudonym_message",
    "receipt_sha256",
    "sale_of",
]

PSEUDONYM_LABEL = b"emarket buyer pseudonym key v1"
"""What the pseudonym key is derived under: ``K = HMAC-SHA256(noise secret, label)``."""
SALE_BYTES = 1024
"""The most a sale notice takes as a record: its key (64 bytes), its value with 64-character
ids, the longest numbers and times, and its ``emarket-answer`` header (14 + 65 bytes)."""


def pseudonym_key(noise_secret: bytes) -> bytes:
    """The key buyers' pseudonyms are derived under: from the noise secret, so every worker of
    a market (and a replay) names a buyer alike without another secret to distribute."""
    return hmac.digest(noise_secret, PSEUDONYM_LABEL, "sha256")


def pseudonym_message(seller_id: str, buyer_id: str) -> bytes:
    """``s(seller_id) ‖ s(buyer_id)``, the tagged text items of §2 (``"s"`` ‖ u32be length ‖
    UTF-8): no two pairs of ids give the same bytes."""
    return b"".join(
        b"s" + struct.pack(">I", len(d)) + d
        for d in (seller_id.encode("utf-8"), buyer_id.encode("utf-8"))
    )


def buyer_ref(key: bytes, seller_id: str, buyer_id: str) -> str:
    """``buyer_id`` as seller ``seller_id`` sees it: the first 16 bytes, in hex, of
    ``HMAC-SHA256(key, pseudonym_message(seller_id, buyer_id))``."""
    return hmac.digest(key, pseudonym_message(seller_id, buyer_id), "sha256")[:16].hex()


def receipt_sha256(receipt: Mapping[str, Any] | Receipt) -> str:
    """SHA-256 (hex) of a receipt's signed bytes (§11.2), from its JSON fields or itself.

    Raises
    ------
    market.errors.ReceiptError
        ``receipt`` is not a receipt's fields.
    """
    rec = receipt if isinstance(receipt, Receipt) else Receipt.from_dict(receipt)
    return hashlib.sha256(rec.canonical_bytes()).hexdigest()


def sale_of(receipt: Mapping[str, Any] | Receipt, key: bytes, sold_at_ms: int) -> Sale:
    """The sale notice of the purchase ``receipt`` was issued for, decided at ``sold_at_ms``
    (the market's clock), its buyer named under the pseudonym ``key``: every field but the
    time follows from the receipt, so a purchase's notice is the same bytes whenever it is
    made again.

    Raises
    ------
    market.errors.ReceiptError
        ``receipt`` is not a receipt's fields.
    """
    rec = receipt if isinstance(receipt, Receipt) else Receipt.from_dict(receipt)
    return trusted(
        Sale,
        seller_id=rec.seller_id,
        stream_id=rec.stream_id,
        buyer_ref=buyer_ref(key, rec.seller_id, rec.buyer_id),
        level_unit=UNIT_OF[rec.mechanism],
        level_before=rec.level_before,
        level_after=rec.level_after,
        price_minor=rec.price_minor,
        currency=rec.currency,
        value_count=len(rec.value_ids),
        receipt_sha256=receipt_sha256(rec),
        requested_at_ms=rec.requested_at_ms,
        sold_at_ms=sold_at_ms,
    )
