"""Orders in the buyer's terms, on the real broker: accuracy orders, quotes with every level's
accuracy, and the coverage of the intervals the *service's* releases state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streams.clients.client import MarketClient
from streams.clients.intervals import intervals
from streams.wire.events import LinearLevelSpec, PurchaseFulfilled, QuoteAnswer, Rejection

from ...market.stats import assert_proportion
from ..conftest import Market
from ..helpers import cli_parties, party

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
DIM, N_VALUES = 1000, 20


def reg(stream: str, mechanism: str, steps: list[float]) -> dict[str, Any]:
    return {
        "stream_id": stream,
        "mechanism": mechanism,
        "sensitivity": 1.0,
        "dimension": DIM,
        "steps": steps,
        "cap": steps[-1],
        "retain_last": N_VALUES,
        "pricing": LinearLevelSpec(rate_per_level=100.0),
    }


def test_accuracy_orders_and_the_coverage_of_what_the_service_releases(market: Market) -> None:
    market.start_worker()
    market.open_accounts("seller1", "alice")
    alice = party("alice")
    rng = np.random.default_rng(5)
    truth = {
        "temp": rng.normal(20.0, 5.0, size=(N_VALUES, DIM)),
        "counts": rng.integers(0, 50, size=(N_VALUES, DIM)).astype(float),
    }

    async def setup(c: MarketClient) -> None:
        for sid, mech, steps in (
            ("temp", "laplace", [0.5, 1.0, 2.0, 4.0]),
            ("counts", "poisson", [0.01, 0.05, 0.25]),
        ):
            entry = await c.register(reg(sid, mech, steps))
            assert not isinstance(entry, Rejection), entry
            for i, row in enumerate(truth[sid]):
                await c.publish(sid, row.tolist(), value_id=f"v{i}")

    market.run(setup)
    for sid in truth:
        market.wait_ingested(sid, N_VALUES)

    async def buy(c: MarketClient) -> list[Any]:
        return [
            # Laplace Δ = 1: RMS √2/ε ≤ 1 needs ε ≥ 1.41 → 2 (the cheapest that meets it)
            await c.buy("temp", accuracy={"rmse": 1.0}, max_price_minor=10**6, party=alice),
            # ±0.25 at 95 % needs ε ≥ 12: not for sale; the best offer is named
            await c.buy(
                "temp",
                accuracy={"half_width": 0.25, "confidence": 0.95},
                max_price_minor=10**6,
                party=alice,
            ),
            # Poisson ω: λ = 1/ω; ±10 at 90 % → the cheapest ω whose interval is that narrow
            await c.buy(
                "counts",
                accuracy={"half_width": 10.0, "confidence": 0.9},
                max_price_minor=10**6,
                party=alice,
            ),
            await c.quote("temp", party=alice),
        ]

    lap, impossible, poi, quote = market.run(buy)
    assert isinstance(lap, PurchaseFulfilled) and lap.level_after == 2.0
    assert isinstance(impossible, Rejection) and impossible.reason == "accuracy_not_for_sale"
    assert impossible.details["best_level"] == 4.0
    assert isinstance(poi, PurchaseFulfilled) and poi.level_after == 0.05  # λ = 20: ±8
    assert poi.error_model is not None and poi.error_model.offset == pytest.approx(20.0)
    assert isinstance(quote, QuoteAnswer)
    assert [(o.level, o.held) for o in quote.offers] == [
        (0.5, True),
        (1.0, True),
        (2.0, True),
        (4.0, False),
    ]
    # the intervals the service's releases state cover the true values as stated
    for ev, sid in ((lap, "temp"), (poi, "counts")):
        assert len(ev.releases) == N_VALUES
        exact = {f"v{i}": row for i, row in enumerate(truth[sid])}
        for c in (0.90, 0.95, 0.99):
            hits = sum(
                int(np.count_nonzero((lo <= exact[vid]) & (exact[vid] <= hi)))
                for vid, (lo, hi) in intervals(ev, c).items()
            )
            print(
                f"{sid} level {ev.level_after:g}: coverage at {c:.0%}: "
                f"{hits / (N_VALUES * DIM):.4f}"
            )
            if sid == "temp":
                assert_proportion(hits, N_VALUES * DIM, c)
            else:  # discrete: at least c
                assert hits / (N_VALUES * DIM) > c - 4.5 * np.sqrt(c * (1 - c) / (N_VALUES * DIM))


def test_the_cli_quotes_a_table_and_buys_by_accuracy(market: Market, tmp_path: Path) -> None:
    market.start_worker()
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "streams", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            check=False,
        )

    acme, bob = cli_parties(cli, pre, tmp_path, "acme", "bob").values()
    r = cli(*pre, "register", *acme, "--stream", "temp", "--steps", "0.5,1,2", "--cap", "4")
    assert r.returncode == 0, r.stderr
    assert cli(*pre, "publish", *acme, "--stream", "temp", "--values", "20.5").returncode == 0
    r = cli(*pre, "buy", *bob, "--stream", "temp", "--rmse", "1.0", "--max-price", "5", "--json")
    assert r.returncode == 0 and "bought level 2 (epsilon)" in r.stderr, r.stderr
    r = cli(*pre, "quote", *bob, "--stream", "temp", "--json")
    assert r.returncode == 0, r.stderr
    table = [line for line in r.stderr.splitlines() if not line.startswith("warning: trusting")]
    assert table[0].split()[:4] == ["level", "(epsilon)", "RMS", "error"], r.stderr
    # the lattice Laplace's noise scale is (1 + 2^-12)·Δ/ε, plus half a grid step of rounding
    assert table[3].split()[:4] == ["2", "0.7073", "1.498", "held"], r.stderr
    assert table[4].split()[:5] == ["4", "0.3536", "0.7491", "2.00", "EUR"], r.stderr
    r = cli(*pre, "buy", *bob, "--stream", "temp", "--half-width", "0.1", "--max-price", "5")
    assert r.returncode == 1 and "accuracy_not_for_sale" in r.stderr
    assert "--target 4" in r.stderr
    r = cli(
        *pre, "buy", *bob, "--stream", "temp", "--rmse", "1", "--target", "2", "--max-price", "5"
    )
    assert r.returncode == 2 and "not both" in r.stderr
