"""The live demo behind ``epsilon-market demo``.

Starts the embedded broker (unless a broker URL is given) and one worker in a child process, then
plays a seller who registers a temperature stream and publishes readings, and a buyer who buys
three privacy steps and watches the error of what they hold shrink; then the same for a
histogram stream of visits per city (:mod:`streams.clients.demo_histogram`) and a RAPPOR survey
(:mod:`streams.clients.demo_rappor`). Everything it
started is stopped on exit or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from ..broker.embedded import EmbeddedBroker, find_free_port
from ..wire.events import PurchaseFulfilled, Rejection, ValueReleased
from ..wire.money import format_money
from ..worker.config import Settings
from ..worker.runner import ChildWorker
from ..worker.secrets import load_or_create_keys
from .client import MarketClient
from .demo_histogram import play_histograms
from .demo_rappor import play_rappor
from .keys import Party

__all__ = ["run_demo"]

STEPS = [0.25, 0.5, 1.0, 2.0, 4.0]


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_demo(*, broker: str | None, steps: int = 3, n_values: int = 20) -> int:
    steps = max(1, min(steps, len(STEPS)))
    workdir = Path(tempfile.mkdtemp(prefix="emarket-demo-"))
    embedded = None
    worker = None
    finished = False
    try:
        if broker is None:
            embedded = EmbeddedBroker(log_path=workdir / "broker.log").start()
            broker = embedded.url
            _say(f"embedded broker (Tansu, in-memory) listening on {embedded.bootstrap}")
        settings = Settings(
            broker=broker,
            app_id=f"emarket-demo-{uuid.uuid4().hex[:6]}",
            prefix=f"demo{uuid.uuid4().hex[:6]}",
            data_dir=workdir / "data",
            web_port=find_free_port(),
        )
        if embedded is not None:
            settings = settings.for_tansu()
        worker = ChildWorker(settings, log_path=workdir / "worker.log").start()
        _say(f"worker starting (log: {workdir / 'worker.log'})")
        worker.wait_healthy(timeout=90)
        _say(f"worker up; Prometheus metrics at {worker.url}/metrics")
        asyncio.run(_play(settings, steps, n_values, worker))
        spent = worker.metric("emarket_privacy_spent", {"stream": "thermometer"})
        fulfilled = worker.metric("emarket_purchases_total", {"outcome": "fulfilled"})
        draws = worker.metric("emarket_noise_draws_total")
        _say(
            f"metrics: {fulfilled:.0f} purchases fulfilled, privacy spent on the stream "
            f"ε = {spent:g} (the largest level released, not a sum), {draws:.0f} noise draws"
        )
        _say("demo finished; stopping the worker and the broker")
        finished = True
        return 0
    except KeyboardInterrupt:
        _say("interrupted; stopping the worker and the broker")
        return 130
    finally:
        if worker is not None:
            worker.stop()
        if embedded is not None:
            embedded.stop()
        _clean(workdir, finished)


def _clean(workdir: Path, finished: bool) -> None:
    """Remove the demo's scratch directory (it holds the market's keys and noise secret); after
    a failure keep it for its logs, and say where."""
    if finished:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        _say(f"logs kept in {workdir} (it holds this demo market's keys: remove it after)")


DIM = 4


async def _play(settings: Settings, steps: int, n_values: int, worker: ChildWorker) -> None:
    topics = settings.topics()
    rng = np.random.default_rng()  # the demo's made-up readings, not privacy noise
    seller = Party.generate("acme-sensors", sealing=False)
    buyer = Party.generate("buyer-1")
    market_key = load_or_create_keys(settings.data_dir).public_key_b64  # the demo's own: pinned
    async with MarketClient(
        settings.bootstrap, topics, party=seller, market_public_key=market_key
    ) as client:
        for who in (seller, buyer):
            opened = await client.open_account(who)
            if isinstance(opened, Rejection):
                raise RuntimeError(f"account {who.account_id} not opened: {opened.message}")
        _say(
            "accounts opened: acme-sensors (seller) and buyer-1, each with its own Ed25519 "
            "key; buyer-1 also pinned an X25519 key: every release to it is sealed"
        )
        truth = await _seller(client, worker, n_values, rng)
        print()
        await _buy_steps(client, buyer, steps, truth)
        vid = await client.publish("thermometer", (20.0 + rng.normal(0, 0.1, DIM)).tolist())
        async for ev in client.tail(idle_timeout=5.0, party=buyer):
            if isinstance(ev, ValueReleased) and ev.releases and ev.releases[-1].value_id == vid:
                _say(
                    f"subscription: new reading {vid} delivered at the held level "
                    f"ε={ev.releases[-1].level:g}"
                )
                break
        print()
        await play_histograms(client, buyer)
        print()
        await play_rappor(client, buyer)


async def _seller(
    client: MarketClient, worker: ChildWorker, n_values: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Register the thermometer stream, publish readings, wait until they are ingested."""
    entry = await client.register(
        {
            "stream_id": "thermometer",
            "mechanism": "laplace",
            "sensitivity": 1.0,
            "dimension": DIM,
            "steps": STEPS,
            "cap": STEPS[-1],
            "retain_last": n_values,
            "pricing": {"kind": "linear_level", "rate_per_level": 100.0},
            "currency": "EUR",
            "description": "four room thermometers, degrees Celsius, sensitivity 1",
        },
        timeout=60,
    )
    if isinstance(entry, Rejection):
        raise RuntimeError(f"registration rejected: {entry.message}")
    prices = ", ".join(f"ε={p.level:g}: {format_money(p.price_minor, 'EUR')}" for p in entry.prices)
    _say(f"seller registered 'thermometer' (Laplace, {DIM} sensors); prices {prices}")
    truth: dict[str, np.ndarray] = {}
    rows = []
    for i in range(n_values):
        values = 20.0 + 2.0 * np.sin(i / 3.0 + np.arange(DIM)) + rng.normal(0, 0.1, DIM)
        rows.append((f"t{i:04d}", values.tolist(), None))
        truth[f"t{i:04d}"] = values
    answer = await client.publish_batch(client.value_batch("thermometer", rows), timeout=60)
    accepted = sum(o.status == "accepted" for o in getattr(answer, "outcomes", []))
    _say(f"seller published {n_values} readings in one signed batch; {accepted} accepted")
    return truth


async def _buy_steps(
    client: MarketClient, buyer: Party, steps: int, truth: dict[str, np.ndarray]
) -> None:
    """Buy ``steps`` steps and show how the error of what is held shrinks."""
    print("  step   level ε   paid (EUR)   RMS error   expected √2/ε   shared with previous")
    previous: dict[str, list[float]] = {}
    total = 0
    last: PurchaseFulfilled | None = None
    for step in range(1, steps + 1):
        out = await client.buy(
            "thermometer", max_price_minor=10_000, timeout=60, resend_every=20, party=buyer
        )
        if isinstance(out, Rejection):
            raise RuntimeError(f"purchase rejected: {out.message}")
        total += out.price_minor
        err = np.concatenate([np.asarray(r.values) - truth[r.value_id] for r in out.releases])
        same = [
            a == b
            for r in out.releases
            for a, b in zip(r.values, previous.get(r.value_id, []), strict=False)
        ]
        shared = f"{np.mean(same):>8.0%} of coordinates" if same else "       -"
        rms = float(np.sqrt(np.mean(err**2)))
        print(
            f"  {step:>4}   {out.level_after:>7g}   {out.price_minor / 100:>10.2f}   "
            f"{rms:>9.3f}   {math.sqrt(2) / out.level_after:>13.3f}   {shared}"
        )
        previous = {r.value_id: r.values for r in out.releases}
        last = out
    print()
    assert last is not None
    _say(
        f"buyer paid {format_money(total, 'EUR')} in {steps} steps, exactly the direct price of "
        f"ε={last.level_after:g}; receipt signed by market key {last.receipt.market_key_id}"
    )
