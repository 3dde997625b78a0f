"""The test vectors of the state-record format (``docs/protocol.md`` §3.6), made by its code.

``tests/streams/worker/test_state_records.py`` regenerates them and compares them with the block in
``docs/protocol.md``, and checks each one against a computation written from the text alone
(its own HChaCha20, the AAD and stamp as the text spells them), so the published numbers are
always what the market computes and what the text says.
"""

from __future__ import annotations

import json
from typing import Any

from .checkpoints import Checkpoint, StoreSum
from .history import PROGRESS
from .secrets import state_keys
from .state_records import Stamp, StateSeal, Version, associated_data

__all__ = ["SECRET", "build", "render"]

SECRET = bytes(range(32))
"""The noise secret of the vectors: ``00 01 02 … 1f``."""

_EPOCH = (3 << 32) | 0x5EED5EED
_RECORDS: list[tuple[str, bytes, bytes | None, Stamp]] = [
    ("accounts", b"alice", b'{"account_id":"alice"}', Stamp(2, Version(_EPOCH, 7), 0, 42)),
    ("purchases", b"alice/s/p1", None, Stamp(1, Version(_EPOCH, 8), 3, 1017)),
]


def _nonce(i: int) -> bytes:
    return bytes((i * 24 + j) & 0xFF for j in range(24))


def _record(
    seal: StateSeal, i: int, store: str, key: bytes, value: bytes | None, stamp: Stamp
) -> dict[str, Any]:
    headers, sealed = seal.seal(store, key, value, stamp, nonce=_nonce(i))
    head = headers[0][1]
    return {
        "store": store,
        "key": key.hex(),
        "plaintext": None if value is None else value.hex(),
        "partition": stamp.partition,
        "epoch": str(stamp.version.epoch),  # u64s as decimal strings: exact in every JSON reader
        "n": stamp.version.n,
        "topic": stamp.topic,
        "offset": str(stamp.offset),
        "nonce": _nonce(i).hex(),
        "stamp": stamp.to_bytes().hex(),
        "aad": associated_data(store, key, stamp.to_bytes(), value is None).hex(),
        "header": head.hex(),
        "value": None if sealed is None else sealed.hex(),
    }


def _checkpoint(seal: StateSeal) -> dict[str, Any]:
    version = Version(_EPOCH, 8)
    digest = seal.digest("accounts", "alice", Version(_EPOCH, 7))
    cp = Checkpoint(
        partition=2,
        version=version,
        written_at_ms=1_780_000_000_000,
        positions={"t.accounts": 43, "t.purchases": 1018},
        stores={"accounts": StoreSum(1, digest, 11)},
        ended={(2 << 32) | 0xA11CE: 5},
        floor=-1,
    )
    return {
        "checkpoint": json.loads(cp.to_bytes()),
        "plaintext": cp.to_bytes().decode(),
        "record": _record(seal, 2, PROGRESS, b"2", cp.to_bytes(), Stamp(2, version)),
    }


def _digest(seal: StateSeal, store: str, key: str, n: int) -> dict[str, Any]:
    digest = seal.digest(store, key, Version(_EPOCH, n))
    return {"store": store, "key": key, "epoch": str(_EPOCH), "n": n, "digest": f"{digest:064x}"}


def build() -> dict[str, Any]:
    """Every vector of §3.6, from the fixed secret and nonces."""
    seal_key, digest_key = state_keys(SECRET)
    seal = StateSeal(seal_key, digest_key)
    return {
        "noise_secret": SECRET.hex(),
        "seal_key": seal_key.hex(),
        "digest_key": digest_key.hex(),
        "records": [_record(seal, i, *r) for i, r in enumerate(_RECORDS)],
        "digests": [
            _digest(seal, "accounts", "alice", 7),
            _digest(seal, "purchases", "alice/s/p1", 8),
        ],
        "checkpoint": _checkpoint(seal),
    }


def render(doc: Any) -> str:
    """The JSON of the block in ``docs/protocol.md``."""
    return json.dumps(doc, indent=1)
