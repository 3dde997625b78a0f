"""Time admission: which events are too old, or too far ahead, to be applied.

The market recognises a resent value or purchase by a stored record, and forgets records once
they are older than the dedup horizon before their stream's watermark (:mod:`.records`). So:

* an event older than its stream's watermark minus the horizon is **refused** (``value_too_old``,
  ``request_too_old``): no record can be needed to recognise it, and none may be kept;
* a purchase is also refused when older than the market's *clock* minus the horizon and the
  allowed clock skew: its refusal may be recorded where no watermark guards it (a stream nobody
  has registered yet), and the same signed bytes must not be fulfilled once that record is gone;
* an event more than :data:`MAX_CLOCK_SKEW_MS` ahead of the market's clock is refused
  (``*_from_the_future``): it would push a watermark forward and make the market forget records
  that honest resends still need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..outputs import Reject

__all__ = ["CLOCK_REFUSE_MS", "MAX_CLOCK_SKEW_MS", "Admission", "HorizonKind"]

MAX_CLOCK_SKEW_MS = 3_600_000
"""How far apart the market's clock and a sender's (or two workers') may be."""
CLOCK_REFUSE_MS = MAX_CLOCK_SKEW_MS
"""Beyond the horizon, how much older than the market's clock a purchase may be."""
HorizonKind = Literal["value", "purchase"]


@dataclass(frozen=True)
class _Words:
    """How refusals of one kind of event read, and whether the market's clock also bounds its
    age (for a kind whose records may be kept where no watermark guards them)."""

    noun: str
    stamped: str
    newest: str
    too_old: str
    future: str
    too_old_advice: str
    whose_clock: str
    aged_by_clock: bool


_WORDS: dict[HorizonKind, _Words] = {
    "value": _Words(
        "value",
        "was published",
        "the newest value of stream",
        "value_too_old",
        "value_from_the_future",
        "the market no longer accepts or replays it",
        "seller's",
        False,
    ),
    "purchase": _Words(
        "purchase",
        "was requested",
        "the newest purchase on stream",
        "request_too_old",
        "request_from_the_future",
        "resend it with a new purchase id and a current time",
        "buyer's",
        True,
    ),
}


class Admission:
    """Admits events by their timestamps against their stream's watermark and the clock."""

    def __init__(self, horizon_ms: int, clock: Callable[[], int]) -> None:
        self.horizon_ms = horizon_ms
        self.clock = clock

    def admit(
        self, kind: HorizonKind, ts: int, watermark: int | None, ident: str, stream_id: str
    ) -> None:
        """Raise :class:`Reject` if an event stamped ``ts`` is too old (:meth:`admit_age`) or
        from the future (:meth:`admit_time`); ``watermark`` is the stream's newest timestamp of
        this kind (``None`` for a stream the market does not know)."""
        self.admit_age(kind, ts, watermark, ident, stream_id)
        self.admit_time(kind, ts, ident)

    def admit_age(
        self, kind: HorizonKind, ts: int, watermark: int | None, ident: str, stream_id: str
    ) -> None:
        """Raise ``*_too_old`` if no record can be needed to recognise an event stamped ``ts``:
        older than the horizon before its stream's watermark (or, for a purchase, before the
        market's clock and the allowed skew)."""
        w = _WORDS[kind]
        if watermark is not None and ts < watermark - self.horizon_ms:
            raise Reject(
                w.too_old,
                f"{w.noun} {ident!r} {w.stamped} more than the dedup horizon "
                f"({self.horizon_ms} ms) before {w.newest} {stream_id!r} ({watermark} ms); "
                f"{w.too_old_advice}",
            )
        now = self.clock()
        if w.aged_by_clock and ts < now - self.horizon_ms - CLOCK_REFUSE_MS:
            raise Reject(
                w.too_old,
                f"{w.noun} {ident!r} {w.stamped} more than the dedup horizon "
                f"({self.horizon_ms} ms) and the allowed clock skew ({CLOCK_REFUSE_MS} ms) "
                f"before the market's clock ({now} ms); {w.too_old_advice}",
            )

    def admit_time(self, kind: HorizonKind, ts: int, ident: str) -> None:
        """Raise ``*_from_the_future`` if ``ts`` is more than :data:`MAX_CLOCK_SKEW_MS` ahead
        of the market's clock."""
        w = _WORDS[kind]
        if ts > self.clock() + MAX_CLOCK_SKEW_MS:
            raise Reject(
                w.future,
                f"{w.noun} {ident!r} claims a time more than {MAX_CLOCK_SKEW_MS} ms "
                f"ahead of the market's clock; check the {w.whose_clock} clock",
            )
