"""Flood benchmark: what a cheap flood does to a legitimate buyer's latency.

Run ``python -m bench.flood`` (``--quick`` for a smoke run; ``--garbage`` for the 1-byte garbage
flood of issue #40, :mod:`bench.flood_garbage`). It starts the embedded broker and
one worker, then measures one legitimate buyer's purchase latency (send → outcome in her
inbox, closed loop, each purchase on its own stream) in the same run:

* **idle** — nothing else on the input topics (the baseline);
* **during a flood of junk** — while a stranger sends ``--flood`` unsigned purchases, each
  naming a different buyer id (issue #13): each costs one parse and one rejection and creates
  no topic;
* **during signed account openings** — while ``--openings`` valid, signed ``open_account``
  events (fresh keys each) are sent at once (issue #29), ``--rounds`` times: each round's
  buyer samples run until every inbox of the round exists, so they cover the whole episode.
  Inboxes are made by the batch that opens their accounts; the worker is started
  with ``EMARKET_MAX_OPENINGS_PER_MINUTE`` raised so that every opening is accepted (the
  default rate would refuse most of them, ``rate_limited``: that is not what is measured here).

It prints the latency rows with their ratio to the idle baseline, then per round of openings:
how fast they were sent, how long the worker took to apply them (per account) and how long
until all their inboxes existed (per account), with the accounts already there, so a cost that
grows with the accounts shows as a growing column.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.parser import text_string_to_metric_families

from bench.machine import Machine
from bench.service import DIM, READ_WAIT_MS, _pct
from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.client import MarketClient, TopicReader, now_ms
from streams.clients.keys import Party
from streams.wire.events import LinearPrecisionSpec, PurchaseRequest
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker

SELLER = Party.generate("seller", sealing=False)
BUYER = Party.generate("buyer", sealing=False)
GOAL_P99_MS = 1000.0


@dataclass
class Sizes:
    """How much each row measures."""

    lat: int  # closed-loop samples of the idle and junk rows (and the least of an opening row)
    junk: int  # unsigned purchases in the junk flood
    openings: int  # signed openings per round
    rounds: int
    streams: int  # one-level streams available to each opening round's samples


@dataclass
class Row:
    name: str
    samples: list[float]


@dataclass
class Round:
    before: int  # accounts already open
    sent_s: float
    applied_s: float
    ready_s: float


def _junk(i: int) -> bytes:
    return json.dumps(
        {
            "schema_version": 1,
            "type": "purchase",
            "purchase_id": f"junk{i}",
            "buyer_id": f"victim{i}",
            "stream_id": "s",
            "max_price_minor": 10**12,
            "requested_at_ms": 1,
            "key_id": f"{i:016x}",
            "signature": "A" * 86 + "==",
        }
    ).encode()


class Probe:
    """The legitimate buyer: one free purchase at a time, each on its own one-level stream."""

    def __init__(self, c: MarketClient, reader: TopicReader) -> None:
        self.c, self.reader = c, reader

    async def one(self, stream: str) -> float:
        req = BUYER.sign(
            PurchaseRequest,
            self.c.market,
            purchase_id=f"p-{stream}",
            buyer_id=BUYER.account_id,
            stream_id=stream,
            max_price_minor=0,
            requested_at_ms=now_ms(),
        )
        t0 = time.perf_counter()
        await self.c.send(self.c.topics.purchases, stream, req.model_dump_json().encode())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(b"purchase_" in v for _, v in await self.reader.poll(0.05)):
                break
        return time.perf_counter() - t0

    async def until(self, tag: str, n_min: int, n_max: int, done: asyncio.Event) -> list[float]:
        """Samples on streams ``tag0``… until ``done`` is set and ``n_min`` were taken."""
        out: list[float] = []
        for i in range(n_max):
            if done.is_set() and len(out) >= n_min:
                break
            out.append(await self.one(f"{tag}{i}"))
        return out


async def _streams(c: MarketClient, tags: dict[str, int]) -> None:
    for tag, n in tags.items():
        for i in range(n):
            await c.register(
                dict(
                    stream_id=f"{tag}{i}",
                    mechanism="laplace",
                    sensitivity=1.0,
                    dimension=DIM,
                    steps=[1.0],
                    cap=1.0,
                    retain_last=1,
                    pricing=LinearPrecisionSpec(rate_per_precision=0.0),
                ),
                timeout=60,
            )
            await c.publish(f"{tag}{i}", [1.0] * DIM, value_id="v0")


async def _junk_row(
    probe: Probe, prod: AIOKafkaProducer, admin: AIOKafkaAdminClient, topics: Topics, sizes: Sizes
) -> tuple[Row, float, int]:
    """The junk flood's row, how long it took to send, and the topics it created."""
    before = set(await admin.list_topics())
    t0 = time.perf_counter()
    futs = [
        await prod.send(topics.purchases, _junk(i), key=f"victim{i}".encode())
        for i in range(sizes.junk)
    ]
    done = asyncio.Event()
    done.set()
    samples = await probe.until("junk", sizes.lat, sizes.lat, done)
    await asyncio.gather(*futs)
    created = set(await admin.list_topics()) - before
    return (
        Row(f"during {sizes.junk:,} unsigned purchases", samples),
        time.perf_counter() - t0,
        len(created),
    )


async def _wait_all(
    check: Callable[[], object], done: asyncio.Event, t0: float, period: float = 0.1
) -> float:
    """Seconds from ``t0`` until ``check()`` is true (it may be a coroutine); sets ``done``.

    Checked seldom: listing the topics costs the broker more with every inbox (~0.26 s at
    4,500 topics on the embedded broker), and this is the benchmark's own load."""
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            done.set()
            return time.perf_counter() - t0
        await asyncio.sleep(period)


def _accepted(worker: ChildWorker) -> float:
    """Accounts the worker has opened (``emarket_account_events_total{outcome="accepted"}``)."""
    for fam in text_string_to_metric_families(worker.get("/metrics")):
        for sample in fam.samples:
            if sample.name == "emarket_account_events_total" and (
                sample.labels.get("outcome") == "accepted"
            ):
                return sample.value
    return 0.0


def rejected_purchases(worker: ChildWorker) -> float:
    """Events of the purchases topic the worker refused
    (``emarket_purchases_total{outcome="rejected"}``): how much of a garbage flood it read."""
    for fam in text_string_to_metric_families(worker.get("/metrics")):
        for sample in fam.samples:
            if sample.name == "emarket_purchases_total" and (
                sample.labels.get("outcome") == "rejected"
            ):
                return sample.value
    return 0.0


async def _all_exist(admin: AIOKafkaAdminClient, names: set[str]) -> bool:
    return names <= set(await admin.list_topics())


async def _opening_round(
    probe: Probe,
    prod: AIOKafkaProducer,
    admin: AIOKafkaAdminClient,
    worker: ChildWorker,
    sizes: Sizes,
    r: int,
) -> tuple[Row, Round]:
    """One round of signed openings sent at once, with the buyer's samples meanwhile."""
    topics, n = probe.c.topics, sizes.openings
    parties = [Party.generate(f"flood{r}x{i}") for i in range(n)]
    payloads = [
        (p.account_id.encode(), p.open_account(probe.c.market).model_dump_json().encode())
        for p in parties
    ]
    names = {topics.inbox(p.account_id) for p in parties}
    accepted0 = await asyncio.to_thread(_accepted, worker)
    applied, ready = asyncio.Event(), asyncio.Event()
    sampling = asyncio.create_task(probe.until(f"open{r}-", sizes.lat, sizes.streams, ready))
    t0 = time.perf_counter()
    futs = [await prod.send(topics.accounts, v, key=k) for k, v in payloads]
    await asyncio.gather(*futs)
    sent_s = time.perf_counter() - t0
    applied_s, ready_s = await asyncio.gather(
        _wait_all(lambda: _accepted(worker) >= accepted0 + n, applied, t0, period=0.25),
        _wait_all(lambda: _all_exist(admin, names), ready, t0, period=1.0),
    )
    samples = await sampling
    row = Row(
        f"during {n:,} signed openings, round {r + 1} ({2 + r * n:,} accounts before)", samples
    )
    return row, Round(2 + r * n, sent_s, applied_s, ready_s)


async def _run(
    settings: Settings, worker: ChildWorker, sizes: Sizes
) -> tuple[list[Row], float, int, list[Round]]:
    topics = Topics(settings.prefix, settings.partitions)
    async with MarketClient(settings.bootstrap, topics, party=SELLER) as c:
        await c.open_account(SELLER, timeout=60)
        await c.open_account(BUYER, timeout=60)
        await _streams(
            c,
            {
                "idle": sizes.lat,
                "junk": sizes.lat,
                **{f"open{r}-": sizes.streams for r in range(sizes.rounds)},
            },
        )
        reader = TopicReader(
            settings.bootstrap, topics.inbox(BUYER.account_id), fetch_max_wait_ms=READ_WAIT_MS
        )
        await reader.start()
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
        await admin.start()
        prod = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, linger_ms=5)
        await prod.start()
        try:
            await reader.poll(1.0)  # the account confirmation
            probe = Probe(c, reader)
            done = asyncio.Event()
            done.set()
            rows = [Row("idle (baseline)", await probe.until("idle", sizes.lat, sizes.lat, done))]
            junk, junk_s, created = await _junk_row(probe, prod, admin, topics, sizes)
            rows.append(junk)
            rounds = []
            for r in range(sizes.rounds):
                row, rnd = await _opening_round(probe, prod, admin, worker, sizes, r)
                rows.append(row)
                rounds.append(rnd)
        finally:
            await prod.stop()
            await admin.close()
            await reader.stop()
    return rows, junk_s, created, rounds


def _print(
    rows: list[Row],
    junk_s: float,
    created: int,
    rounds: list[Round],
    sizes: Sizes,
    workdir: Path,
    machine: Machine,
) -> None:
    idle50, idle99 = _pct(rows[0].samples, 0.5), _pct(rows[0].samples, 0.99)
    print(
        f"## A legitimate purchase during a flood ({os.cpu_count()} cores; closed loop, "
        "each row measured in this run)\n"
    )
    print("| condition | samples | p50 ms | p99 ms | max ms | p50 vs idle | p99 vs idle |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        p50, p99 = _pct(row.samples, 0.5), _pct(row.samples, 0.99)
        print(
            f"| {row.name} | {len(row.samples)} | {p50:.1f} | {p99:.1f} | "
            f"{max(row.samples) * 1e3:.1f} | {p50 / idle50:.2f}x | {p99 / idle99:.2f}x |"
        )
    print(
        f"\njunk flood: {sizes.junk:,} unsigned purchases sent in {junk_s:.1f} s; topics "
        f"created by it: {created} (must be 0)"
    )
    print(f"\n## {sizes.openings:,} signed account openings sent at once, per round\n")
    print(
        "| accounts before | sent in s | applied by the worker in s | ms per account "
        "| all inboxes exist after s | ms per account |"
    )
    print("|---|---|---|---|---|---|")
    for rnd in rounds:
        n = sizes.openings
        print(
            f"| {rnd.before:,} | {rnd.sent_s:.2f} | {rnd.applied_s:.2f} | "
            f"{rnd.applied_s / n * 1e3:.2f} | {rnd.ready_s:.2f} | {rnd.ready_s / n * 1e3:.2f} |"
        )
    worst = max(_pct(row.samples, 0.99) for row in rows[2:]) if rows[2:] else 0.0
    print(
        f"\npurchase p99 during the openings < {GOAL_P99_MS:.0f} ms: "
        f"{'yes' if worst < GOAL_P99_MS else 'NO'} (worst round {worst:.1f} ms)"
    )
    print(f"(logs: {workdir})", file=sys.stderr)  # not part of the result
    print(machine.line())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--flood", type=int, default=None, help="unsigned purchases")
    p.add_argument("--openings", type=int, default=None, help="signed openings per round")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument(
        "--garbage",
        action="store_true",
        help="the garbage flood of issue #40 instead (bench/flood_garbage.py)",
    )
    p.add_argument("--rate", type=int, default=None, help="--garbage: records a second")
    p.add_argument("--seconds", type=float, default=None, help="--garbage: how long")
    args = p.parse_args(argv)
    if args.garbage:
        from bench import flood_garbage  # it builds on this module's buyer

        return flood_garbage.run(args.quick, args.rate, args.seconds)
    sizes = Sizes(10, 2000, 300, 1, 20) if args.quick else Sizes(50, 10_000, 2000, 2, 150)
    sizes = replace(
        sizes,
        junk=args.flood or sizes.junk,
        openings=args.openings or sizes.openings,
        rounds=args.rounds or sizes.rounds,
    )
    workdir = Path(tempfile.mkdtemp(prefix="emarket-flood-"))
    machine = Machine.now()
    tag = uuid.uuid4().hex[:6]
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        settings = replace(
            Settings(
                broker=broker.url,
                app_id=f"flood-{tag}",
                prefix=f"flood{tag}",
                data_dir=workdir / "data",
                web_port=find_free_port(),
                log_level="info",
                require_encryption=False,
                metrics_every=0.0,  # a sample is the worker's figures now, not a cached page
            ).for_tansu(),
            fetch_max_wait_ms=10,
        )
        env = {
            "EMARKET_MAX_OPENINGS_PER_MINUTE": str(10 * sizes.openings * sizes.rounds + 100),
            "EMARKET_MAX_STREAMS_PER_SELLER": "4096",
        }  # one seller registers every stream
        worker = ChildWorker(settings, log_path=workdir / "market.log", env=env).start()
        try:
            worker.wait_healthy(90)
            rows, junk_s, created, rounds = asyncio.run(_run(settings, worker, sizes))
        finally:
            worker.stop()
    _print(rows, junk_s, created, rounds, sizes, workdir, machine)
    return 0 if created == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
