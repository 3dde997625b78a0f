"""v2 inbox records (docs/protocol.md §8.5) against docs/vectors/inbox_v2.json, rebuilt from its
text alone: route and seal key by HKDF as the spec writes it, the record opened, the refused
records refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from streams.wire.inbox_v2 import (
    InboxError,
    InboxMessage,
    RouteKeys,
    open_record,
    padded_length,
    route_keys,
)
from streams.wire.topics import murmur2

DOC = json.loads((Path(__file__).parents[3] / "docs" / "vectors" / "inbox_v2.json").read_text())


def _hkdf(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()[:length]


def _keys(account_id: str) -> RouteKeys:
    route = next(r for r in DOC["routes"] if r["account_id"] == account_id)
    return RouteKeys(route["route"], bytes.fromhex(route["seal_key"]))


def _market_key() -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(DOC["market_public_key"]))


@pytest.mark.parametrize("route", DOC["routes"], ids=lambda r: r["account_id"])
def test_a_route_is_what_the_spec_derives_on_both_sides(route: dict[str, Any]) -> None:
    account = X25519PrivateKey.from_private_bytes(bytes.fromhex(route["sealing_private_key"]))
    market_public = X25519PublicKey.from_public_bytes(base64.b64decode(DOC["market_sealing_key"]))
    shared = account.exchange(market_public)
    assert shared.hex() == route["shared"]
    salt = bytes.fromhex(route["salt"])
    assert _hkdf(shared, salt, bytes.fromhex(route["route_info"]), 16).hex() == route["route"]
    assert _hkdf(shared, salt, bytes.fromhex(route["seal_info"]), 32).hex() == route["seal_key"]
    mine = route_keys(account, market_public, DOC["market"], route["account_id"], market_side=False)
    assert (mine.route, mine.seal_key.hex()) == (route["route"], route["seal_key"])
    h = murmur2(route["route"].encode())
    assert h == route["murmur2"]
    assert {n: (h & 0x7FFFFFFF) % int(n) for n in route["partitions"]} == route["partitions"]


@pytest.mark.parametrize("record", DOC["records"], ids=lambda r: r["account_id"])
def test_a_record_opens_to_its_messages_for_its_account_alone(record: dict[str, Any]) -> None:
    value = bytes.fromhex(record["value"])
    account = record["account_id"]
    messages = open_record(_keys(account), _market_key(), DOC["market"], account, value)
    assert messages == [
        InboxMessage(m["request_sha256"], m["key"].encode(), m["value"].encode())
        for m in record["messages"]
    ]
    assert len(value) == 1 + 12 + record["padded_length"] + 16
    assert record["padded_length"] == padded_length(record["plaintext_length"])
    signature = bytes.fromhex(record["signature"])
    _market_key().verify(signature, bytes.fromhex(record["signed_bytes"]))
    other = next(r["account_id"] for r in DOC["routes"] if r["account_id"] != account)
    with pytest.raises(InboxError, match="does not open"):
        open_record(_keys(other), _market_key(), DOC["market"], other, value)


@pytest.mark.parametrize("case", DOC["refused"], ids=lambda c: c["name"])
def test_a_reader_refuses_what_the_market_did_not_write_to_it(case: dict[str, Any]) -> None:
    with pytest.raises(InboxError):
        open_record(
            _keys("alice"), _market_key(), DOC["market"], "alice", bytes.fromhex(case["value"])
        )


def test_sizes_fall_in_buckets() -> None:
    assert [padded_length(n) for n in (1, 256, 257, 65_536, 65_537)] == [
        256,
        256,
        512,
        65_536,
        131_072,
    ]
