"""An open market's openings allowance cannot be spent by one sender faster than honest users
are served (issue #40): each opening carries a proof of work, so one sender opens accounts at
its hash rate over 2^bits, far below a partition's share, whatever ids it picks.

The red team opened accounts at 3/s on one partition and had half of an honest user's openings
refused ``rate_limited``; at the default allowance it reached ~8,000 accounts in 13 minutes.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from streams.core import MarketCore, Stores
from streams.core.context import Limits
from streams.wire.topics import Topics
from streams.wire.work import leading_zero_bits, solve, work_bits

from ..helpers import TEST_KEYS, party, protocol_vectors, signed_for

T = Topics("t")
BITS = 18  # ~2.6e5 hashes an opening: ~0.2-0.5 s of one core in Python


def _core(**limits: Any) -> MarketCore:
    return MarketCore(Stores(), TEST_KEYS, T, limits=Limits(**limits))


def _opening(name: str, bits: int = BITS, work: str | None = None) -> bytes:
    p = party(name)
    if work is None and bits:
        work = solve(T.prefix, p.account_id, p.public_key, bits)
    return p.open_account(signed_for(T.prefix), work=work).model_dump_json().encode()


def _ids_on(partition: int, n: int, prefix: str) -> list[str]:
    ids = (f"{prefix}{i}" for i in range(100_000))
    return [a for a in ids if T.partition_of(a) == partition][:n]


@pytest.mark.slow
def test_an_opening_without_enough_work_is_refused_saying_how_much() -> None:
    c = _core(opening_work=BITS)
    p = party("alice")
    weak = solve(T.prefix, "alice", p.public_key, 4)
    for raw in (_opening("alice", 0), _opening("alice", work=weak)):
        out = c.handle(T.accounts, raw)
        body = json.loads(out.outputs[0].value)
        assert (out.status, out.reason, body["details"]["bits"]) == ("rejected", "more_work", BITS)
        assert all(not T.is_inbox(o.topic) for o in out.outputs)
    bob = party("bob")  # work done for one opening opens nothing else
    theirs = solve(T.prefix, "bob", bob.public_key, BITS)
    assert work_bits(T.prefix, "alice", p.public_key, theirs) < BITS
    assert c.handle(T.accounts, _opening("alice", work=theirs)).reason == "more_work"
    assert c.handle(T.accounts, _opening("alice")).status == "accepted"


@pytest.mark.slow
def test_a_stranger_flooding_openings_does_not_stop_an_honest_one() -> None:
    """For two seconds a stranger opens accounts on the honest user's partition as fast as one
    core lets it, then the honest opening is confirmed: the partition's share (here 60 a
    minute, which a stranger without the work spends in a millisecond) is not spent."""
    c = _core(opening_work=BITS, max_openings_per_minute=60 * T.partitions)
    target = T.partition_of("honest")
    names = iter(_ids_on(target, 1_000, "s"))
    opened = 0
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        out = c.handle(T.accounts, _opening(next(names)))
        assert out.status == "accepted", out.reason
        opened += 1
    assert opened >= 1
    assert c.handle(T.accounts, _opening("honest")).status == "accepted"
    assert not c.ctx.allowance.openings_behind()


def test_leading_zero_bits() -> None:
    assert leading_zero_bits(b"\x00\x00\xff") == 16 and leading_zero_bits(b"\x80") == 0
    assert leading_zero_bits(b"\x00\x01") == 15 and leading_zero_bits(b"\x00") == 8


def test_the_protocols_work_vector() -> None:
    import hashlib

    from streams.wire import work

    v = protocol_vectors("work")
    raw = bytes.fromhex(v["bytes"])
    assert raw == work._head(v["market_prefix"], v["account_id"], v["signing_key"]) + work._s(
        v["work"]
    )
    assert hashlib.sha256(raw).hexdigest() == v["sha256"]
    assert work_bits(v["market_prefix"], v["account_id"], v["signing_key"], v["work"]) == v["bits"]
