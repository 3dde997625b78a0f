"""Turning a refused event into a ``Rejection`` its sender and the operators can act on.

A rejection names the reason (machine-readable) and what to do, the source topic, partition and
offset, the ids that could be read from the payload, and the payload itself — whole when it is
small, else a bounded prefix with the full size and SHA-256, so no rejection can grow past the
broker's message size however large or oddly encoded the input was. It goes to the rejections
topic (operators) and to the inbox of the account that *proved* it sent the event; never to an
inbox named only by the payload, which anyone could write.

A rejection never repeats a seller's numbers: the payload of an event on the values topic is not
quoted (its size and SHA-256 still identify it), and no message quotes a number the event
carried (values, prices, levels, times): it names the field, the bound or the index instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

from ..wire.events import Rejection
from .context import Context
from .outputs import Kind, Outcome, Output, Reject, dump

__all__ = ["Source", "best_effort_ids", "rejection"]

Source = tuple[str, int | None, int | None, bytes]
"""Where an event came from: (topic, partition, offset, raw bytes)."""

_ID_FIELDS = {
    "purchase_id": "request_id",
    "quote_id": "request_id",
    "reservation_id": "request_id",
    "value_id": "request_id",
    "buyer_id": "account_id",
    "seller_id": "account_id",
    "account_id": "account_id",
    "stream_id": "stream_id",
}
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PEEK_BYTES = 65_536  # ids are read from small payloads only: parsing a huge one is the attack
MESSAGE_CHARS = 1_000
"""Longest ``message`` a rejection carries (messages may quote the input)."""
DETAILS_BYTES = 4_096
"""Largest ``details`` a rejection carries, as JSON; larger details are replaced by a note."""


def best_effort_ids(raw: bytes) -> dict[str, str]:
    """Ids that can be read from a (possibly invalid) event, to describe its rejection."""
    if len(raw) > _PEEK_BYTES:
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    out: dict[str, str] = {}
    for name, slot in _ID_FIELDS.items():
        v = data.get(name)
        if isinstance(v, str) and _ID.fullmatch(v):
            out.setdefault(slot, v)
    return out


def _payload(raw: bytes, limit: int) -> tuple[str, str, bool]:
    """(payload text, encoding, truncated) for at most ``limit`` bytes of ``raw``: UTF-8 text if
    it is text (a character cut by the limit is dropped), else base64."""
    kept = raw[:limit]
    for cut in range(4 if len(raw) > limit else 1):  # a cut character has at most 3 bytes
        try:
            return kept[: len(kept) - cut].decode("utf-8"), "utf-8", len(raw) > limit
        except UnicodeDecodeError:
            continue
    return base64.b64encode(kept).decode("ascii"), "base64", len(raw) > limit


def _bounded_message(message: str) -> str:
    if len(message) <= MESSAGE_CHARS:
        return message
    return message[: MESSAGE_CHARS - 30] + f"… ({len(message)} characters in all)"


def _bounded_details(details: dict[str, Any]) -> dict[str, Any]:
    """``details`` when small; else a note saying they were dropped (the payload prefix, size
    and SHA-256 still identify the event)."""
    size = len(json.dumps(details, default=str))
    if size <= DETAILS_BYTES:
        return details
    return {"omitted": f"{size} bytes of details, over the {DETAILS_BYTES}-byte bound"}


def rejection(
    ctx: Context, kind: Kind, src: Source, rej: Reject, *, request_id: str | None = None
) -> Outcome:
    """The outcome of refusing the event ``src`` for the reason ``rej``."""
    topic, partition, offset, raw = src
    ids = best_effort_ids(raw)
    if request_id is not None:
        ids["request_id"] = request_id
    if rej.stream is not None:
        ids["stream_id"] = rej.stream
    quoted = 0 if topic == ctx.topics.values else ctx.limits.rejection_payload_bytes
    payload, encoding, truncated = _payload(raw, quoted)
    claimed = rej.claimed or ids.get("account_id")
    event = Rejection(
        reason=rej.reason,
        message=_bounded_message(rej.message),
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        request_id=ids.get("request_id"),
        sender_id=rej.sender,
        claimed_id=claimed if claimed != rej.sender else None,
        stream_id=ids.get("stream_id"),
        payload=payload,
        payload_encoding=encoding,
        payload_bytes=len(raw),
        payload_sha256=hashlib.sha256(raw).hexdigest(),
        payload_truncated=truncated,
        details=_bounded_details(rej.details),
    )
    body = dump(event)
    key = (ids.get("stream_id") or "").encode() or None
    outputs = [Output(ctx.topics.rejections, key, body)]
    if rej.sender:
        outputs.append(
            Output(ctx.topics.inbox(rej.sender), (ids.get("request_id") or "").encode(), body)
        )
    return Outcome(
        kind=kind,
        status="rejected",
        outputs=outputs,
        reason=rej.reason,
        stream_id=ids.get("stream_id"),
    )
