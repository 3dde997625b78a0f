"""What one input event produces: messages to send, and an outcome the worker counts.

The core never sends anything itself. Each handler returns an :class:`Outcome` whose
:class:`Output` messages the worker sends only after the batch's state is durable, and whose
other fields feed the metrics (:meth:`streams.worker.metrics.Metrics.record`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

__all__ = ["Kind", "Outcome", "Output", "Reject", "Status", "StreamFigures", "dump"]

Kind = Literal["registration", "value", "purchase", "quote", "unknown"]
Status = Literal["accepted", "fulfilled", "rejected", "duplicate", "answered"]


@dataclass(frozen=True)
class Output:
    """One message to produce: a topic, a key and the exact bytes."""

    topic: str
    key: bytes | None
    value: bytes


@dataclass(frozen=True)
class StreamFigures:
    """A stream's ledger after an event: what the privacy and revenue gauges show."""

    stream_id: str
    mechanism: str
    level_unit: str
    spent: float
    cap: float
    currency: str


@dataclass
class Outcome:
    """What happened to one input event."""

    kind: Kind
    status: Status
    outputs: list[Output] = field(default_factory=list)
    reason: str | None = None
    stream_id: str | None = None
    mechanism: str | None = None
    releases: int = 0
    new_noise: int = 0
    price_minor: int = 0
    buyer_topic: str | None = None
    figures: StreamFigures | None = None


class Reject(Exception):
    """Raised by a handler to refuse an event; the router turns it into a rejection.

    ``reason`` is the machine-readable code, ``message`` says what to do, ``details`` carries
    structured extras (e.g. the quoted price).
    """

    def __init__(self, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.reason, self.message, self.details = reason, message, details


def dump(model: BaseModel) -> bytes:
    """The wire bytes of an event: its model's JSON, the one encoding of every format."""
    return model.model_dump_json().encode("utf-8")
