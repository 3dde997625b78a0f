"""docs/protocol.md §11: the vectors are what the code computes, and what the text says.

The document's block must equal :func:`streams.wire.receipt_vectors.block` (regenerate it with
``python -m streams.wire.receipt_vectors``), and every byte in it is recomputed here from the
section's text alone — struct, hashlib, hmac and the envelope's primitives, not the receipts
module — so the text, the vectors and the code cannot drift apart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import struct
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from market.envelope import open_envelope
from market.receipts import verify_outcome
from streams.wire.receipt_vectors import BEGIN, END, block

DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"


def documented() -> tuple[str, dict[str, Any]]:
    text = DOC.read_text()
    found = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert found is not None, "docs/protocol.md lost its receipt vectors block"
    body = found.group(1)
    return body, json.loads(body.removeprefix("```json\n").removesuffix("\n```"))


def test_the_document_holds_the_vectors_the_code_makes() -> None:
    body, _ = documented()
    assert body == block(), "regenerate: python -m streams.wire.receipt_vectors"


# ------------------------------------------------- an implementation from the text alone
def s(text: str) -> bytes:
    data = text.encode()
    return b"s" + struct.pack(">I", len(data)) + data


def i(x: int) -> bytes:
    return b"i" + struct.pack(">q", x)


def f(x: float) -> bytes:
    return b"f" + struct.pack(">d", 0.0 if x == 0 else x)


def enc(*parts: str | int | float) -> bytes:
    """docs/protocol.md §1.1: tag, u32be length, data."""
    out = b""
    for p in parts:
        tag, data = (
            (b"s", p.encode())
            if isinstance(p, str)
            else (b"i", str(p).encode())
            if isinstance(p, int)
            else (b"f", struct.pack(">d", p))
        )
        out += tag + struct.pack(">I", len(data)) + data
    return out


def signed_bytes(r: dict[str, Any]) -> bytes:
    out = b"emarket-receipt\x00" + i(r["receipt_version"])
    out += b"".join(
        s(r[k]) for k in ("purchase_id", "buyer_id", "stream_id", "seller_id", "mechanism")
    )
    out += i(len(r["value_ids"])) + b"".join(s(v) for v in r["value_ids"])
    out += f(r["level_before"]) + f(r["level_after"]) + i(r["price_minor"]) + s(r["currency"])
    out += i(r["requested_at_ms"]) + s(r["market_key_id"]) + s(r["commitment"])
    return out + (s(r["ciphertext_digest"]) if r["ciphertext_digest"] else b"n")


def digest(releases: list[dict[str, Any]]) -> bytes:
    h = hashlib.sha256()
    for rel in releases:
        vid = rel["value_id"].encode()
        xs = [0.0 if x == 0 else x for x in rel["values"]]
        h.update(struct.pack(">I", len(vid)) + vid + struct.pack(">dI", rel["level"], len(xs)))
        h.update(struct.pack(f"<{len(xs)}d", *xs))
        if "keys" in rel:
            h.update(struct.pack(f">{len(xs)}Q", *map(int, rel["keys"])))
    return h.digest()


def padded_length(plain: bytes, releases: list[dict[str, Any]]) -> int:
    numbers = [json.dumps(x) for rel in releases for x in rel["values"]]
    keys = [k for rel in releases for k in rel.get("keys", [])]
    spelled = re.findall(rb'"values":\[([^\]]*)\]', plain)
    assert [t.decode() for t in b",".join(spelled).split(b",")] == numbers
    size = len(plain) + sum(24 - len(t) for t in numbers) + sum(20 - len(k) for k in keys)
    return max(1024, 1 << (size - 1).bit_length()) if keys else size


def test_the_vectors_follow_from_the_text() -> None:
    _, v = documented()
    secret = bytes.fromhex(v["noise_secret"])
    k_open = hmac.new(secret, b"emarket receipt opening key v1", hashlib.sha256).digest()
    assert k_open.hex() == v["opening_key"]
    public = base64.b64decode(v["market_public_key"])
    assert hashlib.sha256(public).hexdigest()[:16] == v["market_key_id"]
    for r in v["receipts"]:
        p = r["purchase"]
        ident = enc(
            p["buyer_id"],
            p["stream_id"],
            p["purchase_id"],
            p["requested_at_ms"],
            float(p["level_after"]),
        )
        assert ident.hex() == r["identity"]
        opening = hmac.new(k_open, ident, hashlib.sha256).digest()
        assert opening.hex() == r["opening"]
        d = digest(r["releases"])
        assert d.hex() == r["releases_digest"]
        message = b"emarket receipt commitment v1\x00" + d
        assert message.hex() == r["commitment_message"]
        assert hmac.new(opening, message, hashlib.sha256).hexdigest() == r["receipt"]["commitment"]
        data = signed_bytes(r["receipt"])
        assert data.hex() == r["canonical_bytes"]
        Ed25519PublicKey.from_public_bytes(public).verify(base64.b64decode(r["signature"]), data)
        assert r["receipt"]["signature"] == r["signature"]
        assert r["receipt"]["receipt_version"] == (5 if "keys" in r["releases"][0] else 4)


def test_the_sealed_vector_opens_to_its_padded_plaintext() -> None:
    _, v = documented()
    (r,) = [r for r in v["receipts"] if "envelope" in r]
    buyer = X25519PrivateKey.from_private_bytes(bytes.fromhex(r["buyer_sealing_private_key"]))
    env = r["envelope"]
    plain = open_envelope(buyer, env, r["purchase"]["purchase_id"].encode())
    text = r["plaintext"].encode()
    assert plain == text + b" " * (r["padded_length"] - len(text))
    assert padded_length(text, r["releases"]) == r["padded_length"]
    assert json.loads(plain) == {"opening": r["opening"], "releases": r["releases"]}
    ct = base64.b64decode(env["ciphertext"])
    assert hashlib.sha256(ct).hexdigest() == r["receipt"]["ciphertext_digest"]


def test_the_vectors_verify_as_outcomes() -> None:
    """The market's own verifier accepts each vector as a purchase outcome, opened."""
    _, v = documented()
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(v["market_public_key"]))
    for r in v["receipts"]:
        rec = r["receipt"]
        outcome = {
            "type": "purchase_fulfilled",
            "releases": r["releases"],
            "opening": r["opening"],
            "sealed": r.get("envelope"),
            "receipt": rec,
            **{
                k: rec[k]
                for k in (
                    "purchase_id",
                    "buyer_id",
                    "stream_id",
                    "level_before",
                    "level_after",
                    "price_minor",
                    "currency",
                )
            },
        }
        assert verify_outcome(outcome, key).purchase_id == r["purchase"]["purchase_id"]
