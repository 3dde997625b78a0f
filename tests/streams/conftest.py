"""Fixtures for tests against a real Kafka-protocol broker and real Faust workers.

One embedded Tansu broker serves the whole session on a free loopback port. Every test gets its
own topic prefix and Faust app id (a fresh consumer group: Tansu fixes a group's session timeout
with its first member), its own data directory and web ports, and stops exactly the worker
processes it started.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streams.broker.embedded import EmbeddedBroker, find_free_port
from streams.clients.client import MarketClient
from streams.clients.keys import Party
from streams.core.context import Limits
from streams.wire.topics import Topics
from streams.worker.config import Settings
from streams.worker.runner import ChildWorker
from streams.worker.secrets import OPERATOR_TOKEN_FILE

from . import helpers


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as b:
        yield b


class Market:
    """One isolated market deployment (prefix, app id, data dir) on the shared broker."""

    def __init__(self, broker: EmbeddedBroker, tmp: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.broker = broker
        self.tmp = tmp
        self.settings = Settings(
            broker=broker.url,
            app_id=f"t-{tag}",
            prefix=f"t{tag}",
            data_dir=tmp / "data",
            log_level="info",
            require_encryption=False,  # the test parties' names say whether they seal
            # no proof of work an opening (test_openings.py asks for it)
            limits=Limits(opening_work=0),
            # pages built for each request (shared by concurrent ones): a test reads what it
            # just did (test_pages.py tests the intervals)
            ledger_every=0.0,
            metrics_every=0.0,
        ).for_tansu()
        helpers.write_test_keys(self.settings.data_dir)  # helpers seal values to its key
        self.topics = Topics(self.settings.prefix, self.settings.partitions)
        self.workers: list[ChildWorker] = []

    def start_worker(self, *, healthy: bool = True, **overrides: Any) -> ChildWorker:
        """A worker of this market; waits until its /health answers ok (with ``healthy``)
        or at all (without: a test of a worker that says it is not ok)."""
        return self.start_worker_env({}, healthy=healthy, **overrides)

    def start_worker_env(
        self, env: dict[str, str], *, healthy: bool = True, **overrides: Any
    ) -> ChildWorker:
        for _ in range(3):
            w = self.spawn_worker(env, **overrides)
            try:
                w.wait_healthy(timeout=60, ok_only=healthy)
                return w
            except RuntimeError:
                # a random free port another test's process bound first: the worker says so
                # in one line and exits; any other exit is the test's to see
                if "web port" not in w.log_tail():
                    raise
                self.workers.remove(w)
        raise RuntimeError("three web ports in a row were taken before the worker bound them")

    def spawn_worker(self, env: dict[str, str] | None = None, **overrides: Any) -> ChildWorker:
        """A worker of this market, started and not waited for (several started at once)."""
        n = len(self.workers)
        s = replace(self.settings, web_port=find_free_port(), **overrides)
        w = ChildWorker(s, log_path=self.tmp / f"worker{n}.log", env=env or {}).start()
        self.workers.append(w)
        return w

    def client(self, party: Party | None = None) -> MarketClient:
        """A client acting as ``party`` (default: the seller, ``seller1``)."""
        me = party or helpers.party("seller1")
        return MarketClient(self.broker.bootstrap, self.topics, party=me)

    def run(self, coro_fn: Callable[[MarketClient], Any], party: Party | None = None) -> Any:
        async def go() -> Any:
            async with self.client(party) as c:
                return await coro_fn(c)

        return asyncio.run(go())

    def open_accounts(self, *names: str) -> None:
        """Open the accounts of the test parties ``names`` (deterministic keys, see helpers)."""

        async def go(c: MarketClient) -> None:
            for name in names:
                out = await c.open_account(helpers.party(name))
                assert out.type == "account", out

        self.run(go)

    def operator_token(self) -> str:
        """The operators' credential the workers wrote to the data directory."""
        return (self.settings.data_dir / OPERATOR_TOKEN_FILE).read_text()

    def ledger(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for w in self.workers:
            if w.alive():
                out.update(w.get("/ledger", token=self.operator_token())["streams"])
        return out

    def metric(self, name: str, **labels: str) -> float:
        """The sample ``name`` with ``labels`` summed over the live workers' /metrics pages."""
        total = 0.0
        for w in self.workers:
            if w.alive():
                for fam in text_string_to_metric_families(w.get("/metrics")):
                    for s in fam.samples:
                        if s.name == name and labels.items() <= s.labels.items():
                            total += s.value
        return total

    def wait_ingested(self, stream: str, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.ledger().get(stream, {}).get("values_ingested", 0)
            if got >= n:
                return
            time.sleep(0.1)
        metrics = "\n".join(
            line
            for w in self.workers
            if w.alive()
            for line in w.get("/metrics").splitlines()
            if line.startswith(
                ("emarket_values", "emarket_rejections", "emarket_batch_events_count")
            )
        )
        raise TimeoutError(f"{stream}: ledger {self.ledger().get(stream)}\n{metrics}")

    def stop(self) -> None:
        for w in self.workers:
            w.stop()

    def stop_workers(self, timeout: float = 90.0) -> None:
        """Stop the live workers one at a time, each after the others have rejoined the group.

        Tansu 0.6 keeps a leader that leaves during a rebalance as the group's leader, and no
        worker joins that group again (docs/operations.md, the embedded broker): a test that
        stops several workers and starts another must not let them leave together.
        """
        live = [w for w in self.workers if w.alive()]
        for i, w in enumerate(live):
            rest = live[i + 1 :]
            before = {id(r): _generation(r) for r in rest}
            w.stop()
            deadline = time.monotonic() + timeout
            while rest and not all(
                _generation(r) > before[id(r)] and status_of(r) not in ("", "degraded")
                for r in rest
            ):
                assert time.monotonic() < deadline, "the other workers never rejoined"
                time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-5000:] for p in sorted(self.tmp.glob("worker*.log"))
        )


def health_of(w: ChildWorker) -> dict[str, Any]:
    """``/health``'s body, 503 included; empty while the worker does not answer."""
    try:
        return dict(w.get("/health", timeout=10))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))
    except (OSError, ValueError):
        return {}


def status_of(w: ChildWorker) -> str:
    return str(health_of(w).get("status", ""))


def _generation(w: ChildWorker) -> int:
    group = health_of(w).get("group") or {}
    return int(group.get("generation") or -1)


@pytest.fixture
def market(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Market]:
    m = Market(broker, tmp_path)
    try:
        yield m
    finally:
        m.stop()
