"""The first hour of a seller, a buyer and an operator: no silent failure, no traceback.

Each test runs the command line as a person would (a subprocess) and checks the exit code and
that the message names what was wrong. Receipts are built by :class:`MarketCore` with the test
market key, so the verify-receipt checks need no broker.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streams.clients.client import MarketClient
from streams.core import MarketCore, Stores
from streams.wire.topics import Topics

from ..conftest import Market
from ..helpers import TEST_KEYS, cli_parties, open_accounts, purchase, registration, value

ROOT = Path(__file__).resolve().parents[3]
T = Topics("t")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.startswith("EMARKET_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "streams", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=full_env,
        check=False,
    )


def assert_clean(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """Exit ``code``, one error line naming every needle, no traceback."""
    text = r.stdout + r.stderr
    assert r.returncode == code, (r.returncode, text)
    assert "Traceback" not in text, text
    for n in needles:
        assert n in text, (n, text)


@pytest.fixture(scope="module")
def outcome() -> dict[str, Any]:
    """A fulfilled, unsealed purchase outcome as `buy --output` writes it."""
    core = MarketCore(Stores(), TEST_KEYS, T, clock=lambda: 1_000)
    open_accounts(core, "seller1", "alice")
    assert core.handle(T.registrations, registration("temp")).status == "accepted"
    core.handle(T.values, value("temp", "v0", [20.0, 1.0, 2.0]))
    out = core.handle(T.purchases, purchase("temp", "alice", "p1"))
    assert out.status == "fulfilled", out.reason
    raw = next(o.value for o in out.outputs if o.topic == T.inbox("alice"))
    data: dict[str, Any] = json.loads(raw)
    return data


KEY = TEST_KEYS.public_key_b64


def write(tmp_path: Path, name: str, data: Any) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_verify_receipt_shows_only_signed_data(outcome: dict[str, Any], tmp_path: Path) -> None:
    r = cli("verify-receipt", write(tmp_path, "ok.json", outcome), "--public-key", KEY)
    assert_clean(r, 0, "valid: purchase p1 by alice on temp", "0.50 EUR", "level 0 -> 0.5")


@pytest.mark.parametrize(
    ("field", "forged"),
    [
        ("buyer_id", "mallory"),
        ("stream_id", "other"),
        ("price_minor", 5),
        ("level_after", 2.0),
        ("level_before", 1.0),
        ("currency", "USD"),
        ("purchase_id", "p9"),
    ],
)
def test_verify_receipt_refuses_edited_outer_fields(
    outcome: dict[str, Any], tmp_path: Path, field: str, forged: Any
) -> None:
    """A field outside the signed receipt that disagrees with it makes the file invalid."""
    r = cli(
        "verify-receipt", write(tmp_path, "t.json", {**outcome, field: forged}), "--public-key", KEY
    )
    assert_clean(r, 1, "INVALID", field)
    assert "valid:" not in r.stdout


def test_verify_receipt_bad_key_or_file_is_a_clear_error(
    outcome: dict[str, Any], tmp_path: Path
) -> None:
    ok = write(tmp_path, "ok.json", outcome)
    assert_clean(cli("verify-receipt", ok, "--public-key", "notakey"), 2, "not valid base64")
    assert_clean(cli("verify-receipt", ok, "--public-key", "null"), 2, "catalog")
    short = "AAAA"
    assert_clean(cli("verify-receipt", ok, "--public-key", short), 2, "32 bytes")
    # without a key and without a broker to read it from: say how to give one
    assert_clean(cli("verify-receipt", ok), 2, "--public-key", "--broker")
    rejection = {
        "schema_version": 1,
        "type": "rejection",
        "reason": "price_too_high",
        "message": "too dear",
    }
    r = cli("verify-receipt", write(tmp_path, "rej.json", rejection), "--public-key", KEY)
    assert_clean(r, 1, "INVALID", "rejection", "price_too_high")
    (tmp_path / "junk.json").write_text("{not json")
    r = cli("verify-receipt", str(tmp_path / "junk.json"), "--public-key", KEY)
    assert_clean(r, 2, "is not JSON")
    assert_clean(
        cli("verify-receipt", str(tmp_path / "missing.json"), "--public-key", KEY), 2, "cannot read"
    )


def test_ledger_names_the_worker_it_could_not_reach() -> None:
    assert_clean(cli("ledger", "--worker", "127.0.0.1:6066"), 2, "'127.0.0.1:6066'", "http://")
    r = cli("ledger", "--worker", "http://127.0.0.1:1")
    assert_clean(r, 4, "worker at http://127.0.0.1:1")
    assert "broker" not in r.stderr.split("(")[0]  # it blames the worker, not the broker
    r = cli("ledger", env={"EMARKET_WORKER": "http://127.0.0.1:1"})
    assert_clean(r, 4, "worker at http://127.0.0.1:1")


def test_account_commands_need_a_key_file_and_never_create_one(tmp_path: Path) -> None:
    boot = ["--broker", "kafka://127.0.0.1:1"]
    assert_clean(cli(*boot, "tail"), 2, "--key-file", "keygen")
    missing = tmp_path / "typo.key"
    assert_clean(cli(*boot, "tail", "--key-file", str(missing)), 2, str(missing))
    assert not missing.exists()


def test_money_is_typed_in_major_units(tmp_path: Path) -> None:
    key = tmp_path / "a.key"
    assert cli("keygen", "--account", "a", "--out", str(key)).returncode == 0
    boot = ["--broker", "kafka://127.0.0.1:1", "buy", "--key-file", str(key), "--stream", "s"]
    assert_clean(cli(*boot, "--max-price", "0.505"), 2, "EUR has 2 decimals")
    assert_clean(cli(*boot, "--max-price", "-1"), 2, "0 or more")
    assert_clean(cli(*boot, "--max-price", "lots"), 2, "not an amount of EUR")
    # a well-formed price gets as far as the (unreachable) broker
    assert_clean(cli(*boot, "--max-price", "0.5"), 4, "cannot reach the broker")


def test_broker_credentials_half_set_are_a_clear_error(tmp_path: Path) -> None:
    r = cli("--broker", "kafka://127.0.0.1:1", "catalog", env={"EMARKET_KAFKA_USER": "alice"})
    assert_clean(r, 2, "EMARKET_KAFKA_PASSWORD")
    r = cli(
        "--broker",
        "kafka://127.0.0.1:1",
        "catalog",
        env={
            "EMARKET_KAFKA_USER": "a",
            "EMARKET_KAFKA_PASSWORD": "p",
            "EMARKET_KAFKA_SECURITY": "SSL",
        },
    )
    assert_clean(r, 2, "SASL_SSL")


@pytest.mark.broker
@pytest.mark.slow
def test_refused_values_and_purchases_exit_non_zero_with_the_reason(
    market: Market, tmp_path: Path
) -> None:
    w = market.start_worker()
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    acme, bob = cli_parties(cli, pre, tmp_path, "acme", "bob").values()
    r = cli(*pre, "register", *acme, "--stream", "temp", "--dimension", "2", "--steps", "1,2")
    assert r.returncode == 0, r.stderr
    r = cli(*pre, "publish", *acme, "--stream", "temp", "--values", "1,2")
    assert_clean(r, 0, "accepted")
    r = cli(*pre, "publish", *acme, "--stream", "temp", "--values", "1,2,3")
    assert_clean(r, 1, "refused (wrong_dimension)", "dimension 2")
    r = cli(*pre, "publish", *acme, "--stream", "nosuch", "--values", "1,2")
    assert_clean(r, 1, "refused (unknown_stream)", "'nosuch'")
    r = cli(*pre, "publish", *bob, "--stream", "temp", "--values", "1,2")  # not bob's stream
    assert r.returncode == 1 and "refused (" in r.stderr and "Traceback" not in r.stderr
    lines = tmp_path / "v.jsonl"
    lines.write_text("[1, 2]\n[3, 4, 5]\n[6, 7]\n")
    r = cli(*pre, "publish", *acme, "--stream", "temp", "--file", str(lines))
    assert_clean(r, 1, "published 3/3 values", "refused (wrong_dimension)")
    assert r.stderr.count("refused") == 1  # the two good values went in
    r = cli(*pre, "buy", *bob, "--stream", "temp", "--max-price", "0.10")
    assert_clean(r, 1, "price_too_high", "costs 1.00 EUR, more than the purchase's --max-price")
    r = cli(*pre, "buy", *bob, "--stream", "nosuch", "--max-price", "1")
    assert_clean(r, 1, "unknown_stream")
    # the operator reads every refusal with its reason
    r = cli(*pre, "rejections", "--stream", "temp")
    assert_clean(r, 0)
    assert len(re.findall(r"^wrong_dimension", r.stdout, re.M)) == 2, r.stdout
    assert re.search(r"^price_too_high .* bob", r.stdout, re.M), r.stdout
    token = ("--data-dir", str(market.settings.data_dir))
    assert_clean(cli("ledger", "--worker", w.url, *token), 0, "temp", "acme")


@pytest.mark.broker
@pytest.mark.slow
def test_a_catalog_entry_someone_else_wrote_is_skipped(market: Market, tmp_path: Path) -> None:
    """An entry a stranger appends to the catalog with its own key (possible on a broker
    without ACLs) carries no signature of the market's and is skipped, like junk, with a
    warning. verify-receipt without a pinned key reads the market's key where every command
    does, from the market's identity record (trusted on first use, with a warning), so the
    stranger's entries change nothing there either."""

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from streams.core import MarketKeys

    market.start_worker()
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    seller, bob = cli_parties(cli, pre, tmp_path, "seller1", "bob").values()
    assert cli(*pre, "register", *seller, "--stream", "temp", "--steps", "1").returncode == 0
    assert_clean(cli(*pre, "publish", *seller, "--stream", "temp", "--values", "1"), 0)
    out = tmp_path / "outcome.json"
    r = cli(*pre, "buy", *bob, "--stream", "temp", "--max-price", "1", "--output", str(out))
    assert_clean(r, 0, "bought level 1")
    assert oct(out.stat().st_mode & 0o777) == "0o600"  # it holds opened releases
    r = cli(*pre, "verify-receipt", str(out))
    assert_clean(r, 0, "valid: purchase", "(not pinned)", "Pin it: --market-key")
    # a stranger's catalog entry for the same stream, signed into the catalog with its own key
    evil = MarketKeys(Ed25519PrivateKey.from_private_bytes(b"e" * 32), b"x" * 32)
    t = market.topics
    core = MarketCore(Stores(), evil, t, clock=lambda: 1_000)
    open_accounts(core, "seller1")
    reg = core.handle(t.registrations, registration("temp", market=core.ctx.market))
    forged = next(o.value for o in reg.outputs if o.topic == t.catalog)

    async def write(c: MarketClient) -> None:
        await c.send(t.catalog, "temp", forged)
        await c.send(t.catalog, "junk", b"not a catalog entry")

    market.run(write)
    assert_clean(cli(*pre, "catalog"), 0, "skipped 2 records")
    r = cli(*pre, "verify-receipt", str(out))
    assert_clean(r, 0, "valid: purchase", f"read from {t.identity}")


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_taken_web_port_is_one_clear_line_before_anything_starts(
    command: str, tmp_path: Path
) -> None:
    """The web port was checked only when the worker's web server bound it, 36-60 s after
    `serve` said it was serving: a 48-line Faust traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = cli(
            command,
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
            env={"EMARKET_BROKER": "kafka://127.0.0.1:9"} if command == "worker" else None,
        )
    assert_clean(r, 2, f"127.0.0.1:{port}", "--web-port")
    assert "is serving" not in r.stdout and "Traceback" not in r.stderr


@pytest.mark.slow
def test_ledger_names_the_market_it_read_and_refuses_another(market: Market) -> None:
    """`ledger` without EMARKET_WORKER read whatever answered on the default port, naming no
    market: another user's market could pass for one's own."""
    w = market.start_worker()
    token = ("--data-dir", str(market.settings.data_dir))
    r = cli("ledger", "--worker", w.url, *token)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert f"from the worker at {w.url}" in first and "ledger of market " in first, first
    other = "Kay64UG8yvCyLhqU000LxzYeUm0L/hLIl5S8kyKWbdc="  # Ed25519 key of bytes 32..63
    assert_clean(
        cli("ledger", "--worker", w.url, *token, env={"EMARKET_MARKET_KEY": other}),
        1,
        "serves another market",
        "24f6ed6acbfe1009",
    )
