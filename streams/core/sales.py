"""A seller's sale notices: one signed ``sales`` message per seller and batch, listing the
purchases fulfilled on its streams.

:mod:`.purchases` calls :func:`sale` where a fulfilment's outputs are made: when a purchase is
decided (a new step sold), and when a batch that may have been committed without its outputs
is replayed and the outcome is sent again. Never for a refusal, a notice or a resend of an
outcome surely sent: those sold nothing, and that sale was already reported. A sale is a pure
function of the receipt, the decision's time and the market's keys
(:func:`streams.wire.sales.sale_of`), so a replay lists the same sale again, under the same id
(the receipt's digest), which readers count once, however the replay's notices group it.

Inside :meth:`SaleNotices.batch` the sales of the whole batch are held back and told in one
notice per seller (:func:`streams.wire.sales.sales_of` splits a longer list), signed once for
them all, instead of one signed record per purchase; outside it each sale is told at once. It
keeps nothing across batches: no store, no stream record changes, so it adds no bound of its
own beyond the notices' size (:data:`~streams.wire.sales.SALES_BYTES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from market.receipts import Receipt

from ..wire.events import Sale
from ..wire.sales import SALE_ITEM_BYTES, sale_of, sales_of
from ..wire.topics import Topics
from .outputs import HeldForBatch, Output, dump

if TYPE_CHECKING:
    from .context import Context

__all__ = ["SaleNotices", "sale"]


def sale(ctx: Context, receipt: Mapping[str, Any] | Receipt, sold_at_ms: int) -> list[Output]:
    """Tell the seller of the purchase whose receipt (or its fields) is ``receipt``, decided at
    ``sold_at_ms``, of its sale: the notice to send now, or none inside a batch (the batch's
    notices are sent with its deliveries)."""
    return ctx.sold.add(sale_of(receipt, ctx.keys.pseudonym_key, sold_at_ms))


class SaleNotices(HeldForBatch):
    """The sales told in the current batch, grouped per seller when the batch ends."""

    def __init__(self, topics: Topics) -> None:
        self._topics = topics
        self._pending: list[Sale] = []
        super().__init__()

    @property
    def pending_bytes(self) -> int:
        """An upper bound on the notices the sales held back would take."""
        return len(self._pending) * SALE_ITEM_BYTES

    def add(self, one: Sale) -> list[Output]:
        """Hold ``one`` back for the batch's notices, or (outside a batch) its notice now."""
        self._pending.append(one)
        return self.drain_unless_batching()

    def drain(self) -> list[Output]:
        """The notices of the sales held back, to their sellers' inboxes, each keyed by the
        digest of the first receipt it lists and signed for that inbox alone (it answers no
        request of the seller's); the list is emptied."""
        pending, self._pending = self._pending, []
        return [
            Output(
                self._topics.inbox(notice.seller_id),
                notice.sales[0].receipt_sha256.encode(),
                dump(notice),
                answer=False,
            )
            for notice in sales_of(pending)
        ]
