"""The event path's Ed25519 verification is libsodium's strict one: it accepts the protocol's
vectors and honest signatures and refuses what libsodium refuses, including what OpenSSL
accepts (small-order and non-canonical keys: R = identity, S = 0 under the identity key is a
signature by nobody); accounts pin no such key (``invalid_key``); docs/protocol.md §5.1's
negative vectors hold; and the market's own signatures, made by libsodium, are OpenSSL's
bytes."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import nacl.bindings
import nacl.exceptions
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from streams.core import MarketKeys
from streams.wire.events import AccountState
from streams.wire.signing import (
    MarketRef,
    SodiumSigningKey,
    ed25519_verify,
    key_id_of,
    sign,
    valid_signing_key,
    verify,
)
from streams.wire.vectors import SIGNED_EVENTS

from ..helpers import market_core, party, registration, value

DOCS = Path(__file__).parents[3] / "docs"
VECTORS = DOCS / "vectors"
P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
IDENTITY = (1).to_bytes(32, "little")
ORDER_2 = (P - 1).to_bytes(32, "little")
MESSAGE = b"emarket-sig-v1\x00 any bytes at all"


def _openssl(public: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except InvalidSignature:
        return False
    return True


def _libsodium(public: bytes, signature: bytes, message: bytes) -> bool:
    try:
        nacl.bindings.crypto_sign_open(signature + message, public)
    except nacl.exceptions.BadSignatureError:
        return False
    return True


def _honest() -> tuple[bytes, bytes]:
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw), key.sign(MESSAGE)


def _cases() -> dict[str, tuple[bytes, bytes]]:
    public, sig = _honest()
    s = int.from_bytes(sig[32:], "little")
    universal = IDENTITY + bytes(32)  # R = the identity, S = 0
    return {
        "honest": (public, sig),
        "S + L": (public, sig[:32] + (s + L).to_bytes(32, "little")),
        "another message's signature": (public, _honest()[1][:63] + bytes([sig[63] ^ 1])),
        "short signature": (public, sig[:63]),
        "identity key, universal signature": (IDENTITY, universal),
        "non-canonical identity key": ((P + 1).to_bytes(32, "little"), universal),
        "identity key with the sign bit": (bytes(31) + b"\x80", universal),
        "order-2 key": (ORDER_2, universal),
        "order-2 key and R": (ORDER_2, ORDER_2 + bytes(32)),
        "non-canonical R": (IDENTITY, (P + 1).to_bytes(32, "little") + bytes(32)),
        "all-zero key": (bytes(32), universal),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_verdict_is_libsodiums(name: str) -> None:
    public, signature = CASES[name]
    b64 = base64.b64encode(public).decode()
    assert ed25519_verify(b64, signature, MESSAGE) == _libsodium(public, signature, MESSAGE)


def test_no_signature_by_nobody_verifies() -> None:
    """The cases OpenSSL accepts and libsodium refuses: the market refuses them all (with
    OpenSSL as the judge, R = identity, S = 0 verified every message under the identity key)."""
    differ = sorted(
        n
        for n, (k, s) in CASES.items()
        if len(s) == 64 and _openssl(k, s, MESSAGE) != _libsodium(k, s, MESSAGE)
    )
    assert "identity key, universal signature" in differ and "order-2 key" in differ
    for name in differ:
        public, signature = CASES[name]
        assert not ed25519_verify(base64.b64encode(public).decode(), signature, MESSAGE), name
    assert not any(
        _libsodium(k, s, MESSAGE) and not _openssl(k, s, MESSAGE)
        for k, s in CASES.values()
        if len(s) == 64
    )


def test_only_keys_of_the_prime_order_subgroup_are_signing_keys() -> None:
    assert valid_signing_key(base64.b64encode(_honest()[0]).decode())
    for name, (public, _) in CASES.items():
        if public != _honest()[0]:
            assert not valid_signing_key(base64.b64encode(public).decode()), name
    for bad in ("", "AAAA", base64.b64encode(bytes(31)).decode()):
        assert not valid_signing_key(bad)


def _negative_vectors() -> list[tuple[str, str, str, str, str]]:
    text = (DOCS / "protocol.md").read_text()
    table = text.split("<!-- negative key vectors: begin -->")[1].split("<!-- negative key")[0]
    rows = re.findall(
        r"^\| ([^|`]+) \| `([A-Za-z0-9+/=]+)` \| `([A-Za-z0-9+/=]+)` \| "
        r"`?(\w+)`? \| (\w+) \|$",
        table,
        re.M,
    )
    assert len(rows) == 5
    return rows


def test_the_negative_vectors_of_the_protocol() -> None:
    """docs/protocol.md §5.1: each key's verdict at opening, and each signature's over the
    §2.4 purchase (version 1), are the market's."""
    text = (DOCS / "protocol.md").read_text()
    table = text.split("<!-- signing vectors: begin -->")[1]
    message = bytes.fromhex(re.findall(r"^\| 1 \| `([0-9a-f]+)`", table, re.M)[0])
    for name, key, signature, opening, verdict in _negative_vectors():
        assert valid_signing_key(key) == (opening == "accepted"), name
        raw = base64.b64decode(signature)
        assert ed25519_verify(key, raw, message) == (verdict == "verifies"), name


def test_an_account_pinning_the_identity_is_refused_and_nobody_signs_a_purchase() -> None:
    """The red team's account anyone can sign for: opened with the identity point (either
    spelling) it is refused ``invalid_key``; and were such an account on record (opened before
    keys were checked), a purchase "signed" R = identity, S = 0 for it is refused, not
    fulfilled."""
    core = market_core("seller1")
    t = core.ctx.topics
    universal = base64.b64encode(IDENTITY + bytes(32)).decode()
    for key in (IDENTITY, (P + 1).to_bytes(32, "little")):
        b64 = base64.b64encode(key).decode()
        opening = {
            "type": "open_account",
            "account_id": "nobody",
            "signing_key": b64,
            "opened_at_ms": 1_000,
            "key_id": key_id_of(b64),
            "signature": universal,
        }
        out = core.handle(t.accounts, json.dumps(opening).encode())
        assert (out.status, out.reason) == ("rejected", "invalid_key")
    assert core.ctx.directory.get("nobody") is None
    assert core.handle(t.registrations, registration("temp")).status == "accepted"
    assert core.handle(t.values, value("temp", "v1", [1.0, 2.0, 3.0])).status == "accepted"
    b64 = base64.b64encode(IDENTITY).decode()
    state = AccountState(
        account_id="nobody",
        version=1,
        signing_key=b64,
        key_id=key_id_of(b64),
        opened_at_ms=1_000,
        updated_at_ms=1_000,
    )
    core.ctx.stores.accounts["nobody"] = state
    core.ctx.directory.learn(state)
    buy = {
        "type": "purchase",
        "purchase_id": "p1",
        "buyer_id": "nobody",
        "stream_id": "temp",
        "max_price_minor": 10**6,
        "requested_at_ms": 1_000,
        "key_id": key_id_of(b64),
        "signature": universal,
    }
    out = core.handle(t.purchases, json.dumps(buy).encode())
    assert (out.status, out.reason) == ("rejected", "bad_signature")


def test_malformed_keys_verify_nothing() -> None:
    _, sig = _honest()
    for key in ("", "AAAA", base64.b64encode(bytes(31)).decode(), "not base64!" * 4):
        assert not ed25519_verify(key, sig, MESSAGE)


def test_the_protocol_vectors_verify_and_a_changed_byte_does_not() -> None:
    """Every signing vector of docs/vectors verifies under the signer's key (each event, even a
    rotation, carries the signature of the account's key at its version), and not with one
    bit of its signature flipped."""
    doc = json.loads((VECTORS / "signing.json").read_text())
    signer = doc["signer"]["public_key"]
    for entry in doc["events"]:
        event = SIGNED_EVENTS[entry["event"]["type"]].model_validate(entry["event"])
        version = entry["key_version"]
        market = MarketRef(doc["market"], doc["market_key_id"])
        assert verify(market, event, signer, generation=version), entry["name"]
        raw = bytearray(base64.b64decode(entry["signature"]))
        raw[7] ^= 1
        bad = base64.b64encode(bytes(raw)).decode()
        assert not verify(market, event, signer, bad, generation=version), entry["name"]


def test_the_markets_key_signs_with_libsodium_the_bytes_openssl_signs() -> None:
    """Receipts and answers are signed by libsodium: Ed25519 is deterministic, so each
    signature is the one OpenSSL makes (the receipt and answer vectors stay as published)."""
    for seed in (bytes(32), bytes(range(32)), b"\xff" * 32):
        key = Ed25519PrivateKey.from_private_bytes(seed)
        sodium = SodiumSigningKey(key)
        for message in (b"", MESSAGE, bytes(range(256)) * 20):
            assert sodium.sign(message) == key.sign(message)
        assert sodium.private_bytes_raw() == seed
        assert sodium.public_key() == key.public_key()
    keys = MarketKeys(signing_key=key, noise_secret=b"n" * 32)
    assert isinstance(keys.signing_key, SodiumSigningKey)
    assert keys.public_key == key.public_key()


def test_rotations_to_keys_that_are_not_keys_are_refused() -> None:
    """``rotate_keys``, signed by the account's current key, to the identity as signing key or
    to a sealing key spelled with its top bit set (the same u-coordinate, a second spelling),
    is refused ``invalid_key`` and leaves the account as it was."""
    core = market_core("sealed-alice")
    t = core.ctx.topics
    alice = party("sealed-alice")
    honest = alice.rotate_to(party("sealed-alice-2"), core.ctx.market, 2, rotated_at_ms=2_000)
    sealing = bytearray(base64.b64decode(honest.sealing_key or ""))
    sealing[31] |= 0x80
    for change in (
        {"signing_key": base64.b64encode(IDENTITY).decode()},
        {"sealing_key": base64.b64encode(bytes(sealing)).decode()},
    ):
        bad = honest.model_copy(update=change)
        bad = bad.model_copy(
            update={
                "signature": sign(core.ctx.market, bad, alice.signing_key),
                "new_key_signature": sign(
                    core.ctx.market, bad, party("sealed-alice-2").signing_key
                ),
            }
        )
        out = core.handle(t.accounts, bad.model_dump_json().encode())
        assert (out.status, out.reason) == ("rejected", "invalid_key"), change
    assert core.ctx.directory.get("sealed-alice").version == 1  # type: ignore[union-attr]
