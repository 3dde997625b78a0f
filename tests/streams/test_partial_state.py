"""A batch whose records are durable but whose streams' records are not, replayed.

The worker acknowledges a batch's records (values' states, purchase outcomes, accounts) before
its streams' records (``streams.worker.batch``; the ``mid_state`` fail point dies in between).
Written in the other order, or all at once, a crash could leave a purchase's charge durable
without its stored outcome, and the replay would charge it again. These tests build the stores
such a crash leaves — the streams table as before the batch, every other table as after it —
and replay the batch on a fresh core (a restarted worker): in its own order it must end in the
state the batch would have left, charging nobody twice and releasing nothing new; in another
order, what it sends must spend each privacy window exactly as the stream's ledger says
(``streams.core.replay.repair``; random batches in ``test_partial_replay.py``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from streams.core import MarketCore, Stores
from streams.wire.events import INBOX_EVENT, PurchaseFulfilled, ValueReleased
from streams.wire.topics import Topics

from .helpers import TEST_KEYS, market_core, purchase, registration, value

T = Topics("t")
NOW = 10**12


def _snapshot(c: MarketCore) -> dict[str, dict[str, Any]]:
    return copy.deepcopy({n: dict(getattr(c.stores, n)) for n in vars(c.stores)})


def _crashed(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> MarketCore:
    """A restarted worker over what a crash between the two sends left durable."""
    tables = {n: dict(after[n]) for n in after} | {"streams": dict(before["streams"])}
    return MarketCore(Stores(**tables), TEST_KEYS, T, clock=lambda: NOW)


def _core(**reg: Any) -> MarketCore:
    c = market_core("seller1", "alice", "bob", now=NOW)
    assert c.handle(T.registrations, registration("s", **reg)).status == "accepted"
    for i in range(3):
        c.handle(T.values, value("s", f"v{i}", [1.0 + i, 2.0, 3.0], published_at_ms=NOW))
    return c


def test_a_purchase_whose_charge_was_lost_is_charged_once_on_replay() -> None:
    c = _core()
    before = _snapshot(c)
    raw = purchase("s", "alice", "p1", requested_at_ms=NOW)  # the next step
    first = c.handle(T.purchases, raw)
    assert first.status == "fulfilled" and first.price_minor == 50
    held = c.stores.streams["s"]
    restarted = _crashed(before, _snapshot(c))
    assert "alice" not in restarted.stores.streams["s"].holders  # the charge was lost
    again = restarted.handle(T.purchases, raw)
    assert again.status == "duplicate" and again.outputs[0].value == first.outputs[0].value
    st = restarted.stores.streams["s"]
    assert st.holders["alice"] == held.holders["alice"]  # level 0.5, paid 50, one purchase
    assert (st.revenue_minor, st.spent) == (held.revenue_minor, held.spent)
    restarted.handle(T.purchases, raw)  # any later copy changes nothing
    assert restarted.stores.streams["s"].holders["alice"].paid_minor == 50
    nxt = restarted.handle(T.purchases, purchase("s", "alice", "p2", requested_at_ms=NOW))
    assert isinstance(INBOX_EVENT.validate_json(nxt.outputs[0].value), PurchaseFulfilled)
    assert (nxt.price_minor, restarted.stores.streams["s"].holders["alice"].level) == (50, 1.0)


def test_a_value_whose_stream_record_was_lost_is_ingested_again() -> None:
    c = _core(retain_last=2)
    c.handle(T.purchases, purchase("s", "bob", "b", requested_at_ms=NOW))  # a holder of 0.5
    before = _snapshot(c)
    raw = value("s", "v3", [9.0, 2.0, 3.0], published_at_ms=NOW)  # evicts v1
    first = c.handle(T.values, raw)
    assert first.status == "accepted"
    restarted = _crashed(before, _snapshot(c))
    again = restarted.handle(T.values, raw)
    assert again.status == "accepted"  # not taken for a resend: its stream never counted it
    assert [e.value_id for e in restarted.stores.streams["s"].window] == ["v2", "v3"]
    delivered = [o.value for o in first.outputs if o.topic == T.inbox("bob")]
    assert [o.value for o in again.outputs if o.topic == T.inbox("bob")] == delivered
    out = restarted.handle(T.purchases, purchase("s", "alice", "a", requested_at_ms=NOW))
    assert out.status == "fulfilled", out.reason  # every window entry has its state


def test_an_increment_whose_stream_record_was_lost_is_added_once() -> None:
    c = market_core("seller1", "alice", now=NOW)
    totals = {"mechanism": "gaussian", "product": "running_totals", "tree_height": 10,
              "steps": [0.5, 1.0], "cap": 1.0, "dimension": 2, "retain_last": 4}  # fmt: skip
    assert c.handle(T.registrations, registration("s", **totals)).status == "accepted"
    c.handle(T.purchases, purchase("s", "alice", "a", requested_at_ms=NOW))
    for i in range(3):
        c.handle(T.values, value("s", f"v{i}", [1.0, 1.0], published_at_ms=NOW))
    before = _snapshot(c)
    raw = value("s", "v3", [1.0, 1.0], published_at_ms=NOW)
    first = c.handle(T.values, raw)
    restarted = _crashed(before, _snapshot(c))
    again = restarted.handle(T.values, raw)
    assert again.status == "accepted" and restarted.stores.streams["s"].next_seq == 4
    total = [o.value for o in first.outputs if o.topic == T.inbox("alice")]
    assert [o.value for o in again.outputs if o.topic == T.inbox("alice")] == total


W = 60_000
ONE_RETAINED: dict[str, Any] = {
    "steps": [0.5, 1.0], "cap": 1.0, "retain_last": 1, "privacy_unit": "window",
    "window": {"duration_ms": W, "cap": 1.0},
}  # fmt: skip


def _released(outcomes: list[Any]) -> set[tuple[str, str, float]]:
    """(buyer, value, level) of every release the outcomes send to an inbox."""
    out: set[tuple[str, str, float]] = set()
    for o in (o for oc in outcomes for o in oc.outputs if o.topic.startswith(T.inbox(""))):
        event = INBOX_EVENT.validate_json(o.value)
        if isinstance(event, PurchaseFulfilled | ValueReleased):
            out |= {(event.buyer_id, r.value_id, r.level) for r in event.releases}
    return out


def test_a_lost_purchase_replayed_after_a_value_spends_the_window_as_sent() -> None:
    """Window cap 1, one value retained: [x buys level 1, value v1] is lost at ``mid_state``
    and replayed values first. What is sent then must spend the window as its ledger says,
    within the cap; x must receive v1 (it holds level 1); y buying v1 later pays for it."""
    c = market_core("seller1", "x", "y", now=NOW)
    assert c.handle(T.registrations, registration("w", **ONE_RETAINED)).status == "accepted"
    c.handle(T.values, value("w", "v0", [1.0, 2.0, 3.0], published_at_ms=NOW))
    before = _snapshot(c)
    bought = purchase("w", "x", "p", target_level=1.0, requested_at_ms=NOW)
    v1 = value("w", "v1", [4.0, 5.0, 6.0], published_at_ms=NOW)
    assert c.handle(T.purchases, bought).status == "fulfilled"
    assert c.handle(T.values, v1).status == "accepted"
    restarted = _crashed(before, _snapshot(c))  # nothing of the batch was sent
    outs = [restarted.handle(T.values, v1), restarted.handle(T.purchases, bought)]
    outs.append(restarted.handle(T.purchases, purchase("w", "y", "q", target_level=1.0,
                                                       requested_at_ms=NOW)))  # fmt: skip
    sent = _released(outs)
    spent: dict[str, float] = {}
    for _, vid, level in sent:
        spent[vid] = max(spent.get(vid, 0.0), level)
    st = restarted.stores.streams["w"]
    assert sum(spent.values()) == st.window_spent[NOW // W] <= 1.0, (sent, st.window_spent)
    assert ("x", "v1", 1.0) in sent, sent  # x holds level 1 after the replay


def test_a_value_a_lost_batch_numbered_and_evicted_is_ingested_when_resent_late() -> None:
    """The lost batch numbered v1 and evicted it; its replay skipped v1 (the broker's consumer
    may), so other values took v1's arrival number. v1's mark names a numbering the stream's
    record never counted: v1 resent is new, not a duplicate."""
    c = _core(retain_last=2)
    before = _snapshot(c)
    raws = [value("s", f"w{i}", [float(i), 2.0, 3.0], published_at_ms=NOW) for i in range(5)]
    for raw in raws:
        assert c.handle(T.values, raw).status == "accepted"
    restarted = _crashed(before, _snapshot(c))
    for raw in raws[1:]:
        assert restarted.handle(T.values, raw).status == "accepted"
    assert restarted.handle(T.values, raws[0]).status == "accepted"
    assert restarted.stores.streams["s"].values_ingested == 3 + 5


@pytest.mark.parametrize("order", ["values first", "purchases first"])
def test_a_counted_value_a_lost_batch_evicted_is_not_ingested_again(order: str) -> None:
    """A worker replaying uncommitted events ingests new values that push out one its stream's
    durable record still counts (v1), and dies at ``mid_state``: v1's mark is durable, the
    record that evicts it is not. The next worker replays the same events (v1 among them, also
    uncommitted); v1 is a duplicate, not a new value, whatever the order (a purchase first
    settles the window, dropping v1 from it). A mark naming the lost batch's numbering would
    read as ahead of the record: v1 would be ingested twice (``values_ingested`` one over)."""
    c = _core(retain_last=2)  # v0, v1, v2 durable, not committed: window [v1, v2]
    raws = [value("s", f"v{i}", [1.0 + i, 2.0, 3.0], published_at_ms=NOW) for i in range(3)]
    lost = MarketCore(Stores(**_snapshot(c)), TEST_KEYS, T, clock=lambda: NOW)  # a restart
    before = _snapshot(lost)
    w0 = value("s", "w0", [7.0, 2.0, 3.0], published_at_ms=NOW)
    assert [lost.handle(T.values, raw).status for raw in [*raws, w0]] == [
        "duplicate", "duplicate", "duplicate", "accepted"]  # fmt: skip
    restarted = _crashed(before, _snapshot(lost))
    bought = purchase("s", "alice", "p", requested_at_ms=NOW)
    if order == "purchases first":
        assert restarted.handle(T.purchases, bought).status == "fulfilled"
    statuses = [restarted.handle(T.values, raw).status for raw in [*raws, w0]]
    assert statuses == ["duplicate", "duplicate", "duplicate", "accepted"], statuses
    st = restarted.stores.streams["s"]
    assert (st.values_ingested, [e.value_id for e in st.window]) == (4, ["v2", "w0"])
