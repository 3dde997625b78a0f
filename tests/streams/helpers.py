"""Builders for signed events used across the streaming tests.

Parties have deterministic keys (derived from their names), so a test can sign as anyone it
names — and an attacker test can sign as itself while claiming to be someone else.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from pydantic import ValidationError

from streams.clients.keys import Party
from streams.core import MarketCore, MarketKeys, Stores
from streams.wire.events import PurchaseRequest, QuoteRequest, StreamRegistration, ValueBatch
from streams.wire.sealing import seal_values
from streams.wire.signing import MarketRef
from streams.wire.topics import Topics
from streams.worker.secrets import NOISE_FILE, SIGNING_FILE

TEST_KEYS = MarketKeys(
    signing_key=Ed25519PrivateKey.from_private_bytes(bytes(range(32))),
    noise_secret=b"n" * 32,
)
MARKET = "t"  # the tests' topic prefix
SIGNED_FOR = MarketRef(MARKET, TEST_KEYS.key_id)
"""What the tests' signatures name: the test market's prefix and the key id of ``TEST_KEYS``."""
Market = str | MarketRef
"""A market the helpers sign for: a prefix (of a market with ``TEST_KEYS``) or a MarketRef."""
_PLACEHOLDER = "A" * 86 + "=="


def write_test_keys(data_dir: Path) -> None:
    """Make ``TEST_KEYS`` the keys of a worker started on ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    pem = TEST_KEYS.signing_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    (data_dir / SIGNING_FILE).write_bytes(pem)
    (data_dir / NOISE_FILE).write_bytes(TEST_KEYS.noise_secret)


def signed_for(market: Market = MARKET) -> MarketRef:
    """The market signatures name: ``market`` itself, or the market of prefix ``market`` whose
    keys are ``TEST_KEYS`` (this module is the one place that knows their key id)."""
    return market if isinstance(market, MarketRef) else MarketRef(market, TEST_KEYS.key_id)


def prefix_of(market: Market) -> str:
    return market.prefix if isinstance(market, MarketRef) else market


@functools.cache
def party(name: str) -> Party:
    """A party whose keys are a function of its name; names starting with "sealed" also have
    a sealing key (releases to them are then sealed)."""
    seed = hashlib.sha256(name.encode()).digest()
    sealing = None
    if name.startswith("sealed"):
        sealing = X25519PrivateKey.from_private_bytes(hashlib.sha256(seed).digest())
    return Party(name, Ed25519PrivateKey.from_private_bytes(seed), sealing)


def account(name: str, market: Market = MARKET, opened_at_ms: int = 1_000) -> bytes:
    opening = party(name).open_account(signed_for(market), opened_at_ms=opened_at_ms)
    return opening.model_dump_json().encode()


def market_core(
    *parties: str, now: int = 1_000, stores: Stores | None = None, **kw: Any
) -> MarketCore:
    """A core on plain dicts (or ``stores``) for the test market ``t``, its clock stopped at
    ``now``, with the named parties' accounts open."""
    core = MarketCore(stores or Stores(), TEST_KEYS, Topics(MARKET), clock=lambda: now, **kw)
    open_accounts(core, *parties)
    return core


def open_accounts(core: MarketCore, *names: str) -> None:
    """Open the named accounts (the accounts topic is the core's first input)."""
    t = core.ctx.topics
    for name in names:
        out = core.handle(t.accounts, account(name, core.ctx.market))
        assert out.status in ("accepted", "duplicate"), out.reason


def registration(stream_id: str = "temp", market: Market = MARKET, **kw: Any) -> bytes:
    body: dict[str, Any] = {
        "stream_id": stream_id,
        "seller_id": "seller1",
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 3,
        "steps": [0.5, 1.0, 2.0],
        "cap": 4.0,
        "retain_last": 4,
        "pricing": {"kind": "linear_level", "rate_per_level": 100},
        "currency": "EUR",
    }
    body.update(kw)
    signer = party(kw.pop("signer", None) or body["seller_id"])
    body.pop("signer", None)
    return _signed(StreamRegistration, market, signer, body)


def assert_registration_refused(core: MarketCore, fields: dict[str, Any], says: str) -> None:
    """A registration with ``fields`` is refused by the market (``invalid_event``) and by the
    wire model itself, with a message that contains ``says`` (a regular expression)."""
    raw = registration("bad", **fields)
    out = core.handle(Topics(MARKET).registrations, raw)
    assert (out.status, out.reason) == ("rejected", "invalid_event")
    body = {k: v for k, v in json.loads(raw).items() if k not in ("key_id", "signature")}
    with pytest.raises(ValidationError, match=says):
        StreamRegistration.model_validate(
            {**body, "key_id": "0" * 16, "signature": "A" * 86 + "=="}
        )


def value(
    stream_id: str, value_id: str, values: list[float], market: Market = MARKET, **kw: Any
) -> bytes:
    """A batch of one value, signed by the stream's seller (``seller_id``, default seller1), its
    numbers sealed to ``TEST_KEYS`` (``sealed_for``: another market's keys; ``clear``: not)."""
    seller = kw.pop("seller_id", "seller1")
    signer = party(kw.pop("signer", seller))
    sealing = {k: kw.pop(k) for k in ("clear", "sealed_for") if k in kw}
    item = {"value_id": value_id, "values": values, "published_at_ms": 1_000}
    item.update(kw)
    body = {"stream_id": stream_id, "seller_id": seller, "items": [item]}
    return signed_batch(market, signer, body, **sealing)


def values(
    stream_id: str,
    items: list[tuple[str, list[float]]],
    market: Market = MARKET,
    published_at_ms: int = 1_000,
    seller: str = "seller1",
    clear: bool = False,
    batch_seq: int | None = None,
) -> bytes:
    body: dict[str, Any] = {
        "stream_id": stream_id,
        "seller_id": seller,
        "items": [
            {"value_id": v, "values": x, "published_at_ms": published_at_ms} for v, x in items
        ],
    }
    if batch_seq is not None:
        body["batch_seq"] = batch_seq
    return signed_batch(market, party(seller), body, clear=clear)


def signed_batch(
    market: Market,
    signer: Party,
    body: dict[str, Any],
    *,
    clear: bool = False,
    sealed_for: MarketKeys = TEST_KEYS,
) -> bytes:
    """A value batch of ``body``, its numbers sealed to ``sealed_for`` as the client seals them
    (deterministically: the same body gives the same bytes), then signed; ``clear``: unsealed.
    An invalid body is returned unsigned (tests of bad input)."""
    try:
        draft = ValueBatch.model_validate({**body, "key_id": "0" * 16, "signature": _PLACEHOLDER})
    except ValueError:
        return _signed(ValueBatch, market, signer, body)
    if not clear:
        prefix = prefix_of(market)
        seed = hashlib.sha256(draft.model_dump_json().encode() + prefix.encode()).digest()
        draft = seal_values(draft, prefix, sealed_for.sealing_public_b64, seed=seed)
    fields = draft.model_dump(exclude={"key_id", "signature"})
    return _signed(ValueBatch, market, signer, fields)


def purchase(
    stream_id: str, buyer: str, pid: str, max_price: int = 10**6, market: Market = MARKET, **kw: Any
) -> bytes:
    signer = party(kw.pop("signer", buyer))
    body: dict[str, Any] = {
        "purchase_id": pid,
        "buyer_id": buyer,
        "stream_id": stream_id,
        "max_price_minor": max_price,
        "requested_at_ms": 1_000,
    }
    body.update(kw)
    return _signed(PurchaseRequest, market, signer, body)


def quote(stream_id: str, buyer: str, qid: str, market: Market = MARKET, **kw: Any) -> bytes:
    body: dict[str, Any] = {
        "quote_id": qid,
        "buyer_id": buyer,
        "stream_id": stream_id,
        "requested_at_ms": 1_000,
    }
    body.update(kw)
    return _signed(QuoteRequest, market, party(buyer), body)


def _signed(model: Any, market: Market, signer: Party, body: dict[str, Any]) -> bytes:
    """Sign ``body`` if it is a valid event; else return it unsigned (tests of bad input)."""
    try:
        event = signer.sign(model, signed_for(market), **body)
    except ValueError:
        return json.dumps({"type": model.model_fields["type"].default, **body}).encode()
    raw = event.model_dump_json().encode()  # the bytes the client library sends for it
    if json.loads(raw) == event.model_dump():
        return raw
    return json.dumps(event.model_dump(), allow_nan=True).encode()  # NaN stays NaN (attacks)


async def buy(c: Any, buyer: str, stream_id: str, **kw: Any) -> Any:
    """``c.buy`` as the test party ``buyer``."""
    return await c.buy(stream_id, party=party(buyer), **kw)


def tail(c: Any, buyer: str, **kw: Any) -> Any:
    """``c.tail`` of the test party ``buyer``'s inbox."""
    return c.tail(party=party(buyer), **kw)


async def inbox_until(c: Any, buyer: str, done: Any, timeout: float = 60.0) -> list[Any]:
    """The test party ``buyer``'s inbox, read again until ``done(events)`` holds: outputs follow
    the ledger by a moment, and a busy machine must not fail a test that reads too early."""
    deadline = time.monotonic() + timeout
    while True:
        events = [e async for e in tail(c, buyer, idle_timeout=1.0)]
        if done(events) or time.monotonic() > deadline:
            return events


def cli_parties(run: Any, pre: list[str], tmp: Any, *names: str) -> dict[str, list[str]]:
    """Parties made as a user makes them, through the CLI (``run(*args)`` runs one command):
    a key file from ``keygen`` and an account opened with it; name → ``--key-file`` arguments."""
    out = {}
    for who in names:
        path = tmp / f"{who}.key"
        assert run("keygen", "--account", who, "--out", str(path)).returncode == 0
        assert run(*pre, "account", "open", "--key-file", str(path)).returncode == 0
        out[who] = ["--key-file", str(path)]
    return out


def protocol_vectors(name: str) -> dict[str, Any]:
    """The JSON block ``<!-- {name} vectors: begin -->`` … ``end`` of docs/protocol.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    block = re.search(
        rf"<!-- {name} vectors: begin -->\s*```json\n(.*?)\n```\s*"
        rf"<!-- {name} vectors: end -->",
        text,
        re.S,
    )
    assert block is not None, f"docs/protocol.md lost its {name} vectors block"
    vectors: dict[str, Any] = json.loads(block.group(1))
    return vectors
