"""The test vectors of ``docs/protocol.md`` §12.1.1 (the market's trust root): made here, checked
by the tests against the Python rule (:mod:`streams.wire.root`) and the Node client's.

Each case is a first record of ``t.market`` (its exact bytes in hex, or null for a tombstone),
the key a client was given (null: none, trust on first use) and what every reader concludes:
``trusted`` or ``pinned`` with the key, else the reason the root is refused.

Print them with ``python -m streams.wire.root_vectors``; ``tests/streams/worker/test_root.py`` fails
when the document and this module disagree.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .events import MarketIdentity
from .root import root_verdict

__all__ = ["BEGIN", "END", "TOPIC", "block", "vectors"]

BEGIN, END = "<!-- root vectors: begin -->", "<!-- root vectors: end -->"
TOPIC = "t.market"


def _key(seed: bytes) -> str:
    raw = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    return base64.b64encode(raw).decode()


def _id(key: str) -> str:
    return hashlib.sha256(base64.b64decode(key)).hexdigest()[:16]


def _identity(key: str | None, key_id: str | None = None) -> dict[str, Any]:
    ident = MarketIdentity(
        noise_secret_fingerprint="0123456789abcdef" * 2,
        noise_derivation="emarket-noise-v2",
        noise_format=2,
        noise_check="ab" * 32,
        noise_check_histogram="cd" * 32,
        state_format=2,
        market_key_id=key_id or (_id(key) if key else "0" * 16),
        market_public_key=key,
        created_at_ms=1_700_000_000_000,
    )
    return dict(json.loads(ident.model_dump_json()))


def _bytes(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def vectors() -> dict[str, Any]:
    """The document's vectors, as the code judges them."""
    ours, theirs = _key(bytes(range(32))), _key(bytes(range(32, 64)))
    good = _bytes(_identity(ours))
    foreign = _bytes(_identity(theirs))
    cases: list[tuple[str, bytes | None, str | None]] = [
        ("the market's identity, no key given", good, None),
        ("the market's identity, its key pinned", good, ours),
        ("a tombstone, no key given", None, None),
        ("a tombstone, the key pinned", None, ours),
        ("not JSON", b"garbage", None),
        ("not UTF-8", b"\xff\xfe{}", ours),
        ("JSON of another type", b'{"type":"refusal"}', None),
        ("a JSON array", b"[]", None),
        ("an identity with a field too many", _bytes({**_identity(ours), "extra": 1}), None),
        (
            "an identity with a required field missing",
            _bytes({k: v for k, v in _identity(ours).items() if k != "created_at_ms"}),
            None,
        ),
        ("an identity whose key id is not its key's", _bytes(_identity(ours, "f" * 16)), ours),
        ("a foreign identity, the market's key pinned", foreign, ours),
        ("a foreign identity, no key given", foreign, None),
        ("an identity without a key, none given", _bytes(_identity(None)), None),
        ("an identity without a key, the key pinned", _bytes(_identity(None)), ours),
    ]
    out = []
    for name, value, pinned in cases:
        out.append(
            {
                "name": name,
                "value_hex": None if value is None else value.hex(),
                "pinned": pinned,
                **root_verdict(TOPIC, value, pinned),
            }
        )
    return {"topic": TOPIC, "market_public_key": ours, "foreign_public_key": theirs, "cases": out}


def block() -> str:
    """The text between the document's markers (its JSON block, fenced)."""
    return "```json\n" + json.dumps(vectors(), indent=1) + "\n```"


if __name__ == "__main__":
    print(BEGIN)
    print(block())
    print(END)
