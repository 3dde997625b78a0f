"""A worker starting on a market of N accounts (issue #45): ``python -m bench.accounts
--changelog 100000``.

What a worker reads when it starts (or another one joins) in a market that holds N accounts:
the accounts changelog and its checkpoints. They are written here as the workers that opened
the accounts would have written them (each account's record sealed under the market's state
key, stamped, batches of 1,000 each followed by every partition's checkpoint with its sums:
:func:`bench.accounts.changelog`), on the embedded broker, with no inbox topic made (the v1
opening path, :mod:`bench.accounts_open`, stalls the embedded broker before 100,000). Then a
worker starts: measured, how long until its replica holds and verifies them all
(``emarket_replica_accounts``) and the worker's RSS against the same worker idle on an empty
market; then the replica alone in a process of its own (:mod:`bench.accounts_replica`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from bench.accounts import Changelogs, changelog
from bench.accounts_open import _catch_up, _idle, _pid, _rss, _settings
from bench.machine import Machine
from streams.broker.embedded import EmbeddedBroker
from streams.worker.config import Settings
from streams.worker.progress import progress_topic
from streams.worker.runner import ChildWorker
from streams.worker.secrets import load_or_create_keys, state_keys
from streams.worker.state_records import StateSeal

__all__ = ["run_changelog"]

EPOCH = (1000 << 32) | 1
"""Above any epoch the idle worker claimed: these records are the market's newest history."""
TIMEOUT_S = 1800.0


async def _write(bootstrap: str, records: list[Any]) -> float:
    t0 = time.perf_counter()
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await prod.start()
    try:
        for at in range(0, len(records), 2_000):
            sent = [
                await prod.send(
                    r.topic, r.value, key=r.key, partition=r.partition, headers=list(r.headers)
                )
                for r in records[at : at + 2_000]
            ]
            await asyncio.gather(*sent)
    finally:
        await prod.stop()
    return time.perf_counter() - t0


def _held(worker: ChildWorker, n: int, t0: float) -> dict[str, float]:
    """Wait until the worker's replica holds ``n`` accounts, every partition verified."""
    while time.perf_counter() - t0 < TIMEOUT_S:
        try:
            held = worker.metric("emarket_replica_accounts")
            distrusted = worker.metric("emarket_partitions_unverified", {"reader": "replica"})
        except OSError:  # not serving yet
            held, distrusted = 0.0, 0.0
        if held >= n and not distrusted:
            took = time.perf_counter() - t0
            time.sleep(5)  # settled
            return {"replica_s": took, "rss": float(_rss(_pid(worker)))}
        time.sleep(0.5)
    raise SystemExit(f"the worker's replica did not reach {n} accounts in {TIMEOUT_S:.0f} s")


def _report(n: int, written_s: float, m: dict[str, float]) -> None:
    per, up = (m["rss"] - m["rss0"]) / n, m["catch_up_s"]
    print(f"| a worker starting on {n:,} accounts (embedded broker) | |")
    print("|---|---|")
    print(f"| accounts changelog written (sealed records and checkpoints) | {written_s:.0f} s |")
    print(f"| worker: its replica held and verified them all after | {m['replica_s']:.1f} s |")
    print(
        f"| worker RSS: idle on an empty market → holding them | {m['rss0'] / 2**20:,.0f} → "
        f"{m['rss'] / 2**20:,.0f} MB ({per:,.0f} B per account) |"
    )
    print(f"| replica alone, from the start: caught up in | {up:.1f} s ({n / up:,.0f}/s) |")
    print(f"| replica alone: RSS per account | {m['replica_rss_per_account']:,.0f} B |")


def _records(settings: Settings, n: int) -> list[Any]:
    seal = StateSeal(*state_keys(load_or_create_keys(settings.data_dir).noise_secret))
    where = Changelogs(
        seal, f"{settings.app_id}-accounts-changelog", progress_topic(settings.app_id), EPOCH
    )
    return changelog(n, 1_000, where)


def run_changelog(n: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="emarket-accounts-"))
    machine = Machine.now()
    base = _settings(workdir, "v1")
    env = {"EMARKET_MAX_ACCOUNTS": str(n + 10)}
    records = _records(base, n)
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        settings = dataclasses.replace(base, broker=broker.url).for_tansu()
        m = _idle(settings, env, workdir)
        written_s = asyncio.run(_write(settings.bootstrap, records))
        worker = ChildWorker(settings, log_path=workdir / "market.log", env=env).start()
        try:
            m.update(_held(worker, n, time.perf_counter()))
            m.update(_catch_up(settings, n))
        finally:
            worker.stop()
    _report(n, written_s, m)
    print(f"(logs: {workdir})", file=sys.stderr)
    print(machine.line())
