"""Answers the market signs (issue #30, #31): clients believe only what the market signed for
their own bytes, and refused senders learn why at once.

* The format: docs/protocol.md's vectors are the code's, and verify from the text alone.
* The core signs every inbox message as the answer to the exact event bytes that caused it (a
  batch's deliveries as answering none), and records a bounded, signed refusal per refused event.
* On the real broker: a stranger's forged ``purchase_fulfilled`` racing the genuine one is
  ignored with a warning; a forged delivery is flagged by ``tail``; a squatted ``account open``
  fails; a reused purchase id reports ``idempotency_key_reused``; ``buy`` without an account
  ends at once with ``unknown_account``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from streams.clients.client import MarketClient, TopicReader
from streams.clients.keys import Party
from streams.wire import answers
from streams.wire.answers import (
    REFUSAL_BYTES,
    REFUSAL_TEXTS,
    AnswerError,
    answer_header,
    refusal_value,
    verify_answer,
)
from streams.wire.events import PurchaseFulfilled, Refusal, Rejection
from streams.wire.topics import Topics

from .. import helpers
from ..conftest import Market
from ..helpers import TEST_KEYS, account, market_core, party, purchase, registration, value

ROOT = Path(__file__).resolve().parents[3]
PUB = TEST_KEYS.signing_key.public_key()
T = Topics(helpers.MARKET)


# -- the format ------------------------------------------------------------------------------------
def _documented() -> dict[str, Any]:
    text = (ROOT / "docs" / "protocol.md").read_text()
    block = text.split("<!-- answer vectors: begin -->")[1].split("<!-- answer vectors: end -->")[0]
    return dict(json.loads(block.split("```json")[1].split("```")[0]))


def _from_the_text(market: str, topic: str, request: str | None, value: bytes) -> bytes:
    """The signed bytes as docs/protocol.md describes them, written without the code."""

    def s(x: str) -> bytes:
        return b"s" + struct.pack(">I", len(x.encode())) + x.encode()

    asked = b"n" if request is None else s(request)
    return (
        b"emarket-sig-v1\x00"
        + s(market)
        + s("answer")
        + s(topic)
        + asked
        + s(hashlib.sha256(value).hexdigest())
    )


def test_the_documented_vectors_are_the_codes_and_verify_from_the_text() -> None:
    doc = _documented()
    assert doc == answers.vectors(), "docs/protocol.md's answer vectors are stale"
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(doc["market_public_key"]))
    for m in doc["messages"]:
        value_bytes = m["value"].encode()
        signed = _from_the_text(doc["market"], m["topic"], m["request_sha256"], value_bytes)
        assert signed.hex() == m["signed_bytes"]
        head = bytes.fromhex(m["header"])
        key.verify(head[1:65], signed)  # raises if not
        assert head[0] == 1 and head[65:].hex() == (m["request_sha256"] or "")
        assert (
            verify_answer(key, doc["market"], m["topic"], value_bytes, [("emarket-answer", head)])
            == m["request_sha256"]
        )


def test_an_answer_does_not_move_and_a_stranger_cannot_sign_one() -> None:
    value_bytes = b'{"type":"rejection"}'
    request = hashlib.sha256(b"the purchase").hexdigest()
    head = [answer_header(TEST_KEYS.signing_key, "t", "t.inbox.alice", request, value_bytes)]
    assert verify_answer(PUB, "t", "t.inbox.alice", value_bytes, head) == request
    for topic, val in (("t.inbox.bob", value_bytes), ("t.inbox.alice", value_bytes + b" ")):
        with pytest.raises(AnswerError, match="does not verify"):
            verify_answer(PUB, "t", topic, val, head)
    stranger = Ed25519PrivateKey.from_private_bytes(b"s" * 32)
    forged = [answer_header(stranger, "t", "t.inbox.alice", request, value_bytes)]
    with pytest.raises(AnswerError, match="does not verify"):
        verify_answer(PUB, "t", "t.inbox.alice", value_bytes, forged)
    with pytest.raises(AnswerError, match="no emarket-answer"):
        verify_answer(PUB, "t", "t.inbox.alice", value_bytes, [])
    with pytest.raises(AnswerError, match="more than one"):
        verify_answer(PUB, "t", "t.inbox.alice", value_bytes, head + forged)
    # another request's digest in the header: the signature no longer verifies
    moved = [(head[0][0], head[0][1][:65] + hashlib.sha256(b"other").digest())]
    with pytest.raises(AnswerError):
        verify_answer(PUB, "t", "t.inbox.alice", value_bytes, moved)


def test_a_refusal_record_is_bounded_and_carries_nothing_of_the_event() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    for code in [*REFUSAL_TEXTS, "price_too_high", "Not A Code!" * 10]:
        val = refusal_value(code, "t" * 239 + ".purchases", 2**31 - 1, 2**63 - 1)
        _, head = answer_header(TEST_KEYS.signing_key, "t", T.refusals, digest, val)
        assert len(digest) + len(val) + len("emarket-answer") + len(head) <= REFUSAL_BYTES
    refused = refusal_value("Not A Code!", T.purchases, 0, 0)
    assert Refusal.model_validate_json(refused).reason == "refused"


# -- the core --------------------------------------------------------------------------------------
def _checked(out: Any, raw: bytes | None) -> None:
    """Every inbox message of ``out`` verifies as the answer to ``raw`` (None: to no event)."""
    want = None if raw is None else hashlib.sha256(raw).hexdigest()
    for o in out:
        if T.is_inbox(o.topic):
            assert verify_answer(PUB, T.prefix, o.topic, o.value, list(o.headers)) == want


def test_the_core_signs_every_answer_for_the_bytes_it_answers() -> None:
    core = market_core("seller1", "buyer1")
    raw = registration()
    [entry] = core.handle(T.registrations, raw).outputs  # it names the key values are sealed to
    assert entry.topic == T.catalog
    digest = hashlib.sha256(raw).hexdigest()
    assert verify_answer(PUB, T.prefix, T.catalog, entry.value, list(entry.headers)) == digest
    [again_entry] = core.handle(T.registrations, raw).outputs  # a resend: signed again
    assert (
        verify_answer(PUB, T.prefix, T.catalog, again_entry.value, list(again_entry.headers))
        == digest
    )
    with core.batch() as deliveries:
        first = value("temp", "v1", [1.0, 2.0, 3.0])
        _checked(core.handle(T.values, first).outputs, first)
    buy = purchase("temp", "buyer1", "p1", target_level=0.5)
    got = core.handle(T.purchases, buy)
    assert got.status == "fulfilled"
    assert [o.topic for o in got.outputs] == ["t.inbox.buyer1", "t.inbox.seller1"]
    _checked(got.outputs[:1], buy)
    _checked(got.outputs[1:], None)  # the seller's sale notice answers no request of its own
    with core.batch() as deliveries:
        later = value("temp", "v2", [1.0, 2.0, 3.0])
        _checked(core.handle(T.values, later).outputs, later)
    assert deliveries and all(T.is_inbox(o.topic) for o in deliveries)
    _checked(deliveries, None)
    again = core.handle(T.accounts, account("buyer1"))  # a resend: the duplicate is signed too
    _checked(again.outputs, account("buyer1"))
    reused = purchase("temp", "buyer1", "p1", target_level=1.0)
    refused = core.handle(T.purchases, reused)
    assert refused.reason == "idempotency_key_reused"
    _checked(refused.outputs, reused)
    [record] = [o for o in refused.outputs if o.topic == T.refusals]
    digest = hashlib.sha256(reused).hexdigest()
    assert record.key == digest.encode()
    assert verify_answer(PUB, T.prefix, T.refusals, record.value, list(record.headers)) == digest
    assert Refusal.model_validate_json(record.value).reason == "idempotency_key_reused"


def test_an_unproven_sender_gets_a_refusal_and_nothing_in_any_inbox() -> None:
    core = market_core("seller1")
    core.handle(T.registrations, registration())
    raw = purchase("temp", "nobody", "p9", max_price=12_345)
    out = core.handle(T.purchases, raw)
    assert out.reason == "unknown_account"
    assert not [o for o in out.outputs if T.is_inbox(o.topic)]
    [record] = [o for o in out.outputs if o.topic == T.refusals]
    assert (
        b"p9" not in record.value
        and b"12345" not in record.value
        and b"nobody" not in (record.value)
    )
    assert record.key == hashlib.sha256(raw).hexdigest().encode()


# -- on the broker ---------------------------------------------------------------------------------
def _cli(market: Market, *args: str) -> subprocess.CompletedProcess[str]:
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    return subprocess.run(
        [sys.executable, "-m", "streams", *pre, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


def _key_file(tmp: Path, who: Party) -> Path:
    path = tmp / f"{who.account_id}-{who.public_key[:6].replace('/', '_')}.key"
    who.save(str(path))
    return path


async def _write(
    market: Market, topic: str, value_bytes: bytes, headers: list[tuple[str, bytes]] | None = None
) -> None:
    """A stranger writes ``value_bytes`` to ``topic`` (no ACLs on the embedded broker)."""
    producer = AIOKafkaProducer(bootstrap_servers=market.broker.bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value_bytes, key=b"p", headers=headers)
    finally:
        await producer.stop()


async def _forge_when_sent(market: Market, template: dict[str, Any], pid: str) -> None:
    """As soon as ``pid`` appears on the purchases topic, write a forged fulfilment of it into
    the buyer's inbox: signed by the stranger's key, for the right inbox and request."""
    reader = TopicReader(market.broker.bootstrap, market.topics.purchases)
    await reader.start()
    try:
        while True:
            for _, raw in await reader.poll(0.05):
                if json.loads(raw).get("purchase_id") == pid:
                    inbox = market.topics.inbox(template["buyer_id"])
                    forged = json.dumps(
                        {**template, "purchase_id": pid, "level_after": 4.0, "price_minor": 1}
                    ).encode()
                    stranger = Ed25519PrivateKey.from_private_bytes(b"m" * 32)
                    digest = hashlib.sha256(raw).hexdigest()
                    head = answer_header(stranger, market.topics.prefix, inbox, digest, forged)
                    await _write(market, inbox, forged)  # unsigned
                    await _write(market, inbox, forged, [head])  # signed, by the wrong key
                    return
    finally:
        await reader.stop()


def _setup(market: Market) -> None:
    """A worker, seller1 and buyer1's accounts, the stream ``temp`` with one value."""
    market.start_worker()
    market.open_accounts("seller1", "buyer1")
    fields = {
        k: v
        for k, v in json.loads(registration()).items()
        if k not in ("type", "key_id", "signature", "seller_id")
    }

    async def reg(c: MarketClient) -> None:
        got = await c.register(fields)
        assert got.type == "catalog_entry", got
        await c.publish("temp", [1.0, 2.0, 3.0], value_id="v1")

    market.run(reg)
    market.wait_ingested("temp", 1)


@pytest.mark.broker
def test_a_forged_answer_racing_the_genuine_one_is_ignored(market: Market) -> None:
    _setup(market)
    warnings: list[str] = []

    async def go() -> tuple[Any, Any, Any]:
        async with MarketClient(
            market.broker.bootstrap,
            market.topics,
            party=party("buyer1"),
            on_warning=warnings.append,
        ) as c:
            first = await c.buy("temp", target_level=0.5, max_price_minor=10**6, purchase_id="p0")
            assert isinstance(first, PurchaseFulfilled), first
            template = json.loads(first.model_dump_json())
            forger = asyncio.create_task(_forge_when_sent(market, template, "p1"))
            got = await c.buy("temp", target_level=1.0, max_price_minor=10**6, purchase_id="p1")
            await asyncio.wait_for(forger, 10)
            # the same id with another target: refused, not the old success
            reused = await c.buy("temp", target_level=2.0, max_price_minor=10**6, purchase_id="p1")
            return first, got, reused

    _, got, reused = asyncio.run(go())
    assert isinstance(got, PurchaseFulfilled) and got.purchase_id == "p1"
    assert got.level_after == 1.0 and got.price_minor == 50  # the market's, not the forger's
    assert sum("forged" in w and "purchase_fulfilled" in w for w in warnings) >= 2, warnings
    assert isinstance(reused, Rejection) and reused.reason == "idempotency_key_reused", reused


@pytest.mark.broker
def test_the_cli_flags_forgeries_and_reports_refusals_at_once(
    market: Market, tmp_path: Path
) -> None:
    _setup(market)
    buyer = _key_file(tmp_path, party("buyer1"))
    r = _cli(
        market,
        "buy",
        "--key-file",
        str(buyer),
        "--stream",
        "temp",
        "--target",
        "0.5",
        "--max-price",
        "10",
    )
    assert r.returncode == 0, r.stderr

    async def genuine_delivery() -> bytes:
        async with market.client() as c:
            await c.publish("temp", [4.0, 5.0, 6.0], value_id="v2")
        reader = TopicReader(market.broker.bootstrap, market.topics.inbox("buyer1"))
        await reader.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for _, raw in await reader.poll(0.3):
                    if b'"value_released"' in raw:
                        return raw
            raise AssertionError("no delivery")
        finally:
            await reader.stop()

    delivery = json.loads(asyncio.run(genuine_delivery()))
    forged = json.dumps(
        {**delivery, "releases": [{**delivery["releases"][0], "values": [999.0, 999.0, 999.0]}]}
    )
    asyncio.run(_write(market, market.topics.inbox("buyer1"), forged.encode()))
    r = _cli(market, "tail", "--key-file", str(buyer), "--json")
    assert r.returncode == 0, r.stderr
    shown = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["type"] for e in shown].count("value_released") == 1
    assert "999.0" not in r.stdout
    assert re.search(r"warning: ignored a 'value_released' message .*forged", r.stderr), r.stderr

    # a squatter opened "victim" first: the victim's `account open` fails, saying so
    asyncio.run(_open(market, Party.generate("victim")))
    victim = _key_file(tmp_path, Party.generate("victim"))
    started = time.monotonic()
    r = _cli(market, "account", "open", "--key-file", str(victim))
    assert r.returncode == 1 and "account_exists" in r.stderr and "another key" in r.stderr, (
        r.stdout,
        r.stderr,
    )
    assert time.monotonic() - started < 20

    # a buyer who never opened an account learns why at once, not after 60 s
    stranger = _key_file(tmp_path, Party.generate("newcomer"))
    started = time.monotonic()
    r = _cli(market, "buy", "--key-file", str(stranger), "--stream", "temp", "--max-price", "1")
    took = time.monotonic() - started
    assert r.returncode == 1 and "unknown_account" in r.stderr, (r.stdout, r.stderr)
    assert took < 20, took
    print(f"buy without an account: refused in {took:.1f} s")
    r = _cli(market, "tail", "--key-file", str(stranger))  # and `tail` says so, not exit 0
    assert r.returncode == 1 and "never confirmed account 'newcomer'" in r.stderr, r.stderr


async def _open(market: Market, who: Party) -> None:
    async with MarketClient(market.broker.bootstrap, market.topics, party=who) as c:
        got = await c.open_account()
        assert got.type == "account", got


def test_a_worker_with_another_signing_key_refuses_to_start() -> None:
    """Clients believe only the key the market's identity publishes: a worker signing with
    another would have every answer refused, so it does not start."""
    from streams.core import MarketKeys
    from streams.worker.identity import MarketIdentityError, _compare, identity_of

    ours = identity_of(TEST_KEYS)
    assert ours.market_public_key == TEST_KEYS.public_key_b64
    other = MarketKeys(
        signing_key=Ed25519PrivateKey.from_private_bytes(b"o" * 32),
        noise_secret=TEST_KEYS.noise_secret,
    )
    with pytest.raises(MarketIdentityError, match="signing key"):
        _compare(identity_of(other), ours, "t.market")
    _compare(identity_of(other), ours.model_copy(update={"market_public_key": None}), "t.market")
