"""Service benchmark: the market's ingest and purchase paths against two baselines, same broker.

Run ``python -m bench.service`` (``--quick`` for a smoke run). It starts the embedded broker and
measures, in one run:

* **raw round trip** — aiokafka produce → consume of same-size messages (this broker's limit);
* **Faust pass-through** — a plain Faust agent forwarding those messages unchanged (the
  framework's own per-event cost), :mod:`bench.passthrough`;
* **market ingest** — values in, the subscribed buyers' releases out (2 subscribers);
* **market fan-out** — values in on a stream with 16 holders, 16 releases out per value,
  counted as deliveries (values × holders) per second;
* **market purchase** — purchases in, each buying the next step of a 16-step schedule on one of
  many streams (so every purchase draws new noise on its stream's 4 retained values), releases
  sealed to the buyer's key (as the deployment requires) and a signed receipt out.

The pass-through and the market worker use the same consumer settings (fetch wait
:data:`FETCH_WAIT_MS`, session timeout, heartbeat).

Throughput is measured open-loop (send everything, wait for the last output); latency p50/p99
closed-loop (one event in flight, idle system), from the client's send to the client's receipt,
so it includes the client's own fetch wait. A second table times **paced** load: requests sent
at a set rate with exponential gaps (open loop: one does not wait for another), each as soon as
it is due, by a client that does not linger — the pass-through forwarding values at 10/s (the
floor this broker and these fetch waits set), then one sealed buyer's purchases at 10/s and at
half the purchase rate the throughput run measured.

Goals (issue #15, on the median of the runs): market ingest at least 1.0x the pass-through,
purchases at least 0.7x; every closed-loop p99 under 50 ms; paced purchases p99 under 25 ms at
10/s and under 50 ms at half their maximum. ``--runs`` (default 3) repeats everything on a
fresh broker and prints min / median / max.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from streams.broker.admin import ensure_topics
from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.client import MarketClient, TopicReader, now_ms
from streams.clients.keys import Party
from streams.core import MarketKeys
from streams.wire.events import (
    LinearPrecisionSpec,
    PurchaseRequest,
    StreamRegistration,
    ValueBatch,
)
from streams.wire.sealing import seal_values
from streams.wire.topics import Topics, TopicSpec
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker

DIM = 8
READ_WAIT_MS = 5
#: the Faust consumer's fetch wait, the same for the pass-through and the market worker
FETCH_WAIT_MS = 10
#: holders of the fan-out stream: each value is released to every one of them
FANOUT_HOLDERS = 16


@dataclass
class Row:
    name: str
    rate: float
    p50_ms: float
    p99_ms: float


SELLER = Party.generate("bench", sealing=False)
#: the benchmarked markets' keys (written to their data directories): values are sealed to them
BENCH_KEYS = MarketKeys(signing_key=Ed25519PrivateKey.from_private_bytes(bytes(range(32))),
                        noise_secret=b"bench noise secret, 32 bytes...!")  # fmt: skip
BENCH_ENV = {"EMARKET_SIGNING_KEY": base64.b64encode(bytes(range(32))).decode(),
             "EMARKET_NOISE_SECRET": base64.b64encode(BENCH_KEYS.noise_secret).decode()}
"""What makes a child worker use :data:`BENCH_KEYS`."""


def sealed_batch(seller: Party, market: str, **fields: Any) -> ValueBatch:
    """A value batch of ``fields``, its numbers sealed to :data:`BENCH_KEYS` as a client seals
    them, signed by ``seller``."""
    clear = seller.sign(ValueBatch, market, **fields)
    sealed = seal_values(clear, market, BENCH_KEYS.sealing_public_b64)
    return seller.sign(ValueBatch, market, **sealed.model_dump(exclude={"key_id", "signature"}))


def _value_payload(i: int, market: str = "bench", stream: str = "bench") -> bytes:
    """A signed batch of one value (signed before any clock starts)."""
    batch = sealed_batch(
        SELLER, market, stream_id=stream, seller_id=SELLER.account_id,
        items=[{"value_id": f"v{i:07d}", "values": [20.0 + 0.001 * i] * DIM,
                "published_at_ms": now_ms()}],
    )  # fmt: skip
    return batch.model_dump_json().encode()


def _count(raw: bytes) -> int:
    """Events carried by one message: subscription deliveries group several values. A
    rejection stops the run: a benchmark that counts refusals as work measures nothing."""
    if raw.startswith(b'{"schema_version":1,"type":"value_released"'):
        return len(json.loads(raw)["releases"])
    if raw.startswith(b'{"schema_version":1,"type":"rejection"'):
        raise RuntimeError(f"the benchmark's events were refused: {raw[:300]!r}")
    return 1


async def _drain(readers: list[TopicReader], expected: int, timeout: float) -> int:
    got = 0
    deadline = time.monotonic() + timeout
    while got < expected and time.monotonic() < deadline:
        for r in readers:
            got += sum(_count(v) for _, v in await r.poll(0.05))
    return got


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


async def _closed_loop(
    send: Callable[[int], Awaitable[None]], readers: list[TopicReader], n: int, per_event: int
) -> list[float]:
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        await send(i)
        await _drain(readers, per_event, 30)
        lat.append(time.perf_counter() - t0)
    return lat


async def _pipe(bootstrap: str, source: str, sink: str, n: int, lat_n: int) -> Row:
    """Throughput and latency of messages sent to ``source`` appearing on ``sink``."""
    reader = TopicReader(bootstrap, sink, fetch_max_wait_ms=READ_WAIT_MS)
    await reader.start()
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=262144)
    await prod.start()
    try:
        payloads = [_value_payload(i) for i in range(n)]
        t0 = time.perf_counter()
        futs = [await prod.send(source, p, key=b"bench") for p in payloads]
        await asyncio.gather(*futs)
        got = await _drain([reader], n, 300)
        rate = got / (time.perf_counter() - t0)

        async def send(i: int) -> None:
            await prod.send_and_wait(source, _value_payload(n + i), key=b"bench")

        lat = await _closed_loop(send, [reader], lat_n, 1)
    finally:
        await prod.stop()
        await reader.stop()
    return Row("", rate, _pct(lat, 0.5), _pct(lat, 0.99))


async def raw_round_trip(bootstrap: str, n: int, lat_n: int) -> Row:
    topic = f"bench-raw-{uuid.uuid4().hex[:6]}"
    await ensure_topics(bootstrap, [TopicSpec(topic, 4, {})])
    row = await _pipe(bootstrap, topic, topic, n, lat_n)
    return replace(row, name="raw aiokafka round trip")


def faust_passthrough(
    broker: EmbeddedBroker, sizes: Sizes, workdir: Path
) -> tuple[Row, Paced]:
    tag = uuid.uuid4().hex[:6]
    src, dst = f"bench-src-{tag}", f"bench-dst-{tag}"
    asyncio.run(ensure_topics(broker.bootstrap, [TopicSpec(src, 4, {}), TopicSpec(dst, 4, {})]))
    log = open(workdir / "passthrough.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.passthrough", "--broker", broker.url, "--source", src,
         "--sink", dst, "--app-id", f"bench-pt-{tag}", "--fetch-max-wait-ms", str(FETCH_WAIT_MS)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        asyncio.run(_wait_forwarding(broker.bootstrap, src, dst))
        row = asyncio.run(_pipe(broker.bootstrap, src, dst, sizes.n, sizes.lat_n))
        paced = asyncio.run(_paced_pipe(broker.bootstrap, src, dst, sizes.paced_slow))
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    return replace(row, name="Faust pass-through agent"), paced


async def _wait_forwarding(bootstrap: str, src: str, dst: str) -> None:
    reader = TopicReader(bootstrap, dst, fetch_max_wait_ms=READ_WAIT_MS)
    await reader.start()
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await prod.start()
    try:
        for _ in range(600):
            await prod.send_and_wait(src, b"{}", key=b"warmup")
            if await reader.poll(0.2):
                return
        raise TimeoutError("pass-through agent did not start")
    finally:
        await prod.stop()
        await reader.stop()


@dataclass
class _Bench:
    """One market under load: its topics, a client, a raw producer, the readers to stop."""

    topics: Topics
    boot: str
    client: MarketClient
    prod: AIOKafkaProducer
    readers: list[TopicReader]
    n: int
    lat_n: int
    #: called when an open-loop measurement starts and ends (bench.scale reads CPU time there)
    marks: list[Callable[[], None]] = field(default_factory=list)
    #: paced runs so far: each has its own streams and buyer
    paced_runs: int = 0

    def mark(self) -> None:
        for fn in self.marks:
            fn()

    async def reader(self, topics: str | list[str]) -> TopicReader:
        r = TopicReader(self.boot, topics, fetch_max_wait_ms=READ_WAIT_MS)
        await r.start()
        self.readers.append(r)
        return r


def _registration(stream: str, steps: list[float], cap: float) -> dict[str, object]:
    return dict(
        stream_id=stream, mechanism="laplace", sensitivity=1.0,
        dimension=DIM, steps=steps, cap=cap, retain_last=4,
        pricing=LinearPrecisionSpec(rate_per_precision=0.0),
    )  # fmt: skip


@dataclass
class Run:
    """One run's measurements: the throughput rows, then the paced-latency rows."""

    rows: list[Row]
    paced: list[Paced]


@dataclass(frozen=True)
class Sizes:
    """Events per measurement: open-loop throughput, closed-loop latency, paced latency."""

    n: int
    lat_n: int
    paced_slow: int  # purchases at PACED_RATE per second
    paced_busy: int  # purchases at half the measured purchase rate


PACED_RATE = 10.0
PASS_THROUGH_PACED = f"Faust pass-through, {PACED_RATE:g}/s"
PACED_SLOW = f"market purchase, {PACED_RATE:g}/s"
PACED_BUSY = "market purchase, 50% of its measured max"
FULL = Sizes(5000, 300, 300, 1000)
QUICK = Sizes(400, 40, 40, 100)


def market_paths(broker: EmbeddedBroker, sizes: Sizes, workdir: Path) -> Run:
    tag = uuid.uuid4().hex[:6]
    settings = replace(
        Settings(
            broker=broker.url,
            app_id=f"bench-m-{tag}",
            prefix=f"bench{tag}",
            data_dir=workdir / "data",
            web_port=find_free_port(),
            log_level="warn",
            require_encryption=False,  # the benchmark's buyers have no sealing key
        ).for_tansu(),
        fetch_max_wait_ms=FETCH_WAIT_MS,
    )
    env = {**BENCH_ENV, "EMARKET_MAX_STREAMS_PER_SELLER": "4096"}  # one seller, many streams
    worker = ChildWorker(settings, log_path=workdir / "market.log", env=env).start()
    try:
        worker.wait_healthy(90)
        return asyncio.run(_market(settings, sizes))
    finally:
        worker.stop()


async def _market(settings: Settings, sizes: Sizes) -> Run:
    topics = Topics(settings.prefix, settings.partitions)
    async with MarketClient(settings.bootstrap, topics, party=SELLER) as c:
        await c.open_account(SELLER, timeout=60)
        prod = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap, linger_ms=5, max_batch_size=262144
        )
        await prod.start()
        b = _Bench(topics, settings.bootstrap, c, prod, [], sizes.n, sizes.lat_n)
        try:
            # Every row stops its readers (consumers fetching every READ_WAIT_MS) when it is
            # done: left polling, they loaded the broker and the two cores through the later
            # rows, which the pass-through's rows never had (the p99 of the purchases at 10/s:
            # 30 ms with them, 23 ms without, seen here).
            rows = []
            for path in (_ingest, _fanout, _purchases):
                rows.append(await path(b))
                await _stop_readers(b)
            busy = rows[-1].rate / 2
            paced = []
            for rate, n, name in ((PACED_RATE, sizes.paced_slow, PACED_SLOW),
                                  (busy, sizes.paced_busy, PACED_BUSY)):  # fmt: skip
                paced.append(await _paced_purchases(b, rate, n, name))
                await _stop_readers(b)
            return Run(rows, paced)
        finally:
            await prod.stop()
            await _stop_readers(b)


async def _stop_readers(b: _Bench) -> None:
    for r in b.readers:
        await r.stop()
    b.readers.clear()


async def _ingest(b: _Bench) -> Row:
    """Values in, one release per subscriber out (2 subscribers)."""
    await b.client.register(_registration("bench", [0.5, 1.0], 1e6), timeout=60)
    for i in range(4):
        await b.client.publish("bench", [1.0] * DIM, value_id=f"w{i}")
    subs = [Party.generate(name, sealing=False) for name in ("sub1", "sub2")]
    readers = []
    for sub in subs:
        await b.client.open_account(sub, timeout=60)
        await b.client.buy("bench", max_price_minor=0, timeout=60, party=sub)
        r = await b.reader(b.topics.inbox(sub.account_id))
        await _drain([r], 2, 5)  # skip the account and the purchase outcome
        readers.append(r)
    market = b.topics.prefix
    payloads = [_value_payload(i, market) for i in range(b.n + b.lat_n)]  # signed beforehand
    b.mark()
    t0 = time.perf_counter()
    futs = [await b.prod.send(b.topics.values, payloads[i], key=b"bench") for i in range(b.n)]
    await asyncio.gather(*futs)
    got = await _drain(readers, b.n * len(subs), 600)
    b.mark()
    rate = got / len(subs) / (time.perf_counter() - t0)

    async def send_value(i: int) -> None:
        await b.prod.send_and_wait(b.topics.values, payloads[b.n + i], key=b"bench")

    lat = await _closed_loop(send_value, readers, b.lat_n, len(subs))
    return Row("market ingest (value → 2 releases)", rate, _pct(lat, 0.5), _pct(lat, 0.99))


STEPS = 16
"""Steps of every purchase-benchmark stream: each purchase buys the next one."""


async def _purchase_streams(b: _Bench, names: list[str]) -> None:
    """Register streams with a :data:`STEPS`-step schedule, 4 values each (not waited for)."""
    levels = [round(0.25 * (k + 1), 2) for k in range(STEPS)]
    market = b.topics.prefix
    for name in names:
        reg = SELLER.sign(StreamRegistration, market, seller_id=SELLER.account_id,
                          **_registration(name, levels, levels[-1]))  # fmt: skip
        await b.client.send(b.topics.registrations, name, reg.model_dump_json().encode())
        for i in range(4):
            await b.client.send(b.topics.values, name, _value_payload(i, market, name))


def _purchase(market: str, buyer: Party, stream: str, k: int) -> bytes:
    """A signed purchase of the next step of ``stream`` (its ``k``-th), signed before timing."""
    req = buyer.sign(PurchaseRequest, market, purchase_id=f"{stream}-{k}",
                     buyer_id=buyer.account_id, stream_id=stream, max_price_minor=0,
                     requested_at_ms=now_ms())  # fmt: skip
    return req.model_dump_json().encode()


async def _purchases(b: _Bench) -> Row:
    """Many streams with a 16-step schedule; each purchase buys the next step of one stream
    (new noise on its 4 retained values) for one of 64 buyers."""
    steps = STEPS
    n_streams = max(1, b.n // steps)
    lat_streams = max(1, -(-b.lat_n // steps))
    names = [f"p{i}" for i in range(n_streams)] + [f"lat{i}" for i in range(lat_streams)]
    market = b.topics.prefix
    await _purchase_streams(b, names)
    # buyers with sealing keys, as the deployment requires (EMARKET_REQUIRE_ENCRYPTION=1):
    # every purchase seals its releases (X25519 + ChaCha20-Poly1305) besides signing a receipt
    buyers = [Party.generate(f"buyer{i}") for i in range(min(64, n_streams))]
    lat = Party.generate("lat")
    for who in (*buyers, lat):
        await b.client.open_account(who, timeout=60)
    # one consumer for all buyer inboxes: 64 polling clients would starve the worker
    all_buyers = await b.reader([b.topics.inbox(x.account_id) for x in buyers])
    lat_reader = await b.reader(b.topics.inbox("lat"))
    await _drain([all_buyers], len(buyers), 5)  # the accounts' confirmations
    await _drain([lat_reader], 1, 5)
    await asyncio.sleep(2.0)  # let the registrations and values land

    payloads = [(_purchase(market, buyers[i % len(buyers)], f"p{i}", k), f"p{i}".encode())
                for k in range(steps) for i in range(n_streams)]  # fmt: skip
    b.mark()
    t0 = time.perf_counter()
    futs = [await b.prod.send(b.topics.purchases, p, key=key) for p, key in payloads]
    await asyncio.gather(*futs)
    got = await _drain([all_buyers], len(futs), 600)
    b.mark()
    rate = got / (time.perf_counter() - t0)

    lat_payloads = [_purchase(market, lat, f"lat{i // steps}", i % steps) for i in range(b.lat_n)]

    async def send_purchase(i: int) -> None:
        stream = f"lat{i // steps}"
        await b.prod.send_and_wait(b.topics.purchases, lat_payloads[i], key=stream.encode())

    lat_ms = await _closed_loop(send_purchase, [lat_reader], b.lat_n, 1)
    return Row("market purchase (next step → 4 sealed releases + receipt)", rate,
               _pct(lat_ms, 0.5), _pct(lat_ms, 0.99))  # fmt: skip


PACED_SEED = 20261124
"""Seed of the paced runs' arrival times (timing only; no noise comes from it)."""


@dataclass
class Paced:
    """Purchase → release latency at an offered rate (open loop, Poisson arrivals)."""

    name: str
    rate: float
    p50_ms: float
    p99_ms: float
    samples: int


Job = tuple[str, bytes, bytes]
"""One paced message: the id its outcome carries, the payload, the key."""


async def _open_loop(
    boot: str, topic: str, jobs: list[Job], rate: float, reader: TopicReader,
    id_of: Callable[[bytes], str],
) -> list[float]:  # fmt: skip
    """Send ``jobs`` at ``rate`` per second (exponential gaps, seeded), each as soon as it is
    due, whatever is still in flight; return each one's send → outcome latency (seconds).

    Open loop, unlike the closed-loop columns: queueing behind a busy worker shows. Sent as a
    buyer's client sends one request (no linger).
    """
    gaps = np.random.default_rng(PACED_SEED).exponential(1.0 / rate, len(jobs))
    prod = AIOKafkaProducer(bootstrap_servers=boot, linger_ms=0, acks="all")
    await prod.start()
    sent: dict[str, float] = {}
    got: dict[str, float] = {}

    async def sender() -> None:
        due, acks = time.perf_counter(), []
        for (ident, payload, key), gap in zip(jobs, gaps, strict=True):
            due += float(gap)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            sent[ident] = time.perf_counter()
            acks.append(await prod.send(topic, payload, key=key))
        await asyncio.gather(*acks)

    task = asyncio.create_task(sender())
    try:
        deadline = time.monotonic() + len(jobs) / rate + 120
        while len(got) < len(jobs) and time.monotonic() < deadline:
            for _, raw in await reader.poll(0.05):
                ident = id_of(raw)
                if ident in sent:  # not an earlier run's message the broker delivers again
                    got.setdefault(ident, time.perf_counter())
        await task
    finally:
        task.cancel()
        await prod.stop()
    missing = [ident for ident, _, _ in jobs if ident not in got]
    if missing:
        raise RuntimeError(f"paced run: {len(missing)} of {len(jobs)} never arrived")
    return [got[ident] - sent[ident] for ident, _, _ in jobs]


def _fulfilled_id(raw: bytes) -> str:
    """The purchase id of a fulfilled purchase; anything else stops the run (a rejection is
    never timed as if it were a purchase)."""
    outcome = json.loads(raw)
    if outcome.get("type") != "purchase_fulfilled":
        raise RuntimeError(f"paced purchases: unexpected outcome {raw[:300]!r}")
    return str(outcome["purchase_id"])


def _value_id(raw: bytes) -> str:
    """The id of the (only) value of a forwarded value batch ("" for the warm-up messages)."""
    items = json.loads(raw).get("items") or [{}]
    return str(items[0].get("value_id", ""))


async def _paced_purchases(b: _Bench, rate: float, n: int, name: str) -> Paced:
    """Purchases at ``rate`` per second for one sealed buyer, each buying the next step of one
    of many streams; latency = her send → her outcome's arrival."""
    b.paced_runs += 1
    tag = f"pace{b.paced_runs}"  # its own streams and buyer
    streams = [f"{tag}s{i}" for i in range(max(1, -(-n // STEPS)))]
    await _purchase_streams(b, streams)
    buyer = Party.generate(tag)
    await b.client.open_account(buyer, timeout=60)
    reader = await b.reader(b.topics.inbox(buyer.account_id))
    await _drain([reader], 1, 5)  # the account's confirmation
    await asyncio.sleep(2.0)  # let the registrations and values land
    market = b.topics.prefix
    jobs = [(f"{streams[i % len(streams)]}-{i // len(streams)}",
             _purchase(market, buyer, streams[i % len(streams)], i // len(streams)),
             streams[i % len(streams)].encode()) for i in range(n)]  # fmt: skip
    lat = await _open_loop(b.boot, b.topics.purchases, jobs, rate, reader, _fulfilled_id)
    return Paced(name, rate, _pct(lat, 0.5), _pct(lat, 0.99), n)


async def _paced_pipe(bootstrap: str, source: str, sink: str, n: int) -> Paced:
    """The pass-through's floor under the same paced load: messages at :data:`PACED_RATE`
    per second, latency = send → arrival on the sink."""
    reader = TopicReader(bootstrap, sink, fetch_max_wait_ms=READ_WAIT_MS)
    await reader.start()
    try:
        first = 10**6  # above every value id the throughput runs sent to this topic
        jobs = [(f"v{i:07d}", _value_payload(i), b"bench") for i in range(first, first + n)]
        lat = await _open_loop(bootstrap, source, jobs, PACED_RATE, reader, _value_id)
    finally:
        await reader.stop()
    return Paced(PASS_THROUGH_PACED, PACED_RATE, _pct(lat, 0.5), _pct(lat, 0.99), n)


async def _fanout(b: _Bench) -> Row:
    """Values in on a stream with many holders: each value is released to every one."""
    await b.client.register(_registration("fan", [0.5, 1.0], 1e6), timeout=60)
    for i in range(4):
        await b.client.publish("fan", [1.0] * DIM, value_id=f"w{i}")
    holders = [Party.generate(f"fan{i}", sealing=False) for i in range(FANOUT_HOLDERS)]
    await asyncio.gather(*(b.client.open_account(who, timeout=60) for who in holders))
    await asyncio.gather(*(b.client.buy("fan", max_price_minor=0, timeout=60, party=who)
                           for who in holders))  # fmt: skip
    reader = await b.reader([b.topics.inbox(x.account_id) for x in holders])
    await _drain([reader], 2 * len(holders), 10)  # the accounts and the purchase outcomes
    market, n = b.topics.prefix, max(1, b.n // 4)
    payloads = [_value_payload(i, market, "fan") for i in range(n + b.lat_n)]
    b.mark()
    t0 = time.perf_counter()
    futs = [await b.prod.send(b.topics.values, payloads[i], key=b"fan") for i in range(n)]
    await asyncio.gather(*futs)
    got = await _drain([reader], n * len(holders), 600)
    b.mark()
    rate = got / (time.perf_counter() - t0)  # deliveries: values × holders

    async def send_value(i: int) -> None:
        await b.prod.send_and_wait(b.topics.values, payloads[n + i], key=b"fan")

    lat = await _closed_loop(send_value, [reader], b.lat_n, len(holders))
    name = f"market fan-out (deliveries/s: value → {FANOUT_HOLDERS} holders)"
    return Row(name, rate, _pct(lat, 0.5), _pct(lat, 0.99))


GOAL_RATIO = {"market ingest": 1.0, "market purchase": 0.7}
"""Throughput goals (issue #15), the median against the same run's pass-through."""
GOAL_P99_MS = 50.0
"""Closed-loop p99 goal for every market path."""
GOAL_PACED_P99_MS = {PACED_SLOW: 25.0, PACED_BUSY: 50.0}
"""p99 goals of the market's paced purchases (the pass-through's row is their floor)."""


def one_run(sizes: Sizes, workdir: Path) -> Run:
    """Every path once, on a fresh embedded broker: raw, pass-through, then the market's."""
    workdir.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        raw = asyncio.run(raw_round_trip(broker.bootstrap, sizes.n, sizes.lat_n))
        faust_row, faust_paced = faust_passthrough(broker, sizes, workdir)
        market = market_paths(broker, sizes, workdir)
        return Run([raw, faust_row, *market.rows], [faust_paced, *market.paced])


def _spread(values: list[float], fmt: str) -> str:
    """``min / median / max`` of several runs (one number for one run)."""
    if len(values) == 1:
        return format(values[0], fmt)
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{lo:{fmt}} / {mid:{fmt}} / {hi:{fmt}}"


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def render(runs: list[list[Row]], paced: list[list[Paced]] | None = None) -> str:
    """The tables and the goals, from every run; ratios are taken within a run, then spread."""
    lines = [
        "| path | events/s | p50 ms | p99 ms | vs Faust pass-through | vs raw round trip |",
        "|---|---|---|---|---|---|",
    ]
    verdicts = []
    for i, row in enumerate(runs[0]):
        rs = [run[i] for run in runs]
        vs_faust = [r.rate / run[1].rate for r, run in zip(rs, runs, strict=True)]
        vs_raw = [r.rate / run[0].rate for r, run in zip(rs, runs, strict=True)]
        lines.append(
            f"| {row.name} | {_spread([r.rate for r in rs], ',.0f')} | "
            f"{_spread([r.p50_ms for r in rs], '.1f')} | {_spread([r.p99_ms for r in rs], '.1f')} "
            f"| {_spread(vs_faust, '.2f')}x | {_spread(vs_raw, '.3f')}x |"
        )
        if i >= 2:
            path = row.name.split(" (")[0]
            ratio, p99 = statistics.median(vs_faust), statistics.median([r.p99_ms for r in rs])
            goal = GOAL_RATIO.get(path)
            throughput = (f">= {goal}x pass-through: {_verdict(ratio >= goal)} ({ratio:.2f}x)"
                          if goal else f"{ratio:.2f}x pass-through (no goal)")  # fmt: skip
            verdicts.append(f"  {path}: {throughput}; closed-loop p99 < {GOAL_P99_MS:g} ms: "
                            f"{_verdict(p99 < GOAL_P99_MS)} ({p99:.1f} ms)")  # fmt: skip
    what = f"min / median / max of {len(runs)} runs" if len(runs) > 1 else "one run"
    out = [f"Each cell: {what}; ratios are taken within a run.\n", *lines]
    if paced:
        out += ["", "Latency under paced load (open loop, Poisson arrivals, a client that sends "
                "each request at once): the pass-through forwarding a value, then a sealed buyer's "
                "purchases (send → her outcome):", "",
                "| path, offered rate | events/s | samples | p50 ms | p99 ms | goal |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        for i, first in enumerate(paced[0]):
            ps = [run[i] for run in paced]
            p99 = statistics.median([p.p99_ms for p in ps])
            goal = GOAL_PACED_P99_MS.get(first.name)
            verdict = f"p99 < {goal:g} ms: {_verdict(p99 < goal)}" if goal else "baseline"
            out.append(f"| {first.name} | {_spread([p.rate for p in ps], ',.0f')} | "
                       f"{first.samples} | {_spread([p.p50_ms for p in ps], '.1f')} | "
                       f"{_spread([p.p99_ms for p in ps], '.1f')} | {verdict} |")  # fmt: skip
            if goal:
                verdicts.append(f"  {first.name}: p99 < {goal:g} ms: "
                                f"{_verdict(p99 < goal)} ({p99:.1f} ms)")  # fmt: skip
    goals = "goals (the median over runs; throughput against its own run's pass-through):"
    return "\n".join([*out, "", goals, *verdicts])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, one run: a smoke test")
    p.add_argument("--runs", type=int, default=None, help="independent runs (default 3; quick 1)")
    args = p.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    runs = args.runs or (1 if args.quick else 3)
    workdir = Path(tempfile.mkdtemp(prefix="emarket-bench-"))
    results = [one_run(sizes, workdir / f"run{i}") for i in range(runs)]
    print(f"## Service on the embedded broker ({sizes.n:,} events per throughput run, "
          f"{sizes.lat_n} closed-loop latency samples, {os.cpu_count()} cores)\n")  # fmt: skip
    print(render([r.rows for r in results], [r.paced for r in results]))
    print(f"(logs: {workdir})", file=sys.stderr)  # not part of the result (bench.report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
