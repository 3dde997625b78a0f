"""N accounts opened on the embedded broker through the operators' invitation path (issue #45):
``python -m bench.accounts --open 100000 [--inboxes v1|v2]``.

One worker (``EMARKET_OPENINGS=invite``, the allowance and ``EMARKET_MAX_ACCOUNTS`` raised to
N): N parties, keys from deterministic seeds, each with an invitation the market's key signs
for its id and key (what ``epsilon-market invite --signing-key`` makes), their ``open_account``
events made before the market runs, then written to ``<p>.accounts`` while the worker runs.
Measured: how long the worker takes to accept them all and its replica to hold them all
(``emarket_replica_accounts``), the worker's RSS idle and then; then a new reader, the
replica alone (:class:`~streams.worker.directory.AccountReplica`, in a process of its own, as a
worker that starts later builds it), catching up from the start of the changelog: how long, and
its RSS per account.

With v1 inboxes (a topic per account) every opening also queues an inbox topic, which the
embedded broker makes at a few a second past 10,000 topics: the confirmations wait for them
(held in the worker, ``emarket_inboxes_waiting``) and the run stops once the replica holds
every account, with most inboxes not made. 10,000 openings went through so; 100,000 did not
(one run slowed to ~25 accepted a second by 34,000; in three others the embedded broker
stopped answering the worker after 400–600, and with the openings all written before the
worker started it did so at 10,000 too): the run gives up after :data:`STALL_S` without
progress.
``--inboxes v2`` runs the market with one partitioned inbox topic (``EMARKET_INBOXES=v2``), on
a checkout that has them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from bench.machine import Machine
from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.keys import Party
from streams.core.context import Limits
from streams.wire.invitations import invite
from streams.wire.signing import MarketRef
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker
from streams.worker.secrets import load_or_create_keys

__all__ = ["run_open"]

POLL_S = 2.0
TIMEOUT_S = 3600.0
STALL_S = 180.0


def _rss(pid: int) -> int:
    """Resident bytes of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _pid(worker: ChildWorker) -> int:
    assert worker.proc is not None
    return worker.proc.pid


def _openings(job: tuple[str, str, int, int, int]) -> list[tuple[int, bytes, bytes]]:
    """The invited openings of parties ``first`` … ``last - 1``: (partition, key, event), the
    invitations signed with the market key in ``data_dir``."""
    prefix, data_dir, partitions, first, last = job
    market = load_or_create_keys(Path(data_dir)).signing_key
    topics = Topics(prefix, partitions)
    out = []
    for i in range(first, last):
        seed = hashlib.sha256(b"bench-open-%d" % i).digest()
        party = Party(
            f"buyer-{i:06d}",
            Ed25519PrivateKey.from_private_bytes(seed),
            X25519PrivateKey.from_private_bytes(hashlib.sha256(seed).digest()),
        )
        inv = invite(market, prefix, party.account_id, 2**52, party.public_key)
        ref = MarketRef(prefix, inv.market_key_id)
        event = party.open_account(ref, invitation=inv)
        raw = event.model_dump_json(exclude_none=True).encode()
        out.append((topics.partition_of(party.account_id), party.account_id.encode(), raw))
    return out


def make_openings(n: int, prefix: str, data_dir: Path, partitions: int) -> list[Any]:
    """Every opening, made on every core (before the market runs: it measures nothing)."""
    step = 2_000
    jobs = [(prefix, str(data_dir), partitions, a, min(n, a + step)) for a in range(0, n, step)]
    with multiprocessing.Pool(os.cpu_count() or 1) as pool:
        return [rec for chunk in pool.map(_openings, jobs) for rec in chunk]


async def _produce(bootstrap: str, topic: str, openings: list[Any]) -> float:
    """Write every opening; seconds it took."""
    t0 = time.perf_counter()
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await prod.start()
    try:
        for at in range(0, len(openings), 1_000):
            sent = [
                await prod.send(topic, raw, key=key, partition=p)
                for p, key, raw in openings[at : at + 1_000]
            ]
            await asyncio.gather(*sent)
    finally:
        await prod.stop()
    return time.perf_counter() - t0


def _watch(worker: ChildWorker, n: int, t0: float) -> dict[str, float]:
    """Poll the worker until its replica holds ``n`` accounts: when it accepted them all,
    when its replica held them all, its RSS then. Gives up after :data:`STALL_S` without
    an account more (the embedded broker stops answering at times, with v1 inboxes)."""
    got: dict[str, float] = {}
    shown = moved = 0.0
    last = -1.0
    while time.perf_counter() - t0 < TIMEOUT_S:
        accepted = worker.metric("emarket_account_events_total", {"outcome": "accepted"})
        held = worker.metric("emarket_replica_accounts")
        now = time.perf_counter() - t0
        if accepted >= n and "accepted_s" not in got:
            got["accepted_s"] = now
        if now - shown >= 30:
            shown = now
            _progress(worker, now, accepted, held)
        if accepted + held != last:
            last, moved = accepted + held, now
        if held >= n:
            return {**got, "replica_s": now, "rss": float(_rss(_pid(worker)))}
        if now - moved > STALL_S:
            _progress(worker, now, accepted, held)
            raise SystemExit(f"stalled: no account more for {STALL_S:.0f} s; see {worker.log_path}")
        time.sleep(POLL_S)
    raise SystemExit(f"the worker's replica did not reach {n} accounts in {TIMEOUT_S:.0f} s")


def _progress(worker: ChildWorker, now: float, accepted: float, held: float) -> None:
    waiting = worker.metric("emarket_inboxes_waiting")
    rss = _rss(_pid(worker)) / 2**20
    print(
        f"  {now:6.0f} s: accepted {accepted:,.0f}, replica {held:,.0f}, "
        f"inboxes waiting {waiting:,.0f}, worker RSS {rss:,.0f} MB",
        flush=True,
    )


def _settings(workdir: Path, inboxes: str) -> Settings:
    tag = uuid.uuid4().hex[:6]
    s = Settings(
        broker="",
        app_id=f"acc-{tag}",
        prefix=f"acc{tag}",
        data_dir=workdir / "data",
        web_port=find_free_port(),
        log_level="info",
        limits=Limits(openings="invite"),
        metrics_every=0.0,
    )
    if inboxes == "v2" and "inboxes" not in {f.name for f in dataclasses.fields(Settings)}:
        raise SystemExit("--inboxes v2: this checkout's worker has no v2 inboxes yet (#45)")
    return s


def _catch_up(settings: Settings, n: int) -> dict[str, float]:
    """The replica alone, in a process of its own, reading the changelogs from the start."""
    argv = [sys.executable, "-m", "bench.accounts_replica", settings.bootstrap, settings.app_id]
    argv += [str(settings.data_dir), str(n), str(settings.partitions)]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=TIMEOUT_S)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _report(n: int, inboxes: str, made_s: float, sent_s: float, m: dict[str, float]) -> None:
    per, up = (m["rss"] - m["rss0"]) / n, m["catch_up_s"]
    mb = f"{m['rss0'] / 2**20:,.0f} → {m['rss'] / 2**20:,.0f} MB"
    print(f"| accounts opened ({inboxes} inboxes) | {n:,} |")
    print("|---|---|")
    print(f"| openings made (keys, invitations, signatures; every core) | {made_s:.0f} s |")
    print(f"| openings written to `<p>.accounts` | {sent_s:.0f} s |")
    print(
        f"| worker: all accepted after | {m['accepted_s']:.0f} s ({n / m['accepted_s']:,.0f}/s) |"
    )
    print(f"| worker: its replica held them all after | {m['replica_s']:.0f} s |")
    print(f"| worker RSS | {mb} ({per:,.0f} B per account) |")
    print(
        f"| replica alone, from the start: caught up in | {up:.1f} s ({n / up:,.0f} accounts/s) |"
    )
    print(f"| replica alone: RSS per account | {m['replica_rss_per_account']:,.0f} B |")


def _idle(settings: Settings, env: dict[str, str], workdir: Path) -> dict[str, float]:
    """Start the worker once: it makes the market's topics; its RSS once settled, idle."""
    worker = ChildWorker(settings, log_path=workdir / "market.log", env=env).start()
    try:
        worker.wait_healthy(120)
        time.sleep(5)  # settled: its first tables and replica read
        return {"rss0": float(_rss(_pid(worker)))}
    finally:
        worker.stop()


def run_open(n: int, inboxes: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="emarket-accounts-"))
    machine = Machine.now()
    base = _settings(workdir, inboxes)
    load_or_create_keys(base.data_dir)  # the market's keys, which the worker then uses
    t0 = time.perf_counter()
    openings = make_openings(n, base.prefix, base.data_dir, base.partitions)
    made_s = time.perf_counter() - t0
    env = {"EMARKET_MAX_ACCOUNTS": str(n + 10), "EMARKET_MAX_OPENINGS_PER_MINUTE": str(100 * n)}
    if inboxes == "v2":
        env["EMARKET_INBOXES"] = "v2"
    with EmbeddedBroker(log_path=workdir / "broker.log") as broker:
        settings = dataclasses.replace(base, broker=broker.url).for_tansu()
        topic = Topics(settings.prefix, settings.partitions).accounts
        worker = ChildWorker(settings, log_path=workdir / "market.log", env=env).start()
        try:
            worker.wait_healthy(120)
            time.sleep(5)  # settled: its first tables and replica read
            m: dict[str, float] = {"rss0": float(_rss(_pid(worker)))}
            t0 = time.perf_counter()
            sent_s = asyncio.run(_produce(settings.bootstrap, topic, openings))
            m.update(_watch(worker, n, t0))
            m.update(_catch_up(settings, n))
        finally:
            worker.stop()
    _report(n, inboxes, made_s, sent_s, m)
    print(f"(logs: {workdir})", file=sys.stderr)
    print(machine.line())
