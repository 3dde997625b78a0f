"""The products beyond real vectors, on the real broker: exact integer counts (discrete Laplace),
running totals (a tree of Gaussian releases) and histograms (keys above a threshold) — each
registered, published, bought in two steps (one buyer's releases sealed), subscribed to, every
receipt verified."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from market.receipts import verify_outcome, verify_receipt
from streams.clients.client import MarketClient
from streams.clients.histograms import named
from streams.core.keys import public_key_from_b64
from streams.wire.events import (
    SCHEMAS,
    LinearLevelSpec,
    PurchaseFulfilled,
    Rejection,
    ValueReleased,
)

from ..conftest import Market
from ..helpers import buy, cli_parties, inbox_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]
DIM = 500
ROOT = Path(__file__).resolve().parents[3]


def test_discrete_laplace_counts_end_to_end(market: Market) -> None:
    market.start_worker()
    market.open_accounts("seller1", "alice", "sealed_bob")
    rng = np.random.default_rng(3)
    truth = {f"v{i}": rng.integers(0, 1000, DIM).tolist() for i in range(3)}

    async def go(c: MarketClient) -> Any:
        entry = await c.register(
            {
                "stream_id": "visits",
                "mechanism": "discrete_laplace",
                "sensitivity": 1.0,
                "dimension": DIM,
                "steps": [0.25, 1.0],
                "cap": 1.0,
                "retain_last": 3,
                "pricing": LinearLevelSpec(rate_per_level=100.0),
            }
        )
        assert not isinstance(entry, Rejection), entry
        for vid, row in truth.items():
            await c.publish("visits", row, value_id=vid)
        refused = await c.publish_batch(c.value_batch("visits", [("half", [0.5] * DIM, None)]))
        market.wait_ingested("visits", 3)
        outs = []
        for who in ("alice", "sealed_bob"):
            for _ in range(2):
                outs.append(await buy(c, who, "visits", max_price_minor=1000))
        await c.publish("visits", [5] * DIM, value_id="late")
        market.wait_ingested("visits", 4)
        subs = await inbox_until(
            c, "alice", lambda evs: any(isinstance(e, ValueReleased) for e in evs)
        )
        return entry, refused, outs, subs

    entry, refused, outs, subs = market.run(go)
    assert refused.outcomes[0].reason == "invalid_count"  # counts are whole numbers
    key = public_key_from_b64(entry.market_public_key)
    for ev in outs:
        assert isinstance(ev, PurchaseFulfilled), ev
        assert {r.value_id for r in ev.releases} == set(truth)
        SCHEMAS["inbox"].validate_json(ev.model_dump_json())
        rel = [(r.value_id, r.level, np.asarray(r.values)) for r in ev.releases]
        env = None if ev.sealed is None else ev.sealed.model_dump()
        verify_receipt(
            ev.receipt.model_dump(),
            ev.receipt.signature,
            rel,
            key,
            envelope=env,
            opening=bytes.fromhex(ev.opening or ""),
        )
        assert ev.error_model is not None and ev.error_model.mechanism == "discrete_laplace"
        for r in ev.releases:  # exact whole numbers, near the truth at these levels
            y = np.asarray(r.values)
            assert np.array_equal(y, np.round(y))
            assert np.mean(np.abs(y - truth[r.value_id])) < 3 * ev.error_model.std
    assert [e.level_after for e in outs] == [0.25, 1.0, 0.25, 1.0]
    assert [e.price_minor for e in outs] == [25, 75, 25, 75]
    alice_last, bob_last = outs[1], outs[3]
    assert alice_last.releases == bob_last.releases  # one process for every buyer: same bits
    (late,) = [e for e in subs if isinstance(e, ValueReleased)]
    assert late.releases[0].value_id == "late" and late.releases[0].level == 1.0
    assert np.array_equal(late.releases[0].values, np.round(late.releases[0].values))
    assert outs[0].sealed is None and outs[2].sealed is not None  # bob's came sealed, opened


def test_running_totals_end_to_end(market: Market) -> None:
    market.start_worker()
    market.open_accounts("seller1", "alice", "sealed_bob")
    increments = [
        [1.0, 0.0, 2.0],
        [3.0, 1.0, 0.0],
        [0.0, 0.0, 5.0],
        [2.0, 2.0, 2.0],
        [1.0, 1.0, 1.0],
    ]

    async def go(c: MarketClient) -> Any:
        entry = await c.register(
            {
                "stream_id": "sales",
                "mechanism": "gaussian",
                "sensitivity": 1.0,
                "dimension": 3,
                "steps": [0.5, 2.0],
                "cap": 2.0,
                "retain_last": 4,
                "product": "running_totals",
                "tree_height": 8,
                "pricing": LinearLevelSpec(rate_per_level=100.0),
            }
        )
        assert not isinstance(entry, Rejection), entry
        for i, row in enumerate(increments):
            await c.publish("sales", row, value_id=f"d{i}")
        market.wait_ingested("sales", 5)
        outs = [
            await buy(c, who, "sales", max_price_minor=1000)
            for who in ("alice", "sealed_bob", "alice", "sealed_bob")
        ]
        await c.publish("sales", [10.0, 10.0, 10.0], value_id="d5")
        market.wait_ingested("sales", 6)
        subs = await inbox_until(
            c, "alice", lambda evs: any(isinstance(e, ValueReleased) for e in evs)
        )
        return entry, outs, subs

    entry, outs, subs = market.run(go)
    key = public_key_from_b64(entry.market_public_key)
    sums = np.cumsum(increments, axis=0)
    for ev in outs:
        assert isinstance(ev, PurchaseFulfilled), ev
        SCHEMAS["inbox"].validate_json(ev.model_dump_json())
        rel = [(r.value_id, r.level, np.asarray(r.values)) for r in ev.releases]
        env = None if ev.sealed is None else ev.sealed.model_dump()
        verify_receipt(
            ev.receipt.model_dump(),
            ev.receipt.signature,
            rel,
            key,
            envelope=env,
            opening=bytes.fromhex(ev.opening or ""),
        )
        assert [r.value_id for r in ev.releases] == ["d1", "d2", "d3", "d4"]  # the retained
        assert [r.terms for r in ev.releases] == [1, 2, 1, 2]  # popcount of 2, 3, 4, 5
        assert ev.error_model is not None  # a node's: σ² = 9/(2ρ), times 1 + 2^-12 (float sums)
        assert ev.error_model.std == pytest.approx(
            np.sqrt(9 / (2 * ev.level_after)) * (1 + 2.0**-12)
        )
        for r, true in zip(ev.releases, sums[1:], strict=True):
            sd = ev.error_model.std * np.sqrt(r.terms or 0)
            assert np.all(np.abs(np.asarray(r.values) - true) < 6 * sd)
    assert [e.level_after for e in outs] == [0.5, 0.5, 2.0, 2.0]
    assert outs[0].sealed is None and outs[1].sealed is not None
    assert outs[0].releases == outs[1].releases and outs[2].releases == outs[3].releases
    (late,) = [e for e in subs if isinstance(e, ValueReleased)]
    (r,) = late.releases
    assert (r.value_id, r.level, r.terms) == ("d5", 2.0, 2)  # 6 = 4 + 2


def test_histograms_end_to_end_from_the_cli(market: Market, tmp_path: Path) -> None:
    """A seller registers a histogram stream of strings and publishes a CSV and a JSON file
    through the CLI; two buyers (one sealed) buy two steps; a subscriber gets the next day."""
    market.start_worker()
    market.open_accounts("alice", "sealed_bob")
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

    acme, carol = cli_parties(cli, pre, tmp_path, "acme", "carol").values()
    r = cli(
        *pre,
        "register",
        *acme,
        "--stream",
        "cities",
        "--mechanism",
        "gaussian",
        "--histogram",
        "strings",
        "--false-keys",
        "0.01",
        "--dimension",
        "20",
        "--steps",
        "0.5,2",
        "--retain",
        "4",
    )
    assert r.returncode == 0, r.stderr
    (tmp_path / "day1.csv").write_text("city,visitors\nberlin,120\nparis,80\nrome,1\n")
    (tmp_path / "day2.json").write_text('{"berlin": 90, "oslo": 200}')
    r = cli(
        *pre,
        "publish",
        *acme,
        "--stream",
        "cities",
        "--counts",
        str(tmp_path / "day1.csv"),
        "--value-id",
        "day1",
    )
    assert r.returncode == 0 and "accepted" in r.stdout, r.stderr

    async def go(c: MarketClient) -> Any:
        outs = [
            await buy(c, who, "cities", max_price_minor=1000)
            for who in ("alice", "sealed_bob", "alice", "sealed_bob")
        ]
        r = cli(
            *pre,
            "publish",
            *acme,
            "--stream",
            "cities",
            "--counts",
            str(tmp_path / "day2.json"),
            "--value-id",
            "day2",
        )
        assert r.returncode == 0, r.stderr
        subs = await inbox_until(
            c, "alice", lambda evs: any(isinstance(e, ValueReleased) for e in evs)
        )
        return (await c.catalog())["cities"], outs, subs

    entry, outs, subs = market.run(go)
    key = public_key_from_b64(entry.market_public_key)
    for ev in outs:
        assert isinstance(ev, PurchaseFulfilled), ev
        SCHEMAS["inbox"].validate_json(ev.model_dump_json())
        assert verify_outcome(ev.model_dump(), key).receipt_version == 5
        (rel,) = ev.releases
        counts, unnamed = named(rel, ["berlin", "paris", "rome"])
        assert set(counts) == {"berlin", "paris"} and unnamed == 0  # rome's 1: below τ
        assert ev.error_model is not None and ev.error_model.threshold is not None
        assert abs(counts["berlin"] - 120) < 6 * ev.error_model.std
    assert [e.level_after for e in outs] == [0.5, 0.5, 2.0, 2.0]
    assert outs[0].sealed is None and outs[1].sealed is not None  # bob's came sealed, opened
    assert outs[0].releases == outs[1].releases and outs[2].releases == outs[3].releases
    (late,) = [e for e in subs if isinstance(e, ValueReleased)]
    (r,) = late.releases
    assert r.value_id == "day2" and r.level == 2.0
    assert named(r, ["berlin", "oslo"])[0].keys() == {"berlin", "oslo"}
    (tmp_path / "cities.txt").write_text("berlin\noslo\nparis\n")
    r = cli(
        *pre,
        "buy",
        *carol,
        "--stream",
        "cities",
        "--max-price",
        "1",
        "--key-names",
        str(tmp_path / "cities.txt"),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert "day2 at level 0.5: oslo" in r.stderr and "berlin" in r.stderr, r.stderr
