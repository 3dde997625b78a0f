"""What anyone may create for free, per minute: account openings and quotes.

Opening an account costs nothing but a key pair, and each opening adds an account record on
every worker (the replicas) and an inbox topic on the broker; a quote costs its sender one
signature and the market a plan, an answer ~29 times the request's size and a message. Without
a rate, a handful of parties could fill the accounts table (and the broker's topic list) in
minutes, or keep a worker busy answering quotes while purchases wait. So:

* openings are bounded **per input partition**: ``Limits.max_openings_per_minute`` split evenly
  over the partitions (a partition's share at once, then its share a minute), so the bound holds
  market-wide however partitions are spread over workers and whoever the new accounts are — a
  new account has no history to be judged by;
* quotes are bounded **per account**: ``Limits.max_quotes_per_minute`` at once, then that many a
  minute, on each worker (a quote is decided on its stream's partition).

A refusal is a rejection with reason ``rate_limited`` whose details say when to retry. The
buckets live in memory, not in the tables: a restarted worker starts them full, and a replayed
event may meet another decision than the first time — harmless, as neither an opening nor a
quote is ever charged, and a refused one is simply sent again later.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .outputs import Reject

__all__ = ["Allowance", "RateLimit"]

MINUTE_MS = 60_000
_SWEEP_AT_LEAST = 1_024


@dataclass
class _Bucket:
    tokens: float
    at_ms: int


class RateLimit:
    """A token bucket per key: ``per_minute`` at once, then ``per_minute`` a minute.

    Parameters
    ----------
    per_minute : int
        Tokens a minute, and the burst a key may spend at once (at least 1).
    clock : callable
        Milliseconds since the epoch (the market's clock).

    Keys whose bucket has refilled are swept once the map has doubled since the last sweep, so
    memory holds only the keys active within the last minute or so (amortised O(1) a call).
    """

    def __init__(self, per_minute: int, clock: Callable[[], int]) -> None:
        if per_minute < 1:
            raise ValueError(f"a rate must allow at least 1 a minute, not {per_minute}")
        self.per_minute = per_minute
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._sweep_at = _SWEEP_AT_LEAST

    def take(self, key: str) -> int:
        """Spend one token of ``key``; return 0, or the milliseconds until one is available
        (then nothing is spent)."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self._sweep_at:
                self._sweep(now)
            bucket = self._buckets[key] = _Bucket(float(self.per_minute), now)
        rate = self.per_minute / MINUTE_MS  # tokens a millisecond
        bucket.tokens = min(
            float(self.per_minute), bucket.tokens + max(0, now - bucket.at_ms) * rate
        )
        bucket.at_ms = max(bucket.at_ms, now)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0
        return max(1, math.ceil((1.0 - bucket.tokens) / rate))

    def __len__(self) -> int:
        return len(self._buckets)

    def _sweep(self, now: int) -> None:
        """Forget the keys whose bucket is full again (they would start full anyway)."""
        refill = MINUTE_MS  # a whole bucket refills in one minute
        self._buckets = {k: b for k, b in self._buckets.items() if now - b.at_ms < refill}
        self._sweep_at = max(_SWEEP_AT_LEAST, 2 * len(self._buckets))


class Allowance:
    """The free-creation rates of one worker: openings per input partition, quotes per account.

    Parameters
    ----------
    openings_per_minute : int
        Openings a minute in the whole market, split evenly over ``partitions``.
    quotes_per_minute : int
        Quotes a minute one account may ask, on each worker.
    partitions : int
        The input partitions.
    clock : callable
        Milliseconds since the epoch.
    """

    def __init__(
        self,
        openings_per_minute: int,
        quotes_per_minute: int,
        partitions: int,
        clock: Callable[[], int],
    ) -> None:
        self.openings_share = math.ceil(openings_per_minute / partitions)
        self.openings_per_minute = openings_per_minute
        self._clock = clock
        #: openings refused ``rate_limited``, and when the last was (``/health``: behind)
        self.openings_refused = 0
        self.openings_refused_at_ms: int | None = None
        self._openings = RateLimit(self.openings_share, clock)
        self._quotes = RateLimit(quotes_per_minute, clock)

    def open_account(self, partition: int, account_id: str) -> None:
        """Spend one opening of ``partition`` or raise ``rate_limited`` (claimed by
        ``account_id``: nobody is proven by a refused opening)."""
        wait = self._openings.take(str(partition))
        if wait:
            self.openings_refused += 1
            self.openings_refused_at_ms = self._clock()
            raise Reject(
                "rate_limited",
                f"the market opens at most {self.openings_per_minute} accounts a minute "
                f"({self.openings_share} on each input partition) and partition {partition}, "
                f"where account id {account_id!r} belongs, has opened its share: send the "
                f"opening again in {wait / 1000:.1f} s (EMARKET_MAX_OPENINGS_PER_MINUTE)",
                claimed=account_id,
                retry_after_ms=wait,
                limit="openings_per_minute",
                per_minute=self.openings_per_minute,
            )

    def openings_behind(self, within_ms: int = MINUTE_MS) -> bool:
        """Whether an opening was refused ``rate_limited`` within the last ``within_ms``: the
        allowance is spent, and honest openings wait too."""
        last = self.openings_refused_at_ms
        return last is not None and self._clock() - last < within_ms

    def quote(self, buyer_id: str) -> None:
        """Spend one quote of ``buyer_id`` or raise ``rate_limited``."""
        wait = self._quotes.take(buyer_id)
        if wait:
            per = self._quotes.per_minute
            raise Reject(
                "rate_limited",
                f"an account may ask at most {per} quotes a minute: ask again in "
                f"{wait / 1000:.1f} s (EMARKET_MAX_QUOTES_PER_MINUTE); a purchase needs no "
                "quote (its max_price bounds what it pays)",
                sender=buyer_id,
                retry_after_ms=wait,
                limit="quotes_per_minute",
                per_minute=per,
            )
