"""docs/protocol.md as a spec a stranger implements (issue #30): the published test vectors are
what the code computes, they verify with the primitives alone, and the published schemas are
strict JSON Schema draft 2020-12 that the vector events satisfy."""

from __future__ import annotations

import ast
import base64
import hashlib
import hmac
import json
import math
import struct
import unicodedata
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from market.histogram_chain import string_key
from market.levels import as_float_vector
from streams.clients.histograms import key_of
from streams.core.outputs import Reject
from streams.core.products.histograms import _hashed
from streams.wire.events import (
    REFUSAL_CODES,
    SCHEMAS,
    LinearLevelSpec,
    ValueBatch,
    ValueItem,
    ValuesAccepted,
    published_schema,
)
from streams.wire.sealing import open_values, values_aad
from streams.wire.signing import MarketRef, canonical_bytes, verify
from streams.wire.topics import Topics
from streams.wire.vectors import MARKET, SIGNED_EVENTS, SIGNED_FOR, build, render

from ..helpers import MARKET as HELPER_MARKET
from ..helpers import market_core, registration, value

ROOT = Path(__file__).parents[3]
VECTORS = ROOT / "docs" / "vectors"
BUILT = build()
TOPIC_OF = {
    "open_account": "accounts",
    "rotate_keys": "accounts",
    "register_stream": "registrations",
    "values": "values",
    "purchase": "purchases",
    "quote": "purchases",
    "reserve": "purchases",
}


def _load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


# --------------------------------------------------------------------------- no drift
@pytest.mark.parametrize("name", sorted(BUILT))
def test_the_published_vectors_are_what_the_code_computes(name: str) -> None:
    """docs/vectors is what `python -m streams vectors` writes: regenerate with `make vectors`."""
    assert (VECTORS / name).read_text() == render(BUILT[name]), (
        f"docs/vectors/{name} is stale: run make vectors"
    )


def test_every_event_type_a_party_sends_has_a_vector() -> None:
    kinds = {e["event"]["type"] for e in _load("signing.json")["events"]}
    assert kinds == set(SIGNED_EVENTS)
    names = [e["name"] for e in _load("signing.json")["events"]]
    assert len(names) == len(set(names))


# ------------------------------------------------------------------- signing vectors
@pytest.mark.parametrize("entry", _load("signing.json")["events"], ids=lambda e: e["name"])
def test_each_signing_vector_verifies_with_the_primitives_alone(entry: dict[str, Any]) -> None:
    """The event as sent parses to the listed canonical bytes, and the listed signature is the
    signer's Ed25519 signature of them (checked without the market's `verify`)."""
    doc = _load("signing.json")
    event = SIGNED_EVENTS[entry["event"]["type"]].model_validate(entry["event"])
    data = bytes.fromhex(entry["canonical_bytes"])
    market = MarketRef(doc["market"], doc["market_key_id"])
    assert market == SIGNED_FOR
    assert canonical_bytes(market, event, entry["key_version"]) == data
    assert data.startswith(
        b"emarket-sig-v2\x00"
        + b"s\x00\x00\x00\x01"
        + doc["market"].encode()
        + b"s\x00\x00\x00\x10"
        + doc["market_key_id"].encode()
    )
    pub = Ed25519PrivateKey.from_private_bytes(
        bytes.fromhex(doc["signer"]["ed25519_private_key"])
    ).public_key()
    pub.verify(base64.b64decode(entry["signature"]), data)
    assert entry["event"]["signature"] == entry["signature"]
    if entry["event"]["type"] == "rotate_keys":  # the same bytes, signed by the new key too
        new = Ed25519PublicKey.from_public_bytes(base64.b64decode(entry["event"]["signing_key"]))
        new.verify(base64.b64decode(entry["event"]["new_key_signature"]), data)
    jsonschema.validate(
        entry["event"],
        published_schema(TOPIC_OF[entry["event"]["type"]]),
        cls=jsonschema.Draft202012Validator,
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )


def test_omitted_fields_are_signed_as_their_defaults() -> None:
    """A purchase sent with its defaults spelled out has the bytes of the one without them."""
    entry = next(e for e in _load("signing.json")["events"] if e["name"] == "purchase, defaults")
    full = {
        **entry["event"],
        "target_level": None,
        "accuracy": None,
        "most_accurate": False,
        "currency": "EUR",
        "schema_version": 1,
    }
    event = SIGNED_EVENTS["purchase"].model_validate(full)
    assert canonical_bytes(SIGNED_FOR, event).hex() == entry["canonical_bytes"]


def test_negative_zero_is_signed_and_read_as_zero() -> None:
    """JavaScript prints -0 as `0`: the three spellings verify, and the value's numbers are
    +0.0 whichever was sent (its digest, and so its noise, do not depend on the spelling)."""
    doc = _load("signing.json")
    vec = doc["negative_zero"]
    for text in vec["texts"]:
        batch = ValueBatch.model_validate_json(text)
        assert canonical_bytes(SIGNED_FOR, batch).hex() == vec["canonical_bytes"]
        assert verify(SIGNED_FOR, batch, doc["signer"]["public_key"])
        exact = as_float_vector(batch.items[0].values)
        assert math.copysign(1.0, exact[0]) == 1.0  # what the market keeps, digests and noises
    plus = struct.pack("<d", 0.0).hex()
    assert "76" + "00000002" + plus + struct.pack("<d", 1.0).hex() in vec["canonical_bytes"]
    assert LinearLevelSpec(rate_per_level=-0.0).rate_per_level.hex() == "0x0.0p+0"


# ------------------------------------------------------------------------ sealing vector
def test_the_sealing_vector_opens_with_the_primitives_and_the_market() -> None:
    vec = _load("sealing.json")
    noise = bytes.fromhex(vec["noise_secret"])
    market_sk = hmac.digest(noise, b"emarket market sealing key v1", "sha256")
    assert market_sk.hex() == vec["market_private_key"]
    market = X25519PrivateKey.from_private_bytes(market_sk)
    eph = X25519PrivateKey.from_private_bytes(bytes.fromhex(vec["ephemeral_private_key"]))
    shared = eph.exchange(market.public_key())
    assert shared.hex() == vec["shared_secret"]
    epk = eph.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    k = market.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert (epk.hex(), base64.b64encode(k).decode()) == (vec["epk"], vec["market_sealing_key"])
    assert (epk + k).hex() == vec["hkdf_salt"]
    key = HKDF(hashes.SHA256(), 32, salt=epk + k, info=b"epsilon-market release v1").derive(shared)
    assert key.hex() == vec["hkdf_key"]
    ct = ChaCha20Poly1305(key).encrypt(
        bytes.fromhex(vec["nonce"]), vec["plaintext"].encode(), bytes.fromhex(vec["aad"])
    )
    assert base64.b64encode(ct).decode() == vec["sealed"]["ciphertext"]
    assert base64.b64decode(vec["sealed"]["epk"]).hex() == vec["epk"]
    assert base64.b64decode(vec["sealed"]["nonce"]).hex() == vec["nonce"]
    assert json.loads(vec["plaintext"]) == [{"values": i["values"]} for i in vec["items"]]
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
    assert values_aad(vec["market"], vec["market_sealing_key"], batch).hex() == vec["aad"]
    opened = open_values(batch, vec["market"], market)
    assert [i.values for i in opened.items] == [i["values"] for i in vec["items"]]
    signed = next(e for e in _load("signing.json")["events"] if e["name"].startswith("values, s"))
    assert signed["event"]["sealed"] == vec["sealed"]


def test_a_release_sealed_to_a_buyer_opens_with_the_primitives() -> None:
    """docs/protocol.md §4.6: the buyer's private key, the envelope and the AAD suffice."""
    vec = _load("sealing.json")["release_to_buyer"]
    buyer = X25519PrivateKey.from_private_bytes(bytes.fromhex(vec["buyer_private_key"]))
    epk = base64.b64decode(vec["sealed"]["epk"])
    shared = buyer.exchange(X25519PublicKey.from_public_bytes(epk))
    own = buyer.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    key = HKDF(hashes.SHA256(), 32, salt=epk + own, info=b"epsilon-market release v1").derive(
        shared
    )
    assert (shared.hex(), key.hex()) == (vec["shared_secret"], vec["hkdf_key"])
    assert bytes.fromhex(vec["aad"]) == vec["purchase_id"].encode()
    plain = ChaCha20Poly1305(key).decrypt(
        base64.b64decode(vec["sealed"]["nonce"]),
        base64.b64decode(vec["sealed"]["ciphertext"]),
        bytes.fromhex(vec["aad"]),
    )
    assert len(plain) == vec["padded_length"]
    assert plain.decode() == vec["plaintext"].ljust(vec["padded_length"])  # padded (§11.5)
    opened = json.loads(plain)
    assert opened["opening"] == vec["opening"]  # beside the releases (§11.4)
    assert [r["value_id"] for r in opened["releases"]] == ["v1", "v2"]


# ------------------------------------------------------------------- keys, ids, partitions
def test_string_keys_are_hashed_in_nfc() -> None:
    """NFC and NFD "Zürich" are one key (to the seller, the buyer and the market); two forms of
    one text in one value are one key twice, refused."""
    vec = _load("keys.json")
    label = bytes.fromhex(vec["string_key_label"])
    for row in vec["string_keys"]:
        nfc = unicodedata.normalize("NFC", row["text"]).encode()
        digest = hashlib.sha256(label + nfc).digest()
        assert (nfc.hex(), digest.hex()) == (row["nfc_utf8"], row["sha256"])
        assert str(int.from_bytes(digest[:8], "big") >> 2) == row["key"]
    by_text = {r["utf8"]: r["key"] for r in vec["string_keys"]}
    assert by_text["5ac3bc72696368"] == by_text["5a75cc88726963 68".replace(" ", "")]
    assert string_key("\u00c5") == string_key("\u212b") == string_key("A\u030a")
    item = ValueItem(
        value_id="v", keys=["Z\u00fcrich", "Zu\u0308rich"], values=[1.0, 2.0], published_at_ms=1
    )
    with pytest.raises(Reject, match="NFC"):
        _hashed(item)


def test_key_ids_and_partitions() -> None:
    vec = _load("keys.json")
    for row in vec["key_ids"]:
        raw = bytes.fromhex(row["public_key_raw"])
        assert base64.b64encode(raw).decode() == row["public_key"]
        assert hashlib.sha256(raw).hexdigest()[:16] == row["key_id"]
    for row in vec["partitions"]:
        # one hash, two spellings: unsigned, and Kafka's signed Java int (§8.2)
        assert row["murmur2_signed"] & 0xFFFFFFFF == row["murmur2"]
        assert -(2**31) <= row["murmur2_signed"] < 2**31 and 0 <= row["murmur2"] < 2**32
        for p, partition in row["partition"].items():
            assert (row["murmur2"] & 0x7FFFFFFF) % int(p) == partition
            assert (row["murmur2_signed"] & 0x7FFFFFFF) % int(p) == partition
            assert Topics(MARKET, int(p)).partition_of(row["key"]) == partition
    signed = {row["key"]: row["murmur2_signed"] for row in vec["partitions"]}
    assert (signed["21"], signed["foobar"]) == (-973932308, -790332482)  # §8.2 quotes them
    spec = (ROOT / "docs" / "protocol.md").read_text()
    assert '`murmur2("21") = −973932308`' in spec and "murmur2_signed" in spec


def _padded(plain: str, numbers_json: list[str]) -> int:
    """§4.2's and §11.5's length rule, from the spelling written: 25·n + 1 − len(J) an item."""
    size = len(plain.rstrip(" ").encode())
    for spelled in numbers_json:
        n = len(json.loads(spelled))
        size += 25 * n + 1 - len(spelled) if n else 0
    return size


def test_the_sealed_plaintexts_spell_numbers_freely_and_pad_by_the_spelling_written() -> None:
    """§4.2: any JSON spelling of a number is valid, the padding rule is measured on the
    spelling written, and the vectors give it (numbers_json) so another language can check
    the rule on the vector's bytes and its own spelling on its own bytes."""
    vec = _load("sealing.json")
    for doc in (vec, vec["release_to_buyer"]):
        for spelled in doc["numbers_json"]:
            assert spelled in doc["plaintext"]
    assert _padded(vec["plaintext"], vec["numbers_json"]) == vec["padded_length"]
    assert len(vec["plaintext"].encode()) == vec["padded_length"]
    rel = vec["release_to_buyer"]
    assert _padded(rel["plaintext"], rel["numbers_json"]) == rel["padded_length"]
    # the shortest spelling (JSON.stringify's: -2, 0, 42) reads as the same numbers at the
    # market, and pads to the same length: the rule does not depend on the spelling either
    short = [
        "[" + ",".join(format(x, "g") if x != int(x) else str(int(x)) for x in i["values"]) + "]"
        for i in vec["items"]
    ]
    body = "[" + ",".join('{"values":' + j + "}" for j in short) + "]"
    assert body != vec["plaintext"].rstrip(" ")
    padded = body + " " * (_padded(body, short) - len(body))
    assert len(padded) == vec["padded_length"]
    assert [r["values"] for r in json.loads(padded)] == [i["values"] for i in vec["items"]]


def test_murmur2_is_kafkas() -> None:
    """Kafka's own test cases for `Utils.murmur2` (as signed 32-bit ints)."""
    from streams.wire.topics import murmur2

    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"abc": 479470107,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    }
    for data, signed in cases.items():
        assert murmur2(data) == signed & 0xFFFFFFFF, data


# ----------------------------------------------------------------------------- schemas
def _walk(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}/{i}")


_ENCODED = (
    "signature",
    "key_id",
    "signing_key",
    "sealing_key",
    "epk",
    "nonce",
    "ciphertext",
    "new_key_signature",
    "payload_sha256",
    "value_sha256",
    "release_digest",
    "ciphertext_digest",
    "market_key_id",
    "market_public_key",
    "market_sealing_key",
    "noise_check",
    "noise_check_discrete",
    "noise_check_histogram",
    "noise_secret_fingerprint",
)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_published_schemas_are_strict_draft_2020_12(name: str) -> None:
    """Valid under the draft 2020-12 metaschema, no `discriminator` (an OpenAPI keyword), a
    pattern on every base64 or hex field, and descriptions that name no Python module."""
    schema = json.loads((ROOT / "docs" / "schemas" / f"{name}.schema.json").read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    known = set(jsonschema.Draft202012Validator.VALIDATORS) | {
        "$schema",
        "$id",
        "$defs",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
    for path, node in _walk(schema):
        parts = path.split("/")
        if parts[-1] in ("properties", "$defs", "patternProperties") or {
            "default",
            "const",
            "examples",
        } & set(parts):
            continue  # names of properties and definitions, or values: not keywords
        assert not set(node) - known, (path, set(node) - known)
        text = node.get("description", "") if isinstance(node.get("description"), str) else ""
        assert not any(m in text for m in (":mod:", ":class:", ":func:", "streams.", "market.")), (
            path,
            text,
        )
        for prop, sub in node.get("properties", {}).items():
            if prop in _ENCODED:
                variants = sub.get("anyOf", [sub])
                assert all("pattern" in v for v in variants if v.get("type") == "string"), (
                    path,
                    prop,
                )


def test_a_payload_without_its_type_is_refused_by_schema_and_market() -> None:
    """The alternatives of a topic's union require their `type`: the market reads it."""
    entry = next(e for e in _load("signing.json")["events"] if e["name"] == "purchase, defaults")
    body = {k: v for k, v in entry["event"].items() if k != "type"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            body, published_schema("purchases"), cls=jsonschema.Draft202012Validator
        )


# ------------------------------------------------ a signer written from docs/protocol.md alone
def _s(x: str) -> bytes:
    data = x.encode("utf-8")
    return b"s" + struct.pack(">I", len(data)) + data


def _i(x: int) -> bytes:
    return b"i" + struct.pack(">q", x)


def _f(x: float | None) -> bytes:
    return b"n" if x is None else b"f" + struct.pack(">d", float(x) + 0.0)


def _v(xs: list[float]) -> bytes:
    return b"v" + struct.pack(">I", len(xs)) + b"".join(struct.pack("<d", x + 0.0) for x in xs)


def _b(x: bool) -> bytes:
    return b"b" + bytes([x])


def _text_or_null(x: str | None) -> bytes:
    return b"n" if x is None else _s(x)


def _accuracy(a: dict[str, Any] | None) -> bytes:
    if a is None:
        return b"n"
    return _b(True) + _f(a.get("rmse")) + _f(a.get("half_width")) + _f(a.get("confidence", 0.95))


def _registration(e: dict[str, Any]) -> bytes:
    out = (
        _s(e["stream_id"])
        + _s(e["seller_id"])
        + _s(e["mechanism"])
        + _f(e["sensitivity"])
        + _i(e["dimension"])
        + _v(e["steps"])
        + _f(e["cap"])
        + _i(e.get("retain_last", 16))
        + _b(e.get("sealed", False))
    )
    pricing = e["pricing"]
    out += _s(pricing["kind"])
    if pricing["kind"] == "table":
        keys = sorted(pricing["prices"], key=lambda k: k.encode())
        out += _i(len(keys)) + b"".join(_s(k) + _i(pricing["prices"][k]) for k in keys)
    else:
        out += _f(pricing.get("rate_per_level", pricing.get("rate_per_precision")))
    out += _s(e.get("currency", "EUR")) + _s(e.get("description", ""))
    if e.get("window") is not None:
        out += _s(e["privacy_unit"]) + _i(e["window"]["duration_ms"]) + _f(e["window"]["cap"])
    if e.get("tree_height") is not None:
        out += _s(e["product"]) + _i(e["tree_height"])
    if e.get("histogram") is not None:
        h = e["histogram"]
        size = h.get("domain_size")
        out += (
            _s(e["product"])
            + _s(h["key_space"])
            + (b"n" if size is None else _i(size))
            + _f(h.get("false_keys", 1.0))
        )
    if e.get("rappor_ones") is not None:
        out += _s(e["product"]) + _i(e["rappor_ones"])
    if e.get("buyer_share") is not None:
        out += _s("buyer_share") + _f(e["buyer_share"])
    return out


def _values(e: dict[str, Any]) -> bytes:
    out = _s(e["stream_id"]) + _s(e["seller_id"]) + _i(len(e["items"]))
    for item in e["items"]:
        out += _s(item["value_id"]) + _i(item["published_at_ms"]) + _v(item.get("values", []))
        if item.get("keys") is not None:
            out += _i(len(item["keys"])) + b"".join(_s(k) for k in item["keys"])
    sealed = e.get("sealed")
    if sealed is not None:
        out += b"".join(_s(sealed[k]) for k in ("alg", "epk", "nonce", "ciphertext"))
    if e.get("batch_seq") is not None:
        out += _i(e["batch_seq"])
    return out


_SPEC: dict[str, Any] = {
    "open_account": lambda e: (
        _s(e["account_id"])
        + _s(e["signing_key"])
        + _text_or_null(e.get("sealing_key"))
        + _i(e["opened_at_ms"])
    ),
    "rotate_keys": lambda e: (
        _s(e["account_id"])
        + _i(e["version"])
        + _s(e["signing_key"])
        + _text_or_null(e.get("sealing_key"))
        + _i(e["rotated_at_ms"])
    ),
    "register_stream": _registration,
    "values": _values,
    "purchase": lambda e: (
        _s(e["purchase_id"])
        + _s(e["buyer_id"])
        + _s(e["stream_id"])
        + _f(e.get("target_level"))
        + _i(e["max_price_minor"])
        + _s(e.get("currency", "EUR"))
        + _i(e["requested_at_ms"])
        + _accuracy(e.get("accuracy"))
        + _b(e.get("most_accurate", False))
        + (b"" if e.get("reservation_id") is None else _s(e["reservation_id"]))
    ),
    "quote": lambda e: (
        _s(e["quote_id"])
        + _s(e["buyer_id"])
        + _s(e["stream_id"])
        + _f(e.get("target_level"))
        + _i(e["requested_at_ms"])
        + _accuracy(e.get("accuracy"))
    ),
    "reserve": lambda e: (
        _s(e["reservation_id"])
        + _s(e["buyer_id"])
        + _s(e["stream_id"])
        + _f(e.get("target_level"))
        + _i(e["hold_ms"])
        + _i(e["requested_at_ms"])
        + _accuracy(e.get("accuracy"))
    ),
}


@pytest.mark.parametrize("entry", _load("signing.json")["events"], ids=lambda e: e["name"])
def test_the_canonical_bytes_follow_from_the_spec_alone(entry: dict[str, Any]) -> None:
    """docs/protocol.md §2 and §6, implemented from the text: the JSON as sent, its defaults
    filled in by the tables of §6, gives the vectors' bytes."""
    e = entry["event"]
    g = entry["key_version"]
    head = b"emarket-sig-v2\x00" + _s(MARKET) + _s(SIGNED_FOR.key_id) + _s(e["type"])
    if g >= 2 and e["type"] not in ("open_account", "rotate_keys"):
        head += _i(g)
    assert (head + _SPEC[e["type"]](e)).hex() == entry["canonical_bytes"]


def _codes_in_the_code() -> set[str]:
    """Every refusal code the market can send: the first argument of each ``Reject(...)`` and
    ``PydanticCustomError(...)``, every ``reason=`` given as text, and the ``code`` of every
    error class (the codes of replay admission are built from a table, so listed here)."""
    found: set[str] = set()
    for path in [*(ROOT / "streams").rglob("*.py"), *(ROOT / "market").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                first = node.args[0] if node.args else None
                if name in ("Reject", "PydanticCustomError") and isinstance(first, ast.Constant):
                    found.add(first.value)
                found |= {
                    k.value.value
                    for k in node.keywords
                    if k.arg == "reason" and isinstance(k.value, ast.Constant) and k.value.value
                }
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if (
                        isinstance(stmt, ast.Assign)
                        and isinstance(stmt.value, ast.Constant)
                        and getattr(stmt.targets[0], "id", None) == "code"
                    ):
                        found.add(stmt.value.value)
    return (
        found
        | set(REFUSAL_CODES)
        | {"value_too_old", "value_from_the_future", "request_too_old", "request_from_the_future"}
    )


def test_every_refusal_code_is_in_the_spec() -> None:
    """docs/protocol.md §9 names every code the market refuses with, and what to do."""
    doc = (ROOT / "docs" / "protocol.md").read_text()
    rejections = doc.split("\n## 9. Rejections\n")[1].split("\n## 10.")[0]
    codes = _codes_in_the_code()
    assert len(codes) > 40
    missing = sorted(c for c in codes if f"`{c}`" not in rejections)
    assert not missing, f"docs/protocol.md §9 does not explain {missing}"


# ---------------------------------------------------------------- the decisions, in the market
def test_a_value_resent_with_the_other_zero_is_the_same_value() -> None:
    """−0.0 is read as 0.0 before use: the resend is a `duplicate` (same digest, same noise),
    not a `conflicting_value`, whether the numbers are clear or sealed."""
    core = market_core("seller1", accept_clear_values=True)
    t = Topics(HELPER_MARKET)
    assert core.handle(t.registrations, registration("temp")).status == "accepted"
    for vid, clear in (("v1", True), ("v2", False)):
        first = core.handle(t.values, value("temp", vid, [-0.0, 1.0, 2.0], clear=clear))
        assert first.status == "accepted", first.outputs[0].value[:300]
        again = core.handle(t.values, value("temp", vid, [0.0, 1.0, 2.0], clear=clear))
        assert again.status == "duplicate", again.outputs[0].value[:300]


def test_a_histogram_value_naming_one_key_in_nfc_and_nfd_is_refused() -> None:
    core = market_core("seller1", accept_clear_values=True)
    t = Topics(HELPER_MARKET)
    reg = registration(
        "h",
        mechanism="gaussian",
        product="histogram",
        steps=[0.5, 1.0],
        cap=2.0,
        dimension=10,
        histogram={"key_space": "strings"},
    )
    assert core.handle(t.registrations, reg).status == "accepted"
    nfc, nfd = "Z\u00fcrich", "Zu\u0308rich"
    out = core.handle(t.values, value("h", "v1", [1.0, 2.0], keys=[nfc, nfd]))
    assert (out.status, out.items[0][1]) == ("rejected", "invalid_value")
    (line,) = [o.value for o in out.outputs if o.topic == t.inbox("seller1")]  # §8.3, §12.4
    body = ValuesAccepted.model_validate_json(line)
    assert "NFC" in (body.outcomes[0].message or "")
    assert core.handle(t.values, value("h", "v2", [3.0], keys=[nfd])).status == "accepted"
    assert key_of(nfd) == key_of(nfc) == str(string_key(nfc))


# ------------------------------------------------------------------- §1.3, §2.1 from the text
def _part(tag: bytes, data: bytes) -> bytes:
    return tag + struct.pack(">I", len(data)) + data


def test_the_value_identity_is_three_text_parts() -> None:
    """§1.3's table, built from §1.1's encoding alone, is the identity the market keys a
    value's noise by: stream id, value id and the hex digest of the numbers, all text."""
    from market import Laplace
    from market.chain import ReleaseChain
    from market.rng import NoiseKeys
    from streams.core.products.base import digest_values, value_identity

    spec = (ROOT / "docs" / "protocol.md").read_text().split("### 1.3 Chains")[1]
    for row in ("| stream id | text |", "| value id | text |", "| digest | text |"):
        assert row in spec, row
    secret = bytes(range(32))
    chain = ReleaseChain(Laplace(1.0, dimension=2), (0.5, 1.0))
    numbers = as_float_vector([1.5, -2.0])
    digest = hashlib.sha256(struct.pack("<2d", 1.5, -2.0)).hexdigest()
    assert digest_values(numbers) == digest
    for j in (0, 1):
        enc = (
            _part(b"b", b"emarket-chain-v2")
            + _part(b"b", chain.fingerprint)
            + _part(b"s", b"temp")
            + _part(b"s", b"v1")
            + _part(b"s", digest.encode())
            + _part(b"i", str(j).encode())
        )
        seed = b"emarket-noise-v2\x00" + struct.pack(">I", len(secret)) + secret + enc
        want = hashlib.shake_256(seed).digest(32)
        got = chain.key(NoiseKeys(secret), value_identity("temp", "v1", digest), j)
        assert got == want


def test_the_canonical_level_rounds_a_tie_to_even() -> None:
    """§2.1: 15 significant digits of the double's exact value, a tie to the even digit (where
    ECMAScript's toPrecision rounds up)."""
    from market.levels import canonical_level

    spec = (ROOT / "docs" / "protocol.md").read_text().split("### 2.1 ")[1].split("### 2.2 ")[0]
    assert "`1.000030517578125`, whose canonical level is `1.00003051757812`" in spec
    assert canonical_level(1.000030517578125) == 1.00003051757812
    assert canonical_level(0.1 + 0.2) == canonical_level(0.3) == 0.3
