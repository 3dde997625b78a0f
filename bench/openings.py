"""One stranger opening accounts as fast as an open market lets him, and an honest user's
openings meanwhile (issue #40): ``python -m bench.openings [--minutes 15] [--strangers 1]``.

A market as ``serve`` runs it (embedded broker, one worker, ``EMARKET_OPENINGS=open`` with the
default proof of work and openings allowance). Each stranger process opens accounts whose ids
all fall on one input partition, doing the work each needs and writing the signed openings
without waiting for answers, as fast as one core lets it. Every few seconds an honest party
opens an account on that same partition through the client library (doing the market's work,
as a client that knows it does): the time its work takes and the time from sending it to the
market's confirmation are measured. Each minute prints a row: the stranger's openings sent, the
accounts the worker opened in all, the honest openings (how many, median and worst seconds,
refused), and whether ``/health`` said openings were behind.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from bench.machine import Machine
from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.client import MarketClient
from streams.clients.keys import Party
from streams.core.context import Limits
from streams.wire.events import AccountState, Rejection
from streams.wire.signing import MarketRef
from streams.wire.topics import Topics
from streams.wire.work import DEFAULT_BITS, solve
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker

PARTITION = 0
HONEST_EVERY_S = 5.0


def _ids_on(topics: Topics, prefix: str) -> Any:
    """Account ids (endless) whose openings belong on :data:`PARTITION`."""
    n = 0
    while True:
        name = f"{prefix}{n}"
        n += 1
        if topics.partition_of(name) == PARTITION:
            yield name


def _stranger(
    bootstrap: str, prefix: str, key_id: str, partitions: int, bits: int, until: float, sent: Any
) -> None:
    """One process: openings on one partition as fast as the work lets it, until ``until``."""
    topics = Topics(prefix, partitions)

    async def run() -> None:
        prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await prod.start()
        try:
            for name in _ids_on(topics, f"s{uuid.uuid4().hex[:6]}x"):
                if time.time() >= until:
                    return
                p = Party.generate(name, sealing=False)
                work = await asyncio.to_thread(solve, prefix, name, p.public_key, bits)
                event = p.open_account(MarketRef(prefix, key_id), work=work)
                raw = event.model_dump_json().encode()
                await prod.send_and_wait(
                    topics.accounts, raw, key=name.encode(), partition=PARTITION
                )
                with sent.get_lock():
                    sent.value += 1
        finally:
            await prod.stop()

    asyncio.run(run())


def _metric(worker: ChildWorker, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(worker.get("/metrics")):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


async def _honest(
    settings: Settings,
    topics: Topics,
    until: float,
    rows: list[dict[str, Any]],
    worker: ChildWorker,
    sent: Any,
    minute_s: float,
) -> None:
    ids = _ids_on(topics, f"h{uuid.uuid4().hex[:6]}x")
    start = time.time()
    row: dict[str, Any] = {"lat": [], "work": [], "refused": 0, "behind": False}
    next_row = start + minute_s
    async with MarketClient(settings.bootstrap, topics) as c:
        while time.time() < until:
            p = Party.generate(next(ids))
            t0 = time.perf_counter()  # the work the market asks, as its client does it
            work = await asyncio.to_thread(
                solve, topics.prefix, p.account_id, p.public_key, settings.limits.opening_work
            )
            t1 = time.perf_counter()
            raw = p.open_account(await c.signing_market(), work=work).model_dump_json().encode()
            got = await c._request(
                topics.accounts,
                p.account_id,
                raw,
                lambda ev: isinstance(ev, AccountState | Rejection),
                inbox=p.account_id,
                timeout=120,
                create_inbox=False,
            )
            took = time.perf_counter() - t0
            if isinstance(got, AccountState):
                row["lat"].append(time.perf_counter() - t1)
                row["work"].append(t1 - t0)
            else:
                row["refused"] += 1
            health = await asyncio.to_thread(worker.get, "/health")
            row["behind"] = row["behind"] or bool((health.get("openings") or {}).get("behind"))
            if time.time() >= next_row:
                row["sent"] = sent.value
                row["accounts"] = await asyncio.to_thread(
                    _metric, worker, "emarket_account_events_total", outcome="accepted"
                )
                rows.append(row)
                _print_row(len(rows), row)
                row = {"lat": [], "work": [], "refused": 0, "behind": False}
                next_row += minute_s
            await asyncio.sleep(max(0.0, HONEST_EVERY_S - took))


def _print_row(n: int, row: dict[str, Any]) -> None:
    lat, work = row["lat"], row["work"]
    med = f"{statistics.median(lat):.2f}" if lat else "-"
    worst = f"{max(lat):.2f}" if lat else "-"
    wmed = f"{statistics.median(work):.2f}" if work else "-"
    print(
        f"| {n} | {row['sent']:,} | {int(row['accounts']):,} | {len(lat)} | {wmed} | {med} | "
        f"{worst} | {row['refused']} | {'yes' if row['behind'] else 'no'} |",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--strangers", type=int, default=1, help="stranger processes (one core each)")
    p.add_argument("--work", type=int, default=DEFAULT_BITS, help="EMARKET_OPENING_WORK")
    p.add_argument("--row-seconds", type=float, default=60.0)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="emarket-openings-"))
    machine = Machine.now()
    tag = uuid.uuid4().hex[:6]
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        settings = Settings(
            broker=broker.url,
            app_id=f"open-{tag}",
            prefix=f"open{tag}",
            data_dir=workdir / "data",
            web_port=find_free_port(),
            log_level="info",
            limits=Limits(openings="open", opening_work=args.work),
            metrics_every=0.0,  # a sample is the worker's figures now, not a cached page
        ).for_tansu()
        topics = Topics(settings.prefix, settings.partitions)
        worker = ChildWorker(settings, log_path=workdir / "market.log").start()
        try:
            worker.wait_healthy(90)
            print(
                f"one worker, {settings.partitions} partitions, work {args.work} bits, "
                f"openings {settings.limits.max_openings_per_minute} a minute "
                f"({settings.limits.max_openings_per_minute // settings.partitions} on partition "
                f"{PARTITION}); {args.strangers} stranger process(es) on partition {PARTITION}"
            )
            print(
                "| row | stranger openings sent (total) | accounts opened (total) | honest "
                "openings | their work, median s | confirmed after sending: median s | "
                "worst s | honest refused | /health behind |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            key_id = worker.get("/health")["market_key_id"]
            until = time.time() + args.minutes * 60
            sent = multiprocessing.Value("i", 0)
            procs = [
                multiprocessing.Process(
                    target=_stranger,
                    args=(
                        settings.bootstrap,
                        settings.prefix,
                        key_id,
                        settings.partitions,
                        args.work,
                        until,
                        sent,
                    ),
                    daemon=True,
                )
                for _ in range(args.strangers)
            ]
            for proc in procs:
                proc.start()
            rows: list[dict[str, Any]] = []
            asyncio.run(_honest(settings, topics, until, rows, worker, sent, args.row_seconds))
            for proc in procs:
                proc.join(timeout=30)
        finally:
            worker.stop()
    lat = [x for r in rows for x in r["lat"]]
    if lat:
        print(
            f"honest openings: {len(lat)}, confirmed after sending: median "
            f"{statistics.median(lat):.2f} s, worst {max(lat):.2f} s, within 2 s: "
            f"{sum(x <= 2.0 for x in lat)}"
        )
    print(f"(logs: {workdir})", file=sys.stderr)
    print(machine.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
