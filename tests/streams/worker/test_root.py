"""The market's trust root (docs/protocol.md §12.1.1): the first record of partition 0 of
``<p>.market``, whatever it is. A stranger's record written there before the first worker spoils
the market the same way for the worker (a clear error, exit 6, no traceback), the Python client
and the Node client (the same typed error and reason); a stranger's valid identity is refused by
a client given the market's key and trusted with a warning by one given none."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from streams.broker.admin import ensure_topics
from streams.broker.embedded import find_free_port
from streams.clients.client import MarketClient, MarketRootError
from streams.wire import root_vectors
from streams.wire.root import RootError, read_root, root_verdict
from streams.worker.identity import identity_of
from streams.worker.runner import settings_args

from ..conftest import Market
from ..helpers import TEST_KEYS

ROOT = Path(__file__).resolve().parents[3]
NODE_DIR = ROOT / "clients" / "node"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(
    NODE is None or not (NODE_DIR / "node_modules").is_dir(),
    reason="node or clients/node/node_modules is missing: the Node client cannot run",
)

FOREIGN = base64.b64encode(
    Ed25519PrivateKey.from_private_bytes(b"s" * 32).public_key().public_bytes_raw()
).decode()
FOREIGN_ID = hashlib.sha256(base64.b64decode(FOREIGN)).hexdigest()[:16]


def _documented() -> dict[str, Any]:
    text = (ROOT / "docs" / "protocol.md").read_text()
    block = text.split(root_vectors.BEGIN)[1].split(root_vectors.END)[0]
    return dict(json.loads(block.split("```json")[1].split("```")[0]))


# -- the rule, without a broker ------------------------------------------------------------------
def test_the_documented_vectors_are_the_rules_verdicts() -> None:
    doc = _documented()
    assert doc == root_vectors.vectors(), "docs/protocol.md's root vectors are stale"
    for c in doc["cases"]:
        value = None if c["value_hex"] is None else bytes.fromhex(c["value_hex"])
        got = root_verdict(doc["topic"], value, c["pinned"])
        assert got == {"verdict": c["verdict"], "key": c["key"]}, c["name"]
    verdicts = {c["verdict"] for c in doc["cases"]}
    assert verdicts == {"trusted", "pinned", "tombstone", "malformed", "foreign", "no_key"}


@needs_node
def test_the_node_client_gives_every_vector_the_same_verdict() -> None:
    assert NODE is not None
    r = subprocess.run(
        [NODE, "--test", "test/root.test.js"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and "# fail 0" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


def test_a_spoiled_root_names_the_record_and_what_to_do() -> None:
    with pytest.raises(RootError) as got:
        read_root("t.market", 0, b"\x00junk")
    assert got.value.reason == "malformed"
    for needle in ("t.market (partition 0, offset 0)", "delete the topic t.market", "prefix"):
        assert needle in got.value.message


# -- on a broker: the worker, the Python client and the Node client agree ------------------------
def _spoil(market: Market, value: bytes | None) -> None:
    """Write ``value`` (None: a tombstone) as the first record of ``<p>.market``, as a stranger
    who can write to the market's topics would before its first worker starts."""

    async def go() -> None:
        boot = market.broker.bootstrap
        await ensure_topics(boot, market.topics, 1)
        producer = AIOKafkaProducer(bootstrap_servers=boot, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(market.topics.identity, value, key=b"x", partition=0)
        finally:
            await producer.stop()

    asyncio.run(go())


def _python_clients(market: Market, *pins: str | None) -> list[dict[str, Any]]:
    """What a fresh Python client concludes, given each key of ``pins`` (None: none)."""

    async def one(pinned: str | None) -> dict[str, Any]:
        warnings: list[str] = []
        async with MarketClient(
            market.broker.bootstrap,
            market.topics,
            market_public_key=pinned,
            on_warning=warnings.append,
        ) as c:
            try:
                key = await c.market_key(wait=10)
            except MarketRootError as exc:
                return {"reason": exc.reason, "message": str(exc), "warnings": warnings}
            raw = key.public_bytes_raw()
            return {"key": base64.b64encode(raw).decode(), "warnings": warnings}

    async def go() -> list[dict[str, Any]]:
        return [await one(p) for p in pins]

    return asyncio.run(go())


_NODE_CLIENT = """
import { MarketClient, MarketRootError } from './src/index.js';
const [broker, prefix, ...pins] = process.argv.slice(1);
const outs = [];
for (const pinned of pins) {
  const warnings = [];
  const c = new MarketClient({ broker, prefix, marketPublicKey: pinned || null, timeoutMs: 10000,
                               warn: (m) => warnings.push(m) });
  try {
    await c.connect();
    outs.push({ key: c.marketPublicKey, warnings });
  } catch (err) {
    if (!(err instanceof MarketRootError)) throw err;
    outs.push({ reason: err.reason, message: err.message, warnings });
  } finally {
    await c.close();
  }
}
console.log(JSON.stringify(outs));
"""


def _node_clients(market: Market, *pins: str | None) -> list[dict[str, Any]]:
    """What a fresh Node client concludes, given each key of ``pins`` (None: none)."""
    assert NODE is not None
    r = subprocess.run(
        [
            NODE,
            "--input-type=module",
            "-e",
            _NODE_CLIENT,
            market.broker.bootstrap,
            market.topics.prefix,
            *(p or "" for p in pins),
        ],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return list(json.loads(r.stdout.strip().splitlines()[-1]))


def _python_cli(market: Market, *args: str) -> subprocess.CompletedProcess[str]:
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    return subprocess.run(
        [sys.executable, "-m", "streams", *pre, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _node_cli(market: Market, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    pre = [
        NODE,
        "bin/emarket.js",
        "--broker",
        market.broker.bootstrap,
        "--prefix",
        market.topics.prefix,
        "--timeout",
        "10",
    ]
    return subprocess.run(
        [*pre, *args], cwd=NODE_DIR, capture_output=True, text=True, timeout=60, check=False
    )


def _worker(market: Market) -> subprocess.CompletedProcess[str]:
    """A worker of ``market`` run to its end: it must refuse to start."""
    settings = replace(market.settings, web_port=find_free_port())
    return subprocess.run(
        [sys.executable, "-m", "streams", *settings_args(settings)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@needs_node
@pytest.mark.broker
@pytest.mark.parametrize(
    ("value", "reason"),
    [(b"\x00 not an identity", "malformed"), (None, "tombstone")],
    ids=["malformed", "tombstone"],
)
def test_a_spoiled_root_stops_the_worker_and_both_clients_alike(
    market: Market, tmp_path: Path, value: bytes | None, reason: str
) -> None:
    _spoil(market, value)
    pins = (None, TEST_KEYS.public_key_b64)
    for py, node in zip(_python_clients(market, *pins), _node_clients(market, *pins), strict=True):
        assert py["reason"] == node["reason"] == reason, (py, node)
        for said in (py["message"], node["message"]):
            assert f"{market.topics.identity} (partition 0, offset 0)" in said, said
            assert f"delete the topic {market.topics.identity}" in said, said
    (tmp_path / "outcome.json").write_text("{}")  # checked with the market's key: read first
    node_cli = _node_cli(market, tmp_path, "verify-receipt", str(tmp_path / "outcome.json"))
    for cli in _python_cli(market, "catalog"), node_cli:
        assert cli.returncode == 1, cli.stdout + cli.stderr
        assert "Traceback" not in cli.stderr and reason in cli.stderr, cli.stderr
        assert f"delete the topic {market.topics.identity}" in cli.stderr, cli.stderr
    r = _worker(market)
    out = r.stdout + r.stderr
    assert r.returncode == 6, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    error = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, r.stderr[-3000:]
    assert reason in error[0] or "not a market identity" in error[0], error
    assert f"{market.topics.identity} (partition 0, offset 0)" in error[0], error
    assert "delete the topic" in error[0] and "prefix" in error[0], error
    assert (
        f"market key {TEST_KEYS.key_id}: clients pin it with "
        f"EMARKET_MARKET_KEY={TEST_KEYS.public_key_b64}"
    ) in r.stdout, r.stdout


@needs_node
@pytest.mark.broker
def test_a_foreign_identity_is_refused_when_pinned_and_warned_of_when_trusted(
    market: Market,
) -> None:
    ours = identity_of(TEST_KEYS)
    theirs = ours.model_copy(update={"market_public_key": FOREIGN, "market_key_id": FOREIGN_ID})
    _spoil(market, theirs.model_dump_json().encode())
    pins = (TEST_KEYS.public_key_b64, None)
    (py, py_tofu), (node, node_tofu) = _python_clients(market, *pins), _node_clients(market, *pins)
    assert py["reason"] == node["reason"] == "foreign", (py, node)
    assert FOREIGN in py["message"] and FOREIGN in node["message"]
    assert not py["warnings"] and not node["warnings"]
    py, node = py_tofu, node_tofu
    assert py["key"] == node["key"] == FOREIGN, (py, node)
    for warned in (py["warnings"], node["warnings"]):
        assert len(warned) == 1 and "on first use" in warned[0], warned
        assert FOREIGN in warned[0] and FOREIGN_ID in warned[0], warned
        assert f"--market-key {FOREIGN}" in warned[0], warned
    r = _worker(market)
    assert r.returncode == 6 and "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    assert "someone else wrote" in r.stderr, r.stderr[-3000:]
