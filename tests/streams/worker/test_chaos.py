"""Crash anywhere: the worker is killed at random fail points 60 times.

Two independent markets ("lanes") run on the shared broker. In each, a driver keeps sending
values, purchases (steps up a ladder, targets above the cap, resends of earlier purchases), while
a supervisor restarts the worker every time it dies at a random fail point (before/after its
state write, between its records and its streams' records, mid-batch, mid-output, after
output: all six of ``streams.worker.faults.POINTS``). A restarted worker replays the events
after the last commit, so a batch lost between its records and its streams' records may evict
values an earlier, durable batch counted, and be replayed again by the next incarnation
(``streams.core.replay.repair.mark_of``; the core's deterministic replays of it are in
test_partial_state.py and test_partial_replay.py). Afterwards a clean worker finishes the
backlog, every purchase is resent by id until it has an outcome, and the test checks the
market's promises:

* every purchase ended in exactly one outcome (every copy of a fulfilment byte-identical, every
  copy of a refusal with the same reason);
* no (stream, value, level) was ever released with two different vectors;
* nobody paid twice: each buyer paid exactly the sum of its distinct fulfilled purchases;
* privacy spent never exceeded a cap, no release above a cap;
* every value sent was ingested, once (``values_ingested`` equals the values sent).
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from streams.clients.client import MarketClient, TopicReader, now_ms
from streams.wire.events import (
    CatalogEntry,
    LinearLevelSpec,
    PurchaseFulfilled,
    Rejection,
    ValueOutcome,
    ValuesAccepted,
)
from streams.worker.faults import POINTS

from .. import helpers
from ..conftest import Market
from ..helpers import buy

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.minutes]

CRASHES = 36  # across the lanes: ~6 at each fail point; each costs a worker restart (3-15 s)
LANES = 2  # independent markets crashing side by side (a third starved the tests beside it)
LADDER = [0.25, 0.5, 1.0, 2.0]
CAP = 2.0
STREAMS = ["s0", "s1"]
BUYERS = [f"b{i}" for i in range(4)]


def reg(stream: str) -> dict[str, Any]:
    return dict(
        stream_id=stream,
        mechanism="laplace",
        sensitivity=1.0,
        dimension=3,
        steps=LADDER,
        cap=CAP,
        retain_last=6,
        pricing=LinearLevelSpec(rate_per_level=100.0),
    )


def purchase_payload(
    market: str, buyer: str, stream: str, pid: str, target: float | None, stamp: int
) -> bytes:
    """A signed purchase, as a client sends it (and resends it: the same bytes)."""
    return helpers.purchase(
        stream,
        buyer,
        pid,
        max_price=10_000,
        market=market,
        target_level=target,
        requested_at_ms=stamp,
    )


class Lane:
    def __init__(self, market: Market, index: int) -> None:
        self.market = market
        self.name = f"L{index}"
        self.index = index
        # short sessions and commits: restarts are quick and progress is committed often
        market.settings = replace(
            market.settings, session_timeout=2.0, heartbeat_interval=0.2, commit_interval=0.3
        )
        self.crashes: collections.Counter[str] = collections.Counter()
        self.purchases: dict[str, tuple[str, str, float | None]] = {}
        self.stamps: dict[str, int] = {}
        self.values: dict[tuple[str, str], bytes] = {}  # (stream, value id) → signed batch
        self.values_resent = 0
        self.missing_values: list[tuple[str, str]] = []
        self.value_rejections: list[tuple[str | None, str]] = []
        self.stop = threading.Event()
        self.failures: list[str] = []

    # -- the supervisor: restart the worker whenever a fail point kills it ----------------------
    def supervise(self, target: int) -> None:
        seed = 0
        while sum(self.crashes.values()) < target and not self.stop.is_set():
            seed += 1
            faults = ",".join(f"{p}:0.05" for p in POINTS)
            try:
                w = self.market.start_worker_env(
                    {
                        "EMARKET_FAULTS": faults,
                        "EMARKET_FAULT_SEED": str(self.index * 10**6 + seed),
                    }
                )
            except RuntimeError:  # died before it answered /health
                w = self.market.workers[-1]
            assert w.proc is not None
            try:
                code = w.proc.wait(timeout=20)
            except Exception:  # no crash in 20 s: stop it and start another incarnation
                w.stop()
                continue
            w.stop()  # closes its log file
            log = w.log_path.read_text(errors="replace") if w.log_path else ""
            if code != 137:  # anything but a fail point is a real failure
                self.failures.append(f"worker exited {code}: {log[-2000:]}")
                self.stop.set()
                return
            points = re.findall(r"fault injection: crashing at (\w+)", log)
            self.crashes[points[-1] if points else "unknown"] += 1

    # -- the driver: a steady flow of values, purchases and resends -----------------------------
    def run_driver(self) -> None:
        try:
            self.market.run(self.drive)
        except Exception as exc:  # a driver that dies must fail the test, not starve it
            self.failures.append(f"driver failed: {exc!r}")
            self.stop.set()

    async def drive(self, c: MarketClient) -> None:
        m = self.market.topics.prefix
        for s in STREAMS:  # like a seller's client: values only once the stream is listed
            entry = await c.register(reg(s), timeout=120)
            assert isinstance(entry, CatalogEntry), entry
        k = 0
        while not self.stop.is_set():
            k += 1
            for s in STREAMS:
                vid = f"v{k}"
                self.values[(s, vid)] = helpers.value(
                    s, vid, [1.0, 2.0, float(k)], market=m, published_at_ms=now_ms()
                )
                await c.send(self.market.topics.values, s, self.values[(s, vid)])
            buyer, stream = BUYERS[k % len(BUYERS)], STREAMS[k % len(STREAMS)]
            target = [None, None, 0.5, 3.0, CAP, 1.0][k % 6]  # next step, explicit, above cap
            pid = f"p{k}"
            self.purchases[pid] = (buyer, stream, target)
            self.stamps[pid] = now_ms()
            payload = purchase_payload(m, buyer, stream, pid, target, self.stamps[pid])
            await c.send(self.market.topics.purchases, stream, payload)
            if k % 5 == 0:  # a duplicate of an earlier purchase
                old = f"p{max(1, k - 7)}"
                b, s2, t = self.purchases[old]
                await c.send(
                    self.market.topics.purchases,
                    s2,
                    purchase_payload(m, b, s2, old, t, self.stamps[old]),
                )
            await asyncio.sleep(0.15)

    # -- after the storm -------------------------------------------------------------------------
    async def settle(self, c: MarketClient) -> dict[str, list[bytes]]:
        """Resend (by id, like the client library does) every purchase still lacking an
        outcome, then return every buyer topic."""
        await asyncio.sleep(3)  # the clean worker drains the backlog
        answered = {k for msgs in (await self.read(c)).values() for k in _outcome_ids(msgs)}
        for pid, (buyer, stream, target) in sorted(self.purchases.items()):
            if pid not in answered:
                await buy(
                    c,
                    buyer,
                    stream,
                    target_level=target,
                    max_price_minor=10_000,
                    purchase_id=pid,
                    resend_every=10,
                    timeout=90,
                    requested_at_ms=self.stamps[pid],
                )
        await self.resend_unanswered_values(c)
        for s in STREAMS:  # the backlog of values is drained too (however busy the machine)
            sent = sum(1 for st, _ in self.values if st == s)
            await asyncio.to_thread(self.market.wait_ingested, s, sent, 180.0)
        return await self.read(c)

    async def resend_unanswered_values(self, c: MarketClient) -> None:
        """Like a seller's client: every value gets an answer in the seller's inbox; one that
        has none after the backlog is drained is resent (same bytes). A value refused is a bug."""
        answers: dict[tuple[str, str], ValueOutcome] = {}
        for _ in range(120):  # until the clean worker has drained the value backlog
            before, answers = len(answers), await self.value_answers(c)
            if len(answers) == before:
                break
            await asyncio.sleep(1)
        missing = sorted(set(self.values) - set(answers))
        self.missing_values = missing[:10]
        refused = {k: v for k, v in answers.items() if v.status == "rejected"}
        assert not refused, f"values refused under crashes: {list(refused.items())[:3]}"
        assert not self.value_rejections, f"values refused: {self.value_rejections[:3]}"
        for key in missing:
            self.values_resent += 1
            await c.send(self.market.topics.values, key[0], self.values[key])

    async def value_answers(self, c: MarketClient) -> dict[tuple[str, str], ValueOutcome]:
        self.value_rejections = []
        reader = TopicReader(c.bootstrap, self.market.topics.inbox("seller1"))
        await reader.start()
        out: dict[tuple[str, str], ValueOutcome] = {}
        try:
            while batch := await reader.poll(1.0):
                for _, raw in batch:
                    if b'"values_accepted"' in raw:
                        ev = ValuesAccepted.model_validate_json(raw)
                        out.update({(ev.stream_id, o.value_id): o for o in ev.outcomes})
                    elif b'"rejection"' in raw:
                        rej = Rejection.model_validate_json(raw)
                        if rej.source_topic == self.market.topics.values:
                            self.value_rejections.append((rej.request_id, rej.reason))
        finally:
            await reader.stop()
        return out

    async def read(self, c: MarketClient) -> dict[str, list[bytes]]:
        reader = TopicReader(c.bootstrap, [self.market.topics.inbox(b) for b in BUYERS])
        await reader.start()
        msgs: list[tuple[bytes | None, bytes]] = []
        while batch := await reader.poll(1.0):
            msgs += batch
        await reader.stop()
        out: dict[str, list[bytes]] = {b: [] for b in BUYERS}
        for _, raw in msgs:
            out.setdefault(json.loads(raw).get("buyer_id") or "?", []).append(raw)
        return out


def _outcome_ids(msgs: list[bytes]) -> set[str]:
    ids = set()
    for raw in msgs:
        ev = json.loads(raw)
        if ev["type"] == "purchase_fulfilled":
            ids.add(ev["purchase_id"])
        elif ev["type"] == "rejection" and ev.get("request_id"):
            ids.add(ev["request_id"])
    return ids


def check_lane(lane: Lane, topics: dict[str, list[bytes]]) -> dict[str, int]:
    outcomes: dict[str, set[bytes]] = collections.defaultdict(set)
    vectors: dict[tuple[str, str, float], set[tuple[float, ...]]] = collections.defaultdict(set)
    paid: collections.Counter[tuple[str, str]] = collections.Counter()
    for msgs in topics.values():
        for raw in msgs:
            ev = json.loads(raw)
            if ev["type"] == "purchase_fulfilled":
                outcomes[ev["purchase_id"]].add(raw)
            elif (
                ev["type"] == "rejection"
                and ev.get("request_id") in lane.purchases
                and ev["reason"] != "already_answered"
            ):  # a notice: the outcome was sent
                # a refusal sent again says when it was first decided: one reason, not the same
                # bytes (a fulfilment is the same bytes every time)
                outcomes[ev["request_id"]].add(b"refused: " + ev["reason"].encode())
            if ev["type"] in ("purchase_fulfilled", "value_released"):
                for r in ev["releases"]:
                    assert r["level"] <= CAP
                    vectors[(ev["stream_id"], r["value_id"], r["level"])].add(tuple(r["values"]))
    for pid, raws in outcomes.items():
        assert len(raws) == 1, f"{pid} has {len(raws)} different outcomes"
        raw = next(iter(raws))
        if b'"purchase_fulfilled"' in raw:
            ev = PurchaseFulfilled.model_validate_json(raw)
            paid[(ev.buyer_id, ev.stream_id)] += ev.price_minor
    assert set(outcomes) == set(lane.purchases), "a purchase has no outcome"
    twice = {k: v for k, v in vectors.items() if len(v) > 1}
    assert not twice, f"re-noised releases: {list(twice)[:3]}"
    ledger = lane.market.ledger()
    for s in STREAMS:
        assert ledger[s]["privacy_spent"] <= CAP
        assert ledger[s]["values_ingested"] == sum(1 for st, _ in lane.values if st == s)
        for buyer, h in ledger[s]["holders"].items():
            assert h["paid_minor"] == paid[(buyer, s)], (s, buyer, h, paid[(buyer, s)])
    return {
        "purchases": len(lane.purchases),
        "fulfilled": sum(1 for v in outcomes.values() if b'"purchase_fulfilled"' in next(iter(v))),
        "outcome_messages": sum(
            1 for msgs in topics.values() for m in msgs if b'"purchase_id"' in m
        ),
        "value_level_pairs_checked": len(vectors),
        "values": len(lane.values),
        "values_resent": lane.values_resent,
        "first_resent": lane.missing_values,
    }


def test_crash_anywhere_many_times(broker: Any, tmp_path: Any) -> None:
    lanes = [Lane(Market(broker, tmp_path / f"lane{i}"), i) for i in range(LANES)]
    for lane in lanes:
        lane.market.tmp.mkdir(parents=True, exist_ok=True)
        opener = lane.market.start_worker()  # accounts first, by a worker without fail points
        lane.market.open_accounts("seller1", *BUYERS)
        opener.stop()
    drivers = [
        threading.Thread(target=lambda ln=lane: ln.run_driver(), daemon=True) for lane in lanes
    ]
    for d in drivers:
        d.start()
    supervisors = [
        threading.Thread(target=lane.supervise, args=(-(-CRASHES // len(lanes)),)) for lane in lanes
    ]
    t0 = time.monotonic()
    for s in supervisors:
        s.start()
    for s in supervisors:
        s.join(timeout=1500)
    for lane in lanes:
        lane.stop.set()
    for d in drivers:
        d.join(timeout=30)
    elapsed = time.monotonic() - t0
    try:
        assert not [f for lane in lanes for f in lane.failures], lanes[0].failures[:1]
        summary: dict[str, Any] = {}

        errors: list[BaseException] = []

        def settle(lane: Lane) -> None:  # the lanes settle side by side
            try:
                lane.market.start_worker()  # a clean worker finishes the backlog
                summary[lane.name] = check_lane(lane, lane.market.run(lane.settle))
            except BaseException as exc:  # re-raised below, in the test's own thread
                errors.append(exc)

        settlers = [threading.Thread(target=settle, args=(lane,)) for lane in lanes]
        for t in settlers:
            t.start()
        for t in settlers:
            t.join(timeout=600)
        if errors:
            raise errors[0]
        assert set(summary) == {lane.name for lane in lanes}, f"a lane did not settle: {summary}"
        crashes = sum((lane.crashes for lane in lanes), collections.Counter())
        print(
            f"\ncrash test: {sum(crashes.values())} crashes in {elapsed:.0f}s by fail point "
            f"{dict(crashes)}; per lane {summary}"
        )
        assert sum(crashes.values()) >= CRASHES
        assert len(crashes) >= 4, f"fail points not all exercised: {crashes}"
    finally:
        for lane in lanes:
            lane.market.stop()
