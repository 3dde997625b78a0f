"""What the market shows to whoever can reach it: sellers' numbers only sealed to the market's
key, no per-buyer data without the operators' credential, every buyer sealed unless an operator
says otherwise."""

from __future__ import annotations

import base64
import hmac
import json
import stat
import struct
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from streams.clients.cli import build_parser
from streams.clients.client import MarketClient, TopicReader, now_ms
from streams.clients.commands.operator import _worker_settings
from streams.core import MarketCore, MarketKeys, Stores
from streams.wire.events import CatalogEntry, ValueBatch
from streams.wire.sealing import open_values, values_aad
from streams.wire.topics import Topics
from streams.worker import web
from streams.worker.runner import settings_args
from streams.worker.secrets import OPERATOR_TOKEN_FILE, load_or_create_keys

from ..conftest import Market
from ..helpers import (
    MARKET,
    TEST_KEYS,
    market_core,
    open_accounts,
    party,
    purchase,
    registration,
    signed_for,
    value,
)

MARKET_TOPICS = Topics(MARKET)


def _core_with_a_buyer() -> Stores:
    core = market_core("seller1", "alice")
    t = core.ctx.topics
    assert core.handle(t.registrations, registration("temp")).status == "accepted"
    assert core.handle(t.values, value("temp", "v1", [1.0, 2.0, 3.0])).status == "accepted"
    assert core.handle(t.purchases, purchase("temp", "alice", "p1")).status == "fulfilled"
    return core.stores


def test_the_ledger_is_the_operators_and_lists_each_buyer() -> None:
    stores = _core_with_a_buyer()
    detail = web.ledger(stores, TEST_KEYS)
    assert detail["streams"]["temp"]["holder_count"] == 1
    assert detail["streams"]["temp"]["holders"]["alice"]["purchases"] == 1


def test_only_the_operators_bearer_token_opens_the_ledger() -> None:
    token = TEST_KEYS.operator_token
    assert web.ledger_access(f"Bearer {token}", TEST_KEYS) is True
    assert web.ledger_access(f"bearer {token}", TEST_KEYS) is True
    for wrong in (None, "", f"Bearer {token[:-1]}", f"Basic {token}", "Bearer", "Bearer é"):
        assert web.ledger_access(wrong, TEST_KEYS) is False, wrong


def test_the_token_is_written_beside_the_keys_for_the_operators_only(tmp_path: Path) -> None:
    keys = load_or_create_keys(tmp_path / "data", env={})
    path = tmp_path / "data" / OPERATOR_TOKEN_FILE
    assert path.read_text() == keys.operator_token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_keys(tmp_path / "data", env={})
    assert again.operator_token == keys.operator_token  # one token per market (its secret)
    assert keys.operator_token not in repr(keys)


def test_serve_and_worker_seal_every_buyer_unless_told_it_is_unsafe() -> None:
    parser = build_parser()
    for command in ("serve", "worker"):
        safe = _worker_settings(parser.parse_args([command]))
        assert safe.require_encryption
        assert "--unsafe-unsealed-buyers" not in settings_args(safe)
        unsafe = _worker_settings(parser.parse_args([command, "--unsafe-unsealed-buyers"]))
        assert not unsafe.require_encryption
        child = _worker_settings(parser.parse_args(settings_args(unsafe)))
        assert not child.require_encryption  # a child worker keeps the operator's choice


# -- values sealed to the market's key -------------------------------------------------------
def _batch(raw: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(raw)
    return body


def _resigned(body: dict[str, Any], signer: str = "seller1", market: str = MARKET) -> bytes:
    """``body`` (a value batch) signed again by ``signer``: what a seller, or a thief who owns
    another stream, can make of sealed numbers it has read on the values topic."""
    fields = {k: v for k, v in body.items() if k not in ("key_id", "signature")}
    return party(signer).sign(ValueBatch, signed_for(market), **fields).model_dump_json().encode()


def _core(**kw: Any) -> MarketCore:
    core = market_core("seller1", "eve", **kw)
    for sid, seller in (("temp", "seller1"), ("mine", "eve")):
        raw = registration(sid, seller_id=seller, market=core.ctx.topics.prefix)
        assert core.handle(core.ctx.topics.registrations, raw).status == "accepted"
    return core


def test_sealed_values_are_opened_once_and_sold_as_plain_numbers() -> None:
    core = _core()
    t = core.ctx.topics
    raw = value("temp", "v1", [1.5, 2.0, 3.0])
    assert b"1.5" not in raw and "sealed" in _batch(raw)
    assert core.handle(t.values, raw).status == "accepted"
    out = core.handle(t.purchases, purchase("temp", "eve", "p1", target_level=4.0))
    (fulfilled,) = [json.loads(o.value) for o in out.outputs if o.topic == t.inbox("eve")]
    assert len(fulfilled["releases"]) == 1  # released from the exact numbers, like a clear value
    entry = CatalogEntry.model_validate_json(
        core.handle(t.registrations, registration("other")).outputs[0].value
    )
    assert entry.market_sealing_key == TEST_KEYS.sealing_public_b64


def test_values_sealed_for_another_market_key_are_refused() -> None:
    other = MarketKeys(TEST_KEYS.signing_key, b"m" * 32)
    out = _core().handle(MARKET_TOPICS.values, value("temp", "v1", [1.0] * 3, sealed_for=other))
    assert (out.status, out.reason) == ("rejected", "bad_seal")


def test_sealed_numbers_moved_to_another_value_id_or_time_are_refused() -> None:
    body = _batch(value("temp", "v1", [1.0, 2.0, 3.0]))
    for change in ({"value_id": "v2"}, {"published_at_ms": 1_001}):
        moved = {**body, "items": [{**body["items"][0], **change}]}
        out = _core().handle(MARKET_TOPICS.values, _resigned(moved))
        assert (out.status, out.reason) == ("rejected", "bad_seal"), change


def test_sealed_numbers_replayed_into_another_stream_or_market_are_refused() -> None:
    body = _batch(value("temp", "v1", [1.0, 2.0, 3.0]))
    stolen = {**body, "stream_id": "mine", "seller_id": "eve"}  # eve sells seller1's numbers
    out = _core().handle(MARKET_TOPICS.values, _resigned(stolen, signer="eve"))
    assert (out.status, out.reason) == ("rejected", "bad_seal")
    elsewhere = MarketCore(Stores(), TEST_KEYS, Topics("u"), clock=lambda: 1_000)
    open_accounts(elsewhere, "seller1")
    elsewhere.handle(Topics("u").registrations, registration("temp", market="u"))
    out = elsewhere.handle(Topics("u").values, _resigned(body, market="u"))  # same key, market u
    assert (out.status, out.reason) == ("rejected", "bad_seal")


def test_clear_values_are_refused_unless_the_market_accepts_them_and_never_echoed() -> None:
    raw = value("temp", "v1", [123.25, 2.0, 3.0], clear=True)
    out = _core().handle(MARKET_TOPICS.values, raw)
    assert (out.status, out.reason) == ("rejected", "values_not_sealed")
    assert all(b"123.25" not in o.value for o in out.outputs)
    assert _core(accept_clear_values=True).handle(MARKET_TOPICS.values, raw).status == "accepted"


#: X25519 public keys of small order (and their non-canonical spellings): no shared secret
_LOW_ORDER = [
    bytes.fromhex(h)
    for h in (
        "00" * 32,
        "01" + "00" * 31,
        "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
        "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
        "ec" + "ff" * 30 + "7f",
        "ed" + "ff" * 30 + "7f",
        "ee" + "ff" * 30 + "7f",
    )
]


def test_a_seal_with_a_low_order_or_malformed_ephemeral_key_is_refused_as_bad_seal() -> None:
    """A seller (or a thief re-signing sealed numbers) choosing ``epk``: a point of small order
    (bit 255 set or not) is a ``bad_seal`` like any seal that does not open, never an internal
    error (a malformed key is refused by the wire model before it is signed or opened)."""
    body = _batch(value("temp", "v1", [1.0, 2.0, 3.0]))
    epks = [
        base64.b64encode(bytes([*p[:31], p[31] | hi])).decode()
        for p in _LOW_ORDER
        for hi in (0, 0x80)
    ]
    core = _core()
    for epk in epks:
        forged = {**body, "sealed": {**body["sealed"], "epk": epk}}
        out = core.handle(MARKET_TOPICS.values, _resigned(forged))
        assert (out.status, out.reason) == ("rejected", "bad_seal"), epk


def test_an_altered_seal_is_refused_by_the_signature_before_anything_is_opened() -> None:
    body = _batch(value("temp", "v1", [1.0, 2.0, 3.0]))
    ct = bytearray(base64.b64decode(body["sealed"]["ciphertext"]))
    ct[0] ^= 1
    body["sealed"]["ciphertext"] = base64.b64encode(bytes(ct)).decode()
    out = _core().handle(MARKET_TOPICS.values, json.dumps(body).encode())
    assert (out.status, out.reason) == ("rejected", "bad_signature")
    out = _core().handle(MARKET_TOPICS.values, _resigned(body))  # signed, but not what was sealed
    assert (out.status, out.reason) == ("rejected", "bad_seal")


def test_refusals_name_the_coordinate_never_the_number() -> None:
    core = market_core("seller1")
    t = core.ctx.topics
    core.handle(
        t.registrations,
        registration("n", mechanism="discrete_laplace", dimension=2, steps=[1.0], cap=1.0),
    )
    for numbers, says in (([4.0, 1234.5], "coordinate 1"), ([float("inf"), 1.0], "coordinate 0")):
        out = core.handle(t.values, value("n", "x", numbers))
        (line,) = [json.loads(o.value) for o in out.outputs if o.topic == t.inbox("seller1")]
        message = line["outcomes"][0]["message"]
        assert says in message and "1234" not in message and "inf" not in message, message


def test_the_protocol_vector_of_sealed_values() -> None:
    """docs/protocol.md §4.4, recomputed from its text with the primitives alone."""
    doc = (Path(__file__).parents[3] / "docs" / "protocol.md").read_text()
    vec = json.loads(doc.split("<!-- sealed-values vector -->\n```json\n")[1].split("```")[0])
    noise = bytes.fromhex(vec["noise_secret_hex"])
    market_sk = hmac.digest(noise, b"emarket market sealing key v1", "sha256")
    assert market_sk.hex() == vec["market_private_key_hex"]
    market = X25519PrivateKey.from_private_bytes(market_sk)
    k = _raw(market)
    assert base64.b64encode(k).decode() == vec["market_sealing_key"]
    aad = (
        b"emarket values v1\x00"
        + b"".join(
            sized(x)
            for x in (
                vec["market"].encode(),
                k,
                vec["stream_id"].encode(),
                vec["seller_id"].encode(),
            )
        )
        + struct.pack(">I", len(vec["items"]))
        + b"".join(
            sized(i["value_id"].encode()) + struct.pack(">Q", i["published_at_ms"])
            for i in vec["items"]
        )
    )
    assert aad.hex() == vec["aad_hex"]
    assert json.loads(vec["plaintext"]) == [{"values": i["values"]} for i in vec["items"]]
    eph = X25519PrivateKey.from_private_bytes(bytes.fromhex(vec["ephemeral_private_key_hex"]))
    epk = _raw(eph)
    key = HKDF(hashes.SHA256(), 32, salt=epk + k, info=b"epsilon-market release v1").derive(
        eph.exchange(market.public_key())
    )
    assert key.hex() == vec["hkdf_key_hex"]
    ct = ChaCha20Poly1305(key).encrypt(
        bytes.fromhex(vec["nonce_hex"]), vec["plaintext"].encode(), aad
    )
    assert vec["sealed"] == {
        "alg": "x25519-hkdf-sha256-chacha20poly1305",
        "epk": base64.b64encode(epk).decode(),
        "nonce": base64.b64encode(bytes.fromhex(vec["nonce_hex"])).decode(),
        "ciphertext": base64.b64encode(ct).decode(),
    }
    batch = ValueBatch.model_validate(
        {
            "stream_id": vec["stream_id"],
            "seller_id": vec["seller_id"],
            "sealed": vec["sealed"],
            "items": [
                {"value_id": i["value_id"], "published_at_ms": i["published_at_ms"]}
                for i in vec["items"]
            ],
            "key_id": "0" * 16,
            "signature": "A" * 86 + "==",
        }
    )
    assert values_aad(vec["market"], vec["market_sealing_key"], batch) == aad
    opened = open_values(batch, vec["market"], TEST_KEYS.sealing_key)
    assert [i.values for i in opened.items] == [i["values"] for i in vec["items"]]


def sized(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _raw(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


# -- on the embedded broker ----------------------------------------------------------------
@pytest.mark.broker
@pytest.mark.slow
def test_nobody_reading_the_broker_or_the_pages_sees_numbers_or_buyers(market: Market) -> None:
    """The values topic read raw holds no clear number; a refused value's rejection quotes
    none; /metrics and /health name no buyer, /ledger answers only the operators' token."""
    w = market.start_worker()
    market.open_accounts("seller1", "sealed-buyer")
    secret = [1234.5678, 8765.4321, 2468.1357]
    m = market.topics.prefix

    async def go(c: MarketClient) -> tuple[bytes, bytes]:
        await c.register(
            {
                "stream_id": "temp",
                "mechanism": "laplace",
                "sensitivity": 1.0,
                "dimension": 3,
                "steps": [1.0],
                "cap": 1.0,
                "pricing": {"kind": "linear_level", "rate_per_level": 1.0},
            }
        )
        await c.publish("temp", secret)
        clear = value(
            "temp", "clear", [9876.5, 1.0, 2.0], market=m, clear=True, published_at_ms=now_ms()
        )  # a client that does not seal
        c.seal_values = False
        refused = await c.publish_batch(ValueBatch.model_validate_json(clear))
        assert refused is not None and refused.type == "rejection", refused
        c.seal_values = True
        await c.buy("temp", party=party("sealed-buyer"), max_price_minor=100)
        return (
            b"".join(await read_raw(c, c.topics.values)),
            b"".join(await read_raw(c, c.topics.rejections)),
        )

    values, rejections = market.run(go)
    assert values.count(b'"sealed"') == 1 and b"9876.5" in values  # the one clear batch sent
    assert not any(repr(x).encode() in values for x in secret)
    assert b"values_not_sealed" in rejections and b"9876.5" not in rejections
    pages = json.dumps(w.get("/health")) + w.get("/metrics")
    assert "sealed-buyer" not in pages and "temp" in pages
    with pytest.raises(urllib.error.HTTPError) as refused:
        w.get("/ledger")  # the operators' page: not without their token
    assert refused.value.code == 401 and b"operators' token" in refused.value.read()
    assert "sealed-buyer" in json.dumps(market.ledger())  # the operators see it


async def read_raw(c: MarketClient, topic: str) -> list[bytes]:
    """Every record of ``topic`` as anyone on the broker reads it."""
    reader = TopicReader(c.bootstrap, topic)
    await reader.start()
    try:
        return [v for _, v in await reader.poll(2.0)]
    finally:
        await reader.stop()
