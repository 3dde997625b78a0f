"""Test vectors of v2 inboxes (``docs/vectors/inbox_v2.json``, docs/protocol.md §8.5).

For fixed keys: each account's route, seal key and partition with every intermediate, records
of one and two messages with their signed bytes, signature, padded plaintext, nonce and value,
and records a reader must refuse (another key's signature, another account named, a changed
byte), so a reader written from the docs alone can check every step.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .inbox_v2 import (
    HEAD,
    ROUTE_LABEL,
    SEAL_LABEL,
    InboxMessage,
    body,
    padded_length,
    partition_of,
    route_keys,
    seal_record,
)
from .topics import murmur2

__all__ = ["MARKET_SEALING_SEED", "vectors"]

MARKET = "t"
MARKET_SEED = bytes(range(32))
MARKET_SEALING_SEED = bytes(range(96, 128))
ACCOUNTS = {"alice": bytes(range(128, 160)), "bob": bytes(range(160, 192))}
PARTITIONS = 4
REQUEST = b'{"type":"purchase","purchase_id":"p1"}'


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _x_public(seed: bytes) -> bytes:
    return (
        X25519PrivateKey.from_private_bytes(seed)
        .public_key()
        .public_bytes(Encoding.Raw, PublicFormat.Raw)
    )


def _s(data: bytes) -> bytes:
    return b"s" + struct.pack(">I", len(data)) + data


def _route(account_id: str, seed: bytes) -> dict[str, Any]:
    market_priv = X25519PrivateKey.from_private_bytes(MARKET_SEALING_SEED)
    account = X25519PrivateKey.from_private_bytes(seed)
    keys = route_keys(market_priv, account.public_key(), MARKET, account_id, market_side=True)
    same = route_keys(account, market_priv.public_key(), MARKET, account_id, market_side=False)
    assert keys == same
    who = b"\x00" + _s(MARKET.encode()) + _s(account_id.encode())
    return {
        "account_id": account_id,
        "sealing_private_key": seed.hex(),
        "sealing_key": _b64(_x_public(seed)),
        "shared": account.exchange(market_priv.public_key()).hex(),
        "salt": (_x_public(MARKET_SEALING_SEED) + _x_public(seed)).hex(),
        "route_info": (ROUTE_LABEL + who).hex(),
        "route": keys.route,
        "seal_info": (SEAL_LABEL + who).hex(),
        "seal_key": keys.seal_key.hex(),
        "murmur2": murmur2(keys.route.encode()),
        "partitions": {str(n): partition_of(keys.route, n) for n in (1, PARTITIONS, 16)},
    }


def _messages() -> dict[str, list[InboxMessage]]:
    request = hashlib.sha256(REQUEST).hexdigest()
    fulfilled = b'{"type":"purchase_fulfilled","purchase_id":"p1","stream_id":"temp"}'
    released = b'{"type":"value_released","stream_id":"temp","buyer_id":"alice"}'
    sale = b'{"schema_version":1,"type":"sale","seller_id":"bob","stream_id":"temp"}'
    return {
        "alice": [InboxMessage(request, b"p1", fulfilled), InboxMessage(None, b"v9", released)],
        "bob": [InboxMessage(None, b"0" * 64, sale)],
    }


def _record(account_id: str, messages: list[InboxMessage]) -> dict[str, Any]:
    signer = Ed25519PrivateKey.from_private_bytes(MARKET_SEED)
    market_priv = X25519PrivateKey.from_private_bytes(MARKET_SEALING_SEED)
    account = X25519PrivateKey.from_private_bytes(ACCOUNTS[account_id])
    keys = route_keys(market_priv, account.public_key(), MARKET, account_id, market_side=True)
    signed = body(MARKET, account_id, messages)
    signature = signer.sign(signed)
    plain = signature + signed
    value = seal_record(keys, signer, MARKET, account_id, messages)
    return {
        "account_id": account_id,
        "key": keys.route,
        "messages": [
            {"request_sha256": m.request, "key": m.key.decode(), "value": m.value.decode()}
            for m in messages
        ],
        "signed_bytes": signed.hex(),
        "signature": signature.hex(),
        "plaintext_length": len(plain),
        "padded_length": padded_length(len(plain)),
        "nonce": value[1:13].hex(),
        "value": value.hex(),
    }


def _refused() -> list[dict[str, Any]]:
    """Records keyed with alice's route that her reader must refuse."""
    market_priv = X25519PrivateKey.from_private_bytes(MARKET_SEALING_SEED)
    alice = X25519PrivateKey.from_private_bytes(ACCOUNTS["alice"]).public_key()
    keys = route_keys(market_priv, alice, MARKET, "alice", market_side=True)
    forger = Ed25519PrivateKey.from_private_bytes(bytes(32))
    market = Ed25519PrivateKey.from_private_bytes(MARKET_SEED)
    one = [_messages()["alice"][0]]
    good = seal_record(keys, market, MARKET, "alice", one)
    flipped = good[:-1] + bytes([good[-1] ^ 1])
    return [
        {"name": "a changed byte: does not open", "value": flipped.hex()},
        {
            "name": "signed by another key",
            "value": seal_record(keys, forger, MARKET, "alice", one).hex(),
        },
        {
            "name": "names another account",
            "value": seal_record(keys, market, MARKET, "bob", one).hex(),
        },
        {
            "name": "names another market",
            "value": seal_record(keys, market, "u", "alice", one).hex(),
        },
    ]


def vectors() -> dict[str, Any]:
    """The content of ``docs/vectors/inbox_v2.json``."""
    market = Ed25519PrivateKey.from_private_bytes(MARKET_SEED)
    messages = _messages()
    return {
        "market": MARKET,
        "market_private_key": MARKET_SEED.hex(),
        "market_public_key": _b64(market.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)),
        "market_sealing_private_key": MARKET_SEALING_SEED.hex(),
        "market_sealing_key": _b64(_x_public(MARKET_SEALING_SEED)),
        "inbox_partitions": PARTITIONS,
        "head": HEAD.hex(),
        "request": REQUEST.decode(),
        "routes": [_route(a, seed) for a, seed in ACCOUNTS.items()],
        "records": [_record(a, m) for a, m in messages.items()],
        "refused": _refused(),
    }
