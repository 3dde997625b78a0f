"""A seller's sale notices: how a buyer is named, how a sale names the receipt, how a batch's
sales are grouped, their bounds (docs/protocol.md §8.4).

When the market fulfils purchases it tells each stream's seller in the seller's inbox, with one
``sales`` notice per seller and batch listing them (:class:`~streams.wire.events.Sales`, split
by :func:`sales_of` to list at most :data:`~streams.wire.events.SALES_PER_MESSAGE`); markets
before it sent one ``sale`` per purchase (:class:`~streams.wire.events.Sale`), which readers
still read. Two of a sale's fields are derived here, once for the worker, the vectors and any
reader:

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

from .events import SALES_PER_MESSAGE, UNIT_OF, Sale, SaleItem, Sales
from .trusted import trusted

__all__ = [
    "PSEUDONYM_LABEL",
    "SALES_BYTES",
    "SALE_BYTES",
    "SALE_ITEM_BYTES",
    "buyer_ref",
    "pseudonym_key",
    "pseudonym_message",
    "receipt_sha256",
    "sale_of",
    "sales_of",
]

PSEUDONYM_LABEL = b"emarket buyer pseudonym key v1"
"""What the pseudonym key is derived under: ``K = HMAC-SHA256(noise secret, label)``."""
SALE_BYTES = 1024
"""The most a one-sale ``sale`` message took as a record: its key (64 bytes), its value with
64-character ids, the longest numbers and times, and its ``emarket-answer`` header."""
SALE_ITEM_BYTES = 512
"""The most one sale adds to a ``sales`` notice: its members with a 64-character stream id,
the longest numbers and times, and the comma between two sales."""
SALES_BYTES = 512 + SALES_PER_MESSAGE * SALE_ITEM_BYTES
"""The most a ``sales`` notice takes as a record (33,280 bytes): its key (64 bytes), the
envelope with a 64-character seller id, its ``emarket-answer`` header (14 + 65 bytes) and
:data:`~streams.wire.events.SALES_PER_MESSAGE` sales."""


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
    """The sale of the purchase ``receipt`` was issued for, decided at ``sold_at_ms`` (the
    market's clock), its buyer named under the pseudonym ``key``: every field but the time
    follows from the receipt, so a purchase's sale is the same whenever it is made again.

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


def sales_of(sales: list[Sale]) -> list[Sales]:
    """The notices that tell ``sales`` to their sellers: one per seller, in the order each
    seller first appears, listing its sales in their order, split so that none lists more than
    :data:`~streams.wire.events.SALES_PER_MESSAGE`; a sale listed twice (its receipt's digest)
    is listed once."""
    by_seller: dict[str, dict[str, SaleItem]] = {}
    for sale in sales:
        items = by_seller.setdefault(sale.seller_id, {})
        if sale.receipt_sha256 not in items:
            fields = {k: v for k, v in dict(sale).items() if k not in _ENVELOPE}
            items[sale.receipt_sha256] = trusted(SaleItem, **fields)
    out = []
    for seller, items in by_seller.items():
        listed = list(items.values())
        for i in range(0, len(listed), SALES_PER_MESSAGE):
            chunk = listed[i : i + SALES_PER_MESSAGE]
            out.append(trusted(Sales, seller_id=seller, sales=chunk))
    return out


_ENVELOPE = frozenset(("schema_version", "type", "seller_id"))
"""A ``sale``'s members that a ``sales`` notice states once for all its sales."""
