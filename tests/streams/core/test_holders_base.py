"""A stream with many holders stores them apart (``streams.core.stream_store``, "Holders
apart"): its record carries only the holders changed since a holders base, bases alternate
between two slots at most once a batch, and the record is still the truth after a crash between
a batch's records and its streams' records (the base is written with the former), after the
changelogs are read back through their codecs, and after a replay."""

from __future__ import annotations

import copy
from typing import Any

from streams.core import MarketCore, Stores
from streams.core.codecs import CODECS
from streams.core.state import HOLDER_BYTES
from streams.core.stream_store import INLINE_HOLDERS, holders_of
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS, market_core, open_accounts, purchase, registration, value

T = Topics("t")
NOW = 10**12
BUYERS = [f"b{i:03d}" for i in range(120)]


def _core() -> MarketCore:
    c = market_core("seller1", now=NOW)
    open_accounts(c, *BUYERS)
    assert c.handle(T.registrations, registration("s")).status == "accepted"
    c.handle(T.values, value("s", "v0", [1.0, 2.0, 3.0], published_at_ms=NOW))
    return c


def _buy(c: MarketCore, buyer: str, pid: str) -> Any:
    out = c.handle(T.purchases, purchase("s", buyer, pid, requested_at_ms=NOW))
    assert out.status == "fulfilled", out.reason
    return out


def _whole(c: MarketCore) -> dict[str, Any]:
    st = c.stores.streams["s"]
    return {b: h.model_dump() for b, h in holders_of(c.stores, "s", st).items()}


def _snapshot(c: MarketCore) -> dict[str, dict[str, Any]]:
    return copy.deepcopy({n: dict(getattr(c.stores, n)) for n in vars(c.stores)})


def _read_back(tables: dict[str, dict[str, Any]]) -> Stores:
    """The stores a worker rebuilds from the changelogs: every record through its codec."""
    return Stores(
        **{
            n: {k: CODECS[n][1](CODECS[n][0](v)) for k, v in recs.items()}
            for n, recs in tables.items()
        }
    )


def test_the_record_carries_only_the_holders_changed_since_its_base() -> None:
    c = _core()
    for b in BUYERS:
        _buy(c, b, "p1")
    st = c.stores.streams["s"]
    assert st.holders_base is not None
    assert len(st.holders) <= INLINE_HOLDERS < len(BUYERS)
    assert list(_whole(c)) == BUYERS  # every holder, in the order they first bought
    assert all(h == {"level": 0.5, "paid_minor": 50, "purchases": 1} for h in _whole(c).values())
    encoded = CODECS["streams"][0](st)
    bare = CODECS["streams"][0](st.model_copy(update={"holders": {}}))
    assert len(encoded) <= len(bare) + HOLDER_BYTES * INLINE_HOLDERS  # not the 120 holders
    _buy(c, BUYERS[0], "p2")  # a change of one holder is written as one holder
    after = c.stores.streams["s"]
    assert after.holders_base == st.holders_base and BUYERS[0] in after.holders
    assert _whole(c)[BUYERS[0]] == {"level": 1.0, "paid_minor": 100, "purchases": 2}
    base = c.stores.holders[f"s/{st.holders_base.slot}"]
    assert base.holders[BUYERS[0]].level == 0.5  # the base is never changed in place


def test_a_small_stream_keeps_every_holder_in_its_record() -> None:
    c = _core()
    for b in BUYERS[:INLINE_HOLDERS]:
        _buy(c, b, "p1")
    st = c.stores.streams["s"]
    assert st.holders_base is None and list(st.holders) == BUYERS[:INLINE_HOLDERS]
    assert not c.stores.holders


def test_bases_alternate_slots_and_a_batch_writes_at_most_one() -> None:
    c = _core()
    for b in BUYERS[:40]:
        _buy(c, b, "p1")
    first = c.stores.streams["s"].holders_base
    assert first is not None and first.gen == 1
    with c.batch():  # 80 new holders in one batch: one base at most, in the other slot
        for b in BUYERS[40:]:
            _buy(c, b, "p1")
    second = c.stores.streams["s"].holders_base
    assert second is not None and (second.slot, second.gen) == (1 - first.slot, 2)
    assert len(c.stores.streams["s"].holders) > INLINE_HOLDERS  # the rest waits a batch
    for b in BUYERS[: INLINE_HOLDERS + 1]:  # the next batches write the next base
        _buy(c, b, "p2")
    third = c.stores.streams["s"].holders_base
    assert third is not None and (third.slot, third.gen) == (first.slot, 3)
    assert list(_whole(c)) == BUYERS


def test_the_changelogs_read_back_give_the_same_stream() -> None:
    c = _core()
    for b in BUYERS:
        _buy(c, b, "p1")
    restarted = MarketCore(_read_back(_snapshot(c)), TEST_KEYS, T, clock=lambda: NOW)
    assert _whole(restarted) == _whole(c)
    raw = purchase("s", BUYERS[5], "p2", requested_at_ms=NOW)
    assert (
        restarted.handle(T.purchases, raw).outputs[0].value
        == _buy(c, BUYERS[5], "p2").outputs[0].value
    )
    assert _whole(restarted) == _whole(c)
