"""Operator pages under a flood: purchase latency with and without clients looping on them.

Run ``python -m bench.pages`` (``--streams 256`` for a smoke run). On the embedded broker, one
worker with the default page intervals (``EMARKET_LEDGER_EVERY`` and ``EMARKET_METRICS_EVERY``,
5 s) holds 4,096 streams, each with one value (so each has its figures on ``/metrics``). Closed-
loop purchases (one at a time, each on a stream not bought before) are timed in rounds that
alternate *quiet* and *flooded*: in a flooded round four client processes loop on ``/ledger``
(with the operators' token) and ``/metrics`` as fast as the worker answers. Each round's p95 is
compared with the quiet rounds' of the same run: the ratio is the pages' cost to a buyer. Each
round has a buyer of its own (the client reads the buyer's inbox from its beginning at each
purchase: one buyer's purchases would grow slower over the run), and the streams are
registered all at once (:mod:`bench.bulk`).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bulk import one_worker, register_streams
from bench.machine import Machine
from bench.service import BENCH_KEYS, MARKET_ENV, SELLER
from streams.broker.embedded import EmbeddedBroker
from streams.clients.client import MarketClient
from streams.clients.keys import Party
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker

FLOODERS = 4


def flood(url: str, token: str, served: Any, stop: Any) -> None:
    """One page client: /ledger then /metrics, again and again, until ``stop``."""
    while not stop.is_set():
        for path in ("/ledger", "/metrics"):
            request = urllib.request.Request(url + path)
            request.add_header("Authorization", f"Bearer {token}")
            with urllib.request.urlopen(request, timeout=120) as resp:
                resp.read()
            with served.get_lock():
                served.value += 1


@dataclass
class Round:
    flooded: bool
    latencies: list[float]
    pages: int
    load: float

    @property
    def p95(self) -> float:
        return statistics.quantiles(self.latencies, n=20)[-1]


async def _setup(
    c: MarketClient, worker: ChildWorker, s: Settings, streams: list[str], buyers: list[Party]
) -> None:
    """The seller's and the buyers' accounts, then every stream with one value, all at once
    (:mod:`bench.bulk`: one round trip each would take minutes at 4,096 streams)."""
    await c.open_account(SELLER, timeout=60)
    for buyer in buyers:
        await c.open_account(buyer, timeout=60)
    await register_streams(worker, s.bootstrap, Topics(s.prefix, s.partitions), streams)


async def _round(c: MarketClient, buyer: Party, streams: list[str]) -> list[float]:
    out = []
    for s in streams:
        t0 = time.perf_counter()
        await c.buy(s, max_price_minor=10**9, party=buyer, timeout=120)
        out.append(time.perf_counter() - t0)
    return out


def run(
    n_streams: int, rounds: int, per_round: int, workdir: Path, sizes: list[int]
) -> list[Round]:
    """Every round on one fresh embedded broker; ``sizes`` gets the two pages' bytes."""
    workdir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    streams = [f"s{i:05d}" for i in range(n_streams)]
    # a buyer per round: the client reads its buyer's inbox from the beginning at each
    # purchase, so one buyer's purchases would slow down as the run goes on
    buyers = [Party.generate(f"pages-buyer{r}", sealing=False) for r in range(2 * rounds + 1)]
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        s = one_worker(broker, "pages", tag, workdir)
        # a partition's share of the stream bounds (4,096 over 4) is below what ids hash to it
        bound = str(max(4096, 2 * n_streams))
        env = {**MARKET_ENV, "EMARKET_MAX_STREAMS": bound, "EMARKET_MAX_STREAMS_PER_SELLER": bound}
        worker = ChildWorker(s, log_path=workdir / "w0.log", env=env).start()
        try:
            worker.wait_healthy(90)
            return asyncio.run(_measure(s, worker, streams, buyers, rounds, per_round, sizes))
        finally:
            worker.stop()


async def _measure(
    s: Settings,
    worker: ChildWorker,
    streams: list[str],
    buyers: list[Party],
    rounds: int,
    k: int,
    sizes: list[int],
) -> list[Round]:
    out = []
    async with MarketClient(s.bootstrap, Topics(s.prefix, s.partitions), party=SELLER) as c:
        t0 = time.perf_counter()
        await _setup(c, worker, s, streams, buyers)
        took = time.perf_counter() - t0
        print(f"set up {len(streams):,} streams in {took:.0f} s ({len(streams) / took:.0f}/s)")
        token = BENCH_KEYS.operator_token
        sizes += [
            len(str(worker.get(p, timeout=120, token=token))) for p in ("/ledger", "/metrics")
        ]
        await _round(c, buyers[-1], streams[-3:])  # the first purchases warm the paths up
        for r in range(2 * rounds):
            flooded = r % 2 == 1
            served = multiprocessing.Value("i", 0)
            stop = multiprocessing.Event()
            procs = [
                multiprocessing.Process(
                    target=flood, args=(worker.url, BENCH_KEYS.operator_token, served, stop)
                )
                for _ in range(FLOODERS if flooded else 0)
            ]
            for p in procs:
                p.start()
            try:
                load = os.getloadavg()[0]
                lat = await _round(c, buyers[r], streams[r * k : (r + 1) * k])
            finally:
                stop.set()
                for p in procs:
                    p.join(120)
            out.append(Round(flooded, lat, served.value, load))
    return out


def render(rounds: list[Round], n_streams: int, page_bytes: tuple[int, int]) -> str:
    quiet = [r for r in rounds if not r.flooded]
    base = statistics.median(r.p95 for r in quiet)
    lines = [
        f"## Pages under a flood ({n_streams:,} streams, one worker, {FLOODERS} clients "
        f"looping on /ledger and /metrics in the flooded rounds)\n",
        f"/ledger {page_bytes[0]:,} B, /metrics {page_bytes[1]:,} B\n",
        "| round | pages served | purchase p50 ms | p95 ms | p95 / quiet p95 | load (1 min) |",
        "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rounds):
        lines.append(
            f"| {i + 1} {'flooded' if r.flooded else 'quiet'} | {r.pages:,} | "
            f"{statistics.median(r.latencies) * 1e3:.1f} | {r.p95 * 1e3:.1f} | "
            f"{r.p95 / base:.2f}x | {r.load:.2f} |"
        )
    flooded = statistics.median(r.p95 for r in rounds if r.flooded)
    lines.append(f"\nflooded p95 / quiet p95 (medians over rounds): {flooded / base:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=4096, help="streams held (default 4096)")
    p.add_argument("--rounds", type=int, default=3, help="quiet/flooded pairs (default 3)")
    p.add_argument("--purchases", type=int, default=60, help="purchases per round (default 60)")
    args = p.parse_args(argv)
    if 2 * args.rounds * args.purchases + 3 > args.streams:
        p.error("--streams must exceed 2 × --rounds × --purchases + 3 (one stream a purchase)")
    machine = Machine.now()
    workdir = Path(tempfile.mkdtemp(prefix="emarket-pages-"))
    sizes: list[int] = []
    rounds = run(args.streams, args.rounds, args.purchases, workdir, sizes)
    print(render(rounds, args.streams, (sizes[0], sizes[1])))
    print(machine.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
