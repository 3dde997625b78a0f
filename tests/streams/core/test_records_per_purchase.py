"""Records and signatures per purchase (issue 45, "fewer records per event"), counted, not timed.

A worker writes each store key a batch changed once (:class:`streams.worker.tables.WriteBackTable`)
and signs each inbox message once (:mod:`streams.core.answering`). A purchase's decision record
is written once, without the outcome's bytes (a replay recomputes them), and the sellers are told
of a batch's sales in one signed ``sales`` notice each, not one per purchase.
"""

from __future__ import annotations

from typing import Any

from streams.core import MarketCore, Stores
from streams.core.outputs import Output
from streams.wire.events import INBOX_EVENT, PurchaseFulfilled, Sales
from streams.wire.topics import Topics

from ..helpers import market_core, purchase, registration, value

T = Topics("t")
BUYERS = [f"b{i}" for i in range(8)]
STREAMS = {"a": "seller1", "b": "seller1", "c": "seller2"}


class Written(dict[str, Any]):
    """A store that counts the records a worker's write-back table would write for it: each key
    changed in a batch, once (a deletion too)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed: set[str] = set()
        self.records = 0

    def _write(self, key: str) -> None:
        if key not in self.changed:
            self.changed.add(key)
            self.records += 1

    def __setitem__(self, key: str, item: Any) -> None:
        self._write(key)
        super().__setitem__(key, item)

    def __delitem__(self, key: str) -> None:
        self._write(key)
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            self._write(key)
        return super().pop(key, *default)

    def batch_over(self) -> None:
        self.changed.clear()


def _market(purchases: Written) -> MarketCore:
    c = market_core(*STREAMS.values(), *BUYERS, stores=Stores(purchases=purchases))
    for sid, seller in STREAMS.items():
        reg = registration(sid, seller_id=seller, retain_last=16)
        assert c.handle(T.registrations, reg).status == "accepted"
        c.handle(T.values, value(sid, "v0", [1.0, 2.0, 3.0], seller_id=seller))
    return c


def _batch(c: MarketCore, events: list[tuple[str, bytes]]) -> tuple[list[Any], list[Output]]:
    with c.batch() as told:
        outcomes = [c.handle(topic, raw) for topic, raw in events]
    return outcomes, told


def test_a_purchase_writes_its_decision_once_and_its_seller_hears_once_a_batch() -> None:
    """8 batches of 3 purchases on 3 streams of 2 sellers (and a value each, which keeps every
    value retained): 24 decision records, and 2 signed notices a batch; each sale told once."""
    purchases = Written()
    c = _market(purchases)
    purchases.batch_over()
    receipts: set[str] = set()
    told_sales: list[str] = []
    notices = 0
    for i, buyer in enumerate(BUYERS):
        events = [(T.purchases, purchase(sid, buyer, f"p{i}")) for sid in STREAMS]
        events += [(T.values, value(sid, f"v{i + 1}", [1.0, 2.0, 3.0], seller_id=seller))
                   for sid, seller in STREAMS.items()]  # fmt: skip
        outcomes, told = _batch(c, events)
        purchases.batch_over()
        for oc in outcomes[:3]:
            assert oc.status == "fulfilled", oc.reason
            answer = INBOX_EVENT.validate_json(oc.outputs[0].value)
            assert isinstance(answer, PurchaseFulfilled) and len(oc.outputs) == 1
            receipts.add(answer.receipt.signature)
        to_sellers = [o for o in told if o.topic in (T.inbox("seller1"), T.inbox("seller2"))]
        assert len(to_sellers) == 2  # one notice per seller and batch, each signed once
        for o in to_sellers:
            notice = INBOX_EVENT.validate_json(o.value)
            assert isinstance(notice, Sales) and o.headers
            told_sales += [s.receipt_sha256 for s in notice.sales]
        notices += len(to_sellers)
    _batch(c, [(T.values, value(sid, "w", [1.0], seller_id=s)) for sid, s in STREAMS.items()])
    purchases.batch_over()
    assert len(receipts) == 24 and len(set(told_sales)) == len(told_sales) == 24
    assert notices == 16
    assert purchases.records == 24  # each decision once: no second write without its bytes
    assert all(r.payload is None for r in purchases.values())


def test_a_batch_that_evicts_what_a_purchase_covered_keeps_its_bytes_until_sent() -> None:
    """The one case a replay could not recompute an outcome: its record takes the bytes in the
    same batch (still one record), and loses them in a later batch (a second)."""
    purchases = Written()
    c = market_core("seller1", "alice", stores=Stores(purchases=purchases))
    c.handle(T.registrations, registration("s", retain_last=1))
    c.handle(T.values, value("s", "v0", [1.0, 2.0, 3.0]))
    purchases.batch_over()
    _batch(
        c,
        [(T.purchases, purchase("s", "alice", "p")), (T.values, value("s", "v1", [1.0, 2.0, 3.0]))],
    )
    purchases.batch_over()
    assert purchases.records == 1 and purchases["alice/s/p"].payload is not None
    _batch(c, [(T.values, value("s", "v2", [1.0, 2.0, 3.0]))])  # the stream's next event
    assert purchases.records == 2 and purchases["alice/s/p"].payload is None
