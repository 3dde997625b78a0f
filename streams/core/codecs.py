"""Bytes of every stored record: the one place that says how state is written to a changelog.

Stream records, registrations and holders bases are their models' JSON; a stream's record leaves
out how the stream was registered (:func:`encode_stream`: it is written once, apart), which is
what keeps the record rewritten after every event small. A value's chain state uses the compact
binary codec of :mod:`market.codec`. The records kept for the dedup horizon, one per purchase and
one per value that left its window, are many and long-lived, so they are packed binary: a
purchase's decision in at most :data:`~.state.PURCHASE_RECORD_BYTES`, an eviction mark in at
most :data:`~.state.VALUE_MARK_BYTES` (``tests/streams/core/test_core_records.py`` checks both).
The worker seals these bytes on the changelogs (:mod:`streams.worker.tables`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Literal

from market.codec import (
    decode_chain_state,
    decode_histogram_value,
    encode_chain_state,
    encode_histogram_value,
)
from market.histogram_chain import HistogramValue

from ..wire.events import AccountState
from .state import (
    EvictedValue,
    HoldersBase,
    PurchaseRecord,
    Registered,
    StreamRecord,
    ValueState,
)

__all__ = [
    "CODECS",
    "decode_purchase",
    "decode_stream",
    "decode_value",
    "encode_purchase",
    "encode_stream",
    "encode_value",
]

_EVICTED = b"EVIC"  # a mark whose digest is not a SHA-256: EVIC<seq>:<digest>:<published>
_MARK = b"EVM3"
_MARK_BODY = struct.Struct("<q32sq")  # seq, SHA-256, published_at_ms
_HISTOGRAM = b"EMHV"
_PADDED = b"EMPH"  # a histogram value padded: EMPH ‖ u32 length ‖ EMHV… ‖ zeros to a power of two
HISTOGRAM_MIN = 256
"""The least bytes a histogram value's record takes (then the next power of two): its size
would otherwise say how many keys the seller's value had, on the changelog and on disk."""
_PURCHASE = b"EMP2"
# status, fingerprint, requested, price, level before, after, first seq, count, decided, digest
_PURCHASE_BODY = struct.Struct("<c32sqqddqIq32s")
_NO_PAYLOAD = 0xFFFFFFFF
_STATUS = {"fulfilled": b"F", "rejected": b"R"}
_STATUS_OF: dict[bytes, Literal["fulfilled", "rejected"]] = {b"F": "fulfilled", b"R": "rejected"}
MAX_REASON = 48
"""Characters of a refusal's reason code a record keeps (the codes are shorter)."""


def _sha(hexdigest: str) -> bytes | None:
    """A SHA-256 in hex as its 32 bytes (``None`` if it is not one)."""
    if len(hexdigest) != 64:
        return None
    try:
        return bytes.fromhex(hexdigest)
    except ValueError:
        return None


def encode_value(obj: ValueState) -> bytes:
    """A value's chain state or histogram counts (binary codecs) or its eviction mark
    (``EVM3`` + seq, digest and publication time packed: 52 bytes)."""
    if isinstance(obj, EvictedValue):
        raw = _sha(obj.digest)
        if raw is None:  # not a SHA-256 in hex: kept as text, whatever it is
            return _EVICTED + f"{obj.seq}:{obj.digest}:{obj.published_at_ms}".encode()
        return _MARK + _MARK_BODY.pack(obj.seq, raw, obj.published_at_ms)
    if isinstance(obj, HistogramValue):
        body = encode_histogram_value(obj)
        size = max(HISTOGRAM_MIN, 1 << (len(body) + 8 - 1).bit_length())
        return (_PADDED + len(body).to_bytes(4, "big") + body).ljust(size, b"\0")
    return encode_chain_state(obj)


def decode_value(data: bytes) -> ValueState:
    """Inverse of :func:`encode_value`."""
    if data.startswith(_MARK):
        seq, raw, published = _MARK_BODY.unpack(data[len(_MARK) :])
        return EvictedValue(seq, raw.hex(), published)
    if data.startswith(_EVICTED):
        seq, rest = data[len(_EVICTED) :].decode().split(":", 1)
        digest, published = rest.rsplit(":", 1)
        return EvictedValue(int(seq), digest, int(published))
    if data.startswith(_PADDED):
        size = int.from_bytes(data[4:8], "big")
        return decode_histogram_value(data[8 : 8 + size])
    if data.startswith(_HISTOGRAM):
        return decode_histogram_value(data)
    return decode_chain_state(data)


def _short(text: str, limit: int) -> bytes:
    raw = text.encode()[:limit]
    return bytes([len(raw)]) + raw


def encode_purchase(rec: PurchaseRecord) -> bytes:
    """A purchase's decision packed (``EMP2``): fixed fields, then the stream id and reason
    code (length-prefixed), then the outcome's bytes while it still carries them."""
    fp = _sha(rec.fingerprint)
    if fp is None:
        raise ValueError(f"a purchase fingerprint is a SHA-256 in hex, not {rec.fingerprint!r}")
    body = _PURCHASE_BODY.pack(
        _STATUS[rec.status],
        fp,
        rec.requested_at_ms,
        rec.price_minor,
        rec.level_before,
        rec.level_after,
        rec.first_seq,
        rec.count,
        rec.decided_at_ms,
        _sha(rec.digest) or bytes(32),
    )
    payload = b"" if rec.payload is None else rec.payload.encode()
    size = _NO_PAYLOAD if rec.payload is None else len(payload)
    return b"".join(
        (
            _PURCHASE,
            body,
            _short(rec.stream_id, 255),
            _short(rec.reason, MAX_REASON),
            struct.pack("<I", size),
            payload,
        )
    )


def decode_purchase(data: bytes) -> PurchaseRecord:
    """Inverse of :func:`encode_purchase`."""
    if not data.startswith(_PURCHASE):
        raise ValueError("not a purchase record")
    at = len(_PURCHASE)
    status, fp, req, price, before, after, first, count, decided, digest = (
        _PURCHASE_BODY.unpack_from(data, at)
    )
    at += _PURCHASE_BODY.size
    texts = []
    for _ in range(2):
        n = data[at]
        texts.append(data[at + 1 : at + 1 + n].decode())
        at += 1 + n
    (size,) = struct.unpack_from("<I", data, at)
    payload = None if size == _NO_PAYLOAD else data[at + 4 : at + 4 + size].decode()
    return PurchaseRecord(
        fingerprint=fp.hex(),
        status=_STATUS_OF[status],
        stream_id=texts[0],
        requested_at_ms=req,
        price_minor=price,
        level_before=before,
        level_after=after,
        first_seq=first,
        count=count,
        decided_at_ms=decided,
        digest="" if digest == bytes(32) else digest.hex(),
        reason=texts[1],
        payload=payload,
    )


def _model_json(model: Any) -> bytes:
    return bytes(model.model_dump_json().encode())


_FIXED: set[str] = {"registered"}  # what a stream's record never writes (StreamState's own)


def encode_stream(record: StreamRecord) -> bytes:
    """A stream's record as JSON, without how the stream was registered.

    A :class:`~.state.StreamState` (what the core holds in memory) carries its
    :class:`~.state.Registered`; this is the one place that leaves it out of the record
    rewritten after every event (it is written once, to ``registered``).
    """
    return record.model_dump_json(exclude=_FIXED).encode()


def decode_stream(data: bytes) -> StreamRecord:
    """Inverse of :func:`encode_stream`."""
    return StreamRecord.model_validate_json(data)


CODECS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    "registered": (_model_json, Registered.model_validate_json),
    "streams": (encode_stream, decode_stream),
    "releases": (encode_value, decode_value),
    "purchases": (encode_purchase, decode_purchase),
    "accounts": (_model_json, AccountState.model_validate_json),
    "holders": (_model_json, HoldersBase.model_validate_json),
}
"""Store name → (encode, decode) of its records."""
