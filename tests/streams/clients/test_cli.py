"""The command line, run as a user would (subprocesses) against a live worker."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streams.broker.embedded import EmbeddedBroker
from streams.clients.client import TopicReader
from streams.wire.events import SCHEMAS

from ..conftest import Market

ROOT = Path(__file__).resolve().parents[3]


def cli(market: Market | None, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    pre = (
        [] if market is None else ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    )
    return subprocess.run(
        [sys.executable, "-m", "streams", *pre, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
        cwd=ROOT,
    )


def test_exported_schemas_are_up_to_date(tmp_path: Path) -> None:
    """docs/schemas is what `epsilon-market schemas` writes; regenerate with `make schemas`."""
    cli(None, "schemas", "--out", str(tmp_path))
    for name in SCHEMAS:
        fresh = (tmp_path / f"{name}.schema.json").read_text()
        committed = (ROOT / "docs" / "schemas" / f"{name}.schema.json").read_text()
        assert fresh == committed, f"docs/schemas/{name}.schema.json is stale: run make schemas"


def test_cli_rejects_bad_input_with_a_clear_message(tmp_path: Path) -> None:
    key = tmp_path / "s.key"
    assert cli(None, "keygen", "--account", "s", "--out", str(key)).returncode == 0
    r = cli(
        None,
        "--broker",
        "kafka://127.0.0.1:1",
        "register",
        "--key-file",
        str(key),
        "--stream",
        "bad id",
        "--steps",
        "1,2",
        check=False,
    )
    assert r.returncode == 2 and "invalid registration: --stream must be" in r.stderr
    r = cli(
        None,
        *("--broker", "kafka://127.0.0.1:1", "register", "--key-file", str(key)),
        *("--stream", "s", "--steps", "1,2", "--buyer-share", "1.5"),
        check=False,
    )
    assert r.returncode == 2 and "invalid registration: --buyer-share" in r.stderr, r.stderr
    r = cli(
        None,
        "--broker",
        "kafka://127.0.0.1:1",
        "publish",
        "--key-file",
        str(key),
        "--stream",
        "s",
        "--values",
        "1,x",
        check=False,
    )
    assert r.returncode == 2 and "comma-separated numbers" in r.stderr
    r = cli(None, "buy", "--key-file", str(key), "--stream", "s", "--max-price", "1", check=False)
    assert r.returncode == 2 and "needs a broker" in r.stderr
    r = cli(
        None,
        "--broker",
        "kafka://127.0.0.1:1",
        "buy",
        "--key-file",
        str(tmp_path / "no.key"),
        "--stream",
        "s",
        "--max-price",
        "1",
        check=False,
    )
    assert r.returncode == 2 and "keygen" in r.stderr  # a mistyped key path creates nothing
    assert not (tmp_path / "no.key").exists()
    for r in (
        cli(None, "keygen", "--account", "a.b", "--out", str(tmp_path / "x"), check=False),
        cli(None, "keygen", "--account", "s", "--out", str(key), check=False),
    ):
        assert r.returncode == 2 and "Traceback" not in r.stderr


def register_other_products(market: Market, key_file: Path) -> None:
    """The other products and the privacy unit, as a seller registers them from the CLI."""
    acme = ["--key-file", str(key_file)]
    for sid, flags in (
        ("home", ["--privacy-window", "1h", "--window-cap", "8"]),
        ("sales", ["--mechanism", "gaussian", "--running-totals", "12"]),
        ("visits", ["--mechanism", "discrete_laplace"]),
        ("cities", ["--mechanism", "gaussian", "--histogram", "strings", "--dimension", "50"]),
        (
            "zips",
            ["--mechanism", "gaussian", "--histogram", "integers:100000", "--false-keys", "0.5"],
        ),
        ("survey", ["--rappor", "1", "--dimension", "8"]),
    ):
        reg = json.loads(
            cli(
                market, "register", *acme, "--stream", sid, "--steps", "0.5,1", *flags, "--json"
            ).stdout
        )["registration"]
        assert reg["stream_id"] == sid
    catalog = json.loads(cli(market, "catalog", "--json").stdout)
    assert catalog["home"]["registration"]["window"] == {"duration_ms": 3_600_000, "cap": 8.0}
    assert catalog["sales"]["registration"]["tree_height"] == 12
    assert catalog["visits"]["registration"]["mechanism"] == "discrete_laplace"
    assert catalog["cities"]["registration"]["histogram"] == {
        "key_space": "strings",
        "domain_size": None,
        "false_keys": 1.0,
    }
    assert catalog["zips"]["registration"]["histogram"]["domain_size"] == 100_000
    survey = catalog["survey"]
    assert survey["registration"]["rappor_ones"] == 1
    assert survey["registration"]["sensitivity"] == 2.0  # 2 × ONES, not the default 1
    assert all("randomized_response" in p for p in survey["prices"])
    for bad, says in (
        (["--rappor", "1", "--histogram", "strings"], "at most one of --running-totals"),
        (["--rappor", "1", "--sensitivity", "1"], "sensitivity 2"),
        (["--histogram", "integers"], "integers:N"),
        (["--histogram", "words"], "strings or integers:N"),
    ):
        r = cli(market, "register", *acme, "--stream", "y", "--steps", "1", *bad, check=False)
        assert r.returncode == 2 and says in r.stderr, r.stderr
    r = cli(
        market,
        "register",
        *acme,
        "--stream",
        "x",
        "--steps",
        "1",
        "--privacy-window",
        "1h",
        check=False,
    )
    assert r.returncode == 2 and "--privacy-window needs --window-cap" in r.stderr


def check_ledger(market: Market, url: str, tmp_path: Path) -> None:
    """The ledger is read only with the operators' token."""
    ledger = cli(
        None, "ledger", "--worker", url, "--data-dir", str(market.settings.data_dir)
    ).stdout
    assert "temp" in ledger and "alice" in ledger
    assert re.search(r"^acme\s+0\.50 EUR\s+temp$", ledger, re.M), ledger  # per-seller revenue
    no_token = ("--data-dir", str(tmp_path / "no"))
    refused = cli(None, "ledger", "--worker", url, *no_token, check=False)
    assert refused.returncode != 0 and "needs their token" in refused.stderr, refused.stderr


@pytest.mark.broker
@pytest.mark.slow
def test_seller_and_buyer_workflow(market: Market, tmp_path: Path) -> None:
    w = market.start_worker()
    keys = {who: tmp_path / f"{who}.key" for who in ("acme", "alice", "eve")}
    for who, path in keys.items():
        cli(None, "keygen", "--account", who, "--out", str(path))
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert "is open" in cli(market, "account", "open", "--key-file", str(path)).stdout
    r = cli(
        market,
        "register",
        "--key-file",
        str(keys["acme"]),
        "--stream",
        "temp",
        "--dimension",
        "2",
        "--steps",
        "0.5,1,2",
        "--cap",
        "4",
        "--price-per-level",
        "1.00",
        "--json",
    )
    entry = json.loads(r.stdout)
    key = entry["market_public_key"]
    lines = tmp_path / "values.jsonl"
    lines.write_text("".join(json.dumps([float(i), 2.0]) + "\n" for i in range(5)))
    r = cli(
        market, "publish", "--key-file", str(keys["acme"]), "--stream", "temp", "--file", str(lines)
    )
    assert "published 5/5 values" in r.stdout
    market.wait_ingested("temp", 5)
    alice = ["--key-file", str(keys["alice"])]
    quote = json.loads(cli(market, "quote", *alice, "--stream", "temp", "--json").stdout)
    assert quote["price_minor"] == 50
    out = tmp_path / "outcome.json"
    r = cli(market, "buy", *alice, "--stream", "temp", "--max-price", "0.50", "--output", str(out))
    assert "{" not in r.stdout  # the outcome went to the file; the terminal gets a summary
    outcome = json.loads(out.read_text())
    assert outcome["level_after"] == 0.5 and outcome["sealed"] and len(outcome["releases"]) == 5
    assert "for 0.50 EUR: 5 values (outcome and receipt in" in r.stdout, r.stdout
    ok = cli(None, "verify-receipt", str(out), "--public-key", key)
    assert ok.stdout.startswith("valid:") and "0.50 EUR" in ok.stdout
    tampered = json.loads(out.read_text())
    tampered["releases"][0]["values"][0] += 1e-9
    bad = tmp_path / "tampered.json"
    bad.write_text(json.dumps(tampered))
    r = cli(None, "verify-receipt", str(bad), "--public-key", key, check=False)
    assert r.returncode == 1 and "INVALID" in r.stdout
    r = cli(market, "buy", *alice, "--stream", "temp", "--max-price", "0.01", "--json", check=False)
    assert r.returncode == 1 and "price_too_high" in r.stdout
    tail = cli(market, "tail", *alice, "--json").stdout
    events = [json.loads(x) for x in tail.splitlines()]
    assert [e["type"] for e in events] == ["account", "quote", "purchase_fulfilled", "rejection"]
    assert events[2]["releases"] == outcome["releases"]

    # isolation does not rest on the broker: eve, reading alice's inbox, sees only ciphertext
    async def spy() -> list[bytes]:
        reader = TopicReader(market.broker.bootstrap, market.topics.inbox("alice"))
        await reader.start()
        got = [v for _, v in await reader.poll(2.0)]
        await reader.stop()
        return got

    raw = next(json.loads(v) for v in asyncio.run(spy()) if b"purchase_fulfilled" in v)
    assert raw["releases"] == [] and raw["sealed"]["ciphertext"]
    catalog = json.loads(cli(market, "catalog", "--json").stdout)
    assert catalog["temp"]["registration"]["steps"] == [0.5, 1.0, 2.0]
    table = cli(market, "catalog").stdout  # a person's view: one line per stream, units, prices
    assert re.search(
        r"^temp\s+acme\s+laplace\s+2\s+0\.5 epsilon \(.+ EUR\), 1 epsilon", table, re.M
    ), table
    assert catalog["temp"]["market_public_key"] in table
    check_ledger(market, w.url, tmp_path)
    register_other_products(market, keys["acme"])


@pytest.mark.broker
@pytest.mark.slow
def test_every_command_prints_for_a_person_and_json_for_machines(
    market: Market, tmp_path: Path
) -> None:
    """Each command's default output is lines with units (no JSON); ``--json`` parses; the exit
    code is 0 only when the market took this request; counts are checked before sending."""
    market.start_worker()
    keys = {who: tmp_path / f"{who}.key" for who in ("acme", "bob")}
    for who, path in keys.items():
        cli(None, "keygen", "--account", who, "--out", str(path))
    r = cli(market, "account", "open", "--key-file", str(keys["acme"]), "--json")
    assert json.loads(r.stdout)["account_id"] == "acme" and "is open" in r.stderr
    assert "is open" in cli(market, "account", "open", "--key-file", str(keys["bob"])).stdout
    acme, bob = ["--key-file", str(keys["acme"])], ["--key-file", str(keys["bob"])]
    r = cli(
        market,
        "register",
        *acme,
        "--stream",
        "visits",
        "--mechanism",
        "discrete_laplace",
        "--dimension",
        "2",
        "--steps",
        "0.5,1",
        "--price-per-level",
        "0.10",
    )
    assert "{" not in r.stdout and "registered stream 'visits' of acme" in r.stdout, r.stdout
    assert "0.5 epsilon (0.05 EUR), 1 epsilon (0.10 EUR)" in r.stdout, r.stdout
    # counts: the CLI knows the stream from the catalog and refuses before sending
    for bad in ("3,-4", "2.5,1"):
        r = cli(market, "publish", *acme, "--stream", "visits", "--values", bad, check=False)
        assert r.returncode == 2 and "takes counts" in r.stderr and "nothing was sent" in r.stderr
    # ... and the market refuses them when the CLI does not know the stream
    sealing = json.loads(cli(market, "catalog", "--json").stdout)["visits"]["market_sealing_key"]
    r = cli(
        market,
        "publish",
        *acme,
        "--stream",
        "visits",
        "--values",
        "3,-4",
        "--market-sealing-key",
        sealing,
        check=False,
    )
    assert r.returncode == 1 and "refused (invalid_count)" in r.stderr, r.stderr
    r = cli(
        market,
        "publish",
        *acme,
        "--stream",
        "visits",
        "--values",
        "12,3",
        "--value-id",
        "d1",
        "--json",
    )
    line = json.loads(r.stdout)
    assert (line["value_id"], line["status"]) == ("d1", "accepted") and line["published_at_ms"]
    r = cli(market, "quote", *bob, "--stream", "visits")
    assert "{" not in r.stdout and "0.05 EUR  <- this quote" in r.stdout, r.stdout
    r = cli(market, "buy", *bob, "--stream", "visits", "--max-price", "0.05")
    assert "{" not in r.stdout and "bought level 0.5 (epsilon) of visits for 0.05 EUR" in r.stdout
    assert re.search(r"^  d1 +-?\d+ -?\d+$", r.stdout, re.M), r.stdout  # whole numbers: 12
    assert "noise: discrete Laplace scale" in r.stdout, r.stdout
    r = cli(market, "buy", *bob, "--stream", "visits", "--max-price", "0.01", check=False)
    assert r.returncode == 1 and not r.stdout and "price_too_high" in r.stderr, r
    tail = cli(market, "tail", *bob).stdout
    assert "{" not in tail and "bought visits at level 0.5 epsilon" in tail, tail
    assert "refused (price_too_high) purchases visits" in tail, tail
    # rotating keys: refused with a reason and exit 1, or done with exit 0
    new = tmp_path / "bob2.key"
    cli(None, "keygen", "--account", "bob", "--out", str(new))
    r = cli(
        market, "account", "rotate", *bob, "--new-key-file", str(new), "--version", "7", check=False
    )
    assert r.returncode == 1 and "stale_key_version" in r.stderr, (r.stdout, r.stderr)
    r = cli(
        market, "account", "rotate", *bob, "--new-key-file", str(new), "--version", "2", "--json"
    )
    assert json.loads(r.stdout)["version"] == 2 and "rotated to version 2" in r.stderr


@pytest.mark.broker
def test_init_topics_says_how_many_workers_the_partitions_allow(broker: EmbeddedBroker) -> None:
    """The partition count is fixed once the topics exist: the command says what it allows,
    and warns when a seller's share of a partition is too small to be useful."""
    r = cli(None, "--broker", broker.url, "--prefix", "cap32", "init-topics", "--partitions", "32")
    assert "at most 32 workers" in r.stdout and "2 of one seller" in r.stdout
    assert "warning" in r.stdout and "at least 128" in r.stdout
    again = cli(
        None,
        "--broker",
        broker.url,
        "--prefix",
        "cap32",
        "--json",
        "init-topics",
        "--partitions",
        "32",
    )
    body = json.loads(again.stdout)
    assert body["created"] == [] and body["capacity"]["max_workers"] == 32


@pytest.mark.broker
def test_init_topics_states_the_partitions_the_topics_have(broker: EmbeddedBroker) -> None:
    """A partition count that is no count is refused before anything is created, and topics
    that exist with another count than asked are reported as such, never as the count asked."""
    for bad in ("0", "-1"):
        r = cli(
            None,
            "--broker",
            broker.url,
            "--prefix",
            "cap0",
            "init-topics",
            "--partitions",
            bad,
            check=False,
        )
        assert r.returncode == 2 and "--partitions" in r.stderr and "Traceback" not in r.stderr
    assert (
        cli(
            None, "--broker", broker.url, "--prefix", "cap4", "init-topics", "--partitions", "4"
        ).returncode
        == 0
    )
    r = cli(
        None,
        "--broker",
        broker.url,
        "--prefix",
        "cap4",
        "init-topics",
        "--partitions",
        "32",
        check=False,
    )
    assert r.returncode != 0 and "at most 32 workers" not in r.stdout
    assert "4" in r.stderr and "Traceback" not in r.stderr
