"""Sizing benchmark: how the market's paths scale with workers, and what a worker core does.

Run ``python -m bench.scale`` (``--quick`` for a smoke run). On one embedded broker, for 1, 2
and 3 workers of one market (same consumer group, 6 partitions, so the streams spread evenly),
it measures open-loop throughput of

* **ingest** — values on 12 streams, each with 2 subscribed holders;
* **purchase** — purchases buying the next step on many streams (4 retained values each),
  sealed to the buyers' keys, with a signed receipt;

and the CPU time the worker processes used meanwhile (``/proc/<pid>/stat``, :mod:`bench.machine`;
the broker's too), so each row also gives **events per worker CPU-second**: the rate one core
sustains, which is what sizing needs. As in :mod:`bench.service`, each open-loop run follows a
quiet window whose idle rate is reported and subtracted in the "net" column. Throughput with
more workers is limited by the cores left beside the broker and the load generator; on a 2-core
machine that ceiling comes quickly.
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

from bench.machine import Machine, Meter
from bench.service import (
    BROKER,
    FETCH_WAIT_MS,
    GENERATOR,
    IDLE_S,
    MARKET_ENV,
    SELLER,
    WORKER,
    Cost,
    Window,
    _Bench,
    _drain,
    _pid,
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
    cost: Cost

    @property
    def per_core(self) -> float:
        """Events per CPU-second of the worker processes (gross)."""
        return 1e6 / max(self.cost.us(WORKER), 1e-9)


async def _ingest_many(b: _Bench, n: int) -> tuple[float, Cost | None]:
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
    payloads = [
        (_value_payload(i, market, streams[i % len(streams)]), streams[i % len(streams)].encode())
        for i in range(n)
    ]
    await b.open()
    t0 = time.perf_counter()
    futs = [await b.prod.send(b.topics.values, p, key=k) for p, k in payloads]
    await asyncio.gather(*futs)
    got = await _drain([reader], n * len(holders), 600)
    rate = got / len(holders) / (time.perf_counter() - t0)
    cost, _ = await b.close(n)
    return rate, cost


async def _run_paths(
    settings: Settings, n: int, meter: Meter, workers: int, idle_s: float
) -> list[Measure]:
    from aiokafka import AIOKafkaProducer

    topics = Topics(settings.prefix, settings.partitions)
    out = []
    async with MarketClient(settings.bootstrap, topics, party=SELLER) as c:
        await c.open_account(SELLER, timeout=60)
        prod = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap, linger_ms=5, max_batch_size=262144
        )
        await prod.start()
        window = Window(meter, settings.bootstrap, None, idle_s)  # CPU, not bytes
        b = _Bench(topics, settings.bootstrap, c, prod, [], n, 10, window)
        try:
            for name in ("ingest", "purchase"):
                if name == "ingest":
                    rate, cost = await _ingest_many(b, n)
                else:
                    row = await _purchases(b)
                    rate, cost = row.rate, row.cost
                assert cost is not None
                out.append(Measure(name, workers, rate, cost))
                await _stop_readers(b)  # idle readers would poll through the next path
        finally:
            await prod.stop()
            await _stop_readers(b)
    return out


def measure(
    broker: EmbeddedBroker, workers: int, n: int, workdir: Path, idle_s: float = IDLE_S
) -> list[Measure]:
    tag = uuid.uuid4().hex[:6]
    base = replace(
        Settings(
            broker=broker.url,
            app_id=f"scale-{tag}",
            prefix=f"scale{tag}",
            partitions=PARTITIONS,
            log_level="warn",
            require_encryption=False,
        ).for_tansu(),
        fetch_max_wait_ms=FETCH_WAIT_MS,
    )
    # the workers of one market share its signing key and noise secret (values are sealed to
    # it), and one seller registers every stream
    env = MARKET_ENV
    procs = []
    try:
        for i in range(workers):
            s = replace(base, web_port=find_free_port(), data_dir=workdir / f"{tag}-w{i}")
            procs.append(ChildWorker(s, log_path=workdir / f"{tag}-w{i}.log", env=env).start())
        for w in procs:
            w.wait_healthy(90)
        time.sleep(2 * base.session_timeout)  # let the group settle on its final assignment
        pids = [w.proc.pid for w in procs if w.proc is not None]
        meter = Meter({WORKER: pids, BROKER: [_pid(broker)], GENERATOR: [os.getpid()]})
        return asyncio.run(_run_paths(base, n, meter, workers, idle_s))
    finally:
        for w in procs:
            w.stop()


def _spread(xs: list[float], fmt: str) -> str:
    """``min / median / max`` over runs (one number for one run)."""
    if len(xs) == 1:
        return format(xs[0], fmt)
    return f"{min(xs):{fmt}} / {statistics.median(xs):{fmt}} / {max(xs):{fmt}}"


def render(runs: list[list[Measure]]) -> str:
    """One row per path and worker count: min / median / max over the runs (each run on its
    own broker); the ratio to one worker is taken within a run."""
    lines = [
        "Events/s: wall clock. CPU: user + system CPU time from `/proc` over the open-loop run "
        "(all workers together); net: less the idle rate of a quiet window just before. Each "
        f"cell: min / median / max of {len(runs)} runs.",
        "",
        "| path | workers | events/s | vs 1 worker | worker µs/event | net of idle | events "
        "per worker CPU-second | broker µs/event | net of idle | idle cores: workers, broker |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for first in runs[0]:
        ms = [m for run in runs for m in run if (m.path, m.workers) == (first.path, first.workers)]
        base = [m.rate for run in runs for m in run if (m.path, m.workers) == (first.path, 1)]
        cs = [m.cost for m in ms]
        lines.append(
            f"| {first.path} | {first.workers} | {_spread([m.rate for m in ms], ',.0f')} | "
            f"{_spread([m.rate / b for m, b in zip(ms, base, strict=True)], '.2f')}x | "
            f"{_spread([c.us(WORKER) for c in cs], ',.0f')} | "
            f"{_spread([c.us(WORKER, net=True) for c in cs], ',.0f')} | "
            f"{_spread([m.per_core for m in ms], ',.0f')} | "
            f"{_spread([c.us(BROKER) for c in cs], ',.0f')} | "
            f"{_spread([c.us(BROKER, net=True) for c in cs], ',.0f')} | "
            f"{_spread([c.idle.cores(WORKER) for c in cs], '.2f')}, "
            f"{_spread([c.idle.cores(BROKER) for c in cs], '.2f')} |"
        )
    return "\n".join(lines)


def one_run(n: int, counts: tuple[int, ...], workdir: Path, idle_s: float) -> list[Measure]:
    """Every worker count on one fresh embedded broker."""
    workdir.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        results = [m for k in counts for m in measure(broker, k, n, workdir, idle_s)]
    return sorted(results, key=lambda m: (m.path, m.workers))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, 1 and 2 workers, 1 run")
    p.add_argument("--runs", type=int, default=None, help="independent runs (default 3; quick 1)")
    args = p.parse_args(argv)
    n = 400 if args.quick else 4000
    counts = (1, 2) if args.quick else (1, 2, 3)
    idle_s = 1.0 if args.quick else IDLE_S
    runs = args.runs or (1 if args.quick else 3)
    workdir = Path(tempfile.mkdtemp(prefix="emarket-scale-"))
    machine = Machine.now()
    results = [one_run(n, counts, workdir / f"run{i}", idle_s) for i in range(runs)]
    print(
        f"## Scaling on the embedded broker ({n:,} events per path, {PARTITIONS} partitions, "
        f"{runs} runs)\n"
    )
    print(render(results))
    per_core = {
        path: statistics.median(
            m.per_core for run in results for m in run if m.path == path and m.workers == 1
        )
        for path in ("ingest", "purchase")
    }
    print(
        "\nmedian events per worker CPU-second, one worker: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in per_core.items())
    )
    print(machine.line())
    print(f"(logs: {workdir})", file=sys.stderr)  # not part of the result
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
