"""A replayed copy of someone's quote or purchase adds nothing to their inbox nor spends their
allowance (issue #40): anyone who reads the purchases topic holds those signed bytes.

The red team had a 30-day-old quote answered, 100 replays of alice's quote put 101 messages in
her inbox and keep her quote allowance empty, and 200 replays of a purchase put 189 signed
messages in the buyer's inbox.
"""

from __future__ import annotations

import hashlib
from typing import Any

from streams.core import MarketCore, Stores
from streams.core.context import Limits
from streams.core.replay.quotes import QUOTE_MAX_AGE_MS, AnsweredQuotes
from streams.wire.events import INBOX_EVENT, PurchaseFulfilled, QuoteAnswer
from streams.wire.topics import DAY_MS, Topics

from ..helpers import TEST_KEYS, open_accounts, purchase, quote, registration, value

T = Topics("t")


def new_core(now: list[int], stores: Stores | None = None, **limits: Any) -> MarketCore:
    c = MarketCore(stores or Stores(), TEST_KEYS, T, clock=lambda: now[0], limits=Limits(**limits))
    open_accounts(c, "seller1", "alice")
    c.handle(T.registrations, registration("temp"))
    return c


def to_inbox(out: Any, who: str = "alice") -> list[Any]:
    return [INBOX_EVENT.validate_json(o.value) for o in out.outputs if o.topic == T.inbox(who)]


def test_a_quote_signed_31_days_ago_is_refused_and_not_in_the_buyers_inbox() -> None:
    now = [1_000 + 31 * DAY_MS]
    c = new_core(now)
    out = c.handle(T.purchases, quote("temp", "alice", "old", requested_at_ms=1_000))
    assert (out.status, out.reason) == ("rejected", "request_too_old")
    assert to_inbox(out) == []  # a stale copy may be anyone's: operators and refusals only
    assert "new quote id" in out.outputs[0].value.decode()
    ahead = c.handle(T.purchases, quote("temp", "alice", "ahead", requested_at_ms=now[0] + DAY_MS))
    assert (ahead.status, ahead.reason) == ("rejected", "request_from_the_future")
    fresh = c.handle(T.purchases, quote("temp", "alice", "q", requested_at_ms=now[0] - 1_000))
    assert fresh.status == "answered"


def test_100_replays_of_a_quote_answer_it_once_and_leave_the_allowance() -> None:
    now = [1_000]
    c = new_core(now, max_quotes_per_minute=3)
    outs = [c.handle(T.purchases, quote("temp", "alice", "q1")) for _ in range(101)]
    answers = [ev for o in outs for ev in to_inbox(o)]
    assert len(answers) == 1 and isinstance(answers[0], QuoteAnswer)
    assert all(
        (o.status, o.reason, o.outputs) == ("duplicate", "already_answered", []) for o in outs[1:]
    )
    more = [c.handle(T.purchases, quote("temp", "alice", f"q{i}")).status for i in (2, 3)]
    assert more == ["answered", "answered"]  # her allowance is hers


def test_a_full_memory_of_quotes_refuses_what_it_forgot() -> None:
    now = [10_000]
    memory = AnsweredQuotes(lambda: now[0], cap=2)
    assert memory.admit("a", "q1", 9_000) and memory.admit("a", "q2", 9_500)
    assert memory.admit("a", "q3", 9_800)  # q1 is forgotten: nothing at or before 9,000 passes
    assert not memory.admit("a", "q3", 9_800)
    try:
        memory.admit("a", "q1", 9_000)
    except Exception as exc:
        assert getattr(exc, "reason", None) == "request_too_old"
    else:
        raise AssertionError("a forgotten quote was admitted again")
    now[0] += QUOTE_MAX_AGE_MS + 1_000  # all too old now: forgotten, and refused by age
    assert memory.admit("a", "q9", now[0]) and len(memory) == 1


def test_50_replays_of_an_answered_purchase_add_nothing_to_the_inbox() -> None:
    now = [1_000]
    c = new_core(now)
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    first = c.handle(T.purchases, purchase("temp", "alice", "p"))
    assert first.status == "fulfilled"
    for _ in range(50):
        now[0] += 1_000  # 50 s of replays: five answer intervals
        out = c.handle(T.purchases, purchase("temp", "alice", "p"))
        assert (out.status, out.reason, out.outputs) == ("duplicate", "already_answered", [])
    # her own client in a new process signs the purchase anew (another request time): it is
    # answered once (the outcome again); copies of that resend add nothing either
    anew = purchase("temp", "alice", "p", requested_at_ms=2_000)
    again = c.handle(T.purchases, anew)
    assert len(to_inbox(again)) == 1 and again.outputs[0].value == first.outputs[0].value
    assert all(c.handle(T.purchases, anew).outputs == [] for _ in range(50))
    refused = c.handle(T.purchases, purchase("temp", "alice", "p2", max_price=0))
    assert refused.status == "rejected"
    for _ in range(50):
        now[0] += 1_000
        out = c.handle(T.purchases, purchase("temp", "alice", "p2", max_price=0))
        assert out.outputs == []
    assert c.stores.streams["temp"].revenue_minor == 50


def test_the_buyers_resend_of_an_unanswered_purchase_gets_its_answer() -> None:
    """Unanswered: the batch that decided it died before its outputs were sent, or its inbox
    was lost and made again since."""
    now = [1_000]
    stores = Stores()
    c = new_core(now, stores)
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    with c.batch():
        first = c.handle(T.purchases, purchase("temp", "alice", "p"))
    restarted = new_core(now, stores)  # the outputs were never sent
    with restarted.batch():
        again = restarted.handle(T.purchases, purchase("temp", "alice", "p"))
    (ev,) = to_inbox(again)
    assert isinstance(ev, PurchaseFulfilled) and again.outputs[0].value == first.outputs[0].value
    now[0] += 60_000
    assert restarted.handle(T.purchases, purchase("temp", "alice", "p")).outputs == []
    now[0] += 1_000
    restarted.ctx.records.inboxes_remade([T.inbox("alice")])  # its answer is gone
    now[0] += 1_000
    remade = restarted.handle(T.purchases, purchase("temp", "alice", "p"))
    (ev,) = to_inbox(remade)
    assert isinstance(ev, PurchaseFulfilled) and remade.outputs[0].value == first.outputs[0].value
    assert stores.streams["temp"].revenue_minor == 50


def test_an_already_answered_notice_names_the_answer_it_stands_for() -> None:
    """A resend signed anew, after the id was used again with other terms, is told which
    earlier answer is its own (docs/protocol.md §12.4): the fulfilment by the digest of its
    bytes, a refusal by its code; never the refusal of the other request."""
    now = [1_000]
    c = new_core(now)
    c.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    first = c.handle(T.purchases, purchase("temp", "alice", "p"))
    sent = next(o.value for o in first.outputs if o.topic == T.inbox("alice"))
    reused = c.handle(T.purchases, purchase("temp", "alice", "p", max_price=10**5))
    assert reused.reason == "idempotency_key_reused"
    now[0] += 1_000
    again = to_inbox(c.handle(T.purchases, purchase("temp", "alice", "p", requested_at_ms=2_000)))
    assert len(again) == 1 and again[0].reason == "already_answered", again
    assert again[0].details["answer_sha256"] == hashlib.sha256(sent).hexdigest()
    c.handle(T.purchases, purchase("temp", "alice", "r", max_price=0))
    c.handle(T.purchases, purchase("temp", "alice", "r", max_price=1))
    now[0] += 1_000
    out = c.handle(T.purchases, purchase("temp", "alice", "r", max_price=0, requested_at_ms=2_000))
    notice = to_inbox(out)
    assert [ev.reason for ev in notice] == ["already_answered"], notice
    assert notice[0].details["answer_reason"] == "price_too_high"
