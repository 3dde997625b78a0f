"""Receipts any JSON tool can carry, and commitments a stranger cannot invert.

A receipt of version 4 or 5 is signed over tagged canonical bytes: re-spelling its numbers (as
JavaScript, or in exponent form) or reordering its keys still verifies, changing a value does
not. Its commitment binds the released numbers without showing them: the version 2 digest of a
small integer release is found by trying every integer, the commitment is not, and it opens only
with the purchase's opening.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import struct
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from market.errors import ReceiptError
from market.receipts import (
    Receipt,
    commitment,
    derive_opening,
    key_id,
    opening_key,
    release_digest,
    sign_receipt,
    verify_outcome,
    verify_receipt,
)

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
PUBLIC = KEY.public_key()
SECRET = bytes(range(32))
PURCHASE = {
    "buyer_id": "alice",
    "stream_id": "counts",
    "purchase_id": "p1",
    "requested_at_ms": 1_700_000_000_000,
    "level_after": 2.0,
}
OPENING = derive_opening(opening_key(SECRET), **PURCHASE)  # type: ignore[arg-type]


def _receipt(releases: list[Any], version: int = 4, **fields: Any) -> Receipt:
    base: dict[str, Any] = {
        "purchase_id": "p1",
        "buyer_id": "alice",
        "stream_id": "counts",
        "seller_id": "bob",
        "mechanism": "discrete_laplace",
        "value_ids": tuple(r[0] for r in releases),
        "level_before": 0.0,
        "level_after": 2.0,
        "price_minor": 150,
        "currency": "EUR",
        "requested_at_ms": 1_700_000_000_000,
        "market_key_id": key_id(PUBLIC),
        "receipt_version": version,
    }
    if version in (2, 3):
        base["release_digest"] = release_digest(releases)
    else:
        base["commitment"] = commitment(OPENING, releases)
    return Receipt(**{**base, **fields})


def _outcome(releases: list[tuple[str, float, list[float]]]) -> dict[str, Any]:
    """A fulfilled purchase, released in clear, as JSON data."""
    rec = _receipt(releases)
    return {
        "type": "purchase_fulfilled",
        "purchase_id": "p1",
        "buyer_id": "alice",
        "stream_id": "counts",
        "level_unit": "epsilon",
        "level_before": 0.0,
        "level_after": 2.0,
        "price_minor": 150,
        "currency": "EUR",
        "releases": [
            {"value_id": v, "seq": k, "level": lv, "values": xs}
            for k, (v, lv, xs) in enumerate(releases)
        ],
        "sealed": None,
        "opening": OPENING.hex(),
        "receipt": {**rec.to_dict(), "signature": sign_receipt(rec, KEY)},
    }


def respell(data: Any, style: str) -> str:
    """JSON text of ``data`` as another writer spells it, every object's keys reversed.

    ``js``: whole numbers without a fraction and -0 as 0 (JavaScript's JSON.stringify);
    ``exp``: every number in exponent form with 17 significant digits; ``float``: integers
    written with a fraction (``150.0``)."""
    if isinstance(data, dict):
        items = reversed(list(data.items()))
        return "{" + ",".join(f"{json.dumps(k)}:{respell(v, style)}" for k, v in items) + "}"
    if isinstance(data, list):
        return "[" + ",".join(respell(v, style) for v in data) + "]"
    if isinstance(data, bool) or data is None or isinstance(data, str):
        return json.dumps(data)
    x = float(data)
    if style == "js":
        return str(int(x)) if x.is_integer() else repr(x)
    if style == "exp":
        return f"{x:.16e}"
    return repr(x) if isinstance(data, float) else f"{data}.0"


RELEASES = [("v1", 2.0, [2.0, -0.0]), ("v2", 2.0, [1.0, 123456.789])]


@pytest.mark.parametrize("style", ["js", "exp", "float"])
def test_a_receipt_verifies_however_json_spells_its_numbers(style: str) -> None:
    text = respell(_outcome(RELEASES), style)
    if style == "js":
        assert '"level_after":2,' in text and "[2,0]" in text and '"price_minor":150' in text
    if style == "exp":
        assert "1.0000000000000000e+00" in text and "1.5000000000000000e+02" in text
    rec = verify_outcome(json.loads(text), PUBLIC)
    assert rec.level_after == 2.0 and rec.price_minor == 150
    assert rec.canonical_bytes() == _receipt(RELEASES).canonical_bytes()


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (("releases", 1, "values", 0), 2.0, "differ"),
        (("receipt", "price_minor"), 151, "signature"),
        (("receipt", "level_before"), 0.5, "signature"),
        (("receipt", "requested_at_ms"), 1_700_000_000_001, "signature"),
        (("receipt", "value_ids", 0), "v9", "signature"),
        (("opening",), "00" * 32, "opening"),
        (("receipt", "price_minor"), 150.5, "whole number"),
        (("receipt", "price_minor"), 2.0**53, "2\\*\\*53"),
        (("receipt", "level_after"), "2.0", "not a finite number"),
    ],
)
def test_changing_a_value_fails(path: tuple[Any, ...], value: Any, says: str) -> None:
    data = json.loads(respell(_outcome(RELEASES), "js"))
    node = data
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    with pytest.raises(ReceiptError, match=says):
        verify_outcome(data, PUBLIC)


def test_the_signed_bytes_are_tagged_fields_not_json() -> None:
    rec = _receipt(RELEASES)
    data = rec.canonical_bytes()
    assert data.startswith(b"emarket-receipt\x00i" + (4).to_bytes(8, "big"))
    assert b"{" not in data and b"release_digest" not in data
    assert b"f" + struct.pack(">d", 2.0) in data and b"2.0" not in data  # bits, not text
    negative = dataclasses.replace(rec, level_before=-0.0)
    assert negative.canonical_bytes() == rec.canonical_bytes()  # a writer may print -0 as 0


def test_a_legacy_receipt_still_verifies_after_respelling() -> None:
    """Version 2: signed over Python's JSON; its numbers are read as numbers and spelled as
    Python spells them, so ``2`` for ``2.0`` still verifies."""
    releases = [("v1", 2.0, np.array([1.5, -0.25]))]
    rec = _receipt(releases, version=2)
    data = json.loads(respell({**rec.to_dict(), "signature": sign_receipt(rec, KEY)}, "js"))
    assert data["level_after"] == 2 and isinstance(data["level_after"], int)
    assert verify_receipt(data, data["signature"], releases, PUBLIC).receipt_version == 2
    with pytest.raises(ReceiptError, match="differ"):
        verify_receipt(data, data["signature"], [("v1", 2.0, np.array([1.5, 0.25]))], PUBLIC)


def test_a_receipt_carries_the_binding_of_its_version_only() -> None:
    rec = _receipt(RELEASES)
    sig = sign_receipt(rec, KEY)
    both = {**rec.to_dict(), "release_digest": release_digest(RELEASES)}
    with pytest.raises(ReceiptError, match="no release_digest"):
        verify_receipt(both, sig, RELEASES, PUBLIC, opening=OPENING)
    with pytest.raises(ReceiptError, match="no opening given"):
        verify_receipt(rec, sig, RELEASES, PUBLIC)
    nulls = {**rec.to_dict(), "release_digest": None, "ciphertext_digest": None}
    assert verify_receipt(nulls, sig, RELEASES, PUBLIC, opening=OPENING) == rec
    with pytest.raises(ReceiptError, match="unknown field 'release_digests'"):
        Receipt.from_dict({**rec.to_dict(), "release_digests": ""})


# ------------------------------------------------------------------- hiding and binding
SMALL = range(-200, 201)


def test_a_small_integer_release_is_found_from_a_digest_but_not_from_a_commitment() -> None:
    """The red team's attack: a count in one coordinate, brute-forced from the receipt."""
    truth = [("v1", 2.0, [37.0])]
    old = _receipt(truth, version=2)
    found = [x for x in SMALL if release_digest([("v1", 2.0, [float(x)])]) == old.release_digest]
    assert found == [37]  # the receipt alone gave the number away
    new = _receipt(truth)
    # what a stranger can compute: the guesses under every opening they might try
    tries = [
        bytes(32),
        hashlib.sha256(b"p1").digest(),
        bytes.fromhex(new.commitment),
        opening_key(b"\x00" * 32),
        hashlib.sha256(new.canonical_bytes()).digest(),
    ]
    assert not [
        x
        for x in SMALL
        for o in tries
        if commitment(o, [("v1", 2.0, [float(x)])]) == new.commitment
    ]
    # the opening, which only the buyer was given, finds it: the commitment binds the number
    assert [
        x for x in SMALL if commitment(OPENING, [("v1", 2.0, [float(x)])]) == new.commitment
    ] == [37]


def test_a_wrong_opening_fails() -> None:
    rec = _receipt(RELEASES)
    sig = sign_receipt(rec, KEY)
    assert verify_receipt(rec, sig, RELEASES, PUBLIC, opening=OPENING)
    elsewhere: Any = {**PURCHASE, "purchase_id": "p2"}
    other = derive_opening(opening_key(SECRET), **elsewhere)
    for wrong in (other, bytes(32), OPENING[:-1] + bytes([OPENING[-1] ^ 1]), OPENING[:31]):
        with pytest.raises(ReceiptError, match="opening"):
            verify_receipt(rec, sig, RELEASES, PUBLIC, opening=wrong)


def test_openings_are_a_pure_function_of_the_purchase() -> None:
    key = opening_key(SECRET)
    assert derive_opening(key, **PURCHASE) == OPENING  # type: ignore[arg-type]
    changed = [
        {**PURCHASE, f: v}
        for f, v in [
            ("buyer_id", "bob"),
            ("stream_id", "c2"),
            ("purchase_id", "p2"),
            ("requested_at_ms", 1),
            ("level_after", 4.0),
        ]
    ]
    openings = {derive_opening(key, **p) for p in changed}  # type: ignore[arg-type]
    assert len(openings) == len(changed) and OPENING not in openings
    assert derive_opening(opening_key(bytes(32)), **PURCHASE) != OPENING  # type: ignore[arg-type]
    assert key not in (SECRET, hashlib.sha256(SECRET).digest())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=4))
def test_the_commitment_binds_every_bit(values: list[float]) -> None:
    releases = [("v1", 2.0, values)]
    c = commitment(OPENING, releases)
    for k, x in enumerate(values):
        if x == 0:  # -0 and +0 are one number to every JSON reader: one commitment
            flipped = [*values[:k], -x, *values[k + 1 :]]
            assert commitment(OPENING, [("v1", 2.0, flipped)]) == c
            continue
        moved = [*values[:k], math.nextafter(x, math.inf), *values[k + 1 :]]
        assert commitment(OPENING, [("v1", 2.0, moved)]) != c


# an outcome the previous release issued (receipt version 2, by the key KEY), saved verbatim
V2_OUTCOME = (
    '{"schema_version":1,"type":"purchase_fulfilled","purchase_id":"p1","buyer_id"'
    ':"alice","stream_id":"temp","level_unit":"epsilon","level_before":0.0,"leve'
    'l_after":0.5,"price_minor":50,"currency":"EUR","releases":[{"value_id":"v0"'
    ',"seq":0,"level":0.5,"values":[-1.9002685546875,0.81805419921875,1.1800537109375]}'
    '],"sealed":null,"receipt":{"receipt_version":2,"purchase_id":"p1","buyer_id"'
    ':"alice","stream_id":"temp","seller_id":"seller1","mechanism":"laplace","'
    'value_ids":["v0"],"level_before":0.0,"level_after":0.5,"price_minor":50,"curre'
    'ncy":"EUR","release_digest":"d4b62ed6268adf96913ad479e7883012cace3f1937688706794e2'
    '277c2033150","requested_at_ms":1000,"market_key_id":"56475aa75463474c","cipherte'
    'xt_digest":"","signature":"6E889doJ3+uBT85QSgbZ7vYOvkqzWBDndw1HPwuh5rLFZ1hvFieV8ru'
    'dlDIPIsOfhLzy71eJhhi9+8ZCLGIjDw=="}}'
)


def test_a_version_2_outcome_of_the_previous_release_still_verifies() -> None:
    old = json.loads(V2_OUTCOME)
    assert old["receipt"]["receipt_version"] == 2 and "release_digest" in old["receipt"]
    for style in ("js", "exp", "float"):
        assert verify_outcome(json.loads(respell(old, style)), PUBLIC).purchase_id == "p1"
    old["releases"][0]["values"][0] += 1
    with pytest.raises(ReceiptError, match="differ"):
        verify_outcome(old, PUBLIC)
