"""The authenticator of state records, without a broker (docs/protocol.md §3).

The format's test vectors against the code and against an HMAC computed from the text alone;
every way a record can fail to be the market's; the guard's counter and log line; and the two
readers — table recovery through Faust's real memory store, and the account replica — applying
only what verifies, a forged deletion included.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka.structs import ConsumerRecord
from faust.types import Message

from streams.wire.events import AccountState
from streams.wire.signing import key_id_of
from streams.worker.directory import AccountReplica
from streams.worker.identity import MarketIdentityError, _compare, identity_of
from streams.worker.metrics import build_metrics
from streams.worker.secrets import STATE_MAC_LABEL, state_mac_key
from streams.worker.state_mac import HEADER, STORES, StateGuard, StateMac, covered
from streams.worker.tables import WriteBackTable, register_codecs

from . import helpers
from .test_counts import TEST_KEYS

ROOT = Path(__file__).resolve().parents[2]
MAC = StateMac(state_mac_key(bytes(range(32))))


def doc_vectors() -> dict[str, Any]:
    text = (ROOT / "docs" / "protocol.md").read_text()
    block = re.search(r"<!-- state vectors: begin -->\s*```json\n(.*?)\n```\s*"
                      r"<!-- state vectors: end -->", text, re.S)  # fmt: skip
    assert block is not None, "docs/protocol.md lost its state vectors block"
    vectors: dict[str, Any] = json.loads(block.group(1))
    return vectors


def from_the_text(secret: bytes, store: str, key: bytes, value: bytes | None) -> bytes:
    """docs/protocol.md §3.1–3.2, written from the text, not from the module."""
    k = hmac.new(secret, b"emarket state-mac key v1", hashlib.sha256).digest()
    m = b"emarket-state-v1" + bytes([len(store)]) + store.encode() + len(key).to_bytes(4, "big")
    m += key + (b"\x00" if value is None else b"\x01" + len(value).to_bytes(4, "big") + value)
    return b"\x01" + hmac.new(k, m, hashlib.sha256).digest()


def test_the_documented_vectors_are_what_the_code_and_the_text_compute() -> None:
    v = doc_vectors()
    secret = bytes.fromhex(v["noise_secret"])
    assert state_mac_key(secret).hex() == v["state_key"]
    mac = StateMac(state_mac_key(secret))
    for r in v["records"]:
        key = bytes.fromhex(r["key"])
        value = None if r["value"] is None else bytes.fromhex(r["value"])
        assert b"".join(covered(r["store"], key, value)).hex() == r["covered"]
        assert mac.tag(r["store"], key, value).hex() == r["header"]
        assert from_the_text(secret, r["store"], key, value).hex() == r["header"]


def test_the_state_key_is_its_own() -> None:
    """Domain separation: not the secret, not its public fingerprint, not a sealing key."""
    secret = bytes(range(32))
    k = state_mac_key(secret)
    assert k != secret and len(k) == 32
    assert STATE_MAC_LABEL == b"emarket state-mac key v1"
    fingerprint = hmac.new(secret, b"emarket noise-secret fingerprint v1", "sha256").digest()
    assert k != fingerprint and state_mac_key(bytes(32)) != k
    assert "key=" not in repr(MAC)  # never printed


def test_covered_bytes_are_injective() -> None:
    """No two (store, key, value) share covered bytes: the length prefixes see to it."""
    triples = [("ab", b"c", b"d"), ("a", b"bc", b"d"), ("a", b"b", b"cd"), ("a", b"b", None),
               ("a", b"b", b""), ("a", b"b\x00", None), ("a", b"b", b"\x00")]  # fmt: skip
    seen = {b"".join(covered(*t)) for t in triples}
    assert len(seen) == len(triples)
    with pytest.raises(ValueError, match="too long"):
        covered("x" * 256, b"k", None)


def test_every_record_the_market_did_not_write_is_refused_and_says_why() -> None:
    value = b'{"account_id":"alice"}'
    good = MAC.headers("accounts", b"alice", value)
    assert MAC.refusal("accounts", b"alice", value, good) is None
    assert MAC.refusal("accounts", b"alice", value, tuple(good)) is None  # as aiokafka gives
    tag = good[0][1]
    other = StateMac(b"another market's key!!")
    cases = {
        "no tag": [("accounts", b"alice", value, None), ("accounts", b"alice", value, [])],
        "bad tag": [
            ("accounts", b"mallory", value, good),  # moved to another key
            ("streams", b"alice", value, good),  # moved to another store
            ("accounts", b"alice", value + b" ", good),  # value changed
            ("accounts", b"alice", None, good),  # a value's tag on a deletion
            ("accounts", b"alice", value, other.headers("accounts", b"alice", value)),
        ],
        "more than one tag": [("accounts", b"alice", value, good + good)],
        "malformed tag": [("accounts", b"alice", value, [(HEADER, tag[:-1])])],
        "tag of unknown format 2": [("accounts", b"alice", value, [(HEADER, b"\x02" + tag[1:])])],
        "no key": [("accounts", None, value, good)],
    }
    for why, records in cases.items():
        for store, key, val, headers in records:
            assert MAC.refusal(store, key, val, headers) == why, (store, key, val)
    deletion = MAC.headers("purchases", b"alice/s/p1", None)
    assert MAC.refusal("purchases", b"alice/s/p1", None, deletion) is None
    assert MAC.refusal("purchases", b"alice/s/p2", None, deletion) == "bad tag"


def test_a_refusal_is_counted_by_store_and_logged_with_where(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = build_metrics()
    guard = StateGuard(MAC, metrics.state_refused)
    for store in STORES:  # every series exists at 0, so the first refusal is an increase
        assert metrics.registry.get_sample_value(
            "emarket_state_records_refused_total", {"store": store}) == 0  # fmt: skip
    where = ("t-accounts-changelog", 3, 17)
    with caplog.at_level(logging.ERROR, logger="emarket.state"):
        assert not guard.admit("accounts", b"alice", b"{}", None, where=where, reader="replica")
        assert not guard.admit("accounts", b"alice", None, None, where=where, reader="replica")
    ok = MAC.headers("accounts", b"alice", b"{}")
    assert guard.admit("accounts", b"alice", b"{}", ok, where=where, reader="replica")
    assert metrics.registry.get_sample_value(
        "emarket_state_records_refused_total", {"store": "accounts"}) == 2  # fmt: skip
    assert "(no tag) at t-accounts-changelog[3]@17, key b'alice', a deletion" in caplog.text


def account_bytes(name: str, as_id: str | None = None) -> bytes:
    """The accounts record of test party ``name`` (stored under ``as_id``: a forgery)."""
    key = helpers.party(name).public_key
    return AccountState(account_id=as_id or name, version=1, signing_key=key,
                        key_id=key_id_of(key), opened_at_ms=1,
                        updated_at_ms=1).model_dump_json().encode()  # fmt: skip


def message(store: str, key: bytes, value: bytes | None, headers: Any, offset: int) -> Message:
    return Message(f"t-{store}-changelog", 0, offset, 0.0, 0, headers, key, value, None)


class _Event:
    def __init__(self, msg: Message) -> None:
        self.message = msg


def test_table_recovery_applies_only_what_verifies_through_faust_s_memory_store() -> None:
    """Faust's recovery hands the table its buffered changelog events: the real memory store
    receives only the market's records, decoded; a forged value and a forged deletion leave
    the store as it was, and a genuine deletion deletes."""
    register_codecs()
    app = faust.App("t-state-mac", broker="memory://", store="memory://")
    guard = StateGuard(MAC)
    table = WriteBackTable.create(app, "accounts", 1, guard)
    genuine = account_bytes("alice")
    forged = account_bytes("mallory", as_id="alice")
    batch = [
        message("accounts", b"alice", genuine, MAC.headers("accounts", b"alice", genuine), 0),
        message("accounts", b"alice", forged, None, 1),
        message("accounts", b"alice", None, [(HEADER, b"\x01" + bytes(32))], 2),
        message("accounts", b"bob", b"\x00garbage", None, 3),
    ]
    table.table.apply_changelog_batch([_Event(m) for m in batch])
    assert dict(table.table.data) == {"alice": AccountState.model_validate_json(genuine)}
    assert table.table.changelog_topic.value_serializer == "raw"  # nothing parsed before
    deletion = message("accounts", b"alice", None, MAC.headers("accounts", b"alice", None), 4)
    table.table.apply_changelog_batch([_Event(deletion)])
    assert dict(table.table.data) == {}


def record(key: bytes, value: bytes | None, headers: Any, offset: int) -> ConsumerRecord[Any, Any]:
    return ConsumerRecord("t-accounts-changelog", 0, offset, 0, 0, key, value, None,
                          len(key), len(value or b""), tuple(headers or ()))  # fmt: skip


def test_the_account_replica_applies_only_what_verifies() -> None:
    metrics = build_metrics()
    replica = AccountReplica("127.0.0.1:1", "t-accounts-changelog",
                             StateGuard(MAC, metrics.state_refused))  # fmt: skip
    genuine, stolen = account_bytes("alice"), account_bytes("mallory", as_id="alice")
    replica.receive(record(b"alice", genuine, MAC.headers("accounts", b"alice", genuine), 0))
    kept = replica.get("alice")
    assert kept is not None
    replica.receive(record(b"alice", stolen, None, 1))  # alice's id → mallory's keys
    replica.receive(record(b"alice", None, None, 2))  # a forged deletion
    replica.receive(record(b"alice", stolen, MAC.headers("accounts", b"bob", stolen), 3))
    assert replica.get("alice") == kept and replica.owner_of_key(kept.key_id) == "alice"
    assert metrics.registry.get_sample_value(
        "emarket_state_records_refused_total", {"store": "accounts"}) == 3  # fmt: skip
    replica.receive(record(b"alice", None, MAC.headers("accounts", b"alice", None), 4))
    assert replica.get("alice") is None  # the market's own deletion applies


def test_a_market_whose_state_carries_no_authenticators_is_refused_with_what_to_do() -> None:
    ours = identity_of(TEST_KEYS)
    assert ours.state_format == 1
    _compare(ours, ours, "t.market")
    old = ours.model_copy(update={"state_format": None})
    with pytest.raises(MarketIdentityError, match=r"without authenticators.*new --prefix"):
        _compare(ours, old, "t.market")
    with pytest.raises(MarketIdentityError, match="state format v2"):
        _compare(ours, ours.model_copy(update={"state_format": 2}), "t.market")
