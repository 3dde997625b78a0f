"""The operator pages' cache (streams/worker/page_cache.py): how often a page is built, what a
request is served, and what concurrent requests share, on a fake clock; and the ledger built in
slices (streams/worker/web.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from streams.worker import web
from streams.worker.page_cache import PageCache

from ..helpers import TEST_KEYS, market_core, purchase, registration, value


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Builds:
    """A page built on demand: each build returns its number, once the test releases it."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.made = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None

    async def __call__(self) -> bytes:
        self.made += 1
        n = self.made
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return str(n).encode()


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_a_flood_builds_once_per_interval_and_every_page_is_fresh_within_it() -> None:
    async def go() -> None:
        clock = Clock()
        builds = Builds(clock)
        cache = PageCache(builds, every=5.0, clock=clock)
        served = []
        for _ in range(600):  # 60 s of requests, ten a second
            page = await cache.get()
            served.append((clock.now, int(page)))
            clock.now += 0.1
        assert cache.builds == builds.made == 12  # 1 + 60 / 5, whatever the requests
        began = {}
        for at, n in served:
            began.setdefault(n, at)
            assert at - began[n] <= 5.0  # no page served more than 5 s after its build began

    run(go())


def test_concurrent_requests_share_one_build() -> None:
    async def go() -> None:
        clock = Clock()
        builds = Builds(clock)
        builds.gate.clear()
        cache = PageCache(builds, every=5.0, clock=clock)
        waiting = [asyncio.ensure_future(cache.get()) for _ in range(50)]
        await asyncio.sleep(0)
        builds.gate.set()
        assert set(await asyncio.gather(*waiting)) == {b"1"} and builds.made == 1

    run(go())


def test_without_an_interval_a_request_gets_a_build_that_began_after_it_arrived() -> None:
    """``every = 0``: what a request sees was read after it arrived (an uncached page), and
    the requests that arrive during one build share the next."""

    async def go() -> None:
        clock = Clock()
        builds = Builds(clock)
        builds.gate.clear()
        cache = PageCache(builds, every=0.0, clock=clock)
        first = asyncio.ensure_future(cache.get())
        await asyncio.sleep(0)  # build 1 runs
        clock.now += 0.01
        later = [asyncio.ensure_future(cache.get()) for _ in range(20)]
        await asyncio.sleep(0)
        builds.gate.set()
        assert await first == b"1"
        assert set(await asyncio.gather(*later)) == {b"2"}  # not build 1, begun before them
        assert builds.made == 2
        clock.now += 0.01
        assert await cache.get() == b"3"

    run(go())


def test_a_failed_build_is_not_kept_and_its_waiters_get_its_error() -> None:
    async def go() -> None:
        clock = Clock()
        builds = Builds(clock)
        builds.fail = RuntimeError("state is inconsistent")
        cache = PageCache(builds, every=5.0, clock=clock)
        for _ in range(2):
            with pytest.raises(RuntimeError, match="inconsistent"):
                await cache.get()
        builds.fail = None
        assert await cache.get() == b"3" and await cache.get() == b"3"

    run(go())


def test_a_request_that_goes_away_ends_no_build() -> None:
    async def go() -> None:
        clock = Clock()
        builds = Builds(clock)
        builds.gate.clear()
        cache = PageCache(builds, every=5.0, clock=clock)
        gone = asyncio.ensure_future(cache.get())
        await asyncio.sleep(0)
        gone.cancel()
        stays = asyncio.ensure_future(cache.get())
        await asyncio.sleep(0)
        builds.gate.set()
        assert await stays == b"1" and builds.made == 1

    run(go())


def test_answers_are_paced_and_a_request_waits_its_turn() -> None:
    """At ``per_second``, 30 requests at once are answered over 3 s, none refused; a request
    that comes after a quiet second does not wait."""

    async def go() -> None:
        clock = Clock()
        waited: list[float] = []

        async def sleep(seconds: float) -> None:
            waited.append(seconds)

        cache = PageCache(Builds(clock), every=5.0, clock=clock, per_second=10, sleep=sleep)
        await asyncio.gather(*(cache.get() for _ in range(30)))
        assert len(waited) == 29 and max(waited) == pytest.approx(2.9)
        clock.now += 10.0
        waited.clear()
        await cache.get()
        assert waited == []

    run(go())


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="EMARKET_LEDGER_EVERY must be 0 or more seconds"):
        PageCache(Builds(Clock()), every=-1.0, setting="EMARKET_LEDGER_EVERY")


def test_the_ledger_built_in_slices_is_the_ledger_and_lets_the_loop_run() -> None:
    """``ledger_page`` (the bytes served) says what ``ledger`` says, and with no time budget
    it lets the event loop run between two streams."""
    core = market_core("seller1", "alice")
    t = core.ctx.topics
    for sid in ("s1", "s2", "s3"):
        assert core.handle(t.registrations, registration(sid)).status == "accepted"
        assert core.handle(t.values, value(sid, "v1", [1.0, 2.0, 3.0])).status == "accepted"
    assert core.handle(t.purchases, purchase("s2", "alice", "p1")).status == "fulfilled"
    ran: list[int] = []
    ran_during: list[int] = []

    async def go() -> bytes:
        async def beside() -> None:
            for i in range(3):
                ran.append(i)
                await asyncio.sleep(0)

        other = asyncio.ensure_future(beside())
        page = await web.ledger_page(core.stores, TEST_KEYS, budget=0.0)
        ran_during.append(len(ran))
        await other
        return page

    page = asyncio.run(go())
    assert json.loads(page) == json.loads(json.dumps(web.ledger(core.stores, TEST_KEYS)))
    assert json.loads(page)["streams"]["s2"]["holders"]["alice"]["purchases"] == 1
    assert ran_during[0] >= 2  # the other task ran while the page was being built
