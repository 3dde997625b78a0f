"""A stranger in the workers' consumer group (issue #39, attack 1), on the real embedded broker.

The rogue (:mod:`tests.streams.rogue_member`) is a plain aiokafka consumer that joins the group
whose id is the market's app id under Faust's assignor name with well-formed Faust metadata,
but cannot prove it is a worker of this market (it has no key derived from the noise secret):

* while workers lead, it is given nothing (the leader counts it, every worker names it), stays
  as long as it likes while every stream on every partition trades, and leaves;
* first in an empty group, it is elected leader and gives itself partition 0 of every input
  topic: the worker that starts under it turns ``/health`` 503 ``untrusted_group`` naming those
  partitions, the gauges move, and a purchase on partition 0 waits; once the rogue leaves the
  worker leads, health recovers and the purchase is answered.

Both fail on the code before #39 (the rogue is given half the input partitions; under a rogue
leader ``/health`` stays ``ok``).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
from dataclasses import replace
from typing import Any

import pytest

from streams.broker.embedded import find_free_port
from streams.clients.client import MarketClient
from streams.wire.events import PurchaseFulfilled
from streams.worker.runner import ChildWorker

from ..conftest import Market
from ..helpers import buy, party
from ..rogue_member import RogueMember

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DEADLINE = 90.0  # generous: a busy 2-core machine, and Tansu holds every join for 1.5 s


def health(worker: ChildWorker) -> tuple[int, dict[str, Any]]:
    """``/health``'s status code and body, 503 included; 0 while the worker does not answer."""
    try:
        return 200, worker.get("/health", timeout=10)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    except (OSError, ValueError):  # not listening yet (URLError is an OSError)
        assert worker.alive(), "the worker exited"
        return 0, {}


def wait_for(what: str, probe: Any, timeout: float = DEADLINE) -> Any:
    """Poll ``probe()`` until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout}s (last: {last!r})")


def streams_on_every_partition(market: Market) -> list[str]:
    """One stream id per input partition."""
    ids: dict[int, str] = {}
    n = 0
    while len(ids) < market.settings.partitions:
        ids.setdefault(market.topics.partition_of(f"s{n}"), f"s{n}")
        n += 1
    return [ids[p] for p in sorted(ids)]


REG = {
    "mechanism": "laplace",
    "sensitivity": 1.0,
    "dimension": 2,
    "steps": [0.5, 1.0],
    "cap": 2.0,
    "retain_last": 4,
    "pricing": {"kind": "linear_level", "rate_per_level": 100.0},
}


def group_of(worker: ChildWorker) -> dict[str, Any]:
    """The ``group`` part of a worker's /health (empty while it does not answer)."""
    group: dict[str, Any] = health(worker)[1].get("group") or {}
    return group


def test_a_stranger_that_joins_while_workers_lead_is_given_nothing(market: Market) -> None:
    """Two workers, then the rogue: it is given nothing, is counted and named, stays while
    every stream on every partition trades, and leaves; the workers stay healthy throughout."""
    workers = [market.start_worker(), market.start_worker()]
    rogue = RogueMember(market.broker.bootstrap, market.settings.app_id, market.topics.inputs())
    streams = streams_on_every_partition(market)

    async def trade(c: MarketClient) -> list[Any]:
        for name in ("seller1", "alice"):
            await c.open_account(party(name))
        for sid in streams:
            await c.register({"stream_id": sid, **REG})
            await c.publish(sid, [1.0, 2.0], value_id="v0")
        return [await buy(c, "alice", sid, max_price_minor=1000) for sid in streams]

    def named_by_both() -> bool:
        return all(len(group_of(w).get("unproven_members", [])) == 1 for w in workers)

    async def stays() -> tuple[set[Any], list[Any]]:
        await rogue.start()
        try:
            held = await rogue.wait_assigned(DEADLINE)
            assert held == set(), f"the rogue was given {sorted(held)}"
            await asyncio.to_thread(wait_for, "both workers name the rogue", named_by_both)
            async with market.client() as c:
                outcomes = await trade(c)
            return rogue.held(), outcomes
        finally:
            await rogue.stop()

    held, outcomes = asyncio.run(stays())
    assert held == set()  # still nothing, after every rebalance while it stayed
    assert all(isinstance(o, PurchaseFulfilled) for o in outcomes), outcomes
    assert market.metric("emarket_group_members_refused_total", reason="no_proof") >= 1
    wait_for(
        "both workers healthy, no stranger named, once the rogue left",
        lambda: all(
            health(w)[0] == 200 and group_of(w).get("unproven_members") == [] for w in workers
        ),
    )
    assert market.metric("emarket_group_unproven_partitions") == 0


def test_a_stranger_that_leads_the_group_is_reported_until_it_leaves(market: Market) -> None:
    """A market whose worker stopped; the rogue joins the empty group first and leads it; a
    worker starts under it and says so; a purchase on a partition the rogue kept waits, and is
    answered once the rogue has left and the worker leads."""
    s = market.settings
    first = market.start_worker()
    market.open_accounts("seller1", "alice")
    sid = streams_on_every_partition(market)[0]  # on partition 0, which the rogue keeps

    async def register(c: MarketClient) -> None:
        await c.register({"stream_id": sid, **REG})
        await c.publish(sid, [1.0, 2.0], value_id="v0")

    market.run(register)
    market.wait_ingested(sid, 1)
    first.stop()
    rogue = RogueMember(market.broker.bootstrap, s.app_id, market.topics.inputs())

    async def lead_then_leave() -> tuple[Any, float, Any, Any]:
        await rogue.start()
        await rogue.wait_assigned(DEADLINE)  # alone in the group: its leader
        worker = ChildWorker(
            replace(s, web_port=find_free_port()), log_path=market.tmp / "worker1.log"
        ).start()
        market.workers.append(worker)
        async with market.client() as c:
            try:
                bad = await asyncio.to_thread(
                    wait_for,
                    "/health says the group is not trusted under the rogue leader",
                    lambda: (h := health(worker))[1].get("status") == "untrusted_group" and h,
                )
                gauge = market.metric("emarket_group_unproven_partitions")
                assert market.metric("emarket_group_untrusted") == 1
                assert rogue.led >= 2 and rogue.held()  # it led the worker's join, kept some
                buying = asyncio.create_task(
                    buy(c, "alice", sid, max_price_minor=1000, timeout=3 * DEADLINE)
                )
                await asyncio.sleep(5)
                assert not buying.done(), "a purchase on the rogue's partition was answered"
            finally:
                await rogue.stop()
            good = await asyncio.to_thread(
                wait_for,
                "/health ok once the rogue left",
                lambda: (h := health(worker))[0] == 200 and h,
            )
            return bad, gauge, good, await buying

    (code, bad), gauge, (_, good), outcome = asyncio.run(lead_then_leave())
    assert code == 503, bad
    reason = bad["group"]["reason"]
    assert "leader" in reason and s.app_id in reason, reason
    held = {f"{t}[0]" for t in market.topics.inputs()}
    assert set(bad["group"]["unproven_partitions"]) == held, bad
    assert gauge == len(held)
    assert good["status"] == "ok", good
    assert market.metric("emarket_group_unproven_partitions") == 0
    assert market.metric("emarket_group_untrusted") == 0
    assert isinstance(outcome, PurchaseFulfilled), outcome  # answered once it left
