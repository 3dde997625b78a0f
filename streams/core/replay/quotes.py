"""Quotes: how old one may be, and which were answered, so a replay is answered at most once.

A quote changes nothing, so the market keeps no record of it in its tables; but its answer is
~29 times its request and lands in the buyer's inbox, kept for a year, and each answer spends
one of the buyer's quotes a minute (:mod:`..allowance`). Anyone who reads the purchases topic
has the buyer's signed bytes, so without a memory every copy written again would add an answer
to the buyer's inbox and keep the buyer's allowance empty. So:

* a quote requested more than :data:`QUOTE_MAX_AGE_MS` before the market's clock is refused
  (``request_too_old``), one more than :data:`~.admission.MAX_CLOCK_SKEW_MS` ahead of it too
  (``request_from_the_future``): the memory below need reach no further back. The refusal goes
  to the operators and the public refusal record (where the buyer's client looks for it), not to
  the buyer's inbox: anyone can send an old quote again, as often as he likes;
* a quote decided once (answered or refused) is remembered by its buyer and id until it is too
  old to be admitted; a copy of it is then counted (status ``duplicate``, reason
  ``already_answered``) and answered nowhere: not in the inbox, not on the refusal topics, and it
  spends no allowance;
* at most :data:`MAX_REMEMBERED` quotes are remembered; beyond that the oldest is forgotten and
  every quote requested no later than it is refused as too old, so a forgotten quote is never
  answered again.

The memory is the worker's, in memory: a worker that restarts, or is given the partition by a
rebalance, has forgotten which quotes were answered within the last hour, and may answer a
replay of one of them once more (a quote is never charged, so nothing but one message is at
stake).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from ..outputs import Reject
from .admission import MAX_CLOCK_SKEW_MS

__all__ = ["MAX_REMEMBERED", "QUOTE_MAX_AGE_MS", "AnsweredQuotes"]

QUOTE_MAX_AGE_MS = MAX_CLOCK_SKEW_MS
"""How long before the market's clock a quote may have been requested (a client stamps a quote
when it sends it, and never resends it; the allowed clock skew is the only slack needed)."""
MAX_REMEMBERED = 131_072
"""Quotes a worker remembers at most (~150 bytes each)."""


class AnsweredQuotes:
    """The quotes this worker decided within the age limit, by buyer and quote id.

    Parameters
    ----------
    clock : callable
        The market's clock (Unix ms).
    cap : int, optional
        Quotes remembered at most.
    """

    def __init__(self, clock: Callable[[], int], cap: int = MAX_REMEMBERED) -> None:
        self._clock = clock
        self._cap = cap
        self._seen: dict[tuple[str, str], int] = {}
        self._heap: list[tuple[int, str, str]] = []
        self._floor = -1  # quotes requested at or before this were forgotten early

    def admit(self, buyer_id: str, quote_id: str, requested_at_ms: int) -> bool:
        """True for a quote not decided before (it is remembered from now on), False for a copy
        of one that was; raise :class:`Reject` for a quote too old or from the future."""
        now = self._clock()
        self._expire(now)
        if requested_at_ms < now - QUOTE_MAX_AGE_MS or requested_at_ms <= self._floor:
            raise Reject(
                "request_too_old",
                f"quote {quote_id!r} was requested at {requested_at_ms} ms, more than "
                f"{QUOTE_MAX_AGE_MS} ms before the market's clock ({now} ms) or before the "
                "oldest quote the market still remembers: ask again with a new quote id and "
                "the current time",
                claimed=buyer_id,
            )
        if requested_at_ms > now + MAX_CLOCK_SKEW_MS:
            raise Reject(
                "request_from_the_future",
                f"quote {quote_id!r} claims a time more than {MAX_CLOCK_SKEW_MS} ms ahead of "
                "the market's clock; check the buyer's clock",
                claimed=buyer_id,
            )
        key = (buyer_id, quote_id)
        if key in self._seen:
            return False
        if len(self._seen) >= self._cap:
            at, b, q = heapq.heappop(self._heap)
            del self._seen[(b, q)]
            self._floor = max(self._floor, at)
        self._seen[key] = requested_at_ms
        heapq.heappush(self._heap, (requested_at_ms, buyer_id, quote_id))
        return True

    def __len__(self) -> int:
        return len(self._seen)

    def _expire(self, now: int) -> None:
        """Forget the quotes too old to be admitted again."""
        while self._heap and self._heap[0][0] < now - QUOTE_MAX_AGE_MS:
            _, b, q = heapq.heappop(self._heap)
            del self._seen[(b, q)]
