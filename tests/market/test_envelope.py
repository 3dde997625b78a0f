"""Sealed envelopes: only the intended buyer can open a release, and tampering is detected."""

from __future__ import annotations

import base64
import os

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from market.envelope import (
    CONTEXT,
    EnvelopeError,
    Opener,
    Sealer,
    _key,
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


SECRET = b"s" * 32


def test_a_sealer_opens_with_the_recipients_key_only_and_binds_the_aad() -> None:
    key, pub = generate_keypair()
    other, _ = generate_keypair()
    env = Sealer(SECRET).seal(pub, b"releases", aad=b"p1")
    assert open_envelope(key, env, aad=b"p1") == b"releases"
    with pytest.raises(EnvelopeError, match="someone else"):
        open_envelope(other, env, aad=b"p1")
    with pytest.raises(EnvelopeError):
        open_envelope(key, env, aad=b"p2")


def test_a_sealer_is_a_function_of_the_message_with_a_nonce_per_message() -> None:
    key, pub = generate_keypair()
    _, pub2 = generate_keypair()
    sealer = Sealer(SECRET, maxsize=1)
    a = sealer.seal(pub, b"m1", aad=b"p1")
    sealer.seal(pub2, b"m1", aad=b"p1")  # pushes pub's key out of the cache
    assert Sealer(SECRET).seal(pub, b"m1", aad=b"p1") == a == sealer.seal(pub, b"m1", aad=b"p1")
    others = [sealer.seal(pub, b"m2", aad=b"p1"), sealer.seal(pub, b"m1", aad=b"p2")]
    assert {e["epk"] for e in others} == {a["epk"]}  # one sender key per recipient
    assert len({e["nonce"] for e in [a, *others]}) == 3  # every message its own nonce
    assert sealer.seal(pub2, b"m1", aad=b"p1")["epk"] != a["epk"]
    assert Sealer(b"t" * 32).seal(pub, b"m1", aad=b"p1")["epk"] != a["epk"]
    assert open_envelope(key, others[1], aad=b"p2") == b"m1"


def test_a_sealer_refuses_keys_nothing_can_be_sealed_for() -> None:
    with pytest.raises(EnvelopeError, match="at least 32"):
        Sealer(b"short")
    with pytest.raises(EnvelopeError, match="low-order"):
        Sealer(SECRET).seal(base64.b64encode(bytes(32)).decode(), b"x")
    with pytest.raises(EnvelopeError, match="32 bytes"):
        Sealer(SECRET).seal(base64.b64encode(b"short").decode(), b"x")


def test_the_key_derivation_is_rfc5869_hkdf() -> None:
    """``_key`` is written out with two HMACs; the library's HKDF is the independent answer."""
    for n in (0, 1, 7):
        shared, epk, rpk = os.urandom(32), os.urandom(32), bytes([n]) * 32
        want = HKDF(algorithm=hashes.SHA256(), length=32, salt=epk + rpk, info=CONTEXT)
        assert _key(shared, epk, rpk) == want.derive(shared)


def test_an_opener_opens_what_was_sealed_to_its_key_and_nothing_else() -> None:
    key, pub = generate_keypair()
    opener = Opener(key)
    assert opener.public_b64 == pub
    env = seal(pub, b"numbers", aad=b"batch")
    assert opener.open(env, aad=b"batch") == b"numbers"
    with pytest.raises(EnvelopeError, match="cannot be opened"):
        opener.open(env, aad=b"another batch")
    other, _ = generate_keypair()
    with pytest.raises(EnvelopeError, match="cannot be opened"):
        Opener(other).open(env, aad=b"batch")
    low = {**env, "epk": base64.b64encode(bytes(32)).decode()}
    with pytest.raises(EnvelopeError, match="low-order"):
        opener.open(low, aad=b"batch")
