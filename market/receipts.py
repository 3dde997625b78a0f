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
        n × u64 BE  receipt version 3 only (histogram streams): the keys of those numbers

Changing any receipt field, any released number, the order of releases or the set of values makes
:func:`verify_receipt` fail with :class:`~market.errors.ReceiptError`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .errors import ReceiptError

__all__ = [
    "KEYED_RECEIPT_VERSION",
    "RECEIPT_VERSION",
    "Receipt",
    "key_id",
    "parse_public_key",
    "release_digest",
    "sign_receipt",
    "verify_outcome",
    "verify_receipt",
]

RECEIPT_VERSION = 2
"""Receipts of streams of vectors; a histogram stream's receipts are version 3
(:data:`KEYED_RECEIPT_VERSION`): the digest also covers the released keys."""
KEYED_RECEIPT_VERSION = 3
_VERSIONS = (RECEIPT_VERSION, KEYED_RECEIPT_VERSION)
_KEY = re.compile(r"0|[1-9][0-9]{0,19}")  # one spelling per key: ASCII digits, no leading 0

ReleaseTriple = tuple[str, float, Any] | tuple[str, float, Any, Any]
"""(value_id, level, vector) or, for a histogram release, (value_id, level, counts, keys)."""


def release_digest(releases: Iterable[ReleaseTriple]) -> str:
    """The digest a receipt signs: SHA-256 of the released numbers.

    Parameters
    ----------
    releases : iterable of (value_id, level, vector) or (value_id, level, counts, keys)
        In receipt order; ``keys`` (histograms, receipt version 3) as many as the counts.

    Returns
    -------
    str
        Hex SHA-256 over the binary layout in the module docstring.
    """
    h = hashlib.sha256()
    for release in releases:
        value_id, level, values = release[0], release[1], release[2]
        vid = value_id.encode("utf-8")
        arr = np.ascontiguousarray(np.asarray(values, dtype="<f8"))
        h.update(struct.pack(">I", len(vid)) + vid + struct.pack(">dI", float(level), arr.size))
        h.update(arr.tobytes())
        if len(release) == 4:
            keys = [_key(k) for k in release[3]]
            if len(keys) != arr.size:
                raise ReceiptError("a histogram release needs one key per number")
            h.update(struct.pack(f">{len(keys)}Q", *keys))
    return h.hexdigest()


def _key(k: Any) -> int:
    """A released key as the digest reads it: a whole number below 2**64, or its one decimal
    spelling (ASCII digits, no leading zero): no other text of it verifies."""
    if isinstance(k, str) and _KEY.fullmatch(k):
        k = int(k)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 0 <= k < 2**64:
        raise ReceiptError(f"key {k!r} is not a whole number below 2**64 in decimal digits")
    return int(k)


def key_id(public_key: Ed25519PublicKey) -> str:
    """Short stable identifier of a market key.

    Returns
    -------
    str
        The first 16 hex digits of SHA-256 of the raw 32-byte public key.
    """
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class Receipt:
    """The signed fields of a receipt (``signature`` travels beside them).

    Attributes
    ----------
    purchase_id, buyer_id, stream_id, seller_id : str
        Who bought what from whom.
    mechanism : str
        The stream's noise family; it fixes the unit of the levels.
    value_ids : tuple of str
        The values released, in order.
    level_before, level_after : float
        Level held before and after the purchase.
    price_minor : int
        Price paid, in minor units of ``currency``.
    currency : str
        ISO 4217 code.
    release_digest : str
        :func:`release_digest` of the released numbers.
    requested_at_ms : int
        When the buyer made the request (Unix ms, from the purchase). Version 2 carries the
        request's time rather than the market's clock, so a purchase processed twice (a replay,
        a second worker) gets a byte-identical receipt.
    market_key_id : str
        :func:`key_id` of the signing key.
    receipt_version : int
        Format version: 2, or 3 for a histogram stream (the digest covers the keys).
    ciphertext_digest : str
        SHA-256 of the sealed envelope's ciphertext when the releases were encrypted for the
        buyer (:mod:`market.envelope`), else "".
    """

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
    requested_at_ms: int
    market_key_id: str
    receipt_version: int = RECEIPT_VERSION
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
    def from_dict(cls, data: Mapping[str, Any]) -> Receipt:
        if not isinstance(data, Mapping):
            raise ReceiptError(f"a receipt is a JSON object, got {type(data).__name__}")
        fields = {k: v for k, v in data.items() if k != "signature"}
        try:
            fields["value_ids"] = tuple(fields["value_ids"])
            return cls(**fields)
        except (KeyError, TypeError) as exc:
            raise ReceiptError(f"receipt is malformed: {exc}") from None


_FIELDS = tuple(f.name for f in fields(Receipt))


def sign_receipt(receipt: Receipt, private_key: Ed25519PrivateKey) -> str:
    """Sign a receipt with the market's key.

    Parameters
    ----------
    receipt : Receipt
        The fields to sign.
    private_key : Ed25519PrivateKey
        The market's receipt key.

    Returns
    -------
    str
        Base64 Ed25519 signature over :meth:`Receipt.canonical_bytes` (deterministic).
    """
    return base64.b64encode(private_key.sign(receipt.canonical_bytes())).decode("ascii")


def verify_receipt(
    receipt: Mapping[str, Any] | Receipt,
    signature: str,
    releases: Sequence[ReleaseTriple],
    public_key: Ed25519PublicKey,
    *,
    envelope: dict[str, Any] | None = None,
) -> Receipt:
    """Check a receipt's signature and that ``releases`` are exactly the numbers it covers.

    Parameters
    ----------
    receipt : Receipt or mapping
        The receipt's fields.
    signature : str
        Its base64 signature.
    releases : sequence of (value_id, level, vector)
        What the buyer received, in order.
    public_key : Ed25519PublicKey
        The market's key (from the catalog).
    envelope : dict, optional
        The sealed envelope, for encrypted deliveries: the receipt binds its ciphertext.

    Returns
    -------
    Receipt

    Raises
    ------
    ReceiptError
        Saying which check failed.
    """
    rec = receipt if isinstance(receipt, Receipt) else Receipt.from_dict(receipt)
    _check_version(rec, releases)
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


def _check_version(rec: Receipt, releases: Sequence[ReleaseTriple]) -> None:
    if rec.receipt_version not in _VERSIONS:
        raise ReceiptError(f"unsupported receipt version {rec.receipt_version}")
    keyed = rec.receipt_version == KEYED_RECEIPT_VERSION
    if any((len(r) == 4) != keyed for r in releases):
        raise ReceiptError(
            "a version 3 receipt covers histogram releases, each with its keys; version 2 "
            "covers releases without keys"
        )


def parse_public_key(text: Any) -> Ed25519PublicKey:
    """A market's Ed25519 public key from base64 of its 32 raw bytes (as in the catalog).

    Raises
    ------
    ReceiptError
        ``text`` is not base64 of exactly 32 bytes.
    """
    if not isinstance(text, str) or not text or text == "null":
        raise ReceiptError(
            f"no market public key given ({text!r}); copy market_public_key from the catalog "
            "entry of the stream (`epsilon-market catalog`)"
        )
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise ReceiptError(f"the market public key {text!r} is not valid base64") from None
    if len(raw) != 32:
        raise ReceiptError(
            f"the market public key decodes to {len(raw)} bytes; an Ed25519 key is 32 bytes"
        )
    return Ed25519PublicKey.from_public_bytes(raw)


#: Fields of a ``purchase_fulfilled`` event that repeat signed receipt fields.
OUTER_FIELDS = (
    "purchase_id", "buyer_id", "stream_id", "level_before", "level_after", "price_minor",
    "currency",
)  # fmt: skip


def _releases_of(outcome: Mapping[str, Any]) -> list[ReleaseTriple]:
    raw = outcome.get("releases")
    if not isinstance(raw, list):
        raise ReceiptError("the outcome's 'releases' is not a list")
    out: list[ReleaseTriple] = []
    for r in raw:
        if not isinstance(r, Mapping) or not {"value_id", "level", "values"} <= set(r):
            raise ReceiptError("a release lacks value_id, level or values")
        try:
            values = np.asarray(r["values"], dtype=np.float64)
        except (TypeError, ValueError):
            raise ReceiptError(f"release {r['value_id']!r} holds non-numeric values") from None
        keys = r.get("keys")
        if keys is None:
            out.append((str(r["value_id"]), r["level"], values))
        elif isinstance(keys, list) and all(isinstance(k, str) and _KEY.fullmatch(k) for k in keys):
            out.append((str(r["value_id"]), r["level"], values, keys))
        else:
            raise ReceiptError(f"release {r['value_id']!r} has keys that are not decimal text")
    return out


def verify_outcome(outcome: Any, public_key: Ed25519PublicKey) -> Receipt:
    """Verify a whole ``purchase_fulfilled`` event (as JSON data) against the market's key.

    Checks the receipt's signature and the released numbers (and envelope) it binds, **and** that
    every field of the event that repeats a receipt field agrees with the signed one: only
    signed data can then be shown as verified. Needs no service dependencies.

    Returns
    -------
    Receipt
        The signed receipt; show its fields, not the event's.

    Raises
    ------
    ReceiptError
        Saying what is wrong: not a purchase outcome, sealed releases not opened, signature,
        numbers, envelope, or outer fields that disagree with the signed ones.
    """
    if not isinstance(outcome, Mapping):
        raise ReceiptError("not a purchase outcome: expected a JSON object")
    kind = outcome.get("type")
    if kind != "purchase_fulfilled":
        why = f" (reason {outcome.get('reason')!r})" if kind == "rejection" else ""
        raise ReceiptError(
            f"this is a {kind!r} event{why}, not a purchase_fulfilled outcome; only fulfilled "
            "purchases carry a receipt"
        )
    receipt = outcome.get("receipt")
    if not isinstance(receipt, Mapping) or not isinstance(receipt.get("signature"), str):
        raise ReceiptError("the outcome carries no signed receipt")
    releases = _releases_of(outcome)
    if outcome.get("sealed") and not releases and receipt.get("value_ids"):
        raise ReceiptError(
            "the releases are sealed for the buyer: open them with the buyer's key first "
            "(`epsilon-market buy --output FILE --key-file KEY` writes them opened)"
        )
    try:
        rec = verify_receipt(
            receipt, receipt["signature"], releases, public_key, envelope=outcome.get("sealed")
        )
    except (TypeError, ValueError) as exc:
        raise ReceiptError(f"the outcome is malformed: {exc}") from None
    differ = [f for f in OUTER_FIELDS if outcome.get(f) != getattr(rec, f)]
    if differ:
        raise ReceiptError(
            "the event's " + ", ".join(differ) + " disagree with the signed receipt "
            "(edited outside the signature?)"
        )
    return rec
