"""Builders for events used across the streaming tests."""

from __future__ import annotations

import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from streams.core.keys import MarketKeys

TEST_KEYS = MarketKeys(
    signing_key=Ed25519PrivateKey.from_private_bytes(bytes(range(32))),
    noise_secret=b"n" * 32,
)


def registration(stream_id: str = "temp", **kw: Any) -> bytes:
    body: dict[str, Any] = {
        "type": "register_stream",
        "stream_id": stream_id,
        "seller_id": "seller1",
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 3,
        "steps": [0.5, 1.0, 2.0],
        "cap": 4.0,
        "retain_last": 4,
        "pricing": {"kind": "linear_level", "rate_per_level": 100},
        "currency": "EUR",
    }
    body.update(kw)
    return json.dumps(body).encode()


def value(stream_id: str, value_id: str, values: list[float], **kw: Any) -> bytes:
    body = {"type": "value", "stream_id": stream_id, "value_id": value_id, "values": values,
            "published_at_ms": 1_000}  # fmt: skip
    body.update(kw)
    return json.dumps(body).encode()


def purchase(stream_id: str, buyer: str, pid: str, max_price: int = 10**6, **kw: Any) -> bytes:
    body: dict[str, Any] = {
        "type": "purchase",
        "purchase_id": pid,
        "buyer_id": buyer,
        "stream_id": stream_id,
        "max_price_minor": max_price,
        "requested_at_ms": 1_000,
    }
    body.update(kw)
    return json.dumps(body).encode()


def quote(stream_id: str, buyer: str, qid: str, **kw: Any) -> bytes:
    body: dict[str, Any] = {
        "type": "quote",
        "quote_id": qid,
        "buyer_id": buyer,
        "stream_id": stream_id,
    }
    body.update(kw)
    return json.dumps(body).encode()
