"""Turning a refused event into a ``Rejection`` its sender and the operators can act on.

A rejection keeps the original bytes (UTF-8 text, or base64 when they are not text), names the
source topic, partition and offset, and carries the ids that could be read from the payload. It
goes to the dead-letter topic, and to the buyer's topic when the payload names a buyer.
"""

from __future__ import annotations

import base64
import json
import re

from ..wire.events import Rejection
from .context import Context
from .outputs import Kind, Outcome, Output, Reject, dump

__all__ = ["Source", "best_effort_ids", "rejection"]

Source = tuple[str, int | None, int | None, bytes]
"""Where an event came from: (topic, partition, offset, raw bytes)."""

_ID_FIELDS = {
    "purchase_id": "request_id",
    "quote_id": "request_id",
    "value_id": "request_id",
    "buyer_id": "buyer_id",
    "stream_id": "stream_id",
}
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def best_effort_ids(raw: bytes) -> dict[str, str]:
    """Ids that can be read from a (possibly invalid) event, to route its rejection."""
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


def rejection(ctx: Context, kind: Kind, src: Source, rej: Reject) -> Outcome:
    """The outcome of refusing the event ``src`` for the reason ``rej``."""
    topic, partition, offset, raw = src
    ids = best_effort_ids(raw)
    try:
        payload, encoding = raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(raw).decode("ascii"), "base64"
    event = Rejection(
        reason=rej.reason,
        message=rej.message,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        request_id=ids.get("request_id"),
        buyer_id=ids.get("buyer_id"),
        stream_id=ids.get("stream_id"),
        payload=payload,
        payload_encoding=encoding,
        details=rej.details,
    )
    body = dump(event)
    key = (ids.get("stream_id") or "").encode() or None
    outputs = [Output(ctx.topics.rejections, key, body)]
    buyer_topic = None
    if ids.get("buyer_id"):
        buyer_topic = ctx.topics.buyer(ids["buyer_id"])
        outputs.append(Output(buyer_topic, (ids.get("request_id") or "").encode(), body))
    return Outcome(
        kind=kind,
        status="rejected",
        outputs=outputs,
        reason=rej.reason,
        stream_id=ids.get("stream_id"),
        buyer_topic=buyer_topic,
    )
