"""Flood benchmark: what a cheap flood of junk does to a legitimate buyer's latency.

Run ``python -m bench.flood`` (``--quick`` for a smoke run). It starts the embedded broker and
one worker, then measures one legitimate buyer's purchase latency (send → outcome in her
inbox, closed loop) in the same run:

* **idle** — nothing else on the purchases topic (the baseline);
* **during a flood** — while a stranger sends ``--flood`` unsigned purchases, each naming a
  different buyer id (the issue #13 attack). Before the fix every one of them created a topic
  inside the batch; now each costs one parse and one rejection.

It prints both rows, the ratio to the idle baseline, how fast the worker rejected the flood,
and how many topics the flood created (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

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


def _junk(i: int) -> bytes:
    return json.dumps({
        "schema_version": 1, "type": "purchase", "purchase_id": f"junk{i}",
        "buyer_id": f"victim{i}", "stream_id": "s", "max_price_minor": 10**12,
        "requested_at_ms": 1, "key_id": f"{i:016x}", "signature": "A" * 86 + "==",
    }).encode()  # fmt: skip


async def _latencies(
    c: MarketClient, reader: TopicReader, market: str, n: int, tag: str
) -> list[float]:
    """Closed loop: one free purchase at a time, each on its own one-level stream."""
    out = []
    for i in range(n):
        stream = f"{tag}{i}"
        req = BUYER.sign(PurchaseRequest, market, purchase_id=f"{tag}-{i}",
                         buyer_id=BUYER.account_id, stream_id=stream, max_price_minor=0,
                         requested_at_ms=now_ms())  # fmt: skip
        t0 = time.perf_counter()
        await c.send(c.topics.purchases, stream, req.model_dump_json().encode())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(b"purchase_" in v for _, v in await reader.poll(0.05)):
                break
        out.append(time.perf_counter() - t0)
    return out


async def _run(settings: Settings, n_lat: int, n_flood: int) -> list[tuple[str, float, float]]:
    topics = Topics(settings.prefix, settings.partitions)
    market = topics.prefix
    async with MarketClient(settings.bootstrap, topics, party=SELLER) as c:
        await c.open_account(SELLER, timeout=60)
        await c.open_account(BUYER, timeout=60)
        for tag in ("idle", "flood"):
            for i in range(n_lat):
                await c.register(dict(
                    stream_id=f"{tag}{i}", mechanism="laplace", sensitivity=1.0,
                    dimension=DIM, steps=[1.0], cap=1.0, retain_last=1,
                    pricing=LinearPrecisionSpec(rate_per_precision=0.0),
                ), timeout=60)  # fmt: skip
                await c.publish(f"{tag}{i}", [1.0] * DIM, value_id="v0")
        reader = TopicReader(settings.bootstrap, topics.inbox(BUYER.account_id),
                             fetch_max_wait_ms=READ_WAIT_MS)  # fmt: skip
        await reader.start()
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
        await admin.start()
        prod = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, linger_ms=5)
        await prod.start()
        try:
            await reader.poll(1.0)  # the account confirmation
            idle = await _latencies(c, reader, market, n_lat, "idle")
            topics_before = set(await admin.list_topics())
            junk = [_junk(i) for i in range(n_flood)]
            t0 = time.perf_counter()
            futs = [await prod.send(topics.purchases, j, key=f"victim{i}".encode())
                    for i, j in enumerate(junk)]  # fmt: skip
            flooded = await _latencies(c, reader, market, n_lat, "flood")
            await asyncio.gather(*futs)
            flood_s = time.perf_counter() - t0
            created = set(await admin.list_topics()) - topics_before
        finally:
            await prod.stop()
            await admin.close()
            await reader.stop()
    return [
        ("idle (baseline)", _pct(idle, 0.5), _pct(idle, 0.99)),
        (f"during a flood of {n_flood:,} unsigned purchases", _pct(flooded, 0.5),
         _pct(flooded, 0.99)),
        ("flood sent in (s)", flood_s, float(len(created))),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--flood", type=int, default=None)
    args = p.parse_args(argv)
    n_lat, n_flood = (10, 2000) if args.quick else (50, 10_000)
    n_flood = args.flood or n_flood
    workdir = Path(tempfile.mkdtemp(prefix="emarket-flood-"))
    tag = uuid.uuid4().hex[:6]
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        settings = replace(
            Settings(broker=broker.url, app_id=f"flood-{tag}", prefix=f"flood{tag}",
                     data_dir=workdir / "data", web_port=find_free_port(),
                     log_level="warn", require_encryption=False).for_tansu(),
            fetch_max_wait_ms=10,
        )  # fmt: skip
        worker = ChildWorker(settings, log_path=workdir / "market.log").start()
        try:
            worker.wait_healthy(90)
            rows = asyncio.run(_run(settings, n_lat, n_flood))
        finally:
            worker.stop()
    (idle_name, idle50, idle99), (flood_name, f50, f99), (_, flood_s, created) = rows
    print(f"## A legitimate purchase during a flood ({n_lat} closed-loop samples per row, "
          f"{os.cpu_count()} cores)\n")  # fmt: skip
    print("| condition | p50 ms | p99 ms | p50 vs idle | p99 vs idle |")
    print("|---|---|---|---|---|")
    print(f"| {idle_name} | {idle50:.1f} | {idle99:.1f} | 1.00x | 1.00x |")
    print(f"| {flood_name} | {f50:.1f} | {f99:.1f} | {f50 / idle50:.2f}x | {f99 / idle99:.2f}x |")
    print(f"\nflood: {n_flood:,} junk purchases sent in {flood_s:.1f} s; topics created by it: "
          f"{created:.0f} (must be 0)  (logs: {workdir})")  # fmt: skip
    return 0 if created == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
