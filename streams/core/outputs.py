"""What one input event produces: messages to send, and an outcome the worker counts.

The core never sends anything itself. Each handler returns an :class:`Outcome` whose
:class:`Output` messages the worker sends only after the batch's state is durable, and whose
other fields feed the metrics (:meth:`streams.worker.metrics.Metrics.record`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from ..wire.topics import TopicSpec

__all__ = [
    "Defer",
    "Kind",
    "Misplaced",
    "Outcome",
    "Output",
    "Reject",
    "Status",
    "StreamFigures",
    "dump",
]

Kind = Literal["account", "registration", "value", "purchase", "quote", "reserve", "unknown"]
Status = Literal[
    "accepted", "fulfilled", "rejected", "duplicate", "answered", "deferred", "forwarded"
]


@dataclass(frozen=True)
class Output:
    """One message to produce: a topic, a key and the exact bytes (and a partition, for an
    event forwarded to the input partition it belongs on; else the key's), with the record
    headers it carries (the market's signature on an answer, :mod:`streams.core.answering`).

    ``answer`` is False for a message to someone other than the event's sender (a seller's
    sale notice): it answers no request of its reader's, so it is signed for its inbox alone.
    """

    topic: str
    key: bytes | None
    value: bytes
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    answer: bool = True


@dataclass(frozen=True)
class StreamFigures:
    """A stream's ledger after an event: what the privacy and revenue gauges show."""

    stream_id: str
    mechanism: str
    level_unit: str
    spent: float
    cap: float
    currency: str
    #: on a ``window`` stream: the window of its newest value (spent, cap, headroom: the
    #: ledger's exact figures as decimals), else None
    window_spent: float | None = None
    window_cap: float | None = None
    window_headroom: float | None = None
    #: reservations holding room (or a price) on the stream now (:mod:`.holds`)
    reservations_held: int = 0


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
    figures: StreamFigures | None = None
    #: inbox topics to create before the outputs are sent (only when an account is opened)
    create_topics: list[TopicSpec] = field(default_factory=list)
    #: subscription deliveries withheld by privacy windows, and of those for buyers' shares
    withheld: int = 0
    quota_withheld: int = 0
    #: per value of a batch: (status, reason)
    items: list[tuple[str, str | None]] = field(default_factory=list)
    #: the account a deferred event waits for (status "deferred": nothing was changed)
    waiting_for: str | None = None
    #: a refusal not written (:data:`~.refusal_budget.DROP_CAUSES`): counted, not answered
    dropped: str | None = None


class Reject(Exception):
    """Raised by a handler to refuse an event; the router turns it into a rejection.

    ``reason`` is the machine-readable code, ``message`` says what to do, ``details`` carries
    structured extras (e.g. the quoted price). ``sender`` is the account whose signature the
    event proved (the rejection is shown to it); ``claimed`` whoever the payload claimed to be;
    ``stream`` the stream of a parsed event (large payloads are not re-read for their ids).
    """

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        sender: str | None = None,
        claimed: str | None = None,
        stream: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message)
        self.reason, self.message, self.details = reason, message, details
        self.sender, self.claimed, self.stream = sender, claimed, stream


class Defer(Exception):
    """An event names an account this worker has not seen yet: retry once the directory of
    accounts has caught up (the worker does), then refuse it if it is still unknown."""

    def __init__(self, account_id: str) -> None:
        super().__init__(account_id)
        self.account_id = account_id


def dump(model: BaseModel) -> bytes:
    """The wire bytes of an event: its model's JSON, the one encoding of every format."""
    return model.model_dump_json().encode("utf-8")


class Misplaced(Exception):
    """A proven sender's event on another input partition than its id's: the router forwards
    it there (:func:`streams.core.placement.forward`). Like :class:`Defer`, not a refusal."""

    def __init__(self, key: str, partition: int) -> None:
        super().__init__(key)
        self.key, self.partition = key, partition


class HeldForBatch:
    """Outputs held back while a batch runs and made once when it ends (a batch's deliveries,
    its sales notices): one message per recipient for the whole batch, instead of one per
    event. Outside a batch each is made at once. Subclasses say what :meth:`drain` makes."""

    def __init__(self) -> None:
        self._batching = False

    def drain(self) -> list[Output]:
        """Every output held back, made now; nothing is held after."""
        raise NotImplementedError

    def drain_unless_batching(self) -> list[Output]:
        """What is held, made now, unless a batch runs (then at its end)."""
        return [] if self._batching else self.drain()

    @contextlib.contextmanager
    def batch(self) -> Iterator[list[Output]]:
        """Hold outputs back while the block runs; on exit append them to the yielded list."""
        outputs: list[Output] = []
        self._batching = True
        try:
            yield outputs
        finally:
            self._batching = False
            outputs.extend(self.drain())
