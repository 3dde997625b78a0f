"""Bounded soak test: a steady load for minutes, watching memory, lag and errors.

    python -m bench.soak                      # 100,000 values and 10,000 purchases, ~4 minutes
    python -m bench.soak --values 20000 --purchases 2000 --rate 400 --horizon 30

A seller feeds values to 20 streams at a fixed rate and 50 buyers keep buying steps (one
purchase per ten values), against one worker on the embedded broker, at the worker's default
dedup horizon (7 days: nothing expires during the run, so every mark and purchase record stays;
``--horizon`` shortens it). Every 10 s it samples the worker's resident memory, its consumer lag
and state sizes from /metrics, and at the end checks that nothing was rejected or lost.

It then prints what each kept record costs: its bytes in the store's codec and the heap it takes
in the memory store with its index (measured in this process on a core fed the same load,
:func:`record_costs`), and the worker's resident memory grown per value over the run (with its
share of purchases); and what an account (in the account replica every worker keeps), a stream
(its record and what a worker builds for it) and a holder (its entry in the stream's record)
take, :func:`holding_costs`. ``--costs-only`` prints these two tables without the soak. The
tables it prints are what docs/operations.md reports.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import math
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench.machine import Machine
from bench.service import BENCH_ENV, BENCH_KEYS, bench_market, sealed_batch
from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.client import MarketClient, now_ms
from streams.clients.keys import Party
from streams.core import EvictedValue, MarketCore, MarketKeys, Stores
from streams.core.codecs import CODECS
from streams.core.context import Limits
from streams.core.state import Holder, with_registration
from streams.wire.events import (
    AccountState,
    LinearLevelSpec,
    PurchaseRequest,
    StreamRegistration,
)
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.directory import AccountReplica
from streams.worker.history import StateReader
from streams.worker.runner import ChildWorker
from streams.worker.state_records import StateSeal, Version

N_STREAMS, N_BUYERS, DIM = 20, 50, 8
STALL_S = 60.0
"""Seconds without one value processed, once every value is sent, that end the run where the
worker stands (a worker still making progress is waited for, however contended its CPU)."""
LADDER = [round(0.1 * k, 1) for k in range(1, 11)]


@dataclass
class Sample:
    t: float
    values_sent: int
    values_ingested: float
    purchases_sent: int
    purchases_done: float
    lag: float
    rss_mb: float
    releases: float
    purchases_table: float


@dataclass
class SoakResult:
    samples: list[Sample] = field(default_factory=list)
    rejections: float = 0.0
    errors_in_log: int = 0
    error_lines: list[str] = field(default_factory=list)
    values: int = 0
    purchases: int = 0
    duration: float = 0.0
    skipped: int = 0

    def add(self, sample: Sample | None) -> None:
        """Keep a sample, or count one /metrics did not answer in time."""
        if sample is None:
            self.skipped += 1
        else:
            self.samples.append(sample)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _sample(w: ChildWorker, t: float, sent_v: int, sent_p: int) -> Sample | None:
    """The worker's figures now; ``None`` if /metrics did not answer in time (a busy or
    shared machine: the sample is skipped, not the soak)."""
    try:
        return _read_sample(w, t, sent_v, sent_p)
    except OSError:  # URLError and socket timeouts
        return None


def _read_sample(w: ChildWorker, t: float, sent_v: int, sent_p: int) -> Sample:
    assert w.proc is not None
    return Sample(
        t=t,
        values_sent=sent_v,
        values_ingested=w.metric("emarket_values_ingested_total", {"status": "accepted"}),
        purchases_sent=sent_p,
        purchases_done=w.metric("emarket_purchases_total"),
        lag=w.metric("emarket_consumer_lag_messages"),
        rss_mb=_rss_mb(w.proc.pid),
        releases=w.metric("emarket_state_entries", {"table": "releases"}),
        purchases_table=w.metric("emarket_state_entries", {"table": "purchases"}),
    )


async def _catch_up(
    w: ChildWorker, res: SoakResult, t0: float, next_sample: float, counts: tuple[int, int, int]
) -> None:
    """Wait for a lagging worker while it makes progress (a contended CPU slows it), sampling
    every 10 s; one that processes nothing for :data:`STALL_S` ends the run where it stands.
    ``counts``: the values to ingest, and the values and purchases sent."""
    n_values, sent_v, sent_p = counts
    deadline, before = time.monotonic() + STALL_S, -1.0
    while time.monotonic() < deadline:
        done = w.metric("emarket_values_ingested_total", {"status": "accepted"})
        if done >= n_values and w.metric("emarket_purchases_total") >= sent_p:
            return
        if done > before:
            deadline, before = time.monotonic() + STALL_S, done
        now = time.monotonic() - t0
        if now >= next_sample:
            res.add(_sample(w, now, sent_v, sent_p))
            next_sample += 10.0
        await asyncio.sleep(0.5)


async def _load(
    settings: Settings, w: ChildWorker, n_values: int, n_purchases: int, rate: float
) -> SoakResult:
    topics = Topics(settings.prefix, settings.partitions)
    res = SoakResult(values=n_values, purchases=n_purchases)
    seller = Party.generate("soak", sealing=False)
    buyers = [Party.generate(f"b{i}", sealing=False) for i in range(N_BUYERS)]
    async with MarketClient(settings.bootstrap, topics, party=seller) as c:
        for who in (seller, *buyers):
            await c.open_account(who, timeout=60)
        for i in range(N_STREAMS):
            await c.register(
                dict(
                    stream_id=f"s{i}",
                    mechanism="laplace",
                    sensitivity=1.0,
                    dimension=DIM,
                    steps=LADDER,
                    cap=LADDER[-1],
                    retain_last=16,
                    pricing=LinearLevelSpec(rate_per_level=100.0),
                ),
                timeout=60,
            )
    prod = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, linger_ms=10)
    await prod.start()
    t0 = time.monotonic()
    next_sample = 0.0
    sent_v = sent_p = 0
    per_purchase = max(1, n_values // max(1, n_purchases))
    try:
        while sent_v < n_values:
            # keep to the target rate (values per second)
            due = int((time.monotonic() - t0) * rate) + 1
            while sent_v < min(due, n_values):
                s = f"s{sent_v % N_STREAMS}"
                batch = sealed_batch(
                    seller,
                    topics.prefix,
                    stream_id=s,
                    seller_id="soak",
                    items=[
                        {
                            "value_id": f"v{sent_v}",
                            "values": [20.0 + (sent_v % 7)] * DIM,
                            "published_at_ms": now_ms(),
                        }
                    ],
                )
                await prod.send(topics.values, batch.model_dump_json().encode(), key=s.encode())
                sent_v += 1
                if sent_v % per_purchase == 0 and sent_p < n_purchases:
                    buyer, s2 = buyers[sent_p % N_BUYERS], f"s{(sent_p // N_BUYERS) % N_STREAMS}"
                    req = buyer.sign(
                        PurchaseRequest,
                        bench_market(topics.prefix),
                        purchase_id=f"p{sent_p}",
                        buyer_id=buyer.account_id,
                        stream_id=s2,
                        max_price_minor=10_000,
                        requested_at_ms=now_ms(),
                    )
                    await prod.send(
                        topics.purchases, req.model_dump_json().encode(), key=s2.encode()
                    )
                    sent_p += 1
            now = time.monotonic() - t0
            if now >= next_sample:
                res.add(_sample(w, now, sent_v, sent_p))
                next_sample += 10.0
            await asyncio.sleep(0.01)
        await prod.flush()
        await _catch_up(w, res, t0, next_sample, (n_values, sent_v, sent_p))
        res.samples.append(_read_sample(w, time.monotonic() - t0, sent_v, sent_p))
        res.duration = time.monotonic() - t0
        res.purchases = sent_p
        res.rejections = w.metric("emarket_rejections_total")
    finally:
        await prod.stop()
    return res


@dataclass
class RecordCosts:
    """What one kept record costs: bytes in its store's codec, heap with its index (and the
    index alone: what stays in memory when the records are in RocksDB)."""

    purchase_bytes: float
    mark_bytes: float
    purchase_heap: float
    mark_heap: float
    purchase_index: float
    mark_index: float


def _feed_core(core: MarketCore, topics: Topics, seller: Party, n: int, start: int) -> None:
    for i in range(start, start + n):
        s = f"s{i % N_STREAMS}"
        batch = sealed_batch(
            seller,
            topics.prefix,
            stream_id=s,
            seller_id="soak",
            items=[
                {"value_id": f"v{i}", "values": [20.0 + i % 7] * DIM, "published_at_ms": now_ms()}
            ],
        )
        out = core.handle(topics.values, batch.model_dump_json().encode())
        assert out.status == "accepted", out.reason  # a refused value leaves no record


def _buy_core(core: MarketCore, topics: Topics, buyers: list[Party], n: int) -> None:
    for k in range(n):
        buyer, s = buyers[k % len(buyers)], f"s{(k // len(buyers)) % N_STREAMS}"
        req = buyer.sign(
            PurchaseRequest,
            bench_market(topics.prefix),
            purchase_id=f"p{k}",
            buyer_id=buyer.account_id,
            stream_id=s,
            max_price_minor=10_000,
            requested_at_ms=now_ms(),
        )
        core.handle(topics.purchases, req.model_dump_json().encode())


def _retained(make: Callable[[], object]) -> float:
    """Heap bytes still held by what ``make`` returns (tracemalloc; collected before and
    after)."""
    gc.collect()
    tracemalloc.start()
    try:
        kept = make()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return float(held)


def _index_heap(records: dict[str, Any], stamp: Callable[[Any], int]) -> float:
    """Heap per record of the expiry index alone, its keys its own strings (as when the
    records live in RocksDB: :meth:`~streams.core.replay.records.Records._index` builds one
    ``(time, key)`` per record from a scan)."""
    pairs = [(stamp(v), k.encode()) for k, v in records.items()]

    def index() -> list[tuple[int, str]]:
        heap = [(t, k.decode()) for t, k in pairs]
        heapq.heapify(heap)
        return heap

    return _retained(index) / max(1, len(pairs))


def _heap(records: dict[str, Any], store: str, stamp: Callable[[Any], int]) -> float:
    """Heap per record of a memory store holding ``records`` (fresh copies: key, record as
    its codec decodes it, dict slot) and the expiry index over them (a ``(time, key)`` each)."""
    encode, decode = CODECS[store]
    raw = [(k.encode(), encode(v)) for k, v in records.items()]
    gc.collect()
    tracemalloc.start()
    try:
        copy = {k.decode(): decode(v) for k, v in raw}
        index = [(stamp(v), k) for k, v in copy.items()]
        heapq.heapify(index)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return held / max(1, len(copy))


def record_costs(n_values: int = 4_000, n_purchases: int = 1_000) -> RecordCosts:
    """Feed a core on dicts the soak's streams, values past their windows (marks) and
    purchases (records), at the default horizon; return each kept record's bytes in its
    store's codec and its heap in a memory store, with its index."""
    topics = Topics("soak", 1)
    core = MarketCore(Stores(), BENCH_KEYS, topics)  # the key sealed_batch seals to
    seller = Party.generate("soak", sealing=False)
    buyers = [Party.generate(f"b{i}", sealing=False) for i in range(N_BUYERS)]
    for who in (seller, *buyers):
        core.handle(topics.accounts, who.open_account(core.ctx.market).model_dump_json().encode())
    for i in range(N_STREAMS):
        reg = seller.sign(
            StreamRegistration,
            core.ctx.market,
            stream_id=f"s{i}",
            seller_id="soak",
            mechanism="laplace",
            sensitivity=1.0,
            dimension=DIM,
            steps=LADDER,
            cap=LADDER[-1],
            retain_last=16,
            currency="EUR",
            pricing={"kind": "linear_level", "rate_per_level": 100.0},
        )
        core.handle(topics.registrations, reg.model_dump_json().encode())
    _feed_core(core, topics, seller, 16 * N_STREAMS + n_values, 0)
    _buy_core(core, topics, buyers, n_purchases)
    _feed_core(core, topics, seller, N_STREAMS, 16 * N_STREAMS + n_values)  # outcomes sent
    stores = core.stores
    kept = dict(stores.purchases)
    marks = {k: v for k, v in stores.releases.items() if isinstance(v, EvictedValue)}
    return RecordCosts(
        purchase_bytes=sum(len(CODECS["purchases"][0](r)) for r in kept.values()) / len(kept),
        mark_bytes=sum(len(CODECS["releases"][0](m)) for m in marks.values()) / len(marks),
        purchase_heap=_heap(kept, "purchases", lambda r: int(r.requested_at_ms)),
        mark_heap=_heap(marks, "releases", lambda m: int(m.published_at_ms)),
        purchase_index=_index_heap(kept, lambda r: int(r.requested_at_ms)),
        mark_index=_index_heap(marks, lambda m: int(m.published_at_ms)),
    )


@dataclass
class HoldingCosts:
    """What an account, a stream and a holder take: bytes in their store's codec, heap."""

    account_bytes: float
    account_heap: float  # in the account replica (every worker holds every account)
    stream_bytes: float  # its record with no holder and no value
    registered_bytes: float  # how it was registered: written once, apart from its record
    stream_heap: float  # its record, its terms and product, the census: a worker's retained heap
    holder_bytes: float
    holder_heap: float
    holders: int  # the holders of the record measured for the holder figures
    full_record_bytes: float  # that record's bytes: what a holders base of as many weighs


def holding_costs(accounts: int = 2_000, streams: int = 200, holders: int = 2_000) -> HoldingCosts:
    """Measure in this process, on a core on dicts: ``accounts`` accounts applied to an
    :class:`~streams.worker.directory.AccountReplica` (as every worker holds them), the heap
    one more registered stream leaves in the core (``streams`` of them, no values), and a
    stream record with ``holders`` holders against one with none (ids of 24 characters)."""
    topics = Topics("soak", 1)
    core = MarketCore(
        Stores(),
        MarketKeys(Ed25519PrivateKey.generate(), b"s" * 32),
        topics,
        limits=Limits(max_streams_per_seller=streams + 1),
    )
    seller = Party.generate("soak", sealing=False)
    core.handle(topics.accounts, seller.open_account(core.ctx.market).model_dump_json().encode())
    regs = [
        seller.sign(
            StreamRegistration,
            core.ctx.market,
            stream_id=f"s{i:05d}",
            seller_id="soak",
            mechanism="laplace",
            sensitivity=1.0,
            dimension=DIM,
            steps=LADDER,
            cap=LADDER[-1],
            retain_last=16,
            pricing=LinearLevelSpec(rate_per_level=100.0),
        )
        .model_dump_json()
        .encode()
        for i in range(streams)
    ]
    core.handle(topics.registrations, regs[0])  # the first builds what all streams share

    def register() -> None:
        for raw in regs[1:]:
            out = core.handle(topics.registrations, raw)
            assert out.status == "accepted", out.reason

    stream_heap = _retained(register) / (streams - 1)
    encode, decode = CODECS["streams"]
    state = with_registration(core.stores, "s00001", core.stores.streams["s00001"])
    bare = encode(state)
    registered = CODECS["registered"][0](state.registered)
    many = state.model_copy(
        update={
            "holders": {
                f"buyer-{i:018d}": Holder(level=LADDER[3], paid_minor=400, purchases=4)
                for i in range(holders)
            }
        }
    )
    full = encode(many)
    holder_heap = (_retained(lambda: decode(full)) - _retained(lambda: decode(bare))) / holders

    seller_state: AccountState = core.stores.accounts["soak"]
    records = [
        (
            f"acct-{i:019d}".encode(),
            seller_state.model_copy(update={"account_id": f"acct-{i:019d}", "key_id": f"{i:016x}"})
            .model_dump_json()
            .encode(),
        )
        for i in range(accounts)
    ]
    reader = StateReader(StateSeal(bytes(32), bytes(32)))
    replica = AccountReplica({}, topics.accounts, "soak-progress", reader)

    def replicate() -> AccountReplica:
        for key, value in records:
            replica._set(
                key.decode(), 0, Version(1 << 32, 1), AccountState.model_validate_json(value)
            )
        return replica

    return HoldingCosts(
        account_bytes=sum(len(v) for _, v in records) / accounts,
        account_heap=_retained(replicate) / accounts,
        stream_bytes=float(len(bare)),
        registered_bytes=float(len(registered)),
        stream_heap=stream_heap,
        holder_bytes=(len(full) - len(bare)) / holders,
        holder_heap=holder_heap,
        holders=holders,
        full_record_bytes=float(len(full)),
    )


def run_soak(
    n_values: int, n_purchases: int, rate: float, workdir: Path, horizon: float | None = None
) -> SoakResult:
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        settings = Settings(
            broker=broker.url,
            app_id=f"soak-{uuid.uuid4().hex[:6]}",
            prefix=f"soak{uuid.uuid4().hex[:6]}",
            data_dir=workdir / "data",
            web_port=find_free_port(),
            log_level="warn",
            require_encryption=False,
            metrics_every=0.0,  # a sample is the worker's figures now, not a cached page
        ).for_tansu()
        # the worker's default horizon, unless a short one is asked for (the CI soak's), so
        # that memory levels off within the run: eviction markers of values older than the
        # horizon are forgotten (resends of them are refused); values sealed to its key
        env = (
            dict(BENCH_ENV)
            if horizon is None
            else {"EMARKET_DEDUP_HORIZON": str(horizon), **BENCH_ENV}
        )
        w = ChildWorker(settings, log_path=workdir / "worker.log", env=env).start()
        try:
            w.wait_healthy(90)
            res = asyncio.run(_load(settings, w, n_values, n_purchases, rate))
        finally:
            w.stop()
        log = (workdir / "worker.log").read_text(errors="replace")
        res.error_lines = [
            line for line in log.splitlines() if "[ERROR]" in line or "Traceback" in line
        ]
        res.errors_in_log = len(res.error_lines)
    return res


def render(res: SoakResult) -> str:
    out = [
        f"## Soak: {res.values:,} values and {res.purchases:,} purchases in "
        f"{res.duration:.0f} s (one worker, embedded broker)\n",
        "| t (s) | values sent | ingested | purchases sent | done | lag | RSS MB | release states "
        "| purchase records |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in res.samples:
        out.append(
            f"| {s.t:.0f} | {s.values_sent:,} | {s.values_ingested:,.0f} | {s.purchases_sent:,} "
            f"| {s.purchases_done:,.0f} | {s.lag:,.0f} | {s.rss_mb:.0f} | {s.releases:,.0f} "
            f"| {s.purchases_table:,.0f} |"
        )
    out.append(
        f"\nrejections: {res.rejections:.0f}; errors in the worker log: "
        f"{res.errors_in_log}; samples skipped (/metrics too slow): {res.skipped}"
    )
    return "\n".join(out)


def render_costs(res: SoakResult, costs: RecordCosts) -> str:
    """What a kept record costs, and the worker's memory grown per value over the run (from
    the first sample with a quarter of the values in, so the windows are full)."""
    first = next((s for s in res.samples if s.values_ingested >= res.values / 4), None)
    last = res.samples[-1] if res.samples else None
    grown = "n/a"
    if first is not None and last is not None and last.values_ingested > first.values_ingested:
        per = (last.rss_mb - first.rss_mb) * 2**20 / (last.values_ingested - first.values_ingested)
        grown = f"{per:,.0f} B"
    return "\n".join(
        [
            "\n## Memory per kept record (dedup horizon: the default, 7 days, unless --horizon)\n",
            "| record | bytes in its store's codec | heap in the memory store, with its index "
            "| its index alone (records in RocksDB) |",
            "|---|---|---|---|",
            f"| purchase (decision) | {costs.purchase_bytes:.0f} B | {costs.purchase_heap:,.0f} B "
            f"| {costs.purchase_index:,.0f} B |",
            f"| value mark | {costs.mark_bytes:.0f} B | {costs.mark_heap:,.0f} B "
            f"| {costs.mark_index:,.0f} B |",
            f"\nworker RSS grown per value ingested, with one purchase per "
            f"{max(1, res.values // max(1, res.purchases))} values: {grown}",
        ]
    )


def render_holdings(h: HoldingCosts) -> str:
    """What an account, a stream and a holder take (:func:`holding_costs`)."""
    return "\n".join(
        [
            "\n## Memory per account, stream and holder (in process, memory stores)\n",
            "| what | bytes in its store's codec | heap |",
            "|---|---|---|",
            f"| account (heap: in the account replica, on every worker) | {h.account_bytes:,.0f} B "
            f"| {h.account_heap:,.0f} B |",
            f"| stream, no value, no holder (heap: record, registration, terms, product, census) "
            f"| {h.stream_bytes:,.0f} B + {h.registered_bytes:,.0f} B registered (written once) "
            f"| {h.stream_heap:,.0f} B |",
            f"| holder (its entry in the stream's record) | {h.holder_bytes:,.0f} B "
            f"| {h.holder_heap:,.0f} B |",
            f"\na stream's record with all its {h.holders:,} holders: "
            f"{h.full_record_bytes:,.0f} B in "
            "its codec, about what a holders base of as many weighs: written once per "
            f"~{math.isqrt(2 * h.holders)} holder changes, the record of each batch carrying only "
            "the holders changed since (`streams/core/stream_store.py`)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--values", type=int, default=100_000)
    p.add_argument("--purchases", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=500.0, help="values per second")
    p.add_argument(
        "--horizon",
        type=float,
        default=None,
        help="dedup horizon, seconds (default: the worker's, 7 days)",
    )
    p.add_argument(
        "--costs-only",
        action="store_true",
        help="only what records, accounts, streams, holders take (no soak)",
    )
    args = p.parse_args(argv)
    machine = Machine.now()
    if args.costs_only:
        print(render_costs(SoakResult(), record_costs()))
        print(render_holdings(holding_costs()))
        print(f"\n{machine.line()}")
        return 0
    res = run_soak(
        args.values, args.purchases, args.rate, Path(tempfile.mkdtemp(prefix="soak-")), args.horizon
    )
    print(render(res))
    print(render_costs(res, record_costs()))
    print(render_holdings(holding_costs()))
    print(f"\n{machine.line()}")
    last = res.samples[-1]
    ok = last.values_ingested >= res.values and res.rejections == 0 and res.errors_in_log == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
