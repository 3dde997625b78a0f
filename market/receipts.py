"""Signed payment receipts: what a buyer paid for, bound to the numbers released, unshown.

A receipt (version 4, or 5 for a histogram stream) is signed by the market with Ed25519 over
*canonical bytes* (:meth:`Receipt.canonical_bytes`, ``docs/protocol.md`` §11): each
field tagged and sized as in the signed events (§2), numbers by their IEEE 754 or two's
complement bits, never by a language's spelling of them. A JSON tool that writes ``2.0`` as
``2`` or ``1e0``, or reorders the keys, changes nothing that was signed.

The receipt binds the released vectors with a *commitment* rather than a digest of them:

    commitment = HMAC-SHA256(opening, "emarket receipt commitment v1" ‖ 0x00 ‖ D)

where ``D`` is the 32-byte SHA-256 over, for each release in receipt order:

    u32 BE  length of value_id in UTF-8 bytes
    bytes   value_id
    f64 BE  level
    u32 BE  number of coordinates n
    n × f64 LE  the released numbers (integers of Poisson releases as exact doubles; -0 as +0)
    n × u64 BE  version 5 only (histogram streams): the keys of those numbers

and ``opening`` is 32 bytes the market derives from its secret and the purchase
(:func:`derive_opening`) and gives to the buyer only, beside the releases (inside the sealed
envelope when the buyer has a sealing key). A digest of the numbers alone could be inverted by
anyone shown the receipt: a count released in one or two coordinates has few likely values, and
hashing each guess finds it. Without the opening the commitment is an HMAC under an unknown
32-byte key, which tells nothing of the numbers; with it, anyone can check them.

Receipts of versions 2 and 3 (signed over Python's canonical JSON, binding a plain
``release_digest``) are still verified: their numbers are read as numbers and spelled again as
the market spelled them, so they verify after a JSON tool re-spells them too.

Changing any receipt field, any released number, the opening, the order of releases or the set
of values makes :func:`verify_receipt` fail with :class:`~market.errors.ReceiptError`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .errors import ReceiptError
from .rng import identity_bytes

__all__ = [
    "COMMITMENT_LABEL",
    "DOMAIN",
    "KEYED_RECEIPT_VERSION",
    "OPENING_KEY_LABEL",
    "RECEIPT_VERSION",
    "Receipt",
    "commitment",
    "commitment_digest",
    "derive_opening",
    "key_id",
    "opening_key",
    "parse_public_key",
    "release_digest",
    "sign_receipt",
    "verify_outcome",
    "verify_receipt",
]

RECEIPT_VERSION = 4
"""Receipts of streams of vectors; a histogram stream's receipts are version 5
(:data:`KEYED_RECEIPT_VERSION`): the commitment also covers the released keys."""
KEYED_RECEIPT_VERSION = 5
_LEGACY = (2, 3)  # canonical JSON and a plain release_digest; 3 covers keys
_KEYED = (3, KEYED_RECEIPT_VERSION)
_VERSIONS = (*_LEGACY, RECEIPT_VERSION, KEYED_RECEIPT_VERSION)
_KEY = re.compile(r"0|[1-9][0-9]{0,19}")  # one spelling per key: ASCII digits, no leading 0
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_EXACT = 2**53 - 1  # an integer field every JSON reader reads alike (docs/protocol.md §2.2)

DOMAIN = b"emarket-receipt\x00"
"""First bytes of a receipt's canonical bytes (versions 4 and 5)."""
COMMITMENT_LABEL = b"emarket receipt commitment v1\x00"
"""What the commitment's HMAC covers before the releases' digest."""
OPENING_KEY_LABEL = b"emarket receipt opening key v1"
"""What the noise secret MACs to give the key openings are derived under: a label no other
derivation from the secret uses, and neither a prefix of another nor prefixed by one."""
OPENING_BYTES = 32

ReleaseTriple = tuple[str, float, Any] | tuple[str, float, Any, Any]
"""(value_id, level, vector) or, for a histogram release, (value_id, level, counts, keys)."""


def _releases_hash(releases: Iterable[ReleaseTriple], *, plus_zero: bool) -> bytes:
    """SHA-256 over the layout in the module docstring; ``plus_zero`` writes -0 as +0 (versions
    4 and 5: a JSON writer may print -0.0 as 0, and the two are one number to a reader)."""
    h = hashlib.sha256()
    for release in releases:
        value_id, level, values = release[0], release[1], release[2]
        vid = value_id.encode("utf-8")
        arr = np.ascontiguousarray(np.asarray(values, dtype="<f8"))
        if plus_zero:
            arr = arr + 0.0  # -0.0 + 0.0 is +0.0; every other double is unchanged
        h.update(struct.pack(">I", len(vid)) + vid + struct.pack(">dI", float(level), arr.size))
        h.update(arr.astype("<f8", copy=False).tobytes())
        if len(release) == 4:
            keys = [_key(k) for k in release[3]]
            if len(keys) != arr.size:
                raise ReceiptError("a histogram release needs one key per number")
            h.update(struct.pack(f">{len(keys)}Q", *keys))
    return h.digest()


def release_digest(releases: Iterable[ReleaseTriple]) -> str:
    """The digest a receipt of version 2 or 3 signs: SHA-256 of the released numbers.

    Parameters
    ----------
    releases : iterable of (value_id, level, vector) or (value_id, level, counts, keys)
        In receipt order; ``keys`` (histograms, receipt version 3) as many as the counts.

    Returns
    -------
    str
        Hex SHA-256 over the binary layout in the module docstring (-0 kept as -0).

    Notes
    -----
    Anyone can compute it from guessed numbers, so a receipt that carried it in clear text
    showed small integer releases to whoever saw the receipt; versions 4 and 5 carry
    :func:`commitment` instead.
    """
    return _releases_hash(releases, plus_zero=False).hex()


def commitment(opening: bytes, releases: Iterable[ReleaseTriple]) -> str:
    """The commitment a receipt of version 4 or 5 signs to the released numbers.

    Parameters
    ----------
    opening : bytes
        The purchase's 32-byte opening (:func:`derive_opening`): only the market and the buyer
        hold it.
    releases : iterable of (value_id, level, vector) or (value_id, level, counts, keys)
        In receipt order (keys for version 5).

    Returns
    -------
    str
        Hex ``HMAC-SHA256(opening, COMMITMENT_LABEL ‖ D)``, ``D`` the releases' SHA-256 (module
        docstring). Hiding: without the opening it is a pseudo-random function's output under
        an unknown key. Binding: other numbers under any opening would need an HMAC-SHA256
        collision.

    Raises
    ------
    ReceiptError
        The opening is not 32 bytes, or a histogram release lacks a key per number.
    """
    if len(opening) != OPENING_BYTES:
        raise ReceiptError(f"an opening is {OPENING_BYTES} bytes, got {len(opening)}")
    return hmac.new(opening, COMMITMENT_LABEL + commitment_digest(releases), "sha256").hexdigest()


def commitment_digest(releases: Iterable[ReleaseTriple]) -> bytes:
    """``D``, what a version 4 or 5 commitment MACs: the releases' SHA-256, -0 read as +0.

    Parameters
    ----------
    releases : iterable of (value_id, level, vector) or (value_id, level, counts, keys)
        In receipt order.

    Returns
    -------
    bytes
        32 bytes: SHA-256 over the layout in the module docstring.
    """
    return _releases_hash(releases, plus_zero=True)


def opening_key(noise_secret: bytes) -> bytes:
    """The key openings are derived under: ``HMAC-SHA256(noise_secret, OPENING_KEY_LABEL)``.

    A key of its own, so that openings, which buyers hold and may show, are never outputs of a
    function that also gives noise, sealing keys, nonces or state authenticators.
    """
    return hmac.digest(noise_secret, OPENING_KEY_LABEL, "sha256")


def derive_opening(
    key: bytes,
    *,
    buyer_id: str,
    stream_id: str,
    purchase_id: str,
    requested_at_ms: int,
    level_after: float,
) -> bytes:
    """A purchase's opening: a pure function of the market's secret and the purchase.

    Parameters
    ----------
    key : bytes
        :func:`opening_key` of the market's noise secret.
    buyer_id, stream_id, purchase_id : str
        The purchase's identity: a resend is the same purchase, and gets the same opening.
    requested_at_ms : int
        The request's time, as the receipt signs it.
    level_after : float
        The level bought.

    Returns
    -------
    bytes
        ``HMAC-SHA256(key, enc(buyer_id, stream_id, purchase_id, requested_at_ms,
        level_after))`` with ``enc`` the identity encoding of ``docs/protocol.md`` §1.1: a
        replayed or recomputed purchase rebuilds byte-identical outcomes, and two purchases
        never share an opening (one shown cannot open another).
    """
    ident = identity_bytes(
        buyer_id, stream_id, purchase_id, int(requested_at_ms), float(level_after) + 0.0
    )
    return hmac.digest(key, ident, "sha256")


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
    requested_at_ms : int
        When the buyer made the request (Unix ms, from the purchase), not the market's clock:
        a purchase processed twice (a replay, a second worker) gets a byte-identical receipt.
    market_key_id : str
        :func:`key_id` of the signing key.
    receipt_version : int
        Format version: 4, or 5 for a histogram stream (the commitment covers the keys); 2
        and 3 are the earlier formats, still verified.
    ciphertext_digest : str
        SHA-256 of the sealed envelope's ciphertext when the releases were encrypted for the
        buyer (:mod:`market.envelope`), else "".
    commitment : str
        Versions 4 and 5: :func:`commitment` of the released numbers (hex), else "".
    release_digest : str
        Versions 2 and 3: :func:`release_digest` of the released numbers (hex), else "".
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
    requested_at_ms: int
    market_key_id: str
    receipt_version: int = RECEIPT_VERSION
    ciphertext_digest: str = ""
    commitment: str = ""
    release_digest: str = ""

    @property
    def legacy(self) -> bool:
        """A version 2 or 3 receipt: canonical JSON, a plain digest of the numbers."""
        return self.receipt_version in _LEGACY

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields of the receipt's version (``value_ids`` as a list): a
        version 4 or 5 receipt has no ``release_digest``, an earlier one no ``commitment``."""
        out = {f: getattr(self, f) for f in _FIELDS}
        out["value_ids"] = list(self.value_ids)
        del out["release_digest" if not self.legacy else "commitment"]
        return out

    def canonical_bytes(self) -> bytes:
        """What the market signs (``docs/protocol.md`` §11).

        Versions 4 and 5: ``DOMAIN ‖ i(version) ‖ s(purchase_id) ‖ s(buyer_id) ‖
        s(stream_id) ‖ s(seller_id) ‖ s(mechanism) ‖ i(count) ‖ s(value_id)… ‖
        f(level_before) ‖ f(level_after) ‖ i(price_minor) ‖ s(currency) ‖ i(requested_at_ms)
        ‖ s(market_key_id) ‖ s(commitment) ‖`` ``n`` or ``s(ciphertext_digest)``, with the
        tagged items of the signed events (§2): ``s`` ‖ u32be length ‖ UTF-8, ``i`` ‖ i64be,
        ``f`` ‖ f64be (-0 written as +0), ``n``. Versions 2 and 3: the fields as JSON, keys
        sorted, no whitespace, UTF-8, numbers as Python spells them.

        Written once per receipt (it is frozen): the market signs these bytes and its sale
        notice names their digest.
        """
        return self._canonical

    @cached_property
    def _canonical(self) -> bytes:
        """The bytes :meth:`canonical_bytes` returns, computed on first use."""
        if self.legacy:
            return json.dumps(
                self.to_dict(),
                sort_keys=True,
                separators=(",", ":"),
                ensure_ascii=False,
                allow_nan=False,
            ).encode("utf-8")
        parts = [DOMAIN, _i(self.receipt_version)]
        parts += map(
            _s, (self.purchase_id, self.buyer_id, self.stream_id, self.seller_id, self.mechanism)
        )
        parts += [_i(len(self.value_ids)), *map(_s, self.value_ids)]
        parts += [
            _f(self.level_before),
            _f(self.level_after),
            _i(self.price_minor),
            _s(self.currency),
            _i(self.requested_at_ms),
            _s(self.market_key_id),
            _s(self.commitment),
            _s(self.ciphertext_digest) if self.ciphertext_digest else b"n",
        ]
        return b"".join(parts)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Receipt:
        """A receipt from its JSON fields (a ``signature`` among them is ignored).

        Numbers are read as numbers, whatever their spelling: an integer field as a whole
        number of magnitude at most 2⁵³ − 1 (``150``, ``150.0`` and ``1.5e2`` are 150), a level
        as a finite double. Texts must be texts; an optional one (``commitment``,
        ``release_digest``, ``ciphertext_digest``) written as null is absent.

        Raises
        ------
        ReceiptError
            A field is missing, unknown, or not of its type.
        """
        if not isinstance(data, Mapping):
            raise ReceiptError(f"a receipt is a JSON object, got {type(data).__name__}")
        # an optional text written as null is absent (some writers spell absence so)
        got = {
            k: v
            for k, v in data.items()
            if k != "signature" and not (v is None and k in _OPTIONAL_TEXTS)
        }
        unknown = set(got) - set(_FIELDS)
        missing = set(_REQUIRED) - set(got)
        if unknown or missing:
            raise ReceiptError(
                "receipt is malformed: "
                + "; ".join(
                    [
                        *(f"unknown field {k!r}" for k in sorted(unknown)),
                        *(f"missing field {k!r}" for k in sorted(missing)),
                    ]
                )
            )
        for name in _TEXTS & set(got):
            if not isinstance(got[name], str):
                raise ReceiptError(f"receipt field {name!r} is not text")
        ids = got["value_ids"]
        if not isinstance(ids, list | tuple) or not all(isinstance(v, str) for v in ids):
            raise ReceiptError("receipt field 'value_ids' is not a list of texts")
        got["value_ids"] = tuple(ids)
        for name in _INTEGERS & set(got):
            got[name] = _integer(name, got[name])
        for name in _DOUBLES:
            got[name] = _double(name, got[name])
        return cls(**got)


_FIELDS = tuple(f.name for f in fields(Receipt))
_OPTIONAL_TEXTS = {"ciphertext_digest", "commitment", "release_digest"}
_REQUIRED = tuple(f for f in _FIELDS if f not in _OPTIONAL_TEXTS)
_TEXTS = {
    "purchase_id",
    "buyer_id",
    "stream_id",
    "seller_id",
    "mechanism",
    "currency",
    "market_key_id",
    "ciphertext_digest",
    "commitment",
    "release_digest",
}
_INTEGERS = {"price_minor", "requested_at_ms", "receipt_version"}
_DOUBLES = ("level_before", "level_after")


def _s(text: str) -> bytes:
    data = text.encode("utf-8")
    return b"s" + struct.pack(">I", len(data)) + data


def _i(x: int) -> bytes:
    return b"i" + struct.pack(">q", x)


def _f(x: float) -> bytes:
    return b"f" + struct.pack(">d", float(x) + 0.0)  # -0.0 + 0.0 is +0.0


def _integer(name: str, v: Any) -> int:
    """An integer field read as the number it is, however JSON spelled it."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ReceiptError(f"receipt field {name!r} is not a number")
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        raise ReceiptError(f"receipt field {name!r} is not a whole number")
    if abs(v) > _MAX_EXACT:
        raise ReceiptError(f"receipt field {name!r} exceeds 2**53 - 1 in magnitude")
    return int(v)


def _double(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ReceiptError(f"receipt field {name!r} is not a finite number")
    return float(v)


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
    opening: bytes | None = None,
) -> Receipt:
    """Check a receipt's signature and that ``releases`` are exactly the numbers it covers.

    Parameters
    ----------
    receipt : Receipt or mapping
        The receipt's fields (JSON numbers in any spelling).
    signature : str
        Its base64 signature.
    releases : sequence of (value_id, level, vector)
        What the buyer received, in order.
    public_key : Ed25519PublicKey
        The market's key (from the catalog).
    envelope : dict, optional
        The sealed envelope, for encrypted deliveries: the receipt binds its ciphertext.
    opening : bytes, optional
        The purchase's opening (versions 4 and 5 need it: it came with the releases).

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
    _check_numbers(rec, releases, opening)
    _check_envelope(rec, envelope)
    return rec


def _check_envelope(rec: Receipt, envelope: dict[str, Any] | None) -> None:
    if rec.ciphertext_digest or envelope is not None:
        from .envelope import EnvelopeError, ciphertext_digest  # noqa: PLC0415

        try:
            got = "" if envelope is None else ciphertext_digest(envelope)
        except EnvelopeError:
            got = "<malformed>"
        if got != rec.ciphertext_digest:
            raise ReceiptError("the sealed envelope is not the one the receipt was issued for")


def _check_numbers(rec: Receipt, releases: Sequence[ReleaseTriple], opening: bytes | None) -> None:
    """The released numbers against the receipt's digest (2, 3) or commitment (4, 5)."""
    if rec.legacy:
        if release_digest(releases) != rec.release_digest:
            raise ReceiptError("released numbers differ from the ones the receipt was issued for")
        return
    if opening is None:
        raise ReceiptError(
            "no opening given: a version 4 receipt's commitment is checked with the opening "
            "that came with the releases (`opening` of the opened outcome)"
        )
    if len(opening) != OPENING_BYTES or commitment(opening, releases) != rec.commitment:
        raise ReceiptError(
            "released numbers (or the opening) differ from the ones the receipt was issued for"
        )


def _check_version(rec: Receipt, releases: Sequence[ReleaseTriple]) -> None:
    if rec.receipt_version not in _VERSIONS:
        raise ReceiptError(f"unsupported receipt version {rec.receipt_version}")
    keyed = rec.receipt_version in _KEYED
    if any((len(r) == 4) != keyed for r in releases):
        raise ReceiptError(
            f"a version {rec.receipt_version} receipt covers "
            + ("histogram releases, each with its keys" if keyed else "releases without keys")
        )
    bound, other = (
        ("release_digest", "commitment") if rec.legacy else ("commitment", "release_digest")
    )
    if not _HEX64.fullmatch(getattr(rec, bound)) or getattr(rec, other):
        raise ReceiptError(
            f"a version {rec.receipt_version} receipt carries a {bound} (64 lower-case hex "
            f"digits) and no {other}"
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
    "purchase_id",
    "buyer_id",
    "stream_id",
    "level_before",
    "level_after",
    "price_minor",
    "currency",
)


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


def _opening_of(outcome: Mapping[str, Any]) -> bytes | None:
    """The opening beside the releases (hex), or None if there is none."""
    text = outcome.get("opening")
    if text is None:
        return None
    if not isinstance(text, str) or not _HEX64.fullmatch(text):
        raise ReceiptError("the outcome's 'opening' is not 64 lower-case hex digits")
    return bytes.fromhex(text)


def verify_outcome(outcome: Any, public_key: Ed25519PublicKey) -> Receipt:
    """Verify a whole ``purchase_fulfilled`` event (as JSON data) against the market's key.

    Checks the receipt's signature, the released numbers (with the ``opening`` beside them,
    for versions 4 and 5) and the envelope it binds, **and** that every field of the event that
    repeats a receipt field agrees with the signed one: only signed data can then be shown as
    verified. Numbers may be spelled as any JSON writer spells them. Needs no service
    dependencies.

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
            receipt,
            receipt["signature"],
            releases,
            public_key,
            envelope=outcome.get("sealed"),
            opening=_opening_of(outcome),
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
