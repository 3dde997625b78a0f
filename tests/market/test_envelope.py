"""Sealed envelopes: only the intended buyer can open a release, and tampering is detected."""

from __future__ import annotations

import base64

import pytest

from market.envelope import (
    EnvelopeError,
    ciphertext_digest,
    generate_keypair,
    open_envelope,
    seal,
)


def test_round_trip_and_fresh_ciphertexts() -> None:
    key, pub = generate_keypair()
    a = seal(pub, b"secret numbers", aad=b"p1")
    b = seal(pub, b"secret numbers", aad=b"p1")
    assert a["ciphertext"] != b["ciphertext"]  # ephemeral key and nonce are fresh
    assert open_envelope(key, a, aad=b"p1") == b"secret numbers"
    assert ciphertext_digest(a) != ciphertext_digest(b)


def test_other_key_cannot_open() -> None:
    _, pub = generate_keypair()
    other, _ = generate_keypair()
    with pytest.raises(EnvelopeError, match="someone else"):
        open_envelope(other, seal(pub, b"x"))


@pytest.mark.parametrize("field", ["epk", "nonce", "ciphertext"])
def test_any_tampering_is_detected(field: str) -> None:
    key, pub = generate_keypair()
    env = seal(pub, b"payload", aad=b"a")
    raw = bytearray(base64.b64decode(env[field]))
    raw[-1] ^= 1
    with pytest.raises(EnvelopeError):
        open_envelope(key, {**env, field: base64.b64encode(bytes(raw)).decode()}, aad=b"a")
    with pytest.raises(EnvelopeError):
        open_envelope(key, env, aad=b"b")  # bound to its purchase / stream


def test_malformed_inputs() -> None:
    key, pub = generate_keypair()
    with pytest.raises(EnvelopeError, match="32 bytes"):
        seal(base64.b64encode(b"short").decode(), b"x")
    with pytest.raises(EnvelopeError, match="algorithm"):
        open_envelope(key, {"alg": "rot13"})
    with pytest.raises(EnvelopeError, match="base64"):
        open_envelope(key, {**seal(pub, b"x"), "nonce": "!!"})
