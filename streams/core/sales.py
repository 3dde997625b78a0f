"""A seller's sale notice: one message to the seller's inbox for each purchase fulfilled.

:mod:`.purchases` calls :func:`sale` where a fulfilment's outputs are made: when a purchase is
decided (a new step sold), and when a batch lost before its outputs were sent is replayed and
the outcome's bytes are sent again (:class:`~.state.PurchaseRecord` still holds them). Never for
a refusal, a notice or a resend answered from the record alone: those sold nothing, and that
sale was already reported. The notice is a pure function of the receipt, the decision's time
and the market's keys (:func:`streams.wire.sales.sale_of`), so the two sends of a replay are
the same bytes under the same key, the receipt's digest, which readers count once.

It keeps nothing: no store, no stream record changes, so it adds no bound of its own beyond
its size (:data:`~streams.wire.sales.SALE_BYTES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from market.receipts import Receipt

from ..wire.sales import sale_of
from .context import Context
from .outputs import Output, dump

__all__ = ["sale"]


def sale(ctx: Context, receipt: Mapping[str, Any] | Receipt, sold_at_ms: int) -> Output:
    """The sale notice of the purchase whose receipt (or its fields) is ``receipt``, decided at
    ``sold_at_ms``: to the seller's inbox, keyed by the receipt's digest, signed for that inbox
    alone (it answers no request of the seller's)."""
    event = sale_of(receipt, ctx.keys.pseudonym_key, sold_at_ms)
    return Output(
        ctx.topics.inbox(event.seller_id), event.receipt_sha256.encode(), dump(event), answer=False
    )
