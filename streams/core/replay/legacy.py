"""Records an earlier version wrote (purchases' keys and format, streams' format), and when to
drop them.

Earlier versions kept a purchase's outcome under ``buyer/purchase_id``; one id used on two
streams was then two records under one key, and the partition a worker restored last decided
which it kept. Outcomes are now kept under ``buyer/stream/purchase_id``
(:func:`~.records.purchase_key`). An outcome under an old key is still recalled for its own
stream, and it still refuses the id on every other stream (that stream's record may be the one
lost): never fulfilled under it. Such a refusal is kept like any other.

Earlier versions also kept a purchase's whole outcome as JSON (:func:`purchase_from_json`);
such a record is read as a decision that still carries its outcome, which a resend gets
verbatim, as before. It is never rewritten, and goes with the horizon like any other.

Earlier versions also wrote a stream's registration and catalog entry inline in its record,
rewritten after every event (:func:`stream_from_json`). Such a record is read whole; the first
event that changes its stream writes the registration to its own store, then the record without
it (:mod:`streams.core.stream_store`).

When to delete the purchases' part of this module: old keys are records like any other,
forgotten with the dedup horizon. One horizon (``EMARKET_DEDUP_HORIZON``, 7 days by default)
after every worker runs a version that writes the new keys, no old key is left; a store
restored from a changelog cannot bring one back once the changelog has compacted its
tombstones. Streams are never deleted, and a stream nothing happens to keeps its old record:
:func:`stream_from_json` stays until a release rewrites every stream's record.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from pydantic import ConfigDict

from ...wire.events import PurchaseRequest
from ..outputs import Reject
from ..state import PurchaseRecord, Registered, StreamRecord, StreamState, record_key

if TYPE_CHECKING:
    from .records import Records

__all__ = ["INLINE_REGISTRATION", "check_id", "purchase_from_json", "recall", "stream_from_json"]

INLINE_REGISTRATION = b'{"registration":'
"""How every record an earlier version wrote for a stream begins (its model's first field, and
pydantic writes fields in order); a record of this version never holds that key."""


class _Inline(StreamRecord, Registered):
    """A stream's record as an earlier version wrote it: the record's fields and, inline, those
    of how it was registered."""

    model_config = ConfigDict(extra="forbid", frozen=False)


def stream_from_json(data: bytes) -> StreamState:
    """An earlier version's stream record (its registration inline), as the stream it is."""
    old = _Inline.model_validate_json(data)
    fixed = {name: getattr(old, name) for name in Registered.model_fields}
    record = {name: getattr(old, name) for name in StreamRecord.model_fields}
    return StreamState.model_construct(registered=Registered.model_construct(**fixed), **record)


def purchase_from_json(data: bytes) -> PurchaseRecord:
    """An earlier version's record (its model's JSON, the outcome's bytes in ``payload``): the
    decision read from the outcome, the outcome kept so a resend still gets its bytes."""
    old = json.loads(data)
    payload: str = old["payload"]
    rec = PurchaseRecord(
        fingerprint=old["fingerprint"], status=old["status"], stream_id=old["stream_id"],
        requested_at_ms=old.get("requested_at_ms", 0), price_minor=old.get("price_minor", 0),
        payload=payload,
    )  # fmt: skip
    outcome = json.loads(payload)
    if rec.status == "fulfilled":
        rec.level_before = float(outcome.get("level_before", 0.0))
        rec.level_after = float(outcome.get("level_after", 0.0))
        rec.digest = hashlib.sha256(payload.encode()).hexdigest()
        seqs = [r["seq"] for r in outcome.get("releases", [])]
        if seqs:
            rec.first_seq, rec.count = min(seqs), len(seqs)
    else:
        rec.reason = str(outcome.get("reason", ""))[:48]
    return rec


def recall(records: Records, req: PurchaseRequest) -> PurchaseRecord | None:
    """The outcome kept under the purchase's old key, if it is this stream's."""
    old = records.purchase(record_key(req.buyer_id, req.purchase_id))
    return old if old is not None and old.stream_id == req.stream_id else None


def check_id(records: Records, req: PurchaseRequest) -> None:
    """Refuse an id an old key holds for another stream (``idempotency_key_reused``)."""
    old = records.purchase(record_key(req.buyer_id, req.purchase_id))
    if old is not None and old.stream_id != req.stream_id:
        raise Reject(
            "idempotency_key_reused",
            f"purchase id {req.purchase_id!r} was already used by buyer {req.buyer_id!r} on "
            f"stream {old.stream_id!r}; use a new purchase id",
        )
