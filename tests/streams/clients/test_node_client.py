"""The Node.js client of clients/node, written from docs/protocol.md alone, against a live worker.

It proves the spec is enough for a stranger: the Node client's own vectors, its end-to-end flow
(accounts, sealed values, gradual purchases, receipts, deliveries, histogram keys), and a Python
buyer buying, opening and verifying what the Node seller published; on a market with v1 inboxes
and on one with v2 inboxes (docs/protocol.md §8.5).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from streams.clients.client import MarketClient
from streams.wire.events import PurchaseFulfilled

from .. import helpers
from ..conftest import Market

ROOT = Path(__file__).resolve().parents[3]
NODE_DIR = ROOT / "clients" / "node"
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node is not on PATH: the Node client cannot run"),
    pytest.mark.skipif(
        not (NODE_DIR / "node_modules").is_dir(),
        reason="clients/node/node_modules is missing: `make` installs it with npm ci",
    ),
]


def _node(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    return subprocess.run(
        [NODE, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=NODE_DIR,
        env=env,
    )


def _cli(market: Market, *args: str) -> subprocess.CompletedProcess[str]:
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    return subprocess.run(
        [sys.executable, "-m", "streams", *pre, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_node_client_passes_every_vector() -> None:
    """Every vector of docs/vectors and docs/protocol.md a client computes, from the spec alone,
    and every negative vector a client must refuse (docs/vectors/negative.json); and the Node
    CLI's exit codes and receipt check, offline."""
    r = _node(
        "--test",
        "test/vectors.test.js",
        "test/cli.test.js",
        "test/negative.test.js",
        "test/inbox_v2.test.js",
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "# fail 0" in r.stdout


@pytest.mark.broker
@pytest.mark.slow
def test_node_client_end_to_end_and_a_python_buyer(market: Market, tmp_path: Path) -> None:
    """The Node e2e flow passes, and a Python buyer buys from the Node seller's stream."""
    market.start_worker()
    env = {
        "PATH": str(Path(NODE or "node").parent),
        "EMARKET_BROKER": market.broker.bootstrap,
        "EMARKET_PREFIX": market.topics.prefix,  # the market key is read from <prefix>.market
    }
    scratch = tmp_path / "node"
    r = _node("test/e2e.js", str(scratch), env=env)
    assert r.returncode == 0, f"node e2e failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert "all steps passed" in r.stdout
    made = json.loads((scratch / "e2e.json").read_text())

    key = tmp_path / "pybuyer.key"
    for args in (
        ("keygen", "--account", "pybuyer", "--out", str(key)),
        ("account", "open", "--key-file", str(key)),
    ):
        out = _cli(market, *args)
        assert out.returncode == 0, out.stderr
    outcome = tmp_path / "outcome.json"
    out = _cli(
        market,
        "buy",
        "--key-file",
        str(key),
        "--stream",
        made["stream"],
        "--max-price",
        "0.50",
        "--output",
        str(outcome),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    bought = json.loads(outcome.read_text())
    assert bought["receipt"]["seller_id"] == made["seller"]
    assert [r["value_id"] for r in bought["releases"]] == ["v1", "v2", "v3"]
    out = _cli(market, "verify-receipt", str(outcome))
    assert out.returncode == 0, out.stdout + out.stderr
    # Each side's outcome file verifies with the other side's verifier.
    out = _cli(market, "verify-receipt", str(scratch / "outcome-1.json"))
    assert out.returncode == 0, out.stdout + out.stderr
    key_b64 = made["market_public_key"]
    r = _node("bin/emarket.js", "verify-receipt", str(outcome), "--public-key", key_b64)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.broker
@pytest.mark.slow
def test_node_client_on_a_v2_market(market: Market, tmp_path: Path) -> None:
    """On a market with v2 inboxes the Node client finds its inbox from the market's identity
    alone: its v2 flow passes (its routes' partitions read alone, forged records skipped, purchases,
    deliveries, sales, a rotation to a route on another partition, the resend rule), and the Node
    CLI's ``tail`` shows the Node seller the sale of a Python buyer's purchase."""
    market.settings = replace(market.settings, inboxes=2, inbox_partitions=2)
    market.topics = market.settings.topics()
    market.start_worker()
    env = {
        "PATH": str(Path(NODE or "node").parent),
        "EMARKET_BROKER": market.broker.bootstrap,
        "EMARKET_PREFIX": market.topics.prefix,
    }
    scratch = tmp_path / "node"
    r = _node("test/e2e_v2.js", str(scratch), env=env)
    assert r.returncode == 0, f"node e2e_v2 failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert "all steps passed" in r.stdout
    made = json.loads((scratch / "e2e.json").read_text())

    async def python_buyer(c: MarketClient) -> None:
        buyer = helpers.party("sealed-pybuyer")
        assert (await c.open_account(buyer)).type == "account"
        got = await c.buy(made["stream"], party=buyer, max_price_minor=50)
        assert isinstance(got, PurchaseFulfilled), got

    market.run(python_buyer)
    pre = ["--broker", market.broker.bootstrap, "--prefix", market.topics.prefix, "--json"]
    sales: list[dict[str, object]] = []
    for _ in range(10):  # the sale is written after the buyer's answer: read until it is there
        r = _node(
            "bin/emarket.js", *pre, "--key-file", made["seller_key"], "tail", "--wait", "3", env=env
        )
        assert r.returncode == 0, r.stdout + r.stderr
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
        listed = [s for m in lines if m["type"] == "sales" for s in m["sales"]]  # §8.4
        sales = [s for s in listed if s["stream_id"] == made["stream"]]
        if len({s["buyer_ref"] for s in sales}) == 2:
            break
    assert len({s["buyer_ref"] for s in sales}) == 2, sales  # the Node buyer's and the Python one's
