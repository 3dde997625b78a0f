"""The command line, run as a user would (subprocesses) against a live worker."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streams.wire.events import SCHEMAS

from .conftest import Market

ROOT = Path(__file__).resolve().parents[2]


def cli(market: Market | None, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    pre = (
        [] if market is None else ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    )
    return subprocess.run(
        [sys.executable, "-m", "streams", *pre, *args],
        capture_output=True, text=True, timeout=120, check=check, cwd=ROOT,
    )  # fmt: skip


def test_exported_schemas_are_up_to_date(tmp_path: Path) -> None:
    """docs/schemas is what `epsilon-market schemas` writes; regenerate with `make schemas`."""
    cli(None, "schemas", "--out", str(tmp_path))
    for name in SCHEMAS:
        fresh = (tmp_path / f"{name}.schema.json").read_text()
        committed = (ROOT / "docs" / "schemas" / f"{name}.schema.json").read_text()
        assert fresh == committed, f"docs/schemas/{name}.schema.json is stale: run make schemas"


def test_cli_rejects_bad_input_with_a_clear_message() -> None:
    r = cli(None, "--broker", "kafka://127.0.0.1:1", "register", "--stream", "bad id",
            "--seller", "s", "--steps", "1,2", check=False)  # fmt: skip
    assert r.returncode == 2 and "invalid registration" in r.stderr and "stream_id" in r.stderr
    r = cli(None, "--broker", "kafka://127.0.0.1:1", "publish", "--stream", "s",
            "--values", "1,x", check=False)  # fmt: skip
    assert r.returncode == 2 and "comma-separated numbers" in r.stderr
    r = cli(None, "buy", "--buyer", "b", "--stream", "s", "--max-price", "1", check=False)
    assert r.returncode == 2 and "needs --broker" in r.stderr


@pytest.mark.broker
@pytest.mark.slow
def test_seller_and_buyer_workflow(market: Market, tmp_path: Path) -> None:
    w = market.start_worker()
    r = cli(market, "register", "--stream", "temp", "--seller", "acme", "--dimension", "2",
            "--steps", "0.5,1,2", "--cap", "4", "--price-per-level", "100")  # fmt: skip
    entry = json.loads(r.stdout)
    key = entry["market_public_key"]
    lines = tmp_path / "values.jsonl"
    lines.write_text("".join(json.dumps([float(i), 2.0]) + "\n" for i in range(5)))
    r = cli(market, "publish", "--stream", "temp", "--file", str(lines))
    assert "published 5/5 values" in r.stdout
    market.wait_ingested("temp", 5)
    quote = json.loads(cli(market, "quote", "--buyer", "alice", "--stream", "temp").stdout)
    assert quote["price_minor"] == 50
    out = tmp_path / "outcome.json"
    alice_key, eve_key = tmp_path / "alice.key", tmp_path / "eve.key"
    r = cli(market, "buy", "--buyer", "alice", "--stream", "temp", "--max-price", "50",
            "--output", str(out), "--key-file", str(alice_key))  # fmt: skip
    assert oct(alice_key.stat().st_mode & 0o777) == "0o600"
    outcome = json.loads(r.stdout)
    assert outcome["level_after"] == 0.5 and outcome["sealed"] and len(outcome["releases"]) == 5
    ok = cli(None, "verify-receipt", str(out), "--public-key", key)
    assert ok.stdout.startswith("valid:")
    tampered = json.loads(out.read_text())
    tampered["releases"][0]["values"][0] += 1e-9
    bad = tmp_path / "tampered.json"
    bad.write_text(json.dumps(tampered))
    r = cli(None, "verify-receipt", str(bad), "--public-key", key, check=False)
    assert r.returncode == 1 and "INVALID" in r.stdout
    r = cli(market, "buy", "--buyer", "alice", "--stream", "temp", "--max-price", "1", check=False)
    assert r.returncode == 1 and "price_too_high" in r.stdout
    tail = cli(market, "tail", "--buyer", "alice", "--key-file", str(alice_key)).stdout
    events = [json.loads(x) for x in tail.splitlines()]
    assert [e["type"] for e in events] == ["quote", "purchase_fulfilled", "rejection"]
    assert events[1]["releases"] == outcome["releases"]
    # isolation does not rest on the broker: another buyer reading alice's topic sees ciphertext
    raw = json.loads(cli(market, "tail", "--buyer", "alice").stdout.splitlines()[1])
    assert raw["releases"] == [] and raw["sealed"]["ciphertext"]
    spy = cli(market, "tail", "--buyer", "alice", "--key-file", str(eve_key), check=False)
    assert spy.returncode == 1 and "cannot be opened" in spy.stderr
    assert "Traceback" not in spy.stderr
    catalog = json.loads(cli(market, "catalog").stdout)
    assert catalog["temp"]["registration"]["steps"] == [0.5, 1.0, 2.0]
    ledger = cli(None, "ledger", "--worker", w.url).stdout
    assert "temp" in ledger and "alice" in ledger
    assert re.search(r"^acme\s+50 EUR\s+temp$", ledger, re.M), ledger  # per-seller revenue
