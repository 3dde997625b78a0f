"""A stream's registration is stored apart, once (``streams.core.stream_store``, "Registered
apart"): the record rewritten after every event carries only what changes; the record is still
the truth when a batch is lost between the registration and the stream's record, after the
changelogs are read back through their codecs, and when the stores were written by the previous
version, its registrations inline (``data/stores_before_registered.json``)."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from streams.core import MarketCore, Stores
from streams.core.codecs import CODECS
from streams.core.state import InconsistentStream, Registered, StreamRecord, StreamState
from streams.wire.events import StreamRegistration
from streams.wire.topics import Topics
from streams.worker.web import ledger

from .helpers import TEST_KEYS, market_core, open_accounts, purchase, registration, value

T = Topics("t")
NOW = 10**12
OLD_STORES = Path(__file__).parent / "data" / "stores_before_registered.json"


class Written(dict[str, Any]):
    """A store that keeps the bytes of every record written to it, through its codec."""

    def __init__(self, store: str) -> None:
        super().__init__()
        self.encode = CODECS[store][0]
        self.writes: list[tuple[str, bytes]] = []

    def __setitem__(self, key: str, record: Any) -> None:
        self.writes.append((key, self.encode(record)))
        super().__setitem__(key, record)


def _snapshot(c: MarketCore) -> dict[str, dict[str, Any]]:
    return copy.deepcopy({n: dict(getattr(c.stores, n)) for n in vars(c.stores)})


def _read_back(tables: dict[str, dict[str, Any]]) -> Stores:
    """The stores a worker rebuilds from the changelogs: every record through its codec."""
    return Stores(**{n: {k: CODECS[n][1](CODECS[n][0](v)) for k, v in recs.items()}
                     for n, recs in tables.items()})  # fmt: skip


def _figures(c: MarketCore) -> dict[str, Any]:
    """What stream ``s`` holds, as the ledger reports it."""
    with c.streams.event():
        st = c.streams.load("s").state
    return {"holders": {b: h.model_dump() for b, h in st.holders.items()},
            "window": [e.value_id for e in st.window], "revenue": st.revenue_minor,
            "spent": st.spent, "values": st.values_ingested,
            "registered": st.registered}  # fmt: skip


def _buy(c: MarketCore, buyer: str, pid: str) -> Any:
    out = c.handle(T.purchases, purchase("s", buyer, pid, requested_at_ms=NOW))
    assert out.status == "fulfilled", out.reason
    return out


def test_the_record_written_after_each_event_carries_no_registration() -> None:
    streams, registered = Written("streams"), Written("registered")
    c = market_core("seller1", "alice", "bob", now=NOW,
                    stores=Stores(streams=streams, registered=registered))  # fmt: skip
    raw = registration("s", description="a thermometer " * 30)
    assert c.handle(T.registrations, raw).status == "accepted"
    for i in range(6):
        c.handle(T.values, value("s", f"v{i}", [1.0 + i, 2.0, 3.0], published_at_ms=NOW))
    for buyer in ("alice", "bob"):
        _buy(c, buyer, "p1")
        _buy(c, buyer, "p2")
    assert c.handle(T.registrations, raw).status == "duplicate"  # answered, nothing rewritten
    signature = StreamRegistration.model_validate_json(raw).signature.encode()
    assert [k for k, _ in registered.writes] == ["s"]  # written once
    once = registered.writes[0][1]
    assert signature in once and len(once) > 2_000
    assert len(streams.writes) >= 1 + 6 + 4  # the stream changed with every event
    for _, record in streams.writes:
        assert signature not in record and b"registration" not in record
        assert b"catalog" not in record and b"a thermometer" not in record
        assert len(record) < 1_500  # 4 retained values, 2 holders: ~1.2 kB
    assert isinstance(c.stores.streams["s"], StreamState)  # in memory, whole


def test_a_registration_whose_stream_record_was_lost_is_decided_afresh() -> None:
    """The registration is acked with the batch's records, before the stream's record: a crash
    in between leaves a registration without a record, which is no stream. The replay accepts
    it again (its catalog entry was never sent), and resends are answered as always."""
    c = market_core("seller1", now=NOW)
    before = _snapshot(c)
    first = c.handle(T.registrations, registration("s"))
    assert first.status == "accepted"
    after = _snapshot(c)
    assert "s" in after["registered"]
    durable = {n: after[n] for n in after} | {"streams": before["streams"]}
    for stores in (Stores(**copy.deepcopy(durable)), _read_back(durable)):
        restarted = MarketCore(stores, TEST_KEYS, T, clock=lambda: NOW + 5)
        lost = restarted.handle(T.values, value("s", "v0", [1.0, 2.0, 3.0], published_at_ms=NOW))
        assert lost.status == "rejected" and lost.reason == "unknown_stream"
        again = restarted.handle(T.registrations, registration("s"))
        assert again.status == "accepted"  # decided afresh, at the restarted worker's clock
        entry = json.loads(again.outputs[0].value)
        assert entry["accepted_at_ms"] == NOW + 5
        registered = restarted.stores.registered["s"]
        assert registered.accepted_at_ms == NOW + 5
        assert registered.catalog_payload.encode() == again.outputs[0].value
        dup = restarted.handle(T.registrations, registration("s"))
        assert dup.status == "duplicate" and dup.outputs[0].value == again.outputs[0].value
        other = restarted.handle(T.registrations, registration("s", retain_last=5))
        assert other.status == "rejected" and other.reason == "stream_exists"


def test_the_changelogs_read_back_give_the_same_stream() -> None:
    c = market_core("seller1", "alice", "bob", now=NOW)
    first = c.handle(T.registrations, registration("s"))
    for i in range(3):
        c.handle(T.values, value("s", f"v{i}", [1.0 + i, 2.0, 3.0], published_at_ms=NOW))
    _buy(c, "alice", "p1")
    stores = _read_back(_snapshot(c))
    stored = stores.streams["s"]
    assert type(stored) is StreamRecord  # the changelog's record has no registration
    assert stores.registered["s"] == c.stores.registered["s"]
    restarted = MarketCore(stores, TEST_KEYS, T, clock=lambda: NOW)
    dup = restarted.handle(T.registrations, registration("s"))
    assert dup.status == "duplicate" and dup.outputs[0].value == first.outputs[0].value
    assert restarted.handle(T.purchases, purchase("s", "bob", "p1", requested_at_ms=NOW)
                            ).outputs[0].value == _buy(c, "bob", "p1").outputs[0].value  # fmt: skip
    assert _figures(restarted) == _figures(c)
    open_accounts(restarted, "seller2")  # the census recounts the streams from their records
    assert restarted.handle(T.registrations, registration("s2", seller_id="seller2")
                            ).status == "accepted"  # fmt: skip


def _old_stores() -> tuple[Stores, dict[str, Any]]:
    data = json.loads(OLD_STORES.read_text())
    tables = {n: {k: CODECS[n][1](base64.b64decode(v)) for k, v in recs.items()}
              for n, recs in data["stores"].items()}  # fmt: skip
    assert "registered" not in tables
    return Stores(**tables), data


def test_a_record_the_previous_version_wrote_is_read_then_written_apart() -> None:
    stores, data = _old_stores()
    old = json.loads(base64.b64decode(data["stores"]["streams"]["s"]))
    assert next(iter(old)) == "registration"  # the registration inline, first
    loaded = stores.streams["s"]
    assert isinstance(loaded, StreamState)  # read whole
    assert loaded.registered == Registered.model_validate(
        {k: old[k] for k in Registered.model_fields})  # fmt: skip
    assert loaded.model_dump(exclude={"registered"}) == StreamRecord.model_validate(
        {k: old[k] for k in StreamRecord.model_fields if k in old}).model_dump()  # fmt: skip
    c = MarketCore(stores, TEST_KEYS, T, clock=lambda: NOW)
    dup = c.handle(T.registrations, registration("s"))
    assert dup.status == "duplicate"
    assert dup.outputs[0].value == old["catalog_payload"].encode()
    assert "registered" not in vars(c.stores) or "s" not in c.stores.registered  # not yet
    again = c.handle(T.purchases, purchase("s", "alice", "p1", requested_at_ms=NOW))
    assert again.outputs[0].value == base64.b64decode(data["p1_outcome"])  # bit for bit
    # the stream changed (this worker numbers its arrivals): written apart, then without it
    assert c.stores.registered["s"] == loaded.registered
    assert b"registration" not in CODECS["streams"][0](c.stores.streams["s"])
    step = _buy(c, "alice", "p2")
    got = json.loads(step.outputs[0].value)
    assert (got["level_before"], got["level_after"], got["price_minor"]) == (0.5, 1.0, 50)
    assert c.handle(T.values, value("s", "v2", [3.0, 2.0, 3.0], published_at_ms=NOW)
                    ).status == "accepted"  # fmt: skip
    restarted = MarketCore(_read_back(_snapshot(c)), TEST_KEYS, T, clock=lambda: NOW)
    resent = restarted.handle(T.purchases, purchase("s", "alice", "p2", requested_at_ms=NOW))
    assert resent.status == "duplicate" and resent.outputs[0].value == step.outputs[0].value
    assert _figures(restarted) == _figures(c)


def test_an_old_record_whose_registration_was_written_before_a_crash_is_not_rewritten() -> None:
    """A crash after the registration was written apart but before the record: the old record
    is read again, and its registration, already held, is not written a second time."""
    stores, _ = _old_stores()
    registered = Written("registered")
    registered.update({"s": stores.streams["s"].registered})  # type: ignore[attr-defined]
    stores.registered = registered
    c = MarketCore(stores, TEST_KEYS, T, clock=lambda: NOW)
    assert c.handle(T.values, value("s", "v2", [3.0, 2.0, 3.0], published_at_ms=NOW)
                    ).status == "accepted"  # fmt: skip
    assert registered.writes == []
    assert b"registration" not in CODECS["streams"][0](c.stores.streams["s"])


def test_an_orphan_registration_replayed_later_does_not_take_the_stream_over() -> None:
    """A batch lost after ``registered`` was acked but before the stream's record leaves a
    genuine, authenticated orphan (seller1's registration R1). If R1 is not accepted again on
    the replay (its seller rotated keys meanwhile, the operators lowered a quota or a size
    limit), the id is free and another registration R2 (here seller2's) is accepted: the
    ``registered`` changelog now holds two genuine records for one key. Whoever may append to
    the changelog (the threat docs/protocol.md §3 is about) appends R1's record again: after the
    next restart, R2's stream is put together with R1's registration — another seller, other
    terms. Before #32 no record ever paired one registration with another's state."""
    c = market_core("seller1", "seller2", now=NOW)
    before = _snapshot(c)
    assert c.handle(T.registrations, registration("s")).status == "accepted"  # R1, seller1
    after = _snapshot(c)
    orphan = CODECS["registered"][0](after["registered"]["s"])  # the bytes the market MAC'd
    durable = {n: after[n] for n in after} | {"streams": before["streams"]}
    restarted = MarketCore(_read_back(durable), TEST_KEYS, T, clock=lambda: NOW + 5)
    # R1 is not replayed (refused on the replay), and seller2 takes the free id
    r2 = registration("s", seller_id="seller2", cap=8.0)
    assert restarted.handle(T.registrations, r2).status == "accepted"
    assert restarted.stores.registered["s"].registration.seller_id == "seller2"
    assert restarted.handle(T.values, value("s", "v0", [1.0, 2.0, 3.0], seller_id="seller2",
                                            published_at_ms=NOW)).status == "accepted"  # fmt: skip
    # the orphan's genuine record appended again; the worker restarts from the changelogs
    tables = _snapshot(restarted)
    tables["registered"]["s"] = CODECS["registered"][1](orphan)
    again = MarketCore(_read_back(tables), TEST_KEYS, T, clock=lambda: NOW + 10)
    # the record names R2 (``registered_sha256``), the store now R1: the pair is refused, so
    # seller1 cannot publish into seller2's stream, and nothing is applied to it (its events
    # are answered ``internal_error`` and logged; the census and the ledger skip the stream)
    theft = again.handle(T.values, value("s", "v1", [9.0, 9.0, 9.0], published_at_ms=NOW))
    assert (theft.status, theft.reason) == ("rejected", "internal_error")
    with pytest.raises(InconsistentStream, match="another registration"):
        again.streams.find("s")
    assert again.handle(T.registrations, r2).reason == "internal_error"
    assert again.handle(T.registrations, registration("t")).status == "accepted"  # census ok
    assert ledger(again.stores, TEST_KEYS)["unserved"] == ["s"]
