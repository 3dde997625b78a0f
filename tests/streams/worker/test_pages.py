"""The operator pages under a flood, on the embedded broker: /ledger and /metrics are built at
most once per interval however many requests come, and what they serve is fresh within it
(streams/worker/page_cache.py); /ledger answers only the operators' token."""

from __future__ import annotations

import threading
import time
import urllib.error

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streams.clients.client import MarketClient
from streams.worker.runner import ChildWorker

from ..conftest import Market

pytestmark = [pytest.mark.broker]

EVERY = 1.0  # seconds: EMARKET_LEDGER_EVERY and EMARKET_METRICS_EVERY of the worker


def builds(w: ChildWorker) -> dict[str, float]:
    text = w.get("/metrics")
    return {
        s.labels["page"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "emarket_page_builds_total"
    }


def test_a_page_flood_builds_once_per_interval_and_pages_stay_fresh(market: Market) -> None:
    w = market.start_worker(ledger_every=EVERY, metrics_every=EVERY)
    market.open_accounts("seller1")
    token = market.operator_token()

    async def register(c: MarketClient) -> None:
        await c.register(
            {
                "stream_id": "temp",
                "mechanism": "laplace",
                "sensitivity": 1.0,
                "dimension": 1,
                "steps": [1.0],
                "cap": 1.0,
                "pricing": {"kind": "linear_level", "rate_per_level": 1.0},
            }
        )
        await c.publish("temp", [1.0], value_id="v0")

    market.run(register)
    with pytest.raises(urllib.error.HTTPError) as refused:
        w.get("/ledger")
    assert refused.value.code == 401  # the operators' page
    before, t0 = builds(w), time.monotonic()
    served = [0]
    stop = threading.Event()

    def flood(path: str) -> None:
        while not stop.is_set():
            w.get(path, token=token)
            served[0] += 1

    flooders = [threading.Thread(target=flood, args=(p,)) for p in ("/ledger", "/metrics") * 2]
    for t in flooders:
        t.start()
    try:
        # a value the market has answered is on every page requested EVERY seconds later
        for n in range(1, 4):
            market.run(lambda c, n=n: c.publish("temp", [float(n)], value_id=f"v{n}"))
            answered = time.monotonic()
            while time.monotonic() < answered + EVERY:
                w.get("/health")  # stays cheap and open meanwhile
            ledger = w.get("/ledger", token=token)["streams"]["temp"]
            assert ledger["values_ingested"] == n + 1, ledger
    finally:
        stop.set()
        for t in flooders:
            t.join(timeout=60)
    after, elapsed = builds(w), time.monotonic() - t0
    assert served[0] >= 40, served  # a flood: built per request, that many builds
    for page in ("ledger", "metrics"):
        made = after[page] - before[page]
        # builds begin EVERY seconds apart: over `elapsed`, at most 1 + elapsed / EVERY, and
        # one more that `before`'s read may have begun just before t0
        assert 2 <= made <= 2 + elapsed / EVERY, (page, made, elapsed, served)
