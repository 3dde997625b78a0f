"""State records, format 2, without a broker (docs/protocol.md §3).

The format's test vectors against the code and against a computation written from the text
alone (HChaCha20, the stamp, the AAD, BLAKE2b); every way a record can fail to be the market's;
the checkpoint's commit rule and epochs; the verdicts; and the two readers — table recovery
through Faust's real memory store, and the account replica — applying only committed, newest
records: an old record appended again after a newer one (a rollback) is refused and counted.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import struct
from typing import Any

import faust
import pytest
from aiokafka.structs import ConsumerRecord
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from faust.types import Message

from streams.wire.events import AccountState
from streams.wire.signing import key_id_of
from streams.worker.checkpoints import MAX_ENDED, MAX_N, Checkpoint, StoreSum
from streams.worker.directory import AccountReplica
from streams.worker.history import PROGRESS, CheckpointBook, StateReader, judge
from streams.worker.identity import MarketIdentityError, _compare, identity_of
from streams.worker.metrics import build_metrics
from streams.worker.secrets import STATE_DIGEST_LABEL, STATE_SEAL_LABEL, state_keys
from streams.worker.state_records import HEADER, Stamp, StateSeal, Version
from streams.worker.state_vectors import build, render
from streams.worker.tables import StateContext, WriteBackTable, register_codecs

from .. import helpers
from ..helpers import protocol_vectors
from ..wire.test_counts import TEST_KEYS

SEAL = StateSeal(*state_keys(bytes(range(32))))
E1, E2 = (1 << 32) | 7, (2 << 32) | 9


def doc_vectors() -> dict[str, Any]:
    return protocol_vectors("state")


# -- §3 written from the text -------------------------------------------------------------------
def _rotl(v: int, c: int) -> int:
    return ((v << c) & 0xFFFFFFFF) | (v >> (32 - c))


def hchacha20(key: bytes, nonce16: bytes) -> bytes:
    """HChaCha20 (draft-irtf-cfrg-xchacha §2.2): 20 ChaCha rounds, no final addition, words
    0–3 and 12–15 of the state."""
    s = [
        0x61707865,
        0x3320646E,
        0x79622D32,
        0x6B206574,
        *struct.unpack("<8I", key),
        *struct.unpack("<4I", nonce16),
    ]

    def qr(a: int, b: int, c: int, d: int) -> None:
        s[a] = (s[a] + s[b]) & 0xFFFFFFFF
        s[d] = _rotl(s[d] ^ s[a], 16)
        s[c] = (s[c] + s[d]) & 0xFFFFFFFF
        s[b] = _rotl(s[b] ^ s[c], 12)
        s[a] = (s[a] + s[b]) & 0xFFFFFFFF
        s[d] = _rotl(s[d] ^ s[a], 8)
        s[c] = (s[c] + s[d]) & 0xFFFFFFFF
        s[b] = _rotl(s[b] ^ s[c], 7)

    for _ in range(10):
        qr(0, 4, 8, 12), qr(1, 5, 9, 13), qr(2, 6, 10, 14), qr(3, 7, 11, 15)
        qr(0, 5, 10, 15), qr(1, 6, 11, 12), qr(2, 7, 8, 13), qr(3, 4, 9, 14)
    return struct.pack("<8I", *s[0:4], *s[12:16])


def xchacha_open(key: bytes, nonce: bytes, aad: bytes, sealed: bytes) -> bytes:
    """XChaCha20-Poly1305 from its definition: ChaCha20-Poly1305 (RFC 8439) under the HChaCha20
    subkey of the nonce's first 16 bytes, with nonce 00000000 ‖ its last 8."""
    sub = hchacha20(key, nonce[:16])
    return ChaCha20Poly1305(sub).decrypt(b"\0\0\0\0" + nonce[16:], sealed, aad)


def text_keys(secret: bytes) -> tuple[bytes, bytes]:
    return (
        hmac.new(secret, b"emarket state seal key v2", hashlib.sha256).digest(),
        hmac.new(secret, b"emarket state digest key v2", hashlib.sha256).digest(),
    )


def text_stamp(r: dict[str, Any]) -> bytes:
    return (
        b"\x02"
        + r["partition"].to_bytes(4, "big")
        + int(r["epoch"]).to_bytes(8, "big")
        + r["n"].to_bytes(4, "big")
        + bytes([r["topic"]])
        + int(r["offset"]).to_bytes(8, "big")
    )


def text_aad(r: dict[str, Any]) -> bytes:
    s, k = r["store"].encode(), bytes.fromhex(r["key"])
    return (
        b"emarket-state-v2"
        + bytes([len(s)])
        + s
        + len(k).to_bytes(4, "big")
        + k
        + text_stamp(r)
        + (b"\x00" if r["plaintext"] is None else b"\x01")
    )


def text_digest(digest_key: bytes, store: str, key: str, epoch: int, n: int) -> int:
    s, k = store.encode(), key.encode()
    data = bytes([len(s)]) + s + len(k).to_bytes(4, "big") + k + epoch.to_bytes(8, "big")
    data += n.to_bytes(4, "big")
    return int.from_bytes(hashlib.blake2b(data, key=digest_key, digest_size=32).digest(), "big")


def check_record(r: dict[str, Any], seal_key: bytes) -> None:
    """One vector, opened from the text alone and by the code."""
    head = bytes.fromhex(r["header"])
    assert text_stamp(r).hex() == r["stamp"] == head[:26].hex()
    assert text_aad(r).hex() == r["aad"]
    nonce = bytes.fromhex(r["nonce"])
    if r["plaintext"] is None:
        assert r["value"] is None and head[26:50] == nonce
        assert xchacha_open(seal_key, nonce, text_aad(r), head[50:]) == b""
    else:
        value = bytes.fromhex(r["value"])
        assert value[:24] == nonce and len(head) == 26
        assert xchacha_open(seal_key, nonce, text_aad(r), value[24:]).hex() == r["plaintext"]


def test_the_documented_vectors_are_what_the_code_and_the_text_compute() -> None:
    v = doc_vectors()
    assert render(v) == render(build())  # the block is what the code makes
    secret = bytes.fromhex(v["noise_secret"])
    seal_key, digest_key = text_keys(secret)
    assert state_keys(secret) == (seal_key, digest_key)
    assert (seal_key.hex(), digest_key.hex()) == (v["seal_key"], v["digest_key"])
    seal = StateSeal(seal_key, digest_key)
    for r in [*v["records"], v["checkpoint"]["record"]]:
        check_record(r, seal_key)
        value = None if r["value"] is None else bytes.fromhex(r["value"])
        opened = seal.open(
            r["store"], bytes.fromhex(r["key"]), value, [(HEADER, bytes.fromhex(r["header"]))]
        )
        assert not isinstance(opened, str), opened
        assert opened.plaintext == (
            None if r["plaintext"] is None else bytes.fromhex(r["plaintext"])
        )
        assert opened.stamp.to_bytes().hex() == r["stamp"]
    for d in v["digests"]:
        want = text_digest(digest_key, d["store"], d["key"], int(d["epoch"]), d["n"])
        assert f"{want:064x}" == d["digest"]
        assert seal.digest(d["store"], d["key"], Version(int(d["epoch"]), d["n"])) == want
    cp = v["checkpoint"]
    canonical = json.dumps(cp["checkpoint"], sort_keys=True, separators=(",", ":"))
    assert cp["plaintext"] == canonical == bytes.fromhex(cp["record"]["plaintext"]).decode()


def test_the_state_keys_are_their_own() -> None:
    """Domain separation: not the secret, not its public fingerprint, not each other."""
    secret = bytes(range(32))
    seal_key, digest_key = state_keys(secret)
    assert STATE_SEAL_LABEL == b"emarket state seal key v2"
    assert STATE_DIGEST_LABEL == b"emarket state digest key v2"
    fingerprint = hmac.new(secret, b"emarket noise-secret fingerprint v1", "sha256").digest()
    assert len({seal_key, digest_key, secret, fingerprint}) == 4
    assert "key=" not in repr(SEAL) and seal_key.hex() not in repr(SEAL)  # never printed


def test_every_record_the_market_did_not_seal_for_this_place_is_refused_and_says_why() -> None:
    value = b'{"account_id":"alice"}'
    stamp = Stamp(2, Version(E1, 3), 0, 10)
    head, sealed = SEAL.seal("accounts", b"alice", value, stamp)
    assert not isinstance(SEAL.open("accounts", b"alice", sealed, head), str)
    assert not isinstance(SEAL.open("accounts", b"alice", sealed, tuple(head)), str)  # aiokafka
    dhead, _ = SEAL.seal("accounts", b"alice", None, stamp)
    other = StateSeal(bytes(32), bytes(32))
    other_head, other_sealed = other.seal("accounts", b"alice", value, stamp)
    later = [(HEADER, Stamp(2, Version(E1, 4), 0, 10).to_bytes())]
    cases: dict[str, list[tuple[str, bytes | None, bytes | None, Any]]] = {
        "no key": [("accounts", None, sealed, head)],
        "no stamp": [("accounts", b"alice", sealed, None), ("accounts", b"alice", sealed, [])],
        "more than one stamp": [("accounts", b"alice", sealed, head + head)],
        "malformed record": [
            ("accounts", b"alice", sealed, [(HEADER, head[0][1][:-1])]),
            ("accounts", b"alice", sealed[:10], head),
            ("accounts", b"alice", None, head),
        ],  # a value's stamp, no seal
        "stamp of format 1": [("accounts", b"alice", sealed, [(HEADER, b"\x01" + bytes(32))])],
        "bad seal": [
            ("accounts", b"mallory", sealed, head),  # moved to another key
            ("streams", b"alice", sealed, head),  # moved to another store
            ("accounts", b"alice", sealed, later),  # given a newer version
            ("accounts", b"alice", sealed[:-1] + bytes([sealed[-1] ^ 1]), head),
            ("accounts", b"alice", other_sealed, other_head),  # another market's
            ("accounts", b"bob", None, dhead),  # a deletion moved
        ],
    }
    for why, records in cases.items():
        for store, key, val, headers in records:
            assert SEAL.open(store, key, val, headers) == why, (why, store, key)
    assert SEAL.open("accounts", b"alice", None, dhead).plaintext is None  # type: ignore[union-attr]


def test_a_record_stamped_for_another_partition_is_refused_as_moved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = build_metrics()
    reader = StateReader(SEAL, metrics.state_refused)
    head, sealed = SEAL.seal("accounts", b"alice", b"{}", Stamp(2, Version(E1, 1)))
    with caplog.at_level(logging.ERROR, logger="emarket.state"):
        assert (
            reader.open("accounts", b"alice", sealed, head, where=("t-c", 3, 17), reader="replica")
            is None
        )
        assert (
            reader.open("accounts", b"alice", sealed, None, where=("t-c", 2, 18), reader="replica")
            is None
        )
    assert (
        reader.open("accounts", b"alice", sealed, head, where=("t-c", 2, 19), reader="replica")
        is not None
    )

    def count(reason: str) -> float | None:
        return metrics.registry.get_sample_value(
            "emarket_state_records_refused_total", {"store": "accounts", "reason": reason}
        )

    assert (count("moved"), count("forged"), count("older")) == (1, 1, 0)
    assert "(moved: stamped for partition 2) at t-c[3]@17" in caplog.text


# -- checkpoints and verdicts -------------------------------------------------------------------
def test_what_a_checkpoint_commits() -> None:
    cp = Checkpoint(1, Version(E2, 5), ended={E1: 3}, floor=(0 << 32) | 99)
    assert cp.commits(Version(E2, 0)) and cp.commits(Version(E2, 5))
    assert not cp.commits(Version(E2, 6))  # the batch after the checkpoint: lost, or not yet
    assert cp.commits(Version(E1, 3)) and not cp.commits(Version(E1, 4))  # E1's lost batch
    assert not cp.commits(Version((1 << 32) | 8, 0))  # an epoch claimed, never committed
    assert cp.commits(Version(99, 123))  # older than every epoch kept: taken as committed
    assert not cp.commits(Version((3 << 32) | 1, 0))  # a later epoch
    assert Checkpoint.empty(4).commits(Version(0, 0))
    assert not Checkpoint.empty(4).commits(Version(E1, 0))


def test_a_claim_starts_a_greater_epoch_and_remembers_the_one_it_ends() -> None:
    cp = Checkpoint(1, Version(E2, 5), stores={"accounts": StoreSum(2, 7, 9)}, ended={E1: 3})
    claimed = cp.claimed(after=(5 << 32) | 1, now_ms=10)
    assert claimed.version.n == 0 and claimed.version.epoch >> 32 == 6
    assert claimed.ended == {E1: 3, E2: 5} and claimed.floor == -1
    assert claimed.stores == cp.stores and claimed.stores["accounts"] is not cp.stores["accounts"]
    many = Checkpoint(0, Version((1 << 32) | 1, 0))
    for _ in range(MAX_ENDED + 3):
        many = many.claimed(0, 0)
    assert len(many.ended) == MAX_ENDED and many.floor >> 32 == 3  # the 3 oldest dropped
    assert all(e > many.floor for e in many.ended)
    assert Checkpoint(0, Version(E1, MAX_N)).successor(0).version.epoch >> 32 == 2
    assert Checkpoint(0, Version(E1, 4)).successor(0).version == Version(E1, 5)


def test_a_checkpoint_reads_back_as_written() -> None:
    cp = Checkpoint(
        3, Version(E2, 5), 1234, {"t.accounts": 9}, {"streams": StoreSum(2, 2**255, 7)}, {E1: 3}, 42
    )
    assert Checkpoint.from_bytes(cp.to_bytes()) == cp
    assert (
        cp.to_bytes()
        == json.dumps(json.loads(cp.to_bytes()), sort_keys=True, separators=(",", ":")).encode()
    )


@pytest.mark.parametrize(
    ("version", "held", "final", "verdict"),
    [
        (Version(E2, 2), None, True, "apply"),
        (Version(E2, 2), Version(E2, 1), True, "apply"),
        (Version(E2, 1), Version(E2, 2), True, "older"),
        (Version(E1, 3), Version(E2, 0), True, "older"),
        (Version(E2, 2), Version(E2, 2), True, "copy"),
        (Version(E2, 6), None, True, "void"),
        (Version(E2, 6), None, False, "pending"),
        ((Version((3 << 32) | 1, 0)), None, False, "pending"),
        (Version(E1, 4), None, False, "void"),
    ],
)
def test_verdicts(version: Version, held: Version | None, final: bool, verdict: str) -> None:
    cp = Checkpoint(1, Version(E2, 5), ended={E1: 3})
    assert judge(cp, version, held, final=final) == verdict


def test_a_checkpoint_older_than_one_read_is_refused() -> None:
    metrics = build_metrics()
    book = CheckpointBook(StateReader(SEAL, metrics.state_refused, metrics.state_copies))

    def rec(cp: Checkpoint, offset: int) -> ConsumerRecord[Any, Any]:
        head, value = SEAL.seal(PROGRESS, b"1", cp.to_bytes(), Stamp(1, cp.version))
        return ConsumerRecord(
            "t-progress", 1, offset, 0, 0, b"1", value, None, 1, len(value or b""), tuple(head)
        )

    new, old = Checkpoint(1, Version(E2, 5)), Checkpoint(1, Version(E2, 4))
    assert book.receive(rec(old, 0), "test") == old
    assert book.receive(rec(new, 1), "test") == new
    assert book.receive(rec(old, 2), "test") is None  # appended again: refused
    assert book.receive(rec(new, 3), "test") is None  # a copy: nothing
    assert book.get(1) == new and book.get(2) == Checkpoint.empty(2)
    assert (
        metrics.registry.get_sample_value(
            "emarket_state_records_refused_total", {"store": PROGRESS, "reason": "checkpoint"}
        )
        == 1
    )
    assert (
        metrics.registry.get_sample_value("emarket_state_records_copies_total", {"store": PROGRESS})
        == 1
    )


# -- the readers --------------------------------------------------------------------------------
def account(name: str, version: int = 1, key_of: str | None = None) -> AccountState:
    key = helpers.party(key_of or name).public_key
    return AccountState(
        account_id=name,
        version=version,
        signing_key=key,
        key_id=key_id_of(key),
        opened_at_ms=1,
        updated_at_ms=1,
    )


def sealed_message(
    store: str, key: bytes, value: bytes | None, version: Version, offset: int, partition: int = 0
) -> Message:
    head, sealed = SEAL.seal(store, key, value, Stamp(partition, version))
    return Message(f"t-{store}-changelog", partition, offset, 0.0, 0, head, key, sealed, None)


class _Event:
    def __init__(self, msg: Message) -> None:
        self.message = msg


def memory_table(cp: Checkpoint) -> tuple[WriteBackTable, StateContext, Any]:
    register_codecs()
    metrics = build_metrics()
    reader = StateReader(
        SEAL, metrics.state_refused, metrics.state_copies, metrics.state_uncommitted
    )
    ctx = StateContext(SEAL, reader, CheckpointBook(reader))
    ctx.book.latest[0] = cp
    app = faust.App("t-state-records", broker="memory://", store="memory://")
    return WriteBackTable.create(app, "accounts", 1, ctx), ctx, metrics


class _Walked(dict[str, Any]):
    """A memory store's dict that counts the walks over its keys."""

    walks = 0

    def keys(self) -> Any:
        self.walks += 1
        return super().keys()

    def __iter__(self) -> Any:
        self.walks += 1
        return super().__iter__()


def test_a_table_counts_its_keys_in_a_batch_without_walking_the_store() -> None:
    """Every opening checks the accounts bound with ``len``: counted by walking the store, each
    opening of a batch cost O(accounts) (a 100,000-opening run slowed 370 → 47 a second)."""
    table, _, _ = memory_table(Checkpoint.empty(1))
    store = table.table.data
    store.data = _Walked({f"a{i}": (Version(E1, i), account(f"a{i}")) for i in range(1000)})
    table["new"] = account("new")  # a key more
    table["a1"] = account("a1", 2)  # a key rewritten
    del table["a2"]  # a key fewer
    table["brief"] = account("brief")
    del table["brief"]  # made and deleted in the batch: no key
    assert len(table) == 1000
    assert store.data.walks == 0
    assert len(table) == sum(1 for _ in table)  # what a walk counts


def test_recovery_applies_only_committed_newest_records_through_faust_s_memory_store() -> None:
    """Faust's recovery hands the table its changelog events: the real memory store receives
    only the market's committed records, each newer than what it holds; a rotated-out key
    appended again after the rotation is refused as older, and counted."""
    table, ctx, metrics = memory_table(Checkpoint(0, Version(E2, 5), ended={E1: 3}))
    v1, v2 = account("alice"), account("alice", 2, key_of="bob")
    j1, j2 = (a.model_dump_json().encode() for a in (v1, v2))
    batch = [
        sealed_message("accounts", b"alice", j1, Version(E1, 2), 0),
        sealed_message("accounts", b"alice", j2, Version(E2, 1), 1),  # rotated
        sealed_message("accounts", b"alice", j1, Version(E1, 2), 2),  # appended again: older
        sealed_message("accounts", b"alice", j2, Version(E2, 1), 3),  # a copy
        sealed_message("accounts", b"carol", j1, Version(E1, 4), 4),  # E1's lost batch
        sealed_message("accounts", b"dave", j1, Version(E2, 6), 5),  # after the checkpoint
        Message("t-accounts-changelog", 0, 6, 0.0, 0, None, b"alice", b"x" * 50, None),  # forged
    ]
    table.table.apply_changelog_batch([_Event(m) for m in batch])
    assert dict(table.table.data.data) == {"alice": (Version(E2, 1), v2)}
    assert table["alice"] == v2
    assert ctx.stale == {0: {("accounts", "carol"), ("accounts", "dave")}}

    def count(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"store": "accounts", **labels})

    assert count("emarket_state_records_refused_total", reason="older") == 1
    assert count("emarket_state_records_refused_total", reason="forged") == 1
    assert count("emarket_state_records_copies_total") == 1
    assert count("emarket_state_records_uncommitted_total") == 2
    # a genuine deletion deletes; the record it deleted, appended again, stays deleted
    gone = sealed_message("accounts", b"alice", None, Version(E2, 2), 7)
    table.table.apply_changelog_batch([_Event(gone)])
    assert dict(table.table.data.data) == {}
    back = sealed_message("accounts", b"alice", j2, Version(E2, 1), 8)
    table.table.apply_changelog_batch([_Event(back)])
    assert dict(table.table.data.data) == {}
    assert count("emarket_state_records_refused_total", reason="older") == 2


def record(
    key: bytes,
    value: bytes | None,
    version: Version,
    offset: int,
    partition: int = 0,
    topic: str = "t-accounts-changelog",
) -> ConsumerRecord[Any, Any]:
    store = PROGRESS if topic == "t-progress" else "accounts"
    head, sealed = SEAL.seal(store, key, value, Stamp(partition, version))
    return ConsumerRecord(
        topic, partition, offset, 0, 0, key, sealed, None, len(key), len(sealed or b""), tuple(head)
    )


def checkpoint_record(cp: Checkpoint, offset: int) -> ConsumerRecord[Any, Any]:
    return record(
        str(cp.partition).encode(), cp.to_bytes(), cp.version, offset, cp.partition, "t-progress"
    )


def test_the_account_replica_applies_what_checkpoints_commit_and_refuses_a_rollback() -> None:
    metrics = build_metrics()
    reader = StateReader(SEAL, metrics.state_refused, metrics.state_copies)
    replica = AccountReplica({}, "t-accounts-changelog", "t-progress", reader)
    v1, v2 = account("alice"), account("alice", 2, key_of="bob")
    j1, j2 = (a.model_dump_json().encode() for a in (v1, v2))
    replica.receive(record(b"alice", j1, Version(E1, 1), 0))
    assert replica.get("alice") is None  # read before its checkpoint: waits for it

    def sums(*held: tuple[str, Version]) -> StoreSum:
        return StoreSum(
            len(held), sum(SEAL.digest("accounts", k, v) for k, v in held) % 2**256, len(held)
        )

    replica.receive(
        checkpoint_record(
            Checkpoint(
                0,
                Version(E1, 1),
                stores={
                    "accounts": StoreSum(1, SEAL.digest("accounts", "alice", Version(E1, 1)), 1)
                },
            ),
            0,
        )
    )
    assert replica.get("alice") == v1 and replica.owner_of_key(v1.key_id) == "alice"
    replica.receive(record(b"alice", j2, Version(E1, 2), 1))  # rotated
    replica.receive(
        checkpoint_record(
            Checkpoint(
                0,
                Version(E1, 2),
                stores={
                    "accounts": StoreSum(1, SEAL.digest("accounts", "alice", Version(E1, 2)), 2)
                },
            ),
            1,
        )
    )
    assert replica.get("alice") == v2 and replica.owner_of_key(v1.key_id) is None
    replica.receive(record(b"alice", j1, Version(E1, 1), 2))  # the old key appended again
    assert replica.get("alice") == v2
    assert (
        metrics.registry.get_sample_value(
            "emarket_state_records_refused_total", {"store": "accounts", "reason": "older"}
        )
        == 1
    )
    assert replica.unverified == {}
    assert sums(("alice", Version(E1, 2))).digest == replica._sums[0].digest


def test_the_account_replica_distrusts_a_partition_that_does_not_match_its_checkpoint() -> None:
    """A compacted changelog lost the rotation (only the old record survived): the replica
    notices once it has read as far as the checkpoint's end, and uses none of its accounts."""
    reader = StateReader(SEAL)
    replica = AccountReplica({}, "t-accounts-changelog", "t-progress", reader)
    j1 = account("alice").model_dump_json().encode()
    replica.receive(
        checkpoint_record(
            Checkpoint(
                0,
                Version(E1, 2),
                stores={
                    "accounts": StoreSum(1, SEAL.digest("accounts", "alice", Version(E1, 2)), 5)
                },
            ),
            0,
        )
    )
    replica.receive(record(b"alice", j1, Version(E1, 1), 3))
    assert replica.unverified == {}  # not read as far as the checkpoint says yet
    replica.receive(record(b"bob", j1.replace(b"alice", b"bob"), Version(E1, 1), 4))
    assert 0 in replica.unverified and replica.get("alice") is None


def test_a_market_of_another_state_format_is_refused_with_what_to_do() -> None:
    ours = identity_of(TEST_KEYS)
    assert ours.state_format == 2
    _compare(ours, ours, "t.market")
    with pytest.raises(MarketIdentityError, match=r"without authenticators.*new --prefix"):
        _compare(ours, ours.model_copy(update={"state_format": None}), "t.market")
    with pytest.raises(MarketIdentityError, match=r"format v1.*no migration.*new --prefix"):
        _compare(ours, ours.model_copy(update={"state_format": 1}), "t.market")
