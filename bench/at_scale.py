"""Measured at scale: many accounts, 4,096 streams, purchases and values flowing.

Run ``python -m bench.at_scale`` (``--accounts 200 --streams 256`` for a smoke run; ``--inboxes
v2`` on a market with partitioned inboxes). On the embedded broker, one worker opening accounts
by invitation (the operators' path, :mod:`bench.bulk`, with the openings allowance raised):

1. the seller and a few buyers are opened; the broker's topics and partitions, the worker's
   and the broker's RSS are read (*empty*);
2. ``--streams`` streams are registered, one value each, all at once (*streams*): the memory
   per stream is the difference over the streams;
3. **baseline**: closed-loop purchases (each on a stream not bought before, by a few buyers)
   while values flow at ``--values-per-s`` over all the streams: purchase p50, p95, p99;
4. ``--accounts`` accounts are opened, ``--chunk`` at a time, their invitations sent at once,
   each chunk's rate printed (*accounts*): topics, partitions and memory per account;
5. the same purchases and values again, with the accounts there: p99 against the baseline's.

``--inboxes`` is passed to the worker as ``EMARKET_INBOXES`` (the inbox layout: ``v1`` a topic
per account, ``v2`` one partitioned topic); the table says which. Memory figures are RSS
differences of whole processes (allocator slack included), so read them as upper bounds; the
latency ratio is against the same run's baseline, and every row gives the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from bench.bulk import INVITE_ENV, PARTITIONS, one_worker, open_accounts, register_streams
from bench.flood_garbage import rss_mb
from bench.machine import Machine, cpu_seconds, load_1min
from bench.service import MARKET_ENV, SELLER, _value_payload
from streams.broker.embedded import EmbeddedBroker
from streams.broker.kafka_internals import fresh_metadata
from streams.clients.client import MarketClient
from streams.clients.keys import Party
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker

BUYERS = 8
"""Buyers per latency phase (the client reads a buyer's inbox from its beginning at each
purchase: few purchases per buyer keep that read small, the same in both phases)."""


@dataclass(frozen=True)
class Snapshot:
    """The broker's topics and the processes' memory at one point of the run."""

    what: str
    accounts: int
    streams: int
    topics: int
    partitions: int
    worker_mb: float
    broker_mb: float
    load: float


@dataclass(frozen=True)
class Phase:
    """Closed-loop purchase latencies (seconds) with values flowing meanwhile."""

    what: str
    latencies: list[float]
    values: int
    seconds: float
    load: float
    cpu_ms: tuple[float, float, float]
    """CPU per purchase of the worker, the broker and this process (the client), in ms: where
    the time goes. It includes the values sent meanwhile (``--values-per-s`` whatever the
    purchases' pace: a slower phase has more values per purchase); ``cpu_ms × purchases /
    seconds`` is the share of a core each used."""

    def q(self, p: int) -> float:
        """The ``p``-th percentile, in ms."""
        return statistics.quantiles(self.latencies, n=100)[p - 1] * 1e3


@dataclass
class Run:
    settings: Settings
    worker: ChildWorker
    broker: EmbeddedBroker
    args: argparse.Namespace
    streams: list[str]
    snapshots: list[Snapshot]
    phases: list[Phase]
    openings: list[str]
    seller: Party
    """Registers every stream and sends the values: on v2 inboxes every account needs a
    sealing key (``encryption_required``), which :data:`~bench.service.SELLER` lacks."""
    values_sent: int = 0
    """Value batches sent so far (each value's id is its number: unique in every stream)."""

    @property
    def topics(self) -> Topics:
        return Topics(self.settings.prefix, self.settings.partitions)


async def _snapshot(run: Run, what: str, accounts: int, streams: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=run.settings.bootstrap)
    await admin.start()
    try:
        cluster = await fresh_metadata(admin)
    finally:
        await admin.close()
    names = cluster.topics()
    parts = sum(len(cluster.partitions_for_topic(t) or ()) for t in names)
    worker_pid = run.worker.proc.pid if run.worker.proc else None
    run.snapshots.append(
        Snapshot(
            what,
            accounts,
            streams,
            len(names),
            parts,
            rss_mb(worker_pid),
            rss_mb(run.broker.pid),
            load_1min(),
        )
    )


async def _values(run: Run, stop: asyncio.Event) -> None:
    """Value batches (one value each) round the streams at ``--values-per-s`` until ``stop``."""
    prod = AIOKafkaProducer(bootstrap_servers=run.settings.bootstrap, linger_ms=5)
    await prod.start()
    market, period = run.topics.prefix, 1.0 / run.args.values_per_s
    try:
        t0, n = time.perf_counter(), 0
        while not stop.is_set():
            run.values_sent += 1
            stream = run.streams[run.values_sent % len(run.streams)]
            payload = _value_payload(run.values_sent, market, stream, seller=run.seller)
            await prod.send(run.topics.values, payload, key=stream.encode())
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * period - time.perf_counter()))
        await prod.flush()
    finally:
        await prod.stop()


async def _phase(
    run: Run, c: MarketClient, what: str, buyers: list[Party], streams: list[str]
) -> None:
    """Closed-loop purchases on ``streams`` by ``buyers`` in turn, values flowing meanwhile."""
    stop = asyncio.Event()
    before = run.values_sent
    flowing = asyncio.create_task(_values(run, stop))
    out = []
    load = load_1min()
    cpu0 = _cpu(run)
    t0 = time.perf_counter()
    try:
        for i, s in enumerate(streams):
            t = time.perf_counter()
            await c.buy(s, max_price_minor=10**9, party=buyers[i % len(buyers)], timeout=120)
            out.append(time.perf_counter() - t)
    finally:
        stop.set()
        await flowing
    took = time.perf_counter() - t0
    cw, cb, cc = (1e3 * (x - y) / len(streams) for x, y in zip(_cpu(run), cpu0, strict=True))
    load = max(load, load_1min())
    run.phases.append(Phase(what, out, run.values_sent - before, took, load, (cw, cb, cc)))


def _cpu(run: Run) -> tuple[float, float, float]:
    """CPU seconds so far of the worker, the broker and this process."""
    assert run.worker.proc is not None and run.broker.pid is not None
    return cpu_seconds(run.worker.proc.pid), cpu_seconds(run.broker.pid), time.process_time()


async def _accounts(run: Run) -> None:
    """Open ``--accounts`` accounts, ``--chunk`` at a time, noting each chunk's rate."""
    n, chunk = run.args.accounts, run.args.chunk
    began = time.perf_counter()
    for start in range(0, n, chunk):
        parties = [Party.generate(f"acct{i:06d}") for i in range(start, min(n, start + chunk))]
        t0 = time.perf_counter()
        await open_accounts(run.worker, run.settings.bootstrap, run.topics, parties)
        rate = len(parties) / (time.perf_counter() - t0)
        line = (
            f"accounts {start:,}-{start + len(parties):,}: {rate:,.0f}/s (load {load_1min():.2f})"
        )
        print(line, flush=True)
        run.openings.append(line)
    took = time.perf_counter() - began
    run.openings.append(
        f"{n:,} accounts opened in {took:,.0f} s ({n / took:,.0f}/s, keys and invitations "
        f"made in this process included; load {load_1min():.2f})"
    )


async def _measure(run: Run) -> None:
    a = run.args
    buyers = [Party.generate(f"buyer{i}") for i in range(2 * BUYERS)]
    few = 1 + len(buyers)
    await open_accounts(run.worker, run.settings.bootstrap, run.topics, [run.seller, *buyers])
    await _snapshot(run, "few accounts, no streams", few, 0)
    t0 = time.perf_counter()
    await register_streams(
        run.worker, run.settings.bootstrap, run.topics, run.streams, seller=run.seller
    )
    took = time.perf_counter() - t0
    run.openings.append(
        f"{len(run.streams):,} streams registered with a value each in {took:.0f} s"
    )
    print(run.openings[-1], flush=True)
    await _snapshot(run, "few accounts, all streams", few, len(run.streams))
    k = a.purchases
    async with MarketClient(run.settings.bootstrap, run.topics, party=run.seller) as c:
        await _phase(run, c, "warm-up", buyers[:1], run.streams[-3:])
        run.phases.clear()
        await _phase(run, c, f"{few} accounts (baseline)", buyers[:BUYERS], run.streams[:k])
        await _accounts(run)
        await _snapshot(run, "all accounts, all streams", few + a.accounts, len(run.streams))
        await _phase(
            run, c, f"{few + a.accounts:,} accounts", buyers[BUYERS:], run.streams[k : 2 * k]
        )


def run(args: argparse.Namespace, workdir: Path) -> Run:
    """The whole measurement on one fresh embedded broker and worker."""
    tag = uuid.uuid4().hex[:6]
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        s = one_worker(broker, "scale", tag, workdir)
        env = {
            **MARKET_ENV,
            **INVITE_ENV,
            "EMARKET_INBOXES": args.inboxes,
            # a partition's share of the bound (4,096 over 4) is below what ids hash to it
            "EMARKET_MAX_STREAMS": str(max(4096, 2 * args.streams)),
            "EMARKET_MAX_STREAMS_PER_SELLER": str(max(4096, 2 * args.streams)),
            "EMARKET_MAX_ACCOUNTS": str(max(100_000, 2 * args.accounts)),
        }
        worker = ChildWorker(s, log_path=workdir / "w0.log", env=env).start()
        streams = [f"s{i:05d}" for i in range(args.streams)]
        seller = SELLER if args.inboxes == "v1" else Party.generate("bench")
        out = Run(s, worker, broker, args, streams, [], [], [], seller)
        try:
            worker.wait_healthy(90)
            asyncio.run(_measure(out))
        finally:
            worker.stop()
    return out


def _per(later: Snapshot, earlier: Snapshot, n: int) -> str:
    """Growth from ``earlier`` to ``later`` per one of ``n`` things, worker and broker."""
    if n <= 0:
        return "-"
    w = (later.worker_mb - earlier.worker_mb) * 1024 * 1024 / n
    b = (later.broker_mb - earlier.broker_mb) * 1024 * 1024 / n
    return f"worker {w:,.0f} B, broker {b:,.0f} B"


def _shares(p: Phase) -> str:
    """The share of a core each process used during ``p``."""
    return ", ".join(f"{ms * len(p.latencies) / p.seconds / 10:.0f} %" for ms in p.cpu_ms)


def render(r: Run) -> str:
    empty, streams, accounts = r.snapshots
    base = r.phases[0]
    lines = [
        f"## At scale ({r.args.inboxes} inboxes, one worker, {PARTITIONS} input partitions)\n",
        *(f"- {line}" for line in r.openings),
        "",
        "| point | accounts | streams | topics | partitions | worker RSS MB | broker RSS MB "
        "| load (1 min) |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {s.what} | {s.accounts:,} | {s.streams:,} | {s.topics:,} | {s.partitions:,} | "
            f"{s.worker_mb:.0f} | {s.broker_mb:.0f} | {s.load:.2f} |"
            for s in r.snapshots
        ),
        "",
        f"per stream (one value each): {_per(streams, empty, streams.streams - empty.streams)}",
        f"per account: {_per(accounts, streams, accounts.accounts - streams.accounts)}; "
        f"topics per account {(accounts.topics - streams.topics) / max(1, r.args.accounts):.3f}",
        "",
        "| purchases with values flowing | purchases | values/s | p50 ms | p95 ms | p99 ms "
        "| p99 / baseline p99 | CPU ms per purchase: worker, broker, client (% of a core) "
        "| load (1 min, highest) |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {p.what} | {len(p.latencies)} | {p.values / p.seconds:.0f} | {p.q(50):.1f} | "
            f"{p.q(95):.1f} | {p.q(99):.1f} | {p.q(99) / base.q(99):.2f}x | "
            f"{p.cpu_ms[0]:.1f}, {p.cpu_ms[1]:.1f}, {p.cpu_ms[2]:.1f} ({_shares(p)}) "
            f"| {p.load:.2f} |"
            for p in r.phases
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--accounts", type=int, default=3000, help="accounts opened (default 3000)")
    p.add_argument("--streams", type=int, default=4096, help="streams registered (default 4096)")
    p.add_argument(
        "--inboxes",
        default="v1",
        help="the worker's EMARKET_INBOXES: v1, a topic per account (default), or v2",
    )
    p.add_argument("--purchases", type=int, default=200, help="purchases per phase (default 200)")
    p.add_argument(
        "--values-per-s", type=float, default=50.0, help="values sent per second (default 50)"
    )
    p.add_argument("--chunk", type=int, default=1000, help="openings sent at once (default 1000)")
    args = p.parse_args(argv)
    if 2 * args.purchases + 3 > args.streams:
        p.error("--streams must exceed 2 × --purchases + 3 (one stream a purchase)")
    if args.purchases < 100:
        p.error("--purchases must be at least 100 (a p99 of fewer is the largest sample)")
    if min(args.accounts, args.chunk) < 1 or args.values_per_s <= 0:
        p.error("--accounts, --chunk and --values-per-s must be positive")
    machine = Machine.now()
    workdir = Path(tempfile.mkdtemp(prefix="emarket-scale-"))
    print(render(run(args, workdir)))
    print(machine.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
