"""An operator page served from a cache, rebuilt at most once every ``every`` seconds.

``/ledger`` and ``/metrics`` grow with the market (~240 kB and ~165 kB per 1,000 streams) and
are built by the worker that runs the batches: built for every request, four clients looping
on them slowed every purchase 75×. A :class:`PageCache` serves every request from the newest
build that began at most ``every`` seconds before the request arrived, so that:

* **a page is fresh within ``every`` seconds**: it was built from state read no earlier than
  ``every`` seconds before the request (``every = 0``: after the request arrived, as an
  uncached page);
* **concurrent requests share one build**: a request that finds a build running which began
  recently enough waits for it; one that needs a newer page waits for the running build to end
  and then shares the next one with every request that arrived meanwhile;
* **a flood cannot make more builds than the rate allows**: a build begins only when no page
  that began within ``every`` seconds exists or runs, so builds begin at least ``every``
  seconds apart and one at a time: over ``T`` seconds at most ``1 + T / every`` builds,
  whatever the number of requests;
* **nor more answers than ``per_second``**: requests take turns ``1 / per_second`` apart and
  wait for theirs (none is refused). Sending a cached page still costs the event loop and the
  machine (four clients looping on a cached ``/ledger`` and ``/metrics`` fetched ~1,000 pages a
  second and doubled purchase p95); paced, a looping client mostly waits. A scraper every few
  seconds, or a person, never waits.

A build that fails is not kept: its waiters get its error and the next request builds again
(at most one at a time). The clock is injected so that the rate is tested without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["PageCache"]


class PageCache:
    """One page's newest build, and the build running now (see the module docstring).

    Parameters
    ----------
    build
        Makes the page's bytes; it should yield to the event loop while it works (the
        worker's builds run in slices or in a thread), since requests and batches wait on it.
    every
        Seconds a build serves requests that arrive after it began (0: none, each request
        waits for a build that begins after it arrived, shared with its concurrent requests).
    clock
        Monotonic seconds (``time.monotonic``; a fake one in tests).
    setting
        What sets ``every`` (``EMARKET_LEDGER_EVERY``), for the error a bad one gets.
    per_second
        Most answers a second (0: no pacing); more requests wait their turn.
    sleep
        How a request waits for its turn (``asyncio.sleep``; a fake one in tests).
    """

    def __init__(
        self,
        build: Callable[[], Awaitable[bytes]],
        every: float,
        clock: Callable[[], float] = time.monotonic,
        setting: str = "the page's interval",
        per_second: float = 0.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not every >= 0:
            raise ValueError(f"{setting} must be 0 or more seconds, not {every}")
        self._build = build
        self.every = every
        self._clock = clock
        self._turn_every = 1 / per_second if per_second > 0 else 0.0
        self._next_turn = 0.0
        self._sleep = sleep
        self._page: bytes | None = None
        self._page_at = 0.0
        self._running: tuple[asyncio.Task[bytes], float] | None = None
        #: builds begun (a failed one included): what the rate bounds
        self.builds = 0

    async def get(self) -> bytes:
        """The page, from a build that began no earlier than ``every`` seconds before this
        request's turn."""
        await self._take_turn()
        oldest = self._clock() - self.every
        while True:
            if self._page is not None and self._page_at >= oldest:
                return self._page
            running = self._running or self._start()
            task, began = running
            if began >= oldest:
                # shielded: a request that goes away (its client disconnected) ends no build
                return await asyncio.shield(task)
            await asyncio.wait([task])  # too old for this request: let it end, then rebuild
            if self._running is running:
                self._running = None

    async def _take_turn(self) -> None:
        if not self._turn_every:
            return
        now = self._clock()
        turn = max(now, self._next_turn)
        self._next_turn = turn + self._turn_every
        if turn > now:
            await self._sleep(turn - now)

    def _start(self) -> tuple[asyncio.Task[bytes], float]:
        self.builds += 1
        began = self._clock()
        task = asyncio.ensure_future(self._build())
        running = self._running = (task, began)

        def done(task: asyncio.Task[bytes]) -> None:
            if self._running is running:
                self._running = None
            if not task.cancelled() and task.exception() is None and began >= self._page_at:
                self._page, self._page_at = task.result(), began

        task.add_done_callback(done)
        return running
