"""``python -m bench.inboxes --service``: v1 against v2 inboxes on the embedded broker.

Two markets on one broker, one worker each (v1, v2), the same sealed seller, buyers and
streams; rounds of concurrent purchases alternate between them. Per purchase: the records and
bytes each market produced (:mod:`bench.produced`), by topic kind, and its worker's and the
broker's CPU over the round less their idle rate (measured once before the rounds, over the
same seconds) — the broker's share is both markets' (the idle one only polls).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.machine import cpu_seconds
from bench.produced import ends, produced_since
from bench.service import BENCH_KEYS, MARKET_ENV, STEPS, _registration
from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.client import MarketClient
from streams.clients.keys import Party
from streams.wire.events import PurchaseFulfilled
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker

BUYERS = 16
KEY = BENCH_KEYS.public_key_b64
IDLE_S = 3.0


@dataclass
class _Market:
    layout: str
    settings: Settings
    worker: ChildWorker
    idle_per_s: float = 0.0


@dataclass
class _Round:
    records: dict[str, float]
    bytes_per: float
    worker_us: float
    broker_us: float


def _kind(prefix: str, app: str) -> Callable[[str], str]:
    def kind(topic: str) -> str:
        if topic.startswith(f"{prefix}.inbox"):
            return "inbox"
        if topic.startswith(app):
            return "state"
        return topic.removeprefix(f"{prefix}.")

    return kind


async def _prepare(m: _Market, seller: Party, buyers: list[Party], streams: int) -> None:
    topics = m.settings.topics()
    async with MarketClient(m.settings.bootstrap, topics, party=seller, market_public_key=KEY) as c:
        for p in (seller, *buyers):
            assert (await c.open_account(p, timeout=60)).type == "account"
        levels = [round(0.25 * (k + 1), 2) for k in range(STEPS)]
        for s in range(streams):
            reg = _registration(f"s{s}", levels, levels[-1])
            assert (await c.register(reg)).type == "catalog_entry"
            batch = c.value_batch(
                f"s{s}", [(f"v{i}", [1.0, 2.0, 3.0, 4.0], None) for i in range(4)]
            )
            await c.publish_batch(batch)


async def _round(
    m: _Market, buyers: list[Party], streams: int, step: int, broker_pid: int, idle_broker: float
) -> _Round:
    s = m.settings
    want = lambda t: t.startswith((f"{s.prefix}.", f"{s.app_id}-"))  # noqa: E731
    start = await ends(s.bootstrap, want)
    since = int(time.time() * 1000)
    assert m.worker.proc is not None
    w0, b0, t0 = cpu_seconds(m.worker.proc.pid), cpu_seconds(broker_pid), time.monotonic()
    async with MarketClient(s.bootstrap, s.topics(), party=buyers[0], market_public_key=KEY) as c:

        async def buy(k: int) -> None:
            got = await c.buy(
                f"s{k % streams}", party=buyers[k % len(buyers)], max_price_minor=10**9
            )
            assert isinstance(got, PurchaseFulfilled), got

        await asyncio.gather(*(buy(k) for k in range(step * streams, (step + 1) * streams)))
    wall = time.monotonic() - t0
    worker = cpu_seconds(m.worker.proc.pid) - w0 - m.idle_per_s * wall
    broker = cpu_seconds(broker_pid) - b0 - idle_broker * wall
    await asyncio.sleep(1.0)  # the last outputs reach the broker
    got = await produced_since(s.bootstrap, want, start, since, streams)
    per = got.per_event(_kind(s.prefix, s.app_id))
    return _Round(
        {k: r for k, (r, _) in per.items()},
        got.bytes_per_event,
        worker / streams * 1e6,
        broker / streams * 1e6,
    )


def _idle(pids: list[int]) -> list[float]:
    before = [cpu_seconds(p) for p in pids]
    time.sleep(IDLE_S)
    return [(cpu_seconds(p) - b) / IDLE_S for p, b in zip(pids, before, strict=True)]


def service(streams: int, runs: int) -> str:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        markets: list[_Market] = []
        for v in (1, 2):
            tag = uuid.uuid4().hex[:6]
            settings = Settings(
                broker=broker.url,
                app_id=f"bench-i{v}-{tag}",
                prefix=f"benchi{v}{tag}",
                data_dir=Path(tmp) / f"v{v}",
                web_port=find_free_port(),
                log_level="warn",
                inboxes=v,
                inbox_partitions=16,
            ).for_tansu()
            w = ChildWorker(settings, Path(tmp) / f"v{v}.log", env=MARKET_ENV).start()
            markets.append(_Market(f"v{v}", settings, w))
        try:
            return asyncio.run(_measure(broker, markets, streams, runs))
        finally:
            for m in markets:
                m.worker.stop()


async def _measure(broker: EmbeddedBroker, markets: list[_Market], streams: int, runs: int) -> str:
    seller = Party.generate("seller")
    buyers = [Party.generate(f"buyer{i}") for i in range(BUYERS)]
    for m in markets:
        m.worker.wait_healthy(90)
        await _prepare(m, seller, buyers, streams)
    pid = broker.pid
    assert pid is not None
    pids = [m.worker.proc.pid for m in markets if m.worker.proc is not None]
    *idle_workers, idle_broker = _idle([*pids, pid])
    for m, idle in zip(markets, idle_workers, strict=True):
        m.idle_per_s = idle
    rounds: dict[str, list[_Round]] = {m.layout: [] for m in markets}
    for step in range(min(runs, STEPS)):
        for m in markets:
            rounds[m.layout].append(await _round(m, buyers, streams, step, pid, idle_broker))
    return _render(rounds, streams)


def _render(rounds: dict[str, list[_Round]], streams: int) -> str:
    base = rounds["v1"]
    lines = [
        f"{streams} concurrent purchases per round, {len(base)} rounds per layout, interleaved",
        "| inboxes | records/purchase (by kind) | bytes/purchase | worker CPU µs | v2/v1 | "
        "broker CPU µs | v2/v1 |",
        "|---|---|---|---|---|---|---|",
    ]
    w1 = statistics.median(r.worker_us for r in base)
    b1 = statistics.median(r.broker_us for r in base)
    for layout, rs in rounds.items():
        kinds: dict[str, float] = {}
        for r in rs:
            for k, v in r.records.items():
                kinds[k] = kinds.get(k, 0.0) + v / len(rs)
        shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(kinds.items()))
        w = statistics.median(r.worker_us for r in rs)
        b = statistics.median(r.broker_us for r in rs)
        total = sum(kinds.values())
        size = statistics.median(r.bytes_per for r in rs)
        lines.append(
            f"| {layout} | {total:.2f} ({shown}) | {size:.0f} | {w:.0f} | {w / w1:.2f} | "
            f"{b:.0f} | {b / b1:.2f} |"
        )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines.append(f"\nload average {load}")
    return "\n".join(lines)
