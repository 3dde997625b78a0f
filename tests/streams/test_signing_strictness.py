"""The event path's Ed25519 verification (libsodium, then OpenSSL on a refusal) accepts exactly
what OpenSSL alone accepts: the protocol's vectors, honest signatures, and the malformed keys
and signatures on which the two libraries disagree (small-order and non-canonical keys, which
OpenSSL accepts and libsodium refuses) or agree (a scalar S ≥ L, a short signature); and the
market's own signatures, made by libsodium, are OpenSSL's bytes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import nacl.bindings
import nacl.exceptions
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from streams.core import MarketKeys
from streams.wire.signing import SodiumSigningKey, ed25519_verify, verify
from streams.wire.vectors import SIGNED_EVENTS

VECTORS = Path(__file__).parents[2] / "docs" / "vectors"
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
def test_the_verdict_is_openssls(name: str) -> None:
    public, signature = CASES[name]
    b64 = base64.b64encode(public).decode()
    assert ed25519_verify(b64, signature, MESSAGE) == _openssl(public, signature, MESSAGE)


def test_the_cases_include_keys_libsodium_alone_refuses() -> None:
    """What makes the test above able to fail: without the fallback to OpenSSL, these verdicts
    would change (the market would refuse events it used to apply)."""
    differ = sorted(n for n, (k, s) in CASES.items() if len(s) == 64
                    and _openssl(k, s, MESSAGE) != _libsodium(k, s, MESSAGE))  # fmt: skip
    assert "identity key, universal signature" in differ
    assert "order-2 key" in differ
    assert not any(_libsodium(k, s, MESSAGE) and not _openssl(k, s, MESSAGE)
                   for k, s in CASES.values() if len(s) == 64)  # fmt: skip


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
        assert verify(doc["market"], event, signer, generation=version), entry["name"]
        raw = bytearray(base64.b64decode(entry["signature"]))
        raw[7] ^= 1
        bad = base64.b64encode(bytes(raw)).decode()
        assert not verify(doc["market"], event, signer, bad, generation=version), entry["name"]


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
