"""Random batches lost, or committed without their outputs, and replayed (#39).

A batch's state counts wholly or not at all (its partition's checkpoint commits it:
``streams/worker/recovery.py``), so a worker that dies leaves one of two states: the batch lost
(the stores as before it: a crash before its checkpoint) or the batch committed but its outputs
never sent (a crash after its checkpoint). The worker that takes over replays the events from
the positions the last checkpoint proves. A batch of values and purchases on a ``window`` or
an ``event`` stream is applied, one of the two states kept, and replayed on a restarted core:

* lost, in its own order, the replay ends in the state the batch would have left and sends the
  very releases it would have sent (noise is a pure function of the request);
* lost, values first or purchases first (the two travel on different topics), the replay is a
  valid history of its own: every retained value's loss, and every privacy window's sum, is
  what the releases actually sent spent, within the cap; each buyer holds and paid for exactly
  the purchases it was told of; a release of one value at one level is always the same numbers;
  and each holder received every retained value at its level, or was told it was withheld;
* committed, the replay sends every purchase's outcome again byte for byte, charges nobody
  again and ingests no value twice.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from market.privacy_units import cap_of, spend_of
from streams.core import MarketCore, Stores
from streams.wire.events import (
    INBOX_EVENT,
    DeliveriesWithheld,
    PurchaseFulfilled,
    ValueReleased,
)
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS, market_core, purchase, registration, value

T = Topics("t")
NOW = 10**12
W = 60_000
BUYERS = ("x", "y", "z")
KINDS: dict[str, dict[str, Any]] = {
    "window": {
        "steps": [0.5, 1.0],
        "cap": 1.0,
        "retain_last": 2,
        "privacy_unit": "window",
        "window": {"duration_ms": W, "cap": 1.5},
    },
    "event": {"steps": [0.5, 1.0, 2.0], "cap": 2.0, "retain_last": 2},
}
Event = tuple[str, bytes]
PUBLISHED: dict[str, int] = {}
"""Each value id's publication time (its privacy window), as the scenarios draw them."""


def _events(rng: np.random.Generator, kind: str, n: int, tag: str) -> list[Event]:
    """``n`` random values and purchases (values may fall in this window or the next)."""
    levels = KINDS[kind]["steps"]
    out: list[Event] = []
    for i in range(n):
        if rng.random() < 0.5:
            at = NOW - NOW % W + int(rng.choice([0, W]))
            vals = [float(rng.integers(-5, 6)) for _ in range(3)]
            PUBLISHED[f"{tag}v{i}"] = at  # the same in every run of one seed
            out.append((T.values, value("s", f"{tag}v{i}", vals, published_at_ms=at)))
        else:
            buyer, level = str(rng.choice(BUYERS)), float(rng.choice(levels))
            out.append(
                (
                    T.purchases,
                    purchase("s", buyer, f"{tag}p{i}", target_level=level, requested_at_ms=NOW),
                )
            )
    return out


def _start(rng: np.random.Generator, kind: str) -> tuple[MarketCore, list[Any]]:
    c = market_core("seller1", *BUYERS, now=NOW)
    assert c.handle(T.registrations, registration("s", **KINDS[kind])).status == "accepted"
    return c, [c.handle(t, raw) for t, raw in _events(rng, kind, 4, "a")]


def _stores(c: MarketCore) -> dict[str, dict[str, Any]]:
    return copy.deepcopy({n: dict(getattr(c.stores, n)) for n in vars(c.stores)})


def _restarted(tables: dict[str, dict[str, Any]]) -> MarketCore:
    """A restarted worker over the stores a crash left (copied)."""
    return MarketCore(Stores(**copy.deepcopy(tables)), TEST_KEYS, T, clock=lambda: NOW)


def _record(c: MarketCore) -> dict[str, Any]:
    return c.stores.streams["s"].model_dump()


def _run(c: MarketCore, events: list[Event]) -> list[Any]:
    return [c.handle(t, raw) for t, raw in events]


def _lose(c: MarketCore, batch: list[Event]) -> None:
    """Apply ``batch`` as one worker batch whose outputs are never sent (a record keeps its
    outcome's bytes until a later batch: :meth:`Records.settle`)."""
    with c.batch():
        _run(c, batch)


def _inbox(outcomes: list[Any]) -> list[Any]:
    return [
        INBOX_EVENT.validate_json(o.value)
        for oc in outcomes
        for o in oc.outputs
        if o.topic.startswith(T.inbox(""))
    ]


def _releases(events: list[Any]) -> dict[tuple[str, str, float], list[float]]:
    """(buyer, value, level) → numbers, of every release sent."""
    out: dict[tuple[str, str, float], list[float]] = {}
    for e in events:
        if isinstance(e, PurchaseFulfilled | ValueReleased):
            out |= {(e.buyer_id, r.value_id, r.level): r.values for r in e.releases}
    return out


def _scenario(seed: int) -> tuple[str, list[Event], list[Event], list[Event]]:
    rng = np.random.default_rng(seed)
    kind = str(rng.choice(sorted(KINDS)))
    batch = _events(rng, kind, int(rng.integers(2, 6)), "b")
    after = _events(rng, kind, 3, "c")
    return kind, batch, after, [e for e in batch if e[0] == T.values]


@pytest.mark.parametrize("seed", range(40))
def test_a_batch_lost_and_replayed_in_its_order_ends_as_if_never_lost(seed: int) -> None:
    kind, batch, after, _ = _scenario(seed)
    clean, early = _start(np.random.default_rng(seed), kind)
    sent_clean = _inbox(_run(clean, batch + after))
    _check_history(clean, _inbox(early) + sent_clean, KINDS[kind])  # the checks hold uncrashed
    c, _ = _start(np.random.default_rng(seed), kind)
    before = _stores(c)
    _lose(c, batch)  # nothing of it was sent, nothing of it counts
    restarted = _restarted(before)
    sent = _inbox(_run(restarted, batch + after))
    assert _releases(sent) == _releases(sent_clean)
    assert _record(restarted) == _record(clean)
    assert {k: (v.status, v.digest, v.reason) for k, v in restarted.stores.purchases.items()} == {
        k: (v.status, v.digest, v.reason) for k, v in clean.stores.purchases.items()
    }


def _check_history(c: MarketCore, sent: list[Any], cap: dict[str, Any]) -> None:
    """The stream's record says what the releases ``sent`` spent, and who holds what."""
    st = c.stores.streams["s"]
    rel = _releases(sent)
    loss: dict[str, float] = {}
    for (_, vid, level), _nums in rel.items():
        loss[vid] = max(loss.get(vid, 0.0), level)
    for e in st.window:
        assert e.level == loss.get(e.value_id, 0.0), (e, loss)
    if "window" in cap:
        for k, total in st.window_spent_nano.items():
            spent = sum(spend_of(lv) for vid, lv in loss.items() if PUBLISHED[vid] // W == k)
            assert total == spent <= cap_of(cap["window"]["cap"])
    fulfilled = {(e.buyer_id, e.purchase_id): e for e in sent if isinstance(e, PurchaseFulfilled)}
    for buyer in BUYERS:
        mine = [e for (b, _), e in fulfilled.items() if b == buyer]
        holder = st.holders.get(buyer)
        assert (holder.paid_minor if holder else 0) == sum(e.price_minor for e in mine)
        assert (holder.level if holder else 0.0) == max((e.level_after for e in mine), default=0)
    withheld = {
        (e.buyer_id, vid) for e in sent if isinstance(e, DeliveriesWithheld) for vid in e.value_ids
    }
    for buyer, h in st.holders.items():
        for e in st.window:
            assert (buyer, e.value_id, h.level) in rel or (buyer, e.value_id) in withheld


@pytest.mark.parametrize("order", ["values first", "purchases first"])
@pytest.mark.parametrize("seed", range(40))
def test_a_batch_lost_and_replayed_in_another_order_is_a_valid_history(
    seed: int, order: str
) -> None:
    kind, batch, after, values = _scenario(seed)
    purchases = [e for e in batch if e[0] == T.purchases]
    c, early = _start(np.random.default_rng(seed), kind)
    before = _stores(c)
    _lose(c, batch)
    restarted = _restarted(before)
    replay = values + purchases if order == "values first" else purchases + values
    sent = _inbox(early) + _inbox(_run(restarted, replay + after))
    clean, _ = _start(np.random.default_rng(seed), kind)
    numbers: dict[tuple[str, float], list[float]] = {}
    for (_, vid, lv), nums in (
        _releases(_inbox(_run(clean, batch + after))) | _releases(sent)
    ).items():
        assert numbers.setdefault((vid, lv), nums) == nums  # one value, one level: one release
    _check_history(restarted, sent, KINDS[kind])


@pytest.mark.parametrize("seed", range(40))
def test_a_batch_lost_while_replaying_uncommitted_events_counts_each_value_once(seed: int) -> None:
    """The first events were applied and committed, but their input positions were not yet
    (a checkpoint of positions follows the offsets Faust commits); a restarted worker replays
    them with the next ones in one batch, lost (its new values may evict earlier ones); the next
    worker replays it all again. Every value is counted once, as in a run never lost, and what
    is sent is a valid history."""
    kind, batch, after, _ = _scenario(seed)
    rng = np.random.default_rng(seed)
    c = market_core("seller1", *BUYERS, now=NOW)
    assert c.handle(T.registrations, registration("s", **KINDS[kind])).status == "accepted"
    early = _events(rng, kind, 4, "a")
    sent = _inbox(_run(c, early))
    lost = _restarted(_stores(c))  # a restart
    before = _stores(lost)
    _lose(lost, early + batch)
    restarted = _restarted(before)
    sent += _inbox(_run(restarted, early + batch + after))
    clean, _ = _start(np.random.default_rng(seed), kind)
    _run(clean, batch + after)
    ingested = restarted.stores.streams["s"].values_ingested
    assert ingested == clean.stores.streams["s"].values_ingested
    numbers: dict[tuple[str, float], list[float]] = {}
    for (_, vid, lv), nums in _releases(sent).items():
        assert numbers.setdefault((vid, lv), nums) == nums  # one value, one level: one release
    _check_history(restarted, sent, KINDS[kind])


@pytest.mark.parametrize("seed", range(40))
def test_a_batch_committed_without_its_outputs_is_answered_again_and_charged_once(
    seed: int,
) -> None:
    """The batch's state was committed but its outputs never sent: the replay answers every
    purchase with the very bytes it would have sent, charges nobody again and counts no value
    twice; what is sent from then on is what a run never interrupted sends."""
    kind, batch, after, _ = _scenario(seed)
    clean, _ = _start(np.random.default_rng(seed), kind)
    first = _run(clean, batch)
    sent_clean = _inbox(_run(clean, after))
    c, _ = _start(np.random.default_rng(seed), kind)
    _lose(c, batch)  # applied, committed: its outputs lost
    restarted = _restarted(_stores(c))
    again = _run(restarted, batch)
    for one, two in zip(first, again, strict=True):
        if one.kind == "purchase" and one.status == "fulfilled":  # the very bytes again
            assert two.status == "duplicate"
            assert [o.value for o in two.outputs if o.topic.startswith(T.inbox(""))] == [
                o.value for o in one.outputs if o.topic.startswith(T.inbox(""))
            ]
        elif one.kind == "purchase":  # refused again, for the same reason
            assert two.status in ("duplicate", "rejected") and two.reason == one.reason
    assert _releases(_inbox(_run(restarted, after))) == _releases(sent_clean)
    assert _record(restarted) == _record(clean)


def test_a_purchase_committed_whose_answer_was_lost_is_answered_again_and_charged_once() -> None:
    """The simplest case of the above: the purchase is a duplicate, its kept bytes are sent
    again, and the buyer holds (and paid for) the level once."""
    c = market_core("seller1", "alice", now=NOW)
    assert c.handle(T.registrations, registration("s")).status == "accepted"
    for i in range(3):
        c.handle(T.values, value("s", f"v{i}", [1.0 + i, 2.0, 3.0], published_at_ms=NOW))
    raw = purchase("s", "alice", "p1", requested_at_ms=NOW)
    with c.batch():
        first = c.handle(T.purchases, raw)
    assert first.status == "fulfilled"
    restarted = _restarted(_stores(c))
    again = restarted.handle(T.purchases, raw)
    assert again.status == "duplicate" and again.outputs[0].value == first.outputs[0].value
    holder = restarted.stores.streams["s"].holders["alice"]
    assert (holder.purchases, holder.paid_minor) == (1, first.price_minor)
