"""The garbage flood of issue #40: 1-byte records on the purchases topic, 5,000 a second, a minute.

Run ``python -m bench.flood --garbage`` (``--quick`` for a 10 s smoke run; ``--rate``,
``--seconds`` to change the flood). It starts the embedded broker and one worker, then, in one
run:

1. **idle** — a legitimate buyer's closed-loop purchases (send → signed outcome in her inbox),
   each on its own stream: the baseline;
2. **control** — the same garbage at the same rate for a few seconds to a topic nobody reads,
   for what the broker keeps of a stranger's records by itself (the market cannot bound that:
   on the embedded broker nothing is ever deleted), while the buyer's purchases go on (what
   the broker and the writer cost her on a shared machine, not the market);
3. **flood** — the garbage to the purchases topic (spread over its partitions) from another
   process, while the buyer's purchases go on at a steady pace over the whole flood.

It prints the buyer's latency (p50, p95, p99 and their ratio to idle: goal p95 ≤ 2×), the
broker's and the worker's RSS growth (sampled every half second; the worker's bound is
:data:`WORKER_BOUND_MB`, the broker's is what the control says the flood's own records cost plus
what the market wrote, at the per-record cost of the control), how long the worker took to
read the whole flood, and how many records the market wrote to ``<p>.rejections`` and
``<p>.refusals`` against :meth:`~streams.core.refusal_budget.RefusalBounds.records_bound`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.flood import BUYER, SELLER, Probe, _streams, rejected_purchases
from bench.machine import Machine
from bench.service import READ_WAIT_MS, _pct
from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.client import MarketClient, TopicReader
from streams.core.refusal_budget import RefusalBounds
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker

__all__ = ["run", "write_garbage"]

GOAL_RATIO = 2.0
"""The goal: the buyer's p95 during the flood at most twice the idle p95 of the same run."""
WORKER_BOUND_MB = 64.0
"""The worker's RSS growth bound: its refusal budget keeps 65,536 digests (a few MB) and one
window per partition; everything else it holds for garbage is freed after each batch."""
SLACK = 1.25
"""The broker's bound allows this factor over the control's per-record cost (allocator noise)."""


@dataclass
class Flood:
    rate: int
    seconds: float
    control_s: float
    idle: int  # idle samples
    samples: int  # samples spread over the flood (one stream each)
    control_samples: int  # samples spread over the control
    size: int = 1  # bytes per garbage record


def rss_mb(pid: int | None) -> float:
    """Resident memory of process ``pid`` in MB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def cpu_s(pid: int | None) -> float:
    """CPU seconds (user and system) process ``pid`` has used (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


async def write_garbage(
    bootstrap: str, topic: str, rate: int, seconds: float, size: int, partitions: int
) -> int:
    """Write random ``size``-byte records to ``topic`` at ``rate`` a second for ``seconds``,
    spread over ``partitions``; return how many."""
    # batched as any producer batches (one record a batch costs the broker ~0.9 kB a record
    # instead of ~50 B, and this process could then not write 5,000 a second on 2 cores)
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
    await prod.start()
    sent = 0
    try:
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < seconds:
            due = int(elapsed * rate) + 1
            for i in range(sent, due):
                await prod.send(topic, os.urandom(size), partition=i % partitions)
            sent = due
            await asyncio.sleep(0.005)
        await prod.flush()
    finally:
        await prod.stop()
    return sent


def _writer(bootstrap: str, topic: str, f: Flood, partitions: int) -> subprocess.Popen[bytes]:
    """The stranger, in a process of its own (its CPU is not the buyer's)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.flood_garbage",
            "--write",
            bootstrap,
            topic,
            str(f.rate),
            str(f.seconds),
            str(f.size),
            str(partitions),
        ],
        stdout=subprocess.PIPE,
    )


async def _paced(probe: Probe, tag: str, n: int, seconds: float) -> list[float]:
    """``n`` purchases spread evenly over ``seconds`` (each on its stream ``tag<i>``)."""
    t0, out = time.monotonic(), []
    for i in range(n):
        wait = t0 + i * seconds / n - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        out.append(await probe.one(f"{tag}{i}"))
    return out


class Peak:
    """The highest RSS of some processes, sampled every half second while running."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids, self.peak = pids, {k: rss_mb(p) for k, p in pids.items()}
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            for k, p in self.pids.items():
                self.peak[k] = max(self.peak[k], rss_mb(p))
            await asyncio.sleep(0.5)

    def __enter__(self) -> Peak:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def _count(bootstrap: str, topic: str) -> int:
    """Records in ``topic``'s one partition, read to the end (the embedded broker's "latest"
    offset is wrong)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        n, idle = 0, 0
        while idle < 3:
            got = await consumer.getmany(tp, timeout_ms=200, max_records=10_000)
            batch = sum(len(v) for v in got.values())
            n, idle = n + batch, (0 if batch else idle + 1)
        return n
    finally:
        await consumer.stop()


@dataclass
class Result:
    idle: list[float]
    control: list[float]  # while the same garbage went to a topic nobody reads
    flood: list[float]
    sent: int
    control_sent: int
    control_mb: float
    broker_mb: tuple[float, float, float]  # before, peak during, after the worker read it all
    worker_mb: tuple[float, float, float]
    drain_s: float
    written: int
    bound: int
    cpu: dict[str, float]  # CPU seconds each process used from the flood's start until read


async def _run(settings: Settings, broker: EmbeddedBroker, worker: ChildWorker, f: Flood) -> Result:
    topics = Topics(settings.prefix, settings.partitions)
    async with MarketClient(settings.bootstrap, topics, party=SELLER) as c:
        await c.open_account(SELLER, timeout=60)
        await c.open_account(BUYER, timeout=60)
        await _streams(c, {"idle": f.idle, "control": f.control_samples, "flood": f.samples})
        reader = TopicReader(
            settings.bootstrap, topics.inbox(BUYER.account_id), fetch_max_wait_ms=READ_WAIT_MS
        )
        await reader.start()
        try:
            await reader.poll(1.0)
            probe = Probe(c, reader)
            done = asyncio.Event()
            done.set()
            idle = await probe.until("idle", f.idle, f.idle, done)
            before = await asyncio.gather(
                *(_count(settings.bootstrap, t) for t in (topics.rejections, topics.refusals))
            )
            # the control: what the broker keeps of the garbage itself
            b0 = rss_mb(broker.pid)
            control = replace(f, seconds=f.control_s)
            w = _writer(settings.bootstrap, f"{settings.prefix}.control", control, 4)
            beside = await _paced(probe, "control", f.control_samples, f.control_s)
            out, _ = await asyncio.to_thread(w.communicate)
            control_sent = int(out)
            await asyncio.sleep(1.0)
            control_mb = rss_mb(broker.pid) - b0
            # the flood, with the buyer's purchases spread over it
            pids = {"broker": broker.pid, "worker": worker.proc.pid if worker.proc else None}
            start = {k: rss_mb(p) for k, p in pids.items()}
            cpu0 = {k: cpu_s(p) for k, p in pids.items()}
            with Peak(pids) as peak:
                t0 = time.monotonic()
                w = _writer(settings.bootstrap, topics.purchases, f, settings.partitions)
                samples = await _paced(probe, "flood", f.samples, f.seconds)
                out, _ = await asyncio.to_thread(w.communicate)
                sent = int(out)
                t_end = time.monotonic()
                while await asyncio.to_thread(rejected_purchases, worker) < sent:
                    await asyncio.sleep(0.5)
                drain_s = time.monotonic() - t_end
                span_ms = int((time.monotonic() - t0) * 1000)
            after = {k: rss_mb(p) for k, p in pids.items()}
            cpu = {k: cpu_s(p) - cpu0[k] for k, p in pids.items()}
            counts = await asyncio.gather(
                *(_count(settings.bootstrap, t) for t in (topics.rejections, topics.refusals))
            )
        finally:
            await reader.stop()
    written = sum(counts) - sum(before)
    bound = RefusalBounds().records_bound(settings.partitions, span_ms)
    return Result(
        idle,
        beside,
        samples,
        sent,
        control_sent,
        control_mb,
        (start["broker"], peak.peak["broker"], after["broker"]),
        (start["worker"], peak.peak["worker"], after["worker"]),
        drain_s,
        written,
        bound,
        cpu,
    )


def _print(r: Result, f: Flood, machine: Machine) -> bool:
    """Print the tables; return whether every goal was met."""
    i95 = _pct(r.idle, 0.95)
    print(
        f"## {f.rate:,} garbage records of {f.size} B a second for {f.seconds:.0f} s on the "
        f"purchases topic ({os.cpu_count()} cores; one worker; closed loop)\n"
    )
    print("| condition | samples | p50 ms | p95 ms | p99 ms | max ms | p95 vs idle |")
    print("|---|---|---|---|---|---|---|")
    rows = (
        ("idle (baseline)", r.idle),
        (f"control: garbage to a topic nobody reads ({r.control_sent:,} records)", r.control),
        (f"during the flood ({r.sent:,} records)", r.flood),
    )
    for name, s in rows:
        print(
            f"| {name} | {len(s)} | {_pct(s, 0.5):.1f} | {_pct(s, 0.95):.1f} | "
            f"{_pct(s, 0.99):.1f} | {max(s) * 1e3:.1f} | {_pct(s, 0.95) / i95:.2f}x |"
        )
    per_record_kb = r.control_mb * 1024 / max(1, r.control_sent)
    garbage_mb = r.sent * per_record_kb / 1024
    answers_mb = r.bound * per_record_kb / 1024 * 2  # a generous per-answer cost
    broker_bound = SLACK * (garbage_mb + answers_mb) + 16
    b_growth = r.broker_mb[2] - r.broker_mb[0]
    w_growth = max(r.worker_mb[1:]) - r.worker_mb[0]
    print("\n| process | RSS before MB | peak MB | after MB | growth MB | bound MB |")
    print("|---|---|---|---|---|---|")
    print(
        f"| broker | {r.broker_mb[0]:.0f} | {r.broker_mb[1]:.0f} | {r.broker_mb[2]:.0f} | "
        f"{b_growth:.0f} | {broker_bound:.0f} |"
    )
    print(
        f"| worker | {r.worker_mb[0]:.0f} | {r.worker_mb[1]:.0f} | {r.worker_mb[2]:.0f} | "
        f"{w_growth:.0f} | {WORKER_BOUND_MB:.0f} |"
    )
    print(
        f"\ncontrol: {r.control_sent:,} of the same records to a topic nobody reads grew the "
        f"broker by {r.control_mb:.1f} MB ({per_record_kb * 1024:.0f} B a record): the "
        f"flood's own records account for {garbage_mb:.0f} MB of the broker's growth"
    )
    print(
        f"records the market wrote to <p>.rejections and <p>.refusals: {r.written:,} "
        f"(bound {r.bound:,}; two a garbage record before the bound: {2 * r.sent:,})"
    )
    print(
        f"the worker read the whole flood {r.drain_s:.1f} s after it ended; CPU used meanwhile: "
        f"worker {r.cpu['worker']:.1f} s ({r.cpu['worker'] / r.sent * 1e6:.0f} µs a record), "
        f"broker {r.cpu['broker']:.1f} s ({r.cpu['broker'] / r.sent * 1e6:.0f} µs a record)"
    )
    ok = (
        _pct(r.flood, 0.95) <= GOAL_RATIO * i95
        and r.written <= r.bound
        and w_growth <= WORKER_BOUND_MB
        and b_growth <= broker_bound
    )
    print(
        f"\ngoals (p95 ≤ {GOAL_RATIO:.0f}× idle, records and memory within their bounds): "
        f"{'met' if ok else 'NOT met'}"
    )
    print(machine.line())
    return ok


def run(quick: bool, rate: int | None, seconds: float | None) -> int:
    f = Flood(5_000, 60.0, 10.0, 50, 200, 40) if not quick else Flood(5_000, 10.0, 3.0, 20, 40, 10)
    f = replace(f, rate=rate or f.rate, seconds=seconds or f.seconds)
    workdir = Path(tempfile.mkdtemp(prefix="emarket-garbage-"))
    machine = Machine.now()
    tag = uuid.uuid4().hex[:6]
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        settings = replace(
            Settings(
                broker=broker.url,
                app_id=f"garbage-{tag}",
                prefix=f"garbage{tag}",
                data_dir=workdir / "data",
                web_port=find_free_port(),
                log_level="info",
                require_encryption=False,
            ).for_tansu(),
            fetch_max_wait_ms=10,
        )
        env = {"EMARKET_MAX_STREAMS_PER_SELLER": "4096"}  # one seller registers every stream
        worker = ChildWorker(settings, log_path=workdir / "market.log", env=env).start()
        try:
            worker.wait_healthy(90)
            result = asyncio.run(_run(settings, broker, worker, f))
        finally:
            worker.stop()
    print(f"(logs: {workdir})", file=sys.stderr)
    return 0 if _print(result, f, machine) else 1


if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:
    bootstrap, topic, rate, seconds, size, partitions = sys.argv[2:8]
    print(
        asyncio.run(
            write_garbage(bootstrap, topic, int(rate), float(seconds), int(size), int(partitions))
        )
    )
