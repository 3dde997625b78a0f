"""Many streams and accounts put into a benchmarked market at once, not one round trip each.

A benchmark at 4,096 streams or thousands of accounts must not spend its time in set-up:
registered one at a time through :meth:`~streams.clients.client.MarketClient.register` (three
readers and a topic check per stream, then a wait for the catalog entry), 4,096 streams take
minutes. Here every event is signed first, all are written with one producer, and one reader
(or the worker's counters) waits for them all: the market's own rate is what bounds it.

* :func:`register_streams` — registrations signed by :data:`~bench.service.SELLER` and a first
  value for each stream; waits for every catalog entry, then for every value to be ingested
  (``emarket_values_ingested_total``). The worker must let one seller hold them all
  (:data:`~bench.service.MARKET_ENV`).
* :func:`open_accounts` — openings carrying the operators' invitation (``EMARKET_OPENINGS=
  invite``, signed with :data:`~bench.service.BENCH_KEYS`), the operators' path for many
  accounts; waits until the worker has opened them all and no inbox waits to be made
  (``emarket_account_events_total``, ``emarket_inboxes_waiting``: the same whatever the
  inbox layout). The worker's openings allowance must be raised to let them all in
  (``EMARKET_MAX_OPENINGS_PER_MINUTE``, :data:`INVITE_ENV`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from bench.service import (
    BENCH_KEYS,
    FETCH_WAIT_MS,
    SELLER,
    _registration,
    _value_payload,
    bench_market,
)
from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.client import TopicReader
from streams.clients.keys import Party
from streams.wire.events import StreamRegistration
from streams.wire.invitations import invite
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker

__all__ = ["INVITE_ENV", "metric", "open_accounts", "register_streams"]

INVITE_ENV = {
    "EMARKET_OPENINGS": "invite",
    "EMARKET_MAX_OPENINGS_PER_MINUTE": "10000000",
}
"""A benchmarked worker that opens accounts by invitation, as many a minute as are sent."""

POLL_S = 2.0
"""Seconds between two reads of the worker's counters: ``/metrics`` is rebuilt at most every
``EMARKET_METRICS_EVERY`` (5 s) and costs the worker more the more streams it holds."""

SEND_CHUNK = 2000
"""Records sent before their acknowledgements are awaited (bounds the producer's buffer)."""


PARTITIONS = 4
"""The input partitions of the one worker's market (:func:`one_worker`)."""


def one_worker(broker: EmbeddedBroker, name: str, tag: str, workdir: Path) -> Settings:
    """The settings of the one worker a bench at scale measures: its own app id and prefix
    on ``broker``, :data:`PARTITIONS` partitions, a free web port, and the service bench's
    fetch wait (so that its latencies compare with ``bench.service``'s)."""
    return replace(
        Settings(
            broker=broker.url,
            app_id=f"{name}-{tag}",
            prefix=f"{name}{tag}",
            partitions=PARTITIONS,
            data_dir=workdir / "w0",
            log_level="warn",
            require_encryption=False,
            web_port=find_free_port(),
        ).for_tansu(),
        fetch_max_wait_ms=FETCH_WAIT_MS,
    )


def metric(worker: ChildWorker, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``, from ``/metrics``."""
    total = 0.0
    for fam in text_string_to_metric_families(worker.get("/metrics", timeout=120)):
        for sample in fam.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


async def _send_all(bootstrap: str, records: Sequence[tuple[str, bytes, bytes]]) -> None:
    """Write ``(topic, key, value)`` records with one producer, acknowledged."""
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=262144)
    await prod.start()
    try:
        for i in range(0, len(records), SEND_CHUNK):
            futs = [
                await prod.send(topic, value, key=key)
                for topic, key, value in records[i : i + SEND_CHUNK]
            ]
            await asyncio.gather(*futs)
    finally:
        await prod.stop()


async def _until(done: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait (checking every :data:`POLL_S` seconds, off the event loop) until ``done()``."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(done):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not done in {timeout:.0f} s")
        await asyncio.sleep(POLL_S)


async def _none_refused(worker: ChildWorker, refused0: float) -> None:
    """Stop the run if the worker refused a registration since it counted ``refused0``."""
    refused = await asyncio.to_thread(
        metric, worker, "emarket_registrations_total", outcome="rejected"
    )
    if refused > refused0:
        raise RuntimeError(
            f"{refused - refused0:.0f} registrations refused (emarket_rejections_total says "
            "why; too_many_streams: raise EMARKET_MAX_STREAMS and _PER_SELLER for the worker)"
        )


async def register_streams(
    worker: ChildWorker,
    bootstrap: str,
    topics: Topics,
    names: Sequence[str],
    *,
    steps: Sequence[float] = (0.5, 1.0),
    cap: float = 1e6,
    timeout: float = 1800.0,
    seller: Party = SELLER,
) -> None:
    """Register ``names`` for ``seller`` (whose account must be open), each with one value;
    return once the catalog lists them all and every value is ingested."""
    market = topics.prefix
    regs = [
        seller.sign(
            StreamRegistration,
            bench_market(market),
            seller_id=seller.account_id,
            **_registration(name, list(steps), cap),
        )
        for name in names
    ]
    refused0 = metric(worker, "emarket_registrations_total", outcome="rejected")
    catalog = TopicReader(bootstrap, topics.catalog)
    await catalog.start(from_end=True)
    try:
        await _send_all(
            bootstrap,
            [
                (topics.registrations, r.stream_id.encode(), r.model_dump_json().encode())
                for r in regs
            ],
        )
        missing, deadline = {n.encode() for n in names}, time.monotonic() + timeout
        while missing and time.monotonic() < deadline:
            for _ in range(int(POLL_S / 0.5)):
                missing -= {k for k, _ in await catalog.poll(0.5)}
            await _none_refused(worker, refused0)
        if missing:
            raise TimeoutError(f"{len(missing)} of {len(names)} registrations not in the catalog")
    finally:
        await catalog.stop()
    ingested0 = metric(worker, "emarket_values_ingested_total")
    await _send_all(
        bootstrap,
        [(topics.values, n.encode(), _value_payload(0, market, n, seller=seller)) for n in names],
    )
    await _until(
        lambda: metric(worker, "emarket_values_ingested_total") >= ingested0 + len(names),
        timeout,
        f"{len(names)} values",
    )


async def open_accounts(
    worker: ChildWorker,
    bootstrap: str,
    topics: Topics,
    parties: Sequence[Party],
    *,
    timeout: float = 3600.0,
) -> None:
    """Open the accounts of ``parties`` with the operators' invitations (a worker started with
    :data:`INVITE_ENV`), all sent at once; return once every one is open and no inbox waits."""
    market = bench_market(topics.prefix)
    expires = int(time.time() * 1000) + 86_400_000
    records = []
    for p in parties:
        ticket = invite(BENCH_KEYS.signing_key, topics.prefix, p.account_id, expires, p.public_key)
        opening = p.open_account(market, invitation=ticket)
        records.append((topics.accounts, p.account_id.encode(), opening.model_dump_json().encode()))
    opened0 = metric(worker, "emarket_account_events_total", outcome="accepted")
    refused0 = metric(worker, "emarket_account_events_total", outcome="rejected")
    await _send_all(bootstrap, records)
    await _until(
        lambda: (
            _no_opening_refused(worker, refused0)
            and metric(worker, "emarket_account_events_total", outcome="accepted")
            >= opened0 + len(parties)
            and metric(worker, "emarket_inboxes_waiting") == 0
        ),
        timeout,
        f"{len(parties)} openings",
    )


def _no_opening_refused(worker: ChildWorker, refused0: float) -> bool:
    """True, or stop the run if the worker refused an account event since it counted
    ``refused0`` (a refused opening is never accepted: waiting for it would wait an hour)."""
    refused = metric(worker, "emarket_account_events_total", outcome="rejected")
    if refused > refused0:
        raise RuntimeError(
            f"{refused - refused0:.0f} openings refused (emarket_rejections_total says why; "
            "encryption_required: on v2 inboxes every party needs a sealing key)"
        )
    return True
