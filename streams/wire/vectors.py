"""The protocol's test vectors, made by the code that implements it (``docs/vectors/*.json``).

``docs/protocol.md`` defines every byte a client computes; these files give, for fixed keys, one
event of every type a party sends with its canonical bytes and signature, a sealed value batch
with every intermediate (AAD, plaintext, HKDF key, envelope), the histogram string-key hashes,
key ids and partitions. ``python -m streams vectors --out docs/vectors`` writes them and
``tests/streams/wire/test_protocol_spec.py`` regenerates them and fails on any difference, so the
published numbers are always the ones the market computes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import unicodedata
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import BaseModel

from market.envelope import CONTEXT, Sealer, public_key_b64, seal
from market.histogram_chain import string_key
from market.receipts import derive_opening, key_id, opening_key

from . import inbox_v2_vectors, receipt_vectors
from .answers import answer_header
from .events import (
    OpenAccount,
    PurchaseRequest,
    QuoteRequest,
    ReleasedValue,
    ReserveRequest,
    RotateKeys,
    Sale,
    SaleItem,
    StreamRegistration,
    ValueBatch,
)
from .negative_vectors import negative
from .sales import PSEUDONYM_LABEL, pseudonym_key, pseudonym_message, sale_of, sales_of
from .sealing import (
    padded_length,
    purchase_aad,
    releases_json,
    seal_releases,
    values_aad,
    values_plaintext,
)
from .signing import MarketRef, answer_bytes, canonical_bytes, public_b64, sign, signed
from .topics import Topics, murmur2

__all__ = ["MARKET", "PROTOCOL_VERSION", "SIGNED_EVENTS", "SIGNED_FOR", "build", "render"]

PROTOCOL_VERSION = 2
MARKET = "t"
SIGNING_SEED = bytes(range(32))
MARKET_SEED = bytes(range(32))
"""The market's Ed25519 key: that of the receipts (§11.7) and the sale (``sales.json``)."""
SIGNED_FOR = MarketRef(
    MARKET, key_id(Ed25519PrivateKey.from_private_bytes(MARKET_SEED).public_key())
)
"""The market the events are signed for: prefix ``t`` and the key id of :data:`MARKET_SEED`."""
SEALING_SEED = bytes(range(32, 64))
NEW_SIGNING_SEED = bytes(range(64, 96))
NOISE_SECRET = b"n" * 32
_SEAL_SEED = b"emarket test vector: a public seed, never used to seal real values"

SIGNED_EVENTS: dict[str, type[BaseModel]] = {
    "open_account": OpenAccount,
    "rotate_keys": RotateKeys,
    "register_stream": StreamRegistration,
    "values": ValueBatch,
    "purchase": PurchaseRequest,
    "quote": QuoteRequest,
    "reserve": ReserveRequest,
}
"""Event type → its model: every event a party sends."""


def _x25519_b64(seed: bytes) -> str:
    return public_key_b64(X25519PrivateKey.from_private_bytes(seed))


def _registration(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "stream_id": "temp",
        "seller_id": "alice",
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 3,
        "steps": [0.5, 1.0, 2.0],
        "cap": 4.0,
        "pricing": {"kind": "linear_level", "rate_per_level": 100.0},
    }
    body.update(kw)
    return body


def _purchase(**kw: Any) -> dict[str, Any]:
    return {
        "purchase_id": "p1",
        "buyer_id": "alice",
        "stream_id": "temp",
        "max_price_minor": 100,
        "requested_at_ms": 1000,
        **kw,
    }


_HISTOGRAM = {
    "mechanism": "gaussian",
    "steps": [0.5, 1.0],
    "cap": 2.0,
    "dimension": 100,
    "product": "histogram",
}

_CASES: list[tuple[str, str, dict[str, Any], int]] = [
    # (name, event type, the fields a client sends, key version)
    (
        "open_account",
        "open_account",
        {
            "account_id": "alice",
            "signing_key": "<signing>",
            "sealing_key": "<sealing>",
            "opened_at_ms": 1000,
        },
        1,
    ),
    (
        "open_account without a sealing key",
        "open_account",
        {"account_id": "alice", "signing_key": "<signing>", "opened_at_ms": 1000},
        1,
    ),
    ("register_stream, defaults", "register_stream", _registration(), 1),
    (
        "register_stream, every field of an event stream",
        "register_stream",
        _registration(
            pricing={"kind": "table", "prices": {"0.5": 10, "1": 20, "2.0": 40}},
            retain_last=4,
            sealed=True,
            currency="USD",
            description="Zürich: temperatures",
        ),
        1,
    ),
    (
        "register_stream, linear_precision",
        "register_stream",
        _registration(
            mechanism="discrete_laplace",
            dimension=1,
            pricing={"kind": "linear_precision", "rate_per_precision": 2.5},
        ),
        1,
    ),
    (
        "register_stream, window",
        "register_stream",
        _registration(privacy_unit="window", window={"duration_ms": 3_600_000, "cap": 8.0}),
        1,
    ),
    (
        "register_stream, window with a per-buyer share",
        "register_stream",
        _registration(
            privacy_unit="window",
            window={"duration_ms": 3_600_000, "cap": 8.0},
            buyer_share=0.25,
        ),
        1,
    ),
    (
        "register_stream, running_totals",
        "register_stream",
        _registration(mechanism="gaussian", product="running_totals", tree_height=20),
        1,
    ),
    (
        "register_stream, histogram over strings",
        "register_stream",
        _registration(**_HISTOGRAM, histogram={"key_space": "strings"}),
        1,
    ),
    (
        "register_stream, rappor",
        "register_stream",
        _registration(product="rappor", rappor_ones=2, sensitivity=4.0, dimension=16),
        1,
    ),
    (
        "register_stream, histogram over integers",
        "register_stream",
        _registration(
            **_HISTOGRAM,
            histogram={"key_space": "integers", "domain_size": 1000, "false_keys": 0.5},
        ),
        1,
    ),
    (
        "values, clear",
        "values",
        {
            "stream_id": "temp",
            "seller_id": "alice",
            "items": [
                {"value_id": "v1", "values": [1.5, -2.0, 0.1], "published_at_ms": 1000},
                {"value_id": "v2", "values": [0.0, 1e300, -5e-324], "published_at_ms": 1001},
            ],
        },
        1,
    ),
    (
        "values, histogram",
        "values",
        {
            "stream_id": "words",
            "seller_id": "alice",
            "items": [
                {
                    "value_id": "v1",
                    "keys": ["berlin", "Zürich"],
                    "values": [3.0, 1.0],
                    "published_at_ms": 1000,
                }
            ],
        },
        1,
    ),
    ("values, sealed (the batch of sealing.json)", "values", {"<sealed>": True}, 1),
    (
        "values, numbered",
        "values",
        {
            "stream_id": "temp",
            "seller_id": "alice",
            "items": [{"value_id": "v3", "values": [1.5, -2.0, 0.1], "published_at_ms": 1002}],
            "batch_seq": 7,
        },
        1,
    ),
    (
        "values, numbered 0 (asks where the numbering stands)",
        "values",
        {
            "stream_id": "temp",
            "seller_id": "alice",
            "items": [{"value_id": "v4", "values": [1.5, -2.0, 0.1], "published_at_ms": 1003}],
            "batch_seq": 0,
        },
        1,
    ),
    ("purchase, defaults", "purchase", _purchase(), 1),
    ("purchase at key version 3", "purchase", _purchase(), 3),
    ("purchase of a level", "purchase", _purchase(target_level=1.0, currency="USD"), 1),
    ("purchase of an accuracy (rmse)", "purchase", _purchase(accuracy={"rmse": 0.5}), 1),
    (
        "purchase of an accuracy (half_width)",
        "purchase",
        _purchase(accuracy={"half_width": 2.0, "confidence": 0.99}),
        1,
    ),
    ("purchase, most_accurate", "purchase", _purchase(most_accurate=True), 1),
    (
        "purchase on a reservation",
        "purchase",
        _purchase(target_level=1.0, reservation_id="r1"),
        1,
    ),
    (
        "reserve, defaults",
        "reserve",
        {
            "reservation_id": "r1",
            "buyer_id": "alice",
            "stream_id": "temp",
            "hold_ms": 60000,
            "requested_at_ms": 1000,
        },
        1,
    ),
    (
        "reserve of a level",
        "reserve",
        {
            "reservation_id": "r1",
            "buyer_id": "alice",
            "stream_id": "temp",
            "target_level": 1.0,
            "hold_ms": 120000,
            "requested_at_ms": 1000,
        },
        1,
    ),
    (
        "quote, defaults",
        "quote",
        {"quote_id": "q1", "buyer_id": "alice", "stream_id": "temp", "requested_at_ms": 1000},
        1,
    ),
    (
        "quote of an accuracy",
        "quote",
        {
            "quote_id": "q1",
            "buyer_id": "alice",
            "stream_id": "temp",
            "requested_at_ms": 1000,
            "accuracy": {"half_width": 2.0},
        },
        1,
    ),
]


def _sealed_batch() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the sealed batch's fields, sealing.json): a batch sealed with a fixed seed."""
    market_sk = hmac.digest(NOISE_SECRET, b"emarket market sealing key v1", "sha256")
    market_key = _x25519_b64(market_sk)
    clear = ValueBatch.model_validate(
        {
            "stream_id": "temp",
            "seller_id": "alice",
            "key_id": "0" * 16,
            "signature": "A" * 86 + "==",
            "items": [
                {"value_id": "v1", "values": [1.5, -2.0, 3.0], "published_at_ms": 1000},
                {"value_id": "v2", "values": [0.0, 0.001, 42.0], "published_at_ms": 1001},
            ],
        }
    )
    eph_sk = hmac.digest(_SEAL_SEED, b"ephemeral key", "sha256")
    nonce = hmac.digest(_SEAL_SEED, b"nonce", "sha256")[:12]
    draft = clear.model_copy(
        update={"items": [i.model_copy(update={"values": []}) for i in clear.items]}
    )
    aad = values_aad(MARKET, market_key, draft)
    plaintext = values_plaintext(clear.items)
    envelope = seal(market_key, plaintext, aad, seed=_SEAL_SEED)
    eph = X25519PrivateKey.from_private_bytes(eph_sk)
    epk = eph.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    k = base64.b64decode(market_key)
    shared = eph.exchange(X25519PrivateKey.from_private_bytes(market_sk).public_key())
    hkdf_key = HKDF(hashes.SHA256(), 32, salt=epk + k, info=CONTEXT).derive(shared)
    fields = {
        "stream_id": "temp",
        "seller_id": "alice",
        "sealed": envelope,
        "items": [
            {"value_id": i.value_id, "published_at_ms": i.published_at_ms} for i in clear.items
        ],
    }
    doc = {
        "market": MARKET,
        "noise_secret": NOISE_SECRET.hex(),
        "market_private_key": market_sk.hex(),
        "market_sealing_key": market_key,
        "stream_id": "temp",
        "seller_id": "alice",
        "items": [i.model_dump(mode="json") for i in clear.items],
        "ephemeral_private_key": eph_sk.hex(),
        "epk": epk.hex(),
        "nonce": nonce.hex(),
        "shared_secret": shared.hex(),
        "hkdf_salt": (epk + k).hex(),
        "hkdf_info": CONTEXT.decode(),
        "hkdf_key": hkdf_key.hex(),
        "aad": aad.hex(),
        "plaintext": plaintext.decode(),
        "numbers_json": [_numbers_json(i.values) for i in clear.items],
        "padded_length": len(plaintext),
        "sealed": envelope,
        "release_to_buyer": release_to_buyer(),
    }
    return fields, doc


def _numbers_json(values: Any) -> str:
    """An item's numbers as the vector's plaintext spells them (``[a,b,c]``): what the padding
    rule of docs/protocol.md §4.2 and §11.5 measures, in the market's spelling (any is valid)."""
    return json.dumps(list(values), separators=(",", ":"))


def release_to_buyer() -> dict[str, Any]:
    """A purchase's releases sealed to the signer's sealing key, as the market seals them
    (docs/protocol.md §4.6): what a buyer opens with its private key alone. The plaintext holds
    the purchase's opening beside the releases (§11.4) and is padded (§11.5)."""
    buyer = X25519PrivateKey.from_private_bytes(SEALING_SEED)
    releases = [
        ReleasedValue(value_id="v1", seq=0, level=1.0, values=[20.25, 19.75, 21.0]),
        ReleasedValue(value_id="v2", seq=1, level=1.0, values=[-0.5, 0.0, 3.0]),
    ]
    aad = purchase_aad("p1")
    opening = derive_opening(
        opening_key(NOISE_SECRET),
        buyer_id="alice",
        stream_id="temp",
        purchase_id="p1",
        requested_at_ms=1000,
        level_after=1.0,
    )
    plaintext = releases_json(releases, opening)
    envelope = seal_releases(Sealer(NOISE_SECRET), public_key_b64(buyer), releases, aad, opening)
    epk = base64.b64decode(envelope.epk)
    shared = buyer.exchange(X25519PublicKey.from_public_bytes(epk))
    own = base64.b64decode(public_key_b64(buyer))
    key = HKDF(hashes.SHA256(), 32, salt=epk + own, info=CONTEXT).derive(shared)
    return {
        "event": "purchase_fulfilled",
        "purchase_id": "p1",
        "buyer_private_key": SEALING_SEED.hex(),
        "buyer_sealing_key": public_key_b64(buyer),
        "aad": aad.hex(),
        "shared_secret": shared.hex(),
        "hkdf_key": key.hex(),
        "opening": opening.hex(),
        "plaintext": plaintext.decode(),
        "numbers_json": [_numbers_json(r.values) for r in releases],
        "padded_length": padded_length(plaintext, releases),
        "sealed": envelope.model_dump(mode="json"),
    }


def _signing(sealed_fields: dict[str, Any]) -> dict[str, Any]:
    """signing.json: every case of :data:`_CASES` and a key rotation, signed by fixed keys."""
    key = Ed25519PrivateKey.from_private_bytes(SIGNING_SEED)
    new = Ed25519PrivateKey.from_private_bytes(NEW_SIGNING_SEED)
    subst = {"<signing>": public_b64(key), "<sealing>": _x25519_b64(SEALING_SEED)}
    events = []
    for name, kind, given, generation in _CASES:
        fields = (
            sealed_fields
            if "<sealed>" in given
            else {k: subst.get(v, v) if isinstance(v, str) else v for k, v in given.items()}
        )
        model = signed(SIGNED_EVENTS[kind], SIGNED_FOR, key, generation=generation, **fields)
        events.append(_entry(name, kind, fields, model, generation))
    rotation = _rotation(key, new)
    events.insert(
        2,
        _entry(
            "rotate_keys to version 2",
            "rotate_keys",
            _sent(rotation, ("signature", "key_id", "new_key_signature")),
            rotation,
            1,
        ),
    )
    return {
        "protocol_version": PROTOCOL_VERSION,
        "market": MARKET,
        "market_key_id": SIGNED_FOR.key_id,
        "signer": {
            "ed25519_private_key": SIGNING_SEED.hex(),
            "public_key": public_b64(key),
            "key_id": key_id(key.public_key()),
            "x25519_private_key": SEALING_SEED.hex(),
            "sealing_key": _x25519_b64(SEALING_SEED),
        },
        "new_signer": {
            "ed25519_private_key": NEW_SIGNING_SEED.hex(),
            "public_key": public_b64(new),
            "key_id": key_id(new.public_key()),
        },
        "events": events,
        "negative_zero": _negative_zero(key),
    }


def _rotation(key: Ed25519PrivateKey, new: Ed25519PrivateKey) -> RotateKeys:
    """Signed by the current key (``signature``) and the new one (``new_key_signature``)."""
    draft = signed(
        RotateKeys,
        SIGNED_FOR,
        key,
        account_id="alice",
        version=2,
        signing_key=public_b64(new),
        rotated_at_ms=2000,
        new_key_signature="A" * 86 + "==",
    )
    return draft.model_copy(update={"new_key_signature": sign(SIGNED_FOR, draft, new)})


def _sent(model: BaseModel, drop: tuple[str, ...]) -> dict[str, Any]:
    """The fields a client sends for ``model``, less ``drop`` and its nulls (which are the
    defaults: leaving them out is the same event)."""
    body = model.model_dump(mode="json")
    return {
        k: v
        for k, v in body.items()
        if k not in drop and k not in ("type", "schema_version") and v is not None
    }


def _entry(
    name: str, kind: str, fields: dict[str, Any], model: Any, generation: int
) -> dict[str, Any]:
    data = canonical_bytes(SIGNED_FOR, model, generation)
    sent = {"type": kind, **fields, "key_id": model.key_id}
    sent["signature"] = model.signature
    if isinstance(model, RotateKeys):
        sent["new_key_signature"] = model.new_key_signature
    return {
        "name": name,
        "key_version": generation,
        "event": sent,
        "canonical_bytes": data.hex(),
        "signature": model.signature,
    }


def _negative_zero(key: Ed25519PrivateKey) -> dict[str, Any]:
    """One signed batch, and three JSON texts of it that all verify: -0.0 is signed as 0.0."""
    fields: dict[str, Any] = {
        "stream_id": "temp",
        "seller_id": "alice",
        "items": [{"value_id": "v1", "values": [-0.0, 1.0], "published_at_ms": 1000}],
    }
    model = signed(ValueBatch, SIGNED_FOR, key, **fields)
    head = (
        f'{{"type":"values","stream_id":"temp","seller_id":"alice","key_id":"{model.key_id}",'
        f'"signature":"{model.signature}","items":[{{"value_id":"v1","published_at_ms":1000,'
        '"values":['
    )
    data = canonical_bytes(SIGNED_FOR, model)
    return {
        "canonical_bytes": data.hex(),
        "signature": model.signature,
        "texts": [head + zero + ",1.0]}]}" for zero in ("-0.0", "0", "0.0")],
    }


_STRINGS = [
    "berlin",
    "Berlin",
    "Zürich",
    unicodedata.normalize("NFD", "Zürich"),
    "東京",
    "😀",
    "",
    "Å",
    "\u212b",
]  # "Å" (U+00C5) and ANGSTROM SIGN (U+212B): one NFC form


def _signed32(h: int) -> int:
    """The 32 bits of ``h`` as a two's-complement integer: Kafka's Java ``int`` (§8.2)."""
    return h - (1 << 32) if h >= 1 << 31 else h


def _keys() -> dict[str, Any]:
    label = b"emarket-histogram-key-v1\x00"
    strings = []
    for text in _STRINGS:
        nfc = unicodedata.normalize("NFC", text).encode()
        digest = hashlib.sha256(label + nfc).digest()
        strings.append(
            {
                "text": text,
                "utf8": text.encode().hex(),
                "nfc_utf8": nfc.hex(),
                "sha256": digest.hex(),
                "key": str(string_key(text)),
            }
        )
    # the ids of the market's tests, and Kafka's own test cases of Utils.murmur2 ("21", "foobar")
    ids = ["alice", "temp", "seller1", "s", "buyer-42", "A_very-long_id_0123456789", "21", "foobar"]
    partitions = [
        {
            "key": k,
            "murmur2": murmur2(k.encode()),
            "murmur2_signed": _signed32(murmur2(k.encode())),
            "partition": {str(p): Topics(MARKET, p).partition_of(k) for p in (1, 4, 12)},
        }
        for k in ids
    ]
    key_ids = []
    for seed in (SIGNING_SEED, NEW_SIGNING_SEED):
        pub = Ed25519PrivateKey.from_private_bytes(seed).public_key()
        raw = pub.public_bytes(Encoding.Raw, PublicFormat.Raw)
        key_ids.append(
            {
                "ed25519_private_key": seed.hex(),
                "public_key_raw": raw.hex(),
                "public_key": public_b64(pub),
                "key_id": key_id(pub),
            }
        )
    return {
        "protocol_version": PROTOCOL_VERSION,
        "string_key_label": label.hex(),
        "string_keys": strings,
        "key_ids": key_ids,
        "partitions": partitions,
    }


def _sales() -> dict[str, Any]:
    """A seller's sale notice (docs/protocol.md §8.4) of the two receipts of §11.7, both
    seller1's: the first buyer's pseudonym step by step, each receipt's digest, the ``sales``
    notice listing both and its signature; and the one-sale ``sale`` message of the first, as
    markets sent it before notices were grouped (readers still read it)."""
    doc = receipt_vectors.vectors()
    first, second = (r["receipt"] for r in doc["receipts"][:2])
    noise = bytes.fromhex(doc["noise_secret"])
    market_key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(doc["signing_private_key"]))
    key = pseudonym_key(noise)
    seller, buyer = first["seller_id"], first["buyer_id"]
    sold = [sale_of(r, key, r["requested_at_ms"] + 250) for r in (first, second)]
    (notice,) = sales_of(sold)
    value = notice.model_dump_json().encode()
    topic = Topics(MARKET).inbox(seller)
    _, header = answer_header(market_key, MARKET, topic, None, value)
    return {
        "market": MARKET,
        "market_private_key": doc["signing_private_key"],
        "market_public_key": doc["market_public_key"],
        "noise_secret": doc["noise_secret"],
        "pseudonym_label": PSEUDONYM_LABEL.hex(),
        "pseudonym_key": key.hex(),
        "seller_id": seller,
        "buyer_id": buyer,
        "pseudonym_message": pseudonym_message(seller, buyer).hex(),
        "buyer_ref": sold[0].buyer_ref,
        "receipt": first,
        "receipt_canonical_bytes": doc["receipts"][0]["canonical_bytes"],
        "receipt_sha256": sold[0].receipt_sha256,
        "second": {
            "buyer_id": second["buyer_id"],
            "buyer_ref": sold[1].buyer_ref,
            "receipt": second,
            "receipt_canonical_bytes": doc["receipts"][1]["canonical_bytes"],
            "receipt_sha256": sold[1].receipt_sha256,
        },
        "topic": topic,
        "key": sold[0].receipt_sha256,
        "value": value.decode(),
        "signed_bytes": answer_bytes(MARKET, topic, None, value).hex(),
        "header": header.hex(),
        "one_sale_value": _one_sale(sold[0]).decode(),
    }


def _one_sale(sale: Sale) -> bytes:
    """The one-sale ``sale`` message of earlier markets: its members in the order they sent
    them (a reader takes them by name)."""
    order = ("schema_version", "type", "seller_id", *SaleItem.model_fields)
    return json.dumps({k: getattr(sale, k) for k in order}, separators=(",", ":")).encode()


def build() -> dict[str, Any]:
    """Every vector file: file name → its content."""
    sealed_fields, sealing = _sealed_batch()
    return {
        "signing.json": _signing(sealed_fields),
        "sealing.json": sealing,
        "keys.json": _keys(),
        "sales.json": _sales(),
        "negative.json": negative(release_to_buyer()),
        "inbox_v2.json": inbox_v2_vectors.vectors(),
    }


def render(doc: Any) -> str:
    """A vector file's text (ASCII: every non-ASCII character escaped, so NFC and NFD differ
    visibly)."""
    return json.dumps(doc, indent=1, ensure_ascii=True) + "\n"
