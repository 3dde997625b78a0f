"""The test vectors of ``docs/protocol.md`` §11: made here, checked by the tests.

Two receipts under fixed keys: a version 4 receipt of releases sealed for a buyer (one number
is -0, which the commitment reads as +0), with the envelope's plaintext, its padded length and
the envelope itself; and a version 5 receipt of a histogram release in clear. Every byte a client
in another language must reproduce is listed: the identity and the opening, the releases'
digest ``D``, the commitment, the canonical bytes and the signature.

Print them (the block between the document's markers) with
``python -m streams.wire.receipt_vectors``;
``tests/streams/wire/test_receipt_vectors.py`` fails when the document and this module disagree.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from market.envelope import Sealer, ciphertext_digest, open_envelope, public_key_b64
from market.receipts import (
    COMMITMENT_LABEL,
    KEYED_RECEIPT_VERSION,
    RECEIPT_VERSION,
    Receipt,
    commitment,
    commitment_digest,
    derive_opening,
    key_id,
    opening_key,
    sign_receipt,
)
from market.rng import identity_bytes

from .events import ReleasedValue
from .sealing import padded, padded_length, purchase_aad, releases_json, seal_releases

__all__ = ["BEGIN", "END", "vectors"]

BEGIN = "<!-- receipt vectors: begin -->"
END = "<!-- receipt vectors: end -->"

SIGNING_SEED = bytes(range(32))
NOISE_SECRET = bytes(range(32))
BUYER_SEALING_SEED = bytes(range(0x40, 0x60))
REQUESTED_AT_MS = 1_700_000_000_000


def _receipt_vector(
    *,
    purchase: dict[str, Any],
    seller_id: str,
    mechanism: str,
    level_before: float,
    price_minor: int,
    releases: list[ReleasedValue],
    sealed_for: X25519PrivateKey | None,
) -> dict[str, Any]:
    """One purchase's receipt, with everything between the secrets and the signature."""
    signing = Ed25519PrivateKey.from_private_bytes(SIGNING_SEED)
    parts = ("buyer_id", "stream_id", "purchase_id", "requested_at_ms", "level_after")
    ident = identity_bytes(*(purchase[p] for p in parts))
    opening = derive_opening(opening_key(NOISE_SECRET), **purchase)
    keyed = any(r.keys is not None for r in releases)
    triples: list[Any] = [
        (r.value_id, r.level, r.values, *([r.keys] if keyed else [])) for r in releases
    ]
    digest = commitment_digest(triples)
    out: dict[str, Any] = {
        "purchase": purchase,
        "identity": ident.hex(),
        "opening": opening.hex(),
        "releases": [r.model_dump(exclude_none=True) for r in releases],
        "releases_digest": digest.hex(),
        "commitment_message": (COMMITMENT_LABEL + digest).hex(),
    }
    sealed = ""
    if sealed_for is not None:
        sealing = _sealing_vector(sealed_for, releases, purchase, opening)
        sealed = ciphertext_digest(sealing["envelope"])
        out |= sealing
    receipt = Receipt(
        purchase_id=purchase["purchase_id"],
        buyer_id=purchase["buyer_id"],
        stream_id=purchase["stream_id"],
        seller_id=seller_id,
        mechanism=mechanism,
        value_ids=tuple(r.value_id for r in releases),
        level_before=level_before,
        level_after=purchase["level_after"],
        price_minor=price_minor,
        currency="EUR",
        requested_at_ms=purchase["requested_at_ms"],
        market_key_id=key_id(signing.public_key()),
        receipt_version=KEYED_RECEIPT_VERSION if keyed else RECEIPT_VERSION,
        ciphertext_digest=sealed,
        commitment=commitment(opening, triples),
    )
    signature = sign_receipt(receipt, signing)
    return out | {
        "canonical_bytes": receipt.canonical_bytes().hex(),
        "signature": signature,
        "receipt": {**receipt.to_dict(), "signature": signature},
    }


def _sealing_vector(
    sealed_for: X25519PrivateKey,
    releases: list[ReleasedValue],
    purchase: dict[str, Any],
    opening: bytes,
) -> dict[str, Any]:
    """The sealed part of a receipt's vector: the buyer's keys, the padded plaintext and the
    envelope that opens to it (checked here, so a vector never states a wrong envelope)."""
    plain = releases_json(releases, opening)
    size = padded_length(plain, releases)
    envelope = seal_releases(
        Sealer(NOISE_SECRET),
        public_key_b64(sealed_for),
        releases,
        purchase_aad(purchase["purchase_id"]),
        opening,
    )
    assert padded(plain, size) == _open(sealed_for, envelope.model_dump(), purchase)
    return {
        "buyer_sealing_private_key": BUYER_SEALING_SEED.hex(),
        "buyer_sealing_key": public_key_b64(sealed_for),
        "plaintext": plain.decode(),
        "padded_length": size,
        "envelope": envelope.model_dump(),
    }


def _open(key: X25519PrivateKey, envelope: dict[str, Any], purchase: dict[str, Any]) -> bytes:
    return open_envelope(key, envelope, purchase_aad(purchase["purchase_id"]))


def vectors() -> dict[str, Any]:
    """The document's vectors: keys, then the two receipts.

    Returns
    -------
    dict
        JSON-ready; :func:`main` prints it as the document holds it.
    """
    signing = Ed25519PrivateKey.from_private_bytes(SIGNING_SEED)
    buyer = X25519PrivateKey.from_private_bytes(BUYER_SEALING_SEED)
    raw_public = base64.b64encode(signing.public_key().public_bytes_raw()).decode()
    sealed = _receipt_vector(
        purchase={
            "buyer_id": "alice",
            "stream_id": "temp",
            "purchase_id": "p1",
            "requested_at_ms": REQUESTED_AT_MS,
            "level_after": 2.0,
        },
        seller_id="seller1",
        mechanism="laplace",
        level_before=0.5,
        price_minor=150,
        releases=[
            ReleasedValue(value_id="v1", seq=0, level=2.0, values=[1.5, -0.25]),
            ReleasedValue(value_id="v2", seq=1, level=2.0, values=[3.0, -0.0]),
        ],
        sealed_for=buyer,
    )
    histogram = _receipt_vector(
        purchase={
            "buyer_id": "bob",
            "stream_id": "cities",
            "purchase_id": "p2",
            "requested_at_ms": REQUESTED_AT_MS,
            "level_after": 0.5,
        },
        seller_id="seller1",
        mechanism="gaussian",
        level_before=0.0,
        price_minor=50,
        releases=[
            ReleasedValue(
                value_id="d1",
                seq=4,
                level=0.5,
                values=[118.25, 81.0],
                keys=["5", "1844674407370955161"],
            )
        ],
        sealed_for=None,
    )
    return {
        "signing_private_key": SIGNING_SEED.hex(),
        "market_public_key": raw_public,
        "market_key_id": key_id(signing.public_key()),
        "noise_secret": NOISE_SECRET.hex(),
        "opening_key": opening_key(NOISE_SECRET).hex(),
        "receipts": [sealed, histogram],
    }


def block() -> str:
    """The text between the document's markers (its JSON block, fenced)."""
    return "```json\n" + json.dumps(vectors(), indent=1, ensure_ascii=False) + "\n```"


def main() -> None:
    print(BEGIN)
    print(block())
    print(END)


if __name__ == "__main__":
    main()
