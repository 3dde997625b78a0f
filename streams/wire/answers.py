"""Answers the market signs: the header on every message it writes to an inbox or to the
refusals record, and the refusal record itself (docs/protocol.md §12).

An inbox is a topic anyone on a broker without ACLs may write to, and the refusals record is
public: a client believes a message there only if it carries the market's Ed25519 signature
(the key that signs receipts) over the topic it is on, the SHA-256 of the event it answers and
the SHA-256 of its exact value bytes (:func:`streams.wire.signing.answer_bytes`). So a stranger
cannot write an answer, a genuine answer cannot be copied into another inbox, and an old answer
to a reused request id does not pass for the answer to a new request.

The signature travels in one record header, ``emarket-answer``::

    u8(1) ‖ signature (64 bytes) ‖ SHA-256 of the event answered (32 bytes; absent for a
    message that answers no single event: the subscription deliveries of a batch)

A **refusal** is also written, keyed by the hex SHA-256 of the refused event's bytes, to
``<p>.refusals``: a code and a fixed text for that code, nothing of the event, so that a sender
the market could not prove (no account yet, a bad signature) learns the reason at once instead
of waiting for an answer that never comes to its inbox.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .events import Refusal
from .signing import answer_bytes

__all__ = [
    "FORMAT",
    "HEADER",
    "REFUSAL_BYTES",
    "REFUSAL_TEXTS",
    "AnswerError",
    "answer_header",
    "describe",
    "refusal_text",
    "refusal_value",
    "vectors",
    "verify_answer",
]

HEADER = "emarket-answer"
"""The record header that carries the market's signature of an answer."""
FORMAT = 1
"""The first byte of the header's value: the format of the signed bytes."""
_CODE = re.compile(r"[a-z0-9_]{1,48}")

REFUSAL_TEXTS: dict[str, str] = {
    "unknown_account": "no account is open for the id this event names: open it first "
    "(epsilon-market account open) and send the event again",
    "bad_signature": "the signature does not verify with the account's key: sign with the key "
    "file of the account it names (the account may belong to another key)",
    "key_rotated": "signed with a past key of the account: sign again with its current key",
    "old_signature_format": "signed with protocol v1, which names no market key: update the "
    "client and sign again",
    "account_exists": "the account id is already open with another key: choose another id",
    "invalid_event": "not a valid event of its topic (see docs/schemas)",
    "too_large": "the event is larger than the market accepts: split it",
    "wrong_partition": "sent to another partition than its id's: let the client choose it",
    "idempotency_key_reused": "this request id was used before with other parameters: send "
    "a new id",
    "rate_limited": "too many requests: wait and send again",
    "encryption_required": "the account has no sealing key: open one with keygen's keys",
    "values_not_sealed": "values must be sealed to the market's key (the client does)",
    "bad_seal": "the sealed numbers do not open for this market, stream and batch",
    "unsafe_integer": "an integer beyond 2^53 - 1 in magnitude (docs/protocol.md §2.2)",
    "duplicate_price_level": "two keys of the price table name the same level",
    "internal_error": "the market could not process the event; the operators were alerted",
    "invitation_required": "this market opens accounts by invitation only: ask its operators "
    "for one (epsilon-market invite) and open with it (account open --invitation)",
    "bad_invitation": "the invitation is not this market's for this account id and key: ask "
    "the operators for one of your own",
    "invitation_expired": "the invitation has expired: ask the operators for a new one",
    "refusals_dropped": "events on this partition whose signature proved no account were "
    "counted, not answered one by one: the same bytes were answered already, or more came in "
    "the interval than the market answers (docs/protocol.md §9)",
}
"""The fixed text a refusal carries for a code (any other code gets a generic one): texts
written by the market, never by the event's sender, since the record is public."""
_GENERIC = "refused; a sender whose signature was proved finds the rejection in its inbox"
REFUSAL_BYTES = 1024
"""The most a refusal record takes: key (64 bytes), value (with the topic it names, at most
249 characters as every Kafka topic name, its partition and offset), and header (14 + 97
bytes), which a test checks for every code's text."""


class AnswerError(ValueError):
    """A message that is not an answer of the market for this topic (saying why)."""


def refusal_text(code: str) -> str:
    """The text a refusal with ``code`` carries."""
    return REFUSAL_TEXTS.get(code, _GENERIC)


def refusal_value(
    code: str, source_topic: str, source_partition: int | None, source_offset: int | None
) -> bytes:
    """The value bytes of a refusal record for ``code`` (a code that is not one is named
    ``refused``) of the event read from ``source_topic`` at ``source_partition`` and
    ``source_offset``: which record was refused, so that a copy of a sender's bytes written by
    someone else (elsewhere, or later, and refused) is not taken for the refusal of what the
    sender wrote."""
    reason = code if _CODE.fullmatch(code) else "refused"
    return (
        Refusal(
            reason=reason,
            message=refusal_text(reason),
            source_topic=source_topic,
            source_partition=source_partition,
            source_offset=source_offset,
        )
        .model_dump_json()
        .encode()
    )


def answer_header(
    key: Ed25519PrivateKey, market: str, topic: str, request_sha256: str | None, value: bytes
) -> tuple[str, bytes]:
    """The ``emarket-answer`` header for ``value`` written to ``topic`` in answer to the event
    whose hex SHA-256 is ``request_sha256`` (None: no single event)."""
    sig = key.sign(answer_bytes(market, topic, request_sha256, value))
    tail = b"" if request_sha256 is None else bytes.fromhex(request_sha256)
    return HEADER, bytes([FORMAT]) + sig + tail


def verify_answer(
    public_key: Ed25519PublicKey,
    market: str,
    topic: str,
    value: bytes,
    headers: Sequence[tuple[str, bytes]] | None,
) -> str | None:
    """The hex SHA-256 of the event a message answers (None for a delivery), if it carries
    the market's signature for ``topic`` and these exact bytes.

    Raises
    ------
    AnswerError
        No header, several, a malformed one, or a signature that does not verify: written by
        someone other than the market, or moved from another topic.
    """
    found = [v for k, v in headers or () if k == HEADER]
    if not found:
        raise AnswerError("not signed by the market (no emarket-answer header)")
    if len(found) > 1:
        raise AnswerError("more than one emarket-answer header")
    head = found[0]
    if not isinstance(head, bytes | bytearray) or len(head) not in (65, 97) or head[0] != FORMAT:
        # a header without a value (Kafka allows null) is malformed, not a crash of the reader
        raise AnswerError("a malformed emarket-answer header")
    head = bytes(head)
    request = head[65:].hex() or None
    try:
        public_key.verify(head[1:65], answer_bytes(market, topic, request, value))
    except InvalidSignature:
        raise AnswerError("the market's signature does not verify for this topic") from None
    return request


def vectors() -> dict[str, Any]:
    """The test vectors of docs/protocol.md §12, as the code makes
    them (a test compares them with the document's)."""
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    market = "t"
    purchase = b'{"type":"purchase","purchase_id":"p1"}'
    answer = b'{"type":"rejection","reason":"price_too_high"}'
    digest = hashlib.sha256(purchase).hexdigest()
    cases: list[tuple[str, str | None, bytes]] = [
        ("t.inbox.alice", digest, answer),
        ("t.inbox.alice", None, b'{"type":"value_released"}'),
        ("t.refusals", digest, refusal_value("unknown_account", "t.purchases", 0, 0)),
    ]
    out: list[dict[str, Any]] = []
    for topic, request, value in cases:
        _, head = answer_header(key, market, topic, request, value)
        out.append(
            {
                "topic": topic,
                "request_sha256": request,
                "value": value.decode(),
                "signed_bytes": answer_bytes(market, topic, request, value).hex(),
                "header": head.hex(),
            }
        )
    pub = key.public_key().public_bytes_raw()
    return {
        "market_private_key": bytes(range(32)).hex(),
        "market_public_key": base64.b64encode(pub).decode(),
        "market": market,
        "request": purchase.decode(),
        "messages": out,
    }


def describe(value: bytes) -> str:
    """A short description of a message's value for a warning (its type, if it has one)."""
    try:
        kind = json.loads(value).get("type")
    except (ValueError, AttributeError, UnicodeDecodeError):
        kind = None
    return f"a {kind!r} message" if isinstance(kind, str) and _CODE.fullmatch(kind) else "a message"
