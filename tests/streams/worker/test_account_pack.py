"""The account replica keeps each account packed (:mod:`streams.worker.account_pack`): it must
answer exactly as the replica that kept objects, and stay within a few hundred bytes an account.
"""

from __future__ import annotations

import base64
import gc
import hashlib
import json
import tracemalloc
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.wire.events import AccountState
from streams.worker.account_pack import key_index, pack, unpack
from streams.worker.checkpoints import Checkpoint, StoreSum
from streams.worker.directory import AccountReplica, _Held
from streams.worker.history import StateReader
from streams.worker.state_records import Version

from .test_state_records import E1, SEAL, checkpoint_record, record

BOUND = 400
"""Heap bytes per account the replica may take (~300 measured, the layout before: ~1,770)."""

_KEYS = [base64.b64encode(hashlib.sha256(b"%d" % i).digest()).decode() for i in range(5)]
_ODD_KEY = "A" * 42 + "B="  # decodes to 32 bytes, but re-encodes as "A…A=": kept as an object
_key_ids = st.integers(0, 2**64 - 1).map(lambda i: f"{i:016x}")
_wild_ints = st.one_of(st.integers(0, 2**53 - 1), st.sampled_from([0, 2**64 - 1, 2**64, 2**70]))


@st.composite
def account_json(draw: Any, wild: bool = True) -> bytes:
    """An account record's text: any mix of the optional fields given, omitted or null; if
    ``wild``, keys and integers a packing cannot give back too."""
    keys = st.sampled_from([*_KEYS, _ODD_KEY] if wild else _KEYS)
    ints = _wild_ints if wild else st.integers(0, 2**53 - 1)
    doc: dict[str, Any] = {
        "account_id": "alice",
        "version": draw(ints),
        "signing_key": draw(keys),
        "key_id": draw(_key_ids),
        "opened_at_ms": draw(st.integers(0, 2**53 - 1)),
        "updated_at_ms": draw(st.integers(0, 2**53 - 1)),
    }
    if draw(st.booleans()):
        doc["sealing_key"] = draw(st.one_of(st.none(), keys))
    if draw(st.booleans()):
        old = st.fixed_dictionaries({"version": ints, "signing_key": keys})
        doc["retired"] = draw(st.lists(old, max_size=8))
    for name, value in (("schema_version", 1), ("type", "account")):
        if draw(st.booleans()):
            doc[name] = value
    return json.dumps(dict(draw(st.permutations(list(doc.items()))))).encode()


@settings(max_examples=400, deadline=None)
@given(account_json(), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
def test_a_packed_account_is_given_back_exactly(text: bytes, epoch: int, p: int) -> None:
    state = AccountState.model_validate_json(text)
    packed = pack(Version(epoch, 3), p, state)
    if packed is None:  # kept as the object: only what a packing could not give back
        canonical = [state.signing_key, state.sealing_key, *(r.signing_key for r in state.retired)]
        ints = [state.version, *(r.version for r in state.retired)]
        assert _ODD_KEY in canonical or max(ints) >= 2**64
        return
    back = unpack("alice", packed)
    assert back == state and back.model_fields_set == state.model_fields_set
    assert back.model_dump_json(exclude_unset=True) == state.model_dump_json(exclude_unset=True)
    assert back.model_dump_json() == state.model_dump_json()
    assert key_index(state.key_id) == int(state.key_id, 16)


def test_a_text_that_is_no_key_id_names_no_account() -> None:
    assert key_index("00000000000000AB") is None  # upper case: not how key ids are written
    assert key_index("0x00000000000000") is None and key_index("12") is None


class ObjectReplica(AccountReplica):
    """The replica as it was before packing (each account its object, key ids as text): the
    reference the packed one is compared with."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._by_text: dict[str, str] = {}

    def get(self, account_id: str) -> AccountState | None:
        held: Any = self._accounts.get(account_id)
        if held is None or held.partition in self.unverified:
            return None
        newer = self._newest.get(account_id)
        if newer is not None and newer > held.version:
            return None
        state: AccountState = held.state
        return state

    def owner_of_key(self, key_id: str) -> str | None:
        owner = self._by_text.get(key_id)
        return owner if owner is not None and self.get(owner) is not None else None

    def _set(self, account_id: str, p: int, version: Version, state: AccountState | None) -> None:
        sums = self._sums.setdefault(p, StoreSum())
        old: Any = self._accounts.pop(account_id, None)
        if old is not None:
            self._by_text.pop(old.state.key_id, None)
            sums.count -= 1
            sums.digest -= self.reader.seal.digest("accounts", account_id, old.version)
        if state is not None:
            self._accounts[account_id] = _Held(version, p, state)
            self._by_text[state.key_id] = account_id
            sums.count += 1
            sums.digest += self.reader.seal.digest("accounts", account_id, version)
        sums.digest %= 2**256


@dataclass
class Market:
    """What the market wrote (the truth checkpoints sum up), and the records it wrote."""

    batch: dict[int, int] = field(default_factory=lambda: {0: 1, 1: 1})
    end: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})
    live: dict[str, tuple[Version, int]] = field(default_factory=dict)  # id: version, partition
    written: dict[str, list[Any]] = field(default_factory=dict)

    def write(self, account_id: str, text: bytes | None) -> Any:
        p = int(account_id[-1]) % 2
        self.batch[p] += 1
        version = Version(E1, self.batch[p])
        rec = record(account_id.encode(), text, version, self.end[p], p)
        self.end[p] += 1
        if text is None:
            self.live.pop(account_id, None)
        else:
            self.live[account_id] = (version, p)
        self.written.setdefault(account_id, []).append(rec)
        return rec

    def checkpoint(self, p: int, offset: int) -> Any:
        held = [(k, v) for k, (v, q) in self.live.items() if q == p]
        digest = sum(SEAL.digest("accounts", k, v) for k, v in held) % 2**256
        sums = StoreSum(len(held), digest, self.end[p])
        return checkpoint_record(
            Checkpoint(p, Version(E1, self.batch[p]), stores={"accounts": sums}), offset
        )


IDS = ["a0", "a1", "b2", "b3"]
_texts = st.one_of(account_json(wild=False), account_json(wild=False), account_json())
_ops = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(IDS), _texts),
    st.tuples(st.just("write"), st.sampled_from(IDS), _texts),
    st.tuples(st.just("lose"), st.sampled_from(IDS), _texts),
    st.tuples(st.just("delete"), st.sampled_from(IDS), st.none()),
    st.tuples(st.just("stale"), st.sampled_from(IDS), st.integers(0, 5)),
    st.tuples(st.just("checkpoint"), st.sampled_from([0, 1]), st.none()),
)


def _answers(replica: AccountReplica, key_ids: set[str]) -> Any:
    sums = {p: (s.count, s.digest) for p, s in replica._sums.items()}
    return (
        {a: replica.get(a) for a in IDS},
        {k: replica.owner_of_key(k) for k in key_ids},
        len(replica),
        dict(replica.unverified),
        sums,
    )


def _step(market: Market, op: tuple[str, Any, Any], progress: list[int]) -> Any | None:
    """The record ``op`` delivers to the replicas, if any."""
    kind, what, arg = op
    if kind == "checkpoint":
        progress[what] += 1
        return market.checkpoint(what, progress[what])
    if kind == "stale":
        old = market.written.get(what, [])
        return old[arg % len(old)] if old else None
    text = None if arg is None else arg.replace(b'"alice"', json.dumps(what).encode())
    rec = market.write(what, text)
    return None if kind == "lose" else rec


@settings(max_examples=200, deadline=None)
@given(st.lists(_ops, min_size=4, max_size=40))
def test_the_packed_replica_answers_as_the_replica_of_objects(ops: list[Any]) -> None:
    """Openings, rotations, deletions, older records appended again, records lost and
    checkpoints, in any order: every answer the same, after every record."""
    packed = AccountReplica({}, "t-accounts-changelog", "t-progress", StateReader(SEAL))
    objects = ObjectReplica({}, "t-accounts-changelog", "t-progress", StateReader(SEAL))
    market, progress, key_ids = Market(), [-1, -1], {"0000000000000000"}
    for op in ops:
        rec = _step(market, op, progress)
        if op[0] in ("write", "lose"):
            key_ids.add(json.loads(op[2])["key_id"])
        if rec is None:
            continue
        packed.receive(rec)
        objects.receive(rec)
        assert _answers(packed, key_ids) == _answers(objects, key_ids)


def _sealed_accounts(n: int) -> list[Any]:
    """``n`` accounts' records (distinct keys, with sealing keys: the larger kind) and the
    checkpoint committing them."""
    out, digest, version = [], 0, Version(E1, 1)
    for i in range(n):
        raw = hashlib.sha256(b"%d" % i).digest()
        state = AccountState(
            account_id=f"buyer-{i:06d}",
            version=1,
            signing_key=base64.b64encode(raw).decode(),
            sealing_key=base64.b64encode(raw[::-1]).decode(),
            key_id=raw[:8].hex(),
            opened_at_ms=1_780_000_000_000 + i,
            updated_at_ms=1_780_000_000_000 + i,
        )
        key = state.account_id.encode()
        out.append(record(key, state.model_dump_json().encode(), version, i))
        digest += SEAL.digest("accounts", state.account_id, version)
    sums = StoreSum(n, digest % 2**256, n)
    return [checkpoint_record(Checkpoint(0, version, stores={"accounts": sums}), 0), *out]


def test_the_replica_keeps_an_account_in_a_few_hundred_bytes() -> None:
    n = 20_000
    records = _sealed_accounts(n)
    for rec in records[1:]:  # fill pydantic's string cache first: a constant, not per account
        opened = SEAL.open("accounts", rec.key, rec.value, rec.headers)
        assert not isinstance(opened, str) and opened.plaintext is not None
        AccountState.model_validate_json(opened.plaintext)
    gc.collect()
    tracemalloc.start()
    try:
        replica = AccountReplica({}, "t-accounts-changelog", "t-progress", StateReader(SEAL))
        for rec in records:
            replica.receive(rec)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(replica) == n and not replica.unverified
    assert replica.get("buyer-000007") is not None
    assert held / n < BOUND, f"{held / n:.0f} B per account"
