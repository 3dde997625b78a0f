"""A stream's registration is stored apart, once (``streams.core.stream_store``, "Registered
apart"): the record rewritten after every event carries only what changes; a registration
whose batch was lost is decided afresh, and the changelogs read back through their codecs give
the same stream."""

from __future__ import annotations

import copy
import json
from typing import Any

from streams.core import MarketCore, Stores
from streams.core.codecs import CODECS
from streams.core.state import StreamRecord, StreamState
from streams.wire.events import StreamRegistration
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS, market_core, open_accounts, purchase, registration, value

T = Topics("t")
NOW = 10**12


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
    return Stores(
        **{
            n: {k: CODECS[n][1](CODECS[n][0](v)) for k, v in recs.items()}
            for n, recs in tables.items()
        }
    )


def _figures(c: MarketCore) -> dict[str, Any]:
    """What stream ``s`` holds, as the ledger reports it."""
    with c.streams.event():
        st = c.streams.load("s").state
    return {
        "holders": {b: h.model_dump() for b, h in st.holders.items()},
        "window": [e.value_id for e in st.window],
        "revenue": st.revenue_minor,
        "spent": st.spent_nano,
        "values": st.values_ingested,
        "registered": st.registered,
    }


def _buy(c: MarketCore, buyer: str, pid: str) -> Any:
    out = c.handle(T.purchases, purchase("s", buyer, pid, requested_at_ms=NOW))
    assert out.status == "fulfilled", out.reason
    return out


def test_the_record_written_after_each_event_carries_no_registration() -> None:
    streams, registered = Written("streams"), Written("registered")
    c = market_core(
        "seller1", "alice", "bob", now=NOW, stores=Stores(streams=streams, registered=registered)
    )
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


def test_a_registration_whose_batch_was_lost_is_decided_afresh() -> None:
    """A batch counts wholly or not at all: one lost after its records were acknowledged but
    before its checkpoint leaves the stores as they were. The replay accepts the registration
    again (its catalog entry was never sent), and resends are answered as always."""
    c = market_core("seller1", now=NOW)
    durable = _snapshot(c)
    first = c.handle(T.registrations, registration("s"))
    assert first.status == "accepted" and "s" in _snapshot(c)["registered"]
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
    assert (
        restarted.handle(T.purchases, purchase("s", "bob", "p1", requested_at_ms=NOW))
        .outputs[0]
        .value
        == _buy(c, "bob", "p1").outputs[0].value
    )
    assert _figures(restarted) == _figures(c)
    open_accounts(restarted, "seller2")  # the census recounts the streams from their records
    assert (
        restarted.handle(T.registrations, registration("s2", seller_id="seller2")).status
        == "accepted"
    )
