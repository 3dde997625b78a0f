"""Bytes of every stored record: the one place that says how state is written to a changelog.

Stream and purchase records are their models' JSON; a value's chain state uses the compact
binary codec of :mod:`market.codec`, and an eviction marker a short tagged text. The worker
registers these functions as Faust codecs (:mod:`streams.worker.tables`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from market.codec import (
    decode_chain_state,
    decode_histogram_value,
    encode_chain_state,
    encode_histogram_value,
)
from market.histogram_chain import HistogramValue

from ..wire.events import AccountState
from .state import EvictedValue, PurchaseRecord, StreamState, ValueState

__all__ = ["CODECS", "decode_value", "encode_value"]

_EVICTED = b"EVIC"
_HISTOGRAM = b"EMHV"


def encode_value(obj: ValueState) -> bytes:
    """A value's chain state or histogram counts (binary codecs) or its eviction marker
    (``EVIC`` + text)."""
    if isinstance(obj, EvictedValue):
        mark = f"{obj.seq}:{obj.digest}:{obj.published_at_ms}:{obj.numbering}"
        return _EVICTED + mark.encode()
    if isinstance(obj, HistogramValue):
        return encode_histogram_value(obj)
    return encode_chain_state(obj)


def decode_value(data: bytes) -> ValueState:
    """Inverse of :func:`encode_value`."""
    if data.startswith(_EVICTED):
        seq, digest, *rest = data[len(_EVICTED) :].decode().split(":")
        published, numbering = (int(x) for x in [*rest, "0", "0"][:2])
        return EvictedValue(int(seq), digest, published, numbering)
    if data.startswith(_HISTOGRAM):
        return decode_histogram_value(data)
    return decode_chain_state(data)


def _model_json(model: Any) -> bytes:
    return bytes(model.model_dump_json().encode())


CODECS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    "streams": (_model_json, StreamState.model_validate_json),
    "releases": (encode_value, decode_value),
    "purchases": (_model_json, PurchaseRecord.model_validate_json),
    "accounts": (_model_json, AccountState.model_validate_json),
}
"""Store name → (encode, decode) of its records."""
