"""One market per signature (issue 40): what a party signed for one market does nothing in
another, whatever their prefixes.

Markets started with defaults are all ``emarket``: the red team copied a buyer's signed opening
and purchase from market A into market B, where a stranger's seller had registered the same
stream id at 50× the price, and B charged the buyer; a seller's registration copied the same
way was listed in B's catalog. Here market B runs on the shared broker and market A is another
deployment with B's prefix and its own key: what its parties signed names B's prefix and A's
key id (docs/protocol.md §2), and is copied into B byte for byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from streams.clients.client import MarketClient, TopicReader, now_ms
from streams.core import MarketKeys
from streams.wire.events import Rejection
from streams.wire.signing import MarketRef

from .. import helpers
from ..conftest import Market

pytestmark = [pytest.mark.broker, pytest.mark.slow]

MARKET_A_KEYS = MarketKeys(
    signing_key=Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33))), noise_secret=b"a" * 32
)


def _reg(stream: str, rate: float) -> dict[str, Any]:
    return {
        "stream_id": stream,
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 3,
        "steps": [0.5, 1.0, 2.0],
        "cap": 4.0,
        "retain_last": 4,
        "pricing": {"kind": "linear_level", "rate_per_level": rate},
    }


async def _refusals_of(
    c: MarketClient, sent: dict[str, bytes], timeout: float = 45.0
) -> dict[str, Rejection]:
    """The rejection of each payload of ``sent`` (name → bytes), read from ``<p>.rejections``
    until every one is there."""
    want = {hashlib.sha256(v).hexdigest(): k for k, v in sent.items()}
    got: dict[str, Rejection] = {}
    reader = TopicReader(c.bootstrap, c.topics.rejections)
    await reader.start()
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(want) and time.monotonic() < deadline:
            for _, raw in await reader.poll(0.5):
                rej = Rejection.model_validate_json(raw)
                if rej.payload_sha256 in want:
                    got[want[rej.payload_sha256]] = rej
    finally:
        await reader.stop()
    assert set(got) == set(sent), f"refused only {sorted(got)} of {sorted(sent)}"
    return got


def test_events_signed_for_another_market_of_the_same_prefix_do_nothing(market: Market) -> None:
    """In B, a stranger's seller sells ``temp`` at 50× A's price and the honest seller has an
    account of its own. Alice's opening and purchase signed for A, and seller1's registration
    signed for A, copied into B: all three are refused, alice has no account in B and is
    charged nothing, and seller1's stream is not in B's catalog."""
    market.start_worker()
    market.open_accounts("stranger", "seller1")
    a = MarketRef(market.topics.prefix, MARKET_A_KEYS.key_id)  # A: B's prefix, A's key
    assert a != market.run(lambda c: c.signing_market())
    t = market.topics
    sent = {
        "opening": helpers.account("alice", a, opened_at_ms=now_ms()),
        "purchase": helpers.purchase(
            "temp", "alice", "pA", max_price=10**6, market=a, requested_at_ms=now_ms()
        ),
        "registration": helpers.registration("weather", a, seller_id="seller1"),
    }
    where = {
        "opening": (t.accounts, "alice"),
        "purchase": (t.purchases, "temp"),
        "registration": (t.registrations, "weather"),
    }

    async def go(c: MarketClient) -> tuple[dict[str, Rejection], dict[str, Any]]:
        await c.register(_reg("temp", 5_000.0), party=helpers.party("stranger"))
        await c.publish_batch(
            c.value_batch("temp", [("v0", [1.0, 2.0, 3.0], None)], party=helpers.party("stranger"))
        )
        prod = AIOKafkaProducer(bootstrap_servers=c.bootstrap)
        await prod.start()
        try:
            for name in ("opening", "purchase", "registration"):
                topic, key = where[name]
                await prod.send_and_wait(topic, sent[name], key=key.encode())
                await asyncio.sleep(0)
        finally:
            await prod.stop()
        refused = await _refusals_of(c, sent)
        return refused, await c.catalog()

    refused, catalog = market.run(go)
    assert refused["opening"].reason == "bad_signature"
    assert refused["purchase"].reason in ("unknown_account", "bad_signature")
    assert refused["registration"].reason == "bad_signature"
    assert "weather" not in catalog and "temp" in catalog
    ledger = market.ledger()["temp"]
    assert "alice" not in ledger["holders"] and ledger["revenue_minor"] == 0
