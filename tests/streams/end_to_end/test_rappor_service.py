"""A RAPPOR stream on the real broker: registered (the catalog states each level's randomized
response), 40 members' category reports published in one sealed batch, bought in two steps
(each a relaxation: the same stored noise), a subscription delivery, every receipt verified, and
the buyer's frequency estimate covering the truth."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from market.receipts import verify_receipt
from streams.clients.client import MarketClient
from streams.clients.rappor import frequencies
from streams.core.keys import public_key_from_b64
from streams.wire.events import LinearLevelSpec, PurchaseFulfilled, Rejection, ValueReleased

from ..conftest import Market
from ..helpers import buy, inbox_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]
K = 4
MEMBERS = 40


def test_rappor_register_publish_relax_subscribe_estimate(market: Market) -> None:
    market.start_worker()
    market.open_accounts("seller1", "alice")
    cats = [i % K for i in range(MEMBERS)]  # each category a quarter of the members

    async def go(c: MarketClient) -> Any:
        entry = await c.register(
            {
                "stream_id": "survey",
                "mechanism": "laplace",
                "sensitivity": 2.0,
                "dimension": K,
                "product": "rappor",
                "rappor_ones": 1,
                "steps": [4.0, 16.0],
                "cap": 16.0,
                "retain_last": MEMBERS,
                "pricing": LinearLevelSpec(rate_per_level=1.0),
            }
        )
        assert not isinstance(entry, Rejection), entry
        items = [(f"m{i}", np.eye(K)[c].tolist(), None) for i, c in enumerate(cats)]
        await c.publish_batch(c.value_batch("survey", items))
        market.wait_ingested("survey", MEMBERS)
        outs = [await buy(c, "alice", "survey", max_price_minor=1000) for _ in range(2)]
        await c.publish("survey", np.eye(K)[0].tolist(), value_id="late")
        market.wait_ingested("survey", MEMBERS + 1)
        subs = await inbox_until(
            c, "alice", lambda evs: any(isinstance(e, ValueReleased) for e in evs)
        )
        return entry, outs, subs

    entry, outs, subs = market.run(go)
    assert [p.randomized_response is not None for p in entry.prices] == [True, True]
    key = public_key_from_b64(entry.market_public_key)
    for ev, level in zip(outs, (4.0, 16.0), strict=True):
        assert isinstance(ev, PurchaseFulfilled), ev
        assert ev.level_after == level and len(ev.releases) == MEMBERS
        assert all(set(r.values) <= {0.0, 1.0} for r in ev.releases)
        rel = [(r.value_id, r.level, np.asarray(r.values)) for r in ev.releases]
        verify_receipt(
            ev.receipt.model_dump(),
            ev.receipt.signature,
            rel,
            key,
            opening=bytes.fromhex(ev.opening or ""),
        )
    (late,) = [e for e in subs if isinstance(e, ValueReleased)]
    assert late.releases[0].value_id == "late" and late.releases[0].level == 16.0
    est = frequencies([outs[1], late], confidence=0.99)
    truth = np.bincount([*cats, 0], minlength=K) / (MEMBERS + 1)
    assert est.reports == MEMBERS + 1
    assert np.all((est.low <= truth) & (truth <= est.high)), (est.low, truth, est.high)
