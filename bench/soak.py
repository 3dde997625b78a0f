"""Bounded soak test: a steady load for minutes, watching memory, lag and errors.

    python -m bench.soak                      # 100,000 values and 10,000 purchases, ~4 minutes
    python -m bench.soak --values 20000 --purchases 2000 --rate 400

A seller feeds values to 20 streams at a fixed rate and 50 buyers keep buying steps (one
purchase per ten values), against one worker on the embedded broker. Every 10 s it samples the
worker's resident memory, its consumer lag and state sizes from /metrics, and at the end checks
that nothing was rejected or lost. The table it prints is what docs/operations.md reports.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaProducer

from bench.service import BENCH_ENV, sealed_batch
from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.client import MarketClient, now_ms
from streams.clients.keys import Party
from streams.wire.events import LinearLevelSpec, PurchaseRequest
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker

N_STREAMS, N_BUYERS, DIM = 20, 50, 8
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
    values: int = 0
    purchases: int = 0
    duration: float = 0.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _sample(w: ChildWorker, t: float, sent_v: int, sent_p: int) -> Sample:
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
                dict(stream_id=f"s{i}", mechanism="laplace", sensitivity=1.0, dimension=DIM,
                     steps=LADDER, cap=LADDER[-1], retain_last=16,
                     pricing=LinearLevelSpec(rate_per_level=100.0)),
                timeout=60,
            )  # fmt: skip
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
                batch = sealed_batch(seller, topics.prefix, stream_id=s, seller_id="soak",
                                     items=[{"value_id": f"v{sent_v}",
                                             "values": [20.0 + (sent_v % 7)] * DIM,
                                             "published_at_ms": now_ms()}])  # fmt: skip
                await prod.send(topics.values, batch.model_dump_json().encode(), key=s.encode())
                sent_v += 1
                if sent_v % per_purchase == 0 and sent_p < n_purchases:
                    buyer, s2 = buyers[sent_p % N_BUYERS], f"s{(sent_p // N_BUYERS) % N_STREAMS}"
                    req = buyer.sign(PurchaseRequest, topics.prefix, purchase_id=f"p{sent_p}",
                                     buyer_id=buyer.account_id, stream_id=s2,
                                     max_price_minor=10_000, requested_at_ms=now_ms())  # fmt: skip
                    await prod.send(topics.purchases, req.model_dump_json().encode(),
                                    key=s2.encode())  # fmt: skip
                    sent_p += 1
            now = time.monotonic() - t0
            if now >= next_sample:
                res.samples.append(_sample(w, now, sent_v, sent_p))
                next_sample += 10.0
            await asyncio.sleep(0.01)
        await prod.flush()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = w.metric("emarket_values_ingested_total", {"status": "accepted"})
            if done >= n_values and w.metric("emarket_purchases_total") >= sent_p:
                break
            now = time.monotonic() - t0
            if now >= next_sample:  # keep sampling while a lagging worker catches up
                res.samples.append(_sample(w, now, sent_v, sent_p))
                next_sample += 10.0
            await asyncio.sleep(0.5)
        res.samples.append(_sample(w, time.monotonic() - t0, sent_v, sent_p))
        res.duration = time.monotonic() - t0
        res.purchases = sent_p
        res.rejections = w.metric("emarket_rejections_total")
    finally:
        await prod.stop()
    return res


def run_soak(
    n_values: int, n_purchases: int, rate: float, workdir: Path, horizon: float = 30.0
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
        ).for_tansu()
        # a short dedup horizon, so that the soak can show memory levelling off: eviction
        # markers of values older than the horizon are forgotten (resends of them are refused)
        env = {"EMARKET_DEDUP_HORIZON": str(horizon), **BENCH_ENV}  # values sealed to its key
        w = ChildWorker(settings, log_path=workdir / "worker.log", env=env).start()
        try:
            w.wait_healthy(90)
            res = asyncio.run(_load(settings, w, n_values, n_purchases, rate))
        finally:
            w.stop()
        log = (workdir / "worker.log").read_text(errors="replace")
        res.errors_in_log = sum(
            1 for line in log.splitlines() if "[ERROR]" in line or "Traceback" in line
        )
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
    out.append(f"\nrejections: {res.rejections:.0f}; errors in the worker log: {res.errors_in_log}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--values", type=int, default=100_000)
    p.add_argument("--purchases", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=500.0, help="values per second")
    p.add_argument("--horizon", type=float, default=30.0, help="dedup horizon, seconds")
    args = p.parse_args(argv)
    res = run_soak(
        args.values, args.purchases, args.rate, Path(tempfile.mkdtemp(prefix="soak-")), args.horizon
    )
    print(render(res))
    last = res.samples[-1]
    ok = last.values_ingested >= res.values and res.rejections == 0 and res.errors_in_log == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
