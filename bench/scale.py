"""Sizing benchmark: how the market's paths scale with workers, and what a worker core does.

Run ``python -m bench.scale`` (``--quick`` for a smoke run). On one embedded broker, for 1, 2
and 3 workers of one market (same consumer group, 6 partitions, so the streams spread evenly),
it measures open-loop throughput of

* **ingest** — values on 12 streams, each with 2 subscribed holders;
* **purchase** — purchases buying the next step on many streams (4 retained values each),
  sealed to the buyers' keys, with a signed receipt;

and the CPU time the worker processes used meanwhile (``/proc/<pid>/stat``), so each row also
gives **events per worker CPU-second**: the rate one core sustains, which is what sizing needs.
Throughput with more workers is limited by the cores left beside the broker and the load
generator; on a 2-core machine that ceiling comes quickly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from bench.service import (
    BENCH_ENV,
    FETCH_WAIT_MS,
    SELLER,
    _Bench,
    _drain,
    _purchases,
    _registration,
    _stop_readers,
    _value_payload,
)
from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.client import MarketClient
from streams.clients.keys import Party
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker

PARTITIONS = 6
INGEST_STREAMS = 12


@dataclass
class Measure:
    path: str
    workers: int
    rate: float
    cpu_s: float
    wall_s: float

    @property
    def per_core(self) -> float:
        """Events per CPU-second of the worker processes."""
        return self.rate * self.wall_s / max(self.cpu_s, 1e-9)


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of the processes (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / tick


async def _ingest_many(b: _Bench, n: int) -> float:
    """Open-loop values/s over INGEST_STREAMS streams with 2 holders each."""
    streams = [f"in{i}" for i in range(INGEST_STREAMS)]
    holders = [Party.generate(f"h{i}", sealing=False) for i in range(2)]
    for who in holders:
        await b.client.open_account(who, timeout=60)
    for s in streams:
        await b.client.register(_registration(s, [0.5, 1.0], 1e6), timeout=60)
        for who in holders:
            await b.client.buy(s, max_price_minor=0, timeout=60, party=who)
    reader = await b.reader([b.topics.inbox(x.account_id) for x in holders])
    await _drain([reader], 2 + 2 * len(streams), 10)
    market = b.topics.prefix
    payloads = [(_value_payload(i, market, streams[i % len(streams)]),
                 streams[i % len(streams)].encode()) for i in range(n)]  # fmt: skip
    b.mark()
    t0 = time.perf_counter()
    futs = [await b.prod.send(b.topics.values, p, key=k) for p, k in payloads]
    await asyncio.gather(*futs)
    got = await _drain([reader], n * len(holders), 600)
    b.mark()
    return got / len(holders) / (time.perf_counter() - t0)


async def _run_paths(settings: Settings, n: int, pids: list[int], workers: int) -> list[Measure]:
    from aiokafka import AIOKafkaProducer

    topics = Topics(settings.prefix, settings.partitions)
    out = []
    async with MarketClient(settings.bootstrap, topics, party=SELLER) as c:
        await c.open_account(SELLER, timeout=60)
        prod = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, linger_ms=5,
                                max_batch_size=262144)  # fmt: skip
        await prod.start()
        b = _Bench(topics, settings.bootstrap, c, prod, [], n, 10)
        # CPU time and wall time of the open-loop part only (not the setup around it)
        stamps: list[tuple[float, float]] = []
        b.marks.append(lambda: stamps.append((_cpu_seconds(pids), time.perf_counter())))
        try:
            for name in ("ingest", "purchase"):
                stamps.clear()
                if name == "ingest":
                    rate = await _ingest_many(b, n)
                else:
                    rate = (await _purchases(b)).rate
                (cpu0, t0), (cpu1, t1) = stamps[:2]
                out.append(Measure(name, workers, rate, cpu1 - cpu0, t1 - t0))
                await _stop_readers(b)  # idle readers would poll through the next path
        finally:
            await prod.stop()
            await _stop_readers(b)
    return out


def measure(broker: EmbeddedBroker, workers: int, n: int, workdir: Path) -> list[Measure]:
    tag = uuid.uuid4().hex[:6]
    base = replace(
        Settings(broker=broker.url, app_id=f"scale-{tag}", prefix=f"scale{tag}",
                 partitions=PARTITIONS, log_level="warn",
                 require_encryption=False).for_tansu(),
        fetch_max_wait_ms=FETCH_WAIT_MS,
    )  # fmt: skip
    # the workers of one market share its signing key and noise secret (values are sealed to it)
    env = BENCH_ENV
    procs = []
    try:
        for i in range(workers):
            s = replace(base, web_port=find_free_port(), data_dir=workdir / f"{tag}-w{i}")
            procs.append(ChildWorker(s, log_path=workdir / f"{tag}-w{i}.log", env=env).start())
        for w in procs:
            w.wait_healthy(90)
        time.sleep(2 * base.session_timeout)  # let the group settle on its final assignment
        pids = [w.proc.pid for w in procs if w.proc is not None]
        return asyncio.run(_run_paths(base, n, pids, workers))
    finally:
        for w in procs:
            w.stop()


def render(results: list[Measure]) -> str:
    base = {m.path: m.rate for m in results if m.workers == 1}
    lines = [
        "| path | workers | events/s | vs 1 worker | worker CPU s | events per worker "
        "CPU-second |",
        "|---|---|---|---|---|---|",
    ]
    for m in results:
        lines.append(f"| {m.path} | {m.workers} | {m.rate:,.0f} | {m.rate / base[m.path]:.2f}x | "
                     f"{m.cpu_s:.1f} | {m.per_core:,.0f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, 1 and 2 workers")
    args = p.parse_args(argv)
    n = 400 if args.quick else 4000
    counts = (1, 2) if args.quick else (1, 2, 3)
    workdir = Path(tempfile.mkdtemp(prefix="emarket-scale-"))
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        results = [m for k in counts for m in measure(broker, k, n, workdir)]
    results.sort(key=lambda m: (m.path, m.workers))
    print(f"## Scaling on the embedded broker ({n:,} events per path, {PARTITIONS} partitions, "
          f"{os.cpu_count()} cores)\n")  # fmt: skip
    print(render(results))
    per_core = {path: statistics.median(m.per_core for m in results if m.path == path)
                for path in ("ingest", "purchase")}  # fmt: skip
    print("\nmedian events per worker CPU-second: "
          + ", ".join(f"{k} {v:,.0f}" for k, v in per_core.items()))  # fmt: skip
    print(f"(logs: {workdir})", file=sys.stderr)  # not part of the result
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
