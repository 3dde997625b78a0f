"""Token buckets per account: what one party may ask for free, at most, of one worker.

A quote changes nothing and is answered with every level for sale (~29 times the bytes of its
request), so a free account could otherwise make the market send without bound and stall the
purchases queued behind its quotes. Each account gets a bucket of ``burst`` tokens refilled at
``rate`` a second; a request finding it empty is refused (``rate_limited``) with the time
after which one is there. The buckets live in the worker's memory, per worker (an account's
quotes on streams of several workers are limited by each), bounded by ``maxsize`` accounts
(the least recently seen forgotten, which then starts full): losing them on a restart costs at
most one burst.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["TokenBuckets"]


class TokenBuckets:
    """``burst`` tokens per account, ``rate`` more a second, on the market's clock.

    Parameters
    ----------
    burst : int
        Requests an idle account may make at once.
    rate : float
        Tokens added a second.
    clock : callable
        The market's clock (Unix ms).
    maxsize : int, optional
        Accounts whose buckets are kept.
    """

    def __init__(self, burst: int, rate: float, clock: Callable[[], int],
                 maxsize: int = 100_000) -> None:  # fmt: skip
        self.burst, self.rate, self.clock, self.maxsize = burst, rate, clock, maxsize
        self._buckets: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def take(self, account: str) -> int | None:
        """Take a token for ``account``: ``None`` if it had one, else the milliseconds until
        it will (nothing is taken then)."""
        now = self.clock()
        tokens, at = self._buckets.get(account, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0, now - at) * self.rate / 1000)
        if tokens < 1.0:
            self._buckets[account] = (tokens, now)
            return max(1, math.ceil((1.0 - tokens) * 1000 / self.rate))
        self._buckets[account] = (tokens - 1.0, now)
        self._buckets.move_to_end(account)
        if len(self._buckets) > self.maxsize:
            self._buckets.popitem(last=False)
        return None
