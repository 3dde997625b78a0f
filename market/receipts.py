"""Signed payment receipts: what a buyer paid for, bound to the exact numbers released.

A receipt is signed by the market with Ed25519 over a canonical JSON encoding of its fields
(keys sorted, no whitespace, UTF-8), so any client that can compute SHA-256 and verify Ed25519
can check it. The ``release_digest`` field binds the receipt to the released vectors:

    SHA-256 over, for each release in receipt order:
        u32 BE  length of value_id in UTF-8 bytes
        bytes   value_id
        f64 BE  level
        u32 BE  number of coordinates n
        n × f64 LE  the released numbers (integers of Poisson releases as exact doubles)

Changing any receipt field, any released number, the order of releases or the set of values makes
:func:`verify_receipt` fail with :class:`~market.errors.ReceiptError`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .errors import ReceiptError

__all__ = [
    "RECEIPT_VERSION",
    "Receipt",
    "key_id",
    "release_digest",
    "sign_receipt",
    "verify_receipt",
]

RECEIPT_VERSION = 1

ReleaseTriple = tuple[str, float, Any]  # (value_id, level, vector)


def release_digest(releases: Iterable[ReleaseTriple]) -> str:
    """Hex SHA-256 of the released numbers in the documented binary layout."""
    h = hashlib.sha256()
    for value_id, level, values in releases:
        vid = value_id.encode("utf-8")
        arr = np.ascontiguousarray(np.asarray(values, dtype="<f8"))
        h.update(struct.pack(">I", len(vid)) + vid + struct.pack(">dI", float(level), arr.size))
        h.update(arr.tobytes())
    return h.hexdigest()


def key_id(public_key: Ed25519PublicKey) -> str:
    """Short stable identifier of a market key: first 16 hex digits of SHA-256(raw key)."""
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class Receipt:
    """The signed fields of a receipt (``signature`` is carried beside them)."""

    purchase_id: str
    buyer_id: str
    stream_id: str
    seller_id: str
    mechanism: str
    value_ids: tuple[str, ...]
    level_before: float
    level_after: float
    price_minor: int
    currency: str
    release_digest: str
    issued_at_ms: int
    market_key_id: str
    receipt_version: int = RECEIPT_VERSION
    #: SHA-256 of the sealed envelope's ciphertext when the releases were encrypted for the
    #: buyer (see :mod:`market.envelope`), else "".
    ciphertext_digest: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields (``value_ids`` as a list); cheaper than dataclasses.asdict."""
        out = {f: getattr(self, f) for f in _FIELDS}
        out["value_ids"] = list(self.value_ids)
        return out

    def canonical_bytes(self) -> bytes:
        return json.dumps(
            self.to_dict(),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        ).encode("utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Receipt:
        fields = {k: v for k, v in data.items() if k != "signature"}
        try:
            fields["value_ids"] = tuple(fields["value_ids"])
            return cls(**fields)
        except (KeyError, TypeError) as exc:
            raise ReceiptError(f"receipt is malformed: {exc}") from None


_FIELDS = tuple(f.name for f in fields(Receipt))


def sign_receipt(receipt: Receipt, private_key: Ed25519PrivateKey) -> str:
    """Base64 Ed25519 signature over the receipt's canonical bytes (deterministic)."""
    return base64.b64encode(private_key.sign(receipt.canonical_bytes())).decode("ascii")


def verify_receipt(
    receipt: dict[str, Any] | Receipt,
    signature: str,
    releases: Sequence[ReleaseTriple],
    public_key: Ed25519PublicKey,
    *,
    envelope: dict[str, Any] | None = None,
) -> Receipt:
    """Check the signature and that ``releases`` are exactly the numbers the receipt covers.

    For encrypted deliveries pass the sealed ``envelope`` too: the receipt binds its ciphertext.
    Returns the parsed receipt; raises ReceiptError saying which check failed.
    """
    rec = receipt if isinstance(receipt, Receipt) else Receipt.from_dict(receipt)
    if rec.receipt_version != RECEIPT_VERSION:
        raise ReceiptError(f"unsupported receipt version {rec.receipt_version}")
    if rec.market_key_id != key_id(public_key):
        raise ReceiptError(
            f"receipt was signed by market key {rec.market_key_id}, not by the key given "
            f"({key_id(public_key)})"
        )
    try:
        public_key.verify(base64.b64decode(signature, validate=True), rec.canonical_bytes())
    except (InvalidSignature, ValueError):
        raise ReceiptError("signature does not match the receipt fields") from None
    if tuple(r[0] for r in releases) != rec.value_ids:
        raise ReceiptError("the releases do not cover exactly the receipt's value ids, in order")
    if any(float(r[1]) != rec.level_after for r in releases):
        raise ReceiptError("a release is not at the receipt's level")
    if release_digest(releases) != rec.release_digest:
        raise ReceiptError("released numbers differ from the ones the receipt was issued for")
    if rec.ciphertext_digest or envelope is not None:
        from .envelope import EnvelopeError, ciphertext_digest  # noqa: PLC0415

        try:
            got = "" if envelope is None else ciphertext_digest(envelope)
        except EnvelopeError:
            got = "<malformed>"
        if got != rec.ciphertext_digest:
            raise ReceiptError("the sealed envelope is not the one the receipt was issued for")
    return rec
