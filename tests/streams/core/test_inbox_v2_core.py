"""A market with v2 inboxes (docs/protocol.md §8.5), at the core: every inbox message goes to
``<p>.inbox`` under the account's route, one record per account and event, sealed and signed
over bytes naming the account; no topic is made per account; an account without a sealing key
is refused, as it could be neither routed nor sealed to."""

from __future__ import annotations

import hashlib

from streams.clients.inbox_reader import routes_of
from streams.core import MarketCore, Stores
from streams.core.outputs import Outcome
from streams.wire.events import INBOX_EVENT, AccountState, PurchaseFulfilled, Sales
from streams.wire.inbox_v2 import InboxMessage, open_record, partition_of
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS, account, party, purchase, registration, value

T = Topics("t", inboxes=2, inbox_partitions=2)
PUB = TEST_KEYS.signing_key.public_key()
SELLER, ALICE, BOB = "sealed-seller", "sealed-alice", "sealed-bob"


def _core() -> MarketCore:
    return MarketCore(Stores(), TEST_KEYS, T, clock=lambda: 5_000)


def _opened(out: Outcome, name: str) -> list[InboxMessage]:
    """The messages of ``out``'s records for ``name``, opened as its reader opens them; every
    record of ``out`` on the inbox topic is checked to sit on its key's partition."""
    (keys,) = routes_of(party(name), T, TEST_KEYS.sealing_public_b64).values()
    got: list[InboxMessage] = []
    for o in out.outputs:
        assert not T.is_inbox(o.topic), "a topic per account"
        if o.topic != T.shared_inbox:
            continue
        assert o.key is not None and o.partition == partition_of(o.key.decode(), 2)
        assert o.headers == ()  # nothing outside the seal
        if o.key == keys.route.encode():
            got += open_record(keys, PUB, "t", name, o.value)
    return got


def test_accounts_are_answered_on_the_one_inbox_topic_under_their_routes() -> None:
    core = _core()
    for name in (SELLER, ALICE):
        raw = account(name)
        out = core.handle(T.accounts, raw)
        assert out.status == "accepted" and out.create_topics == []
        (m,) = _opened(out, name)
        assert m.request == hashlib.sha256(raw).hexdigest()
        state = INBOX_EVENT.validate_json(m.value)
        assert isinstance(state, AccountState) and state.account_id == name
    assert T.specs()[-1].name == "t.inbox" and T.specs()[-1].partitions == 2
    assert T.published_spec("t.inbox") == T.specs()[-1]  # made again if it is lost
    assert (
        T.published_spec("t.inbox.x") is not None and Topics("t").published_spec("t.inbox") is None
    )


def test_an_account_without_a_sealing_key_is_refused_with_what_to_do() -> None:
    out = _core().handle(T.accounts, account("plain"))
    assert (out.status, out.reason) == ("rejected", "encryption_required")
    assert not [o for o in out.outputs if o.topic == T.shared_inbox]
    assert [o.topic for o in out.outputs].count(T.refusals) == 1


def test_a_purchase_makes_one_record_for_the_buyer_and_one_for_the_seller() -> None:
    core = _core()
    for name in (SELLER, ALICE, BOB):
        core.handle(T.accounts, account(name))
    core.handle(T.registrations, registration("temp", seller_id=SELLER))
    core.handle(T.values, value("temp", "v0", [1.0, 2.0, 3.0], seller_id=SELLER))
    raw = purchase("temp", ALICE, "p1", target_level=1.0)
    out = core.handle(T.purchases, raw)
    assert out.status == "fulfilled", out.reason
    assert len([o for o in out.outputs if o.topic == T.shared_inbox]) == 2
    (answer,) = _opened(out, ALICE)
    assert answer.request == hashlib.sha256(raw).hexdigest() and answer.key == b"p1"
    assert isinstance(INBOX_EVENT.validate_json(answer.value), PurchaseFulfilled)
    (sale,) = _opened(out, SELLER)
    assert sale.request is None and isinstance(INBOX_EVENT.validate_json(sale.value), Sales)
    assert _opened(out, BOB) == []


def test_a_rotation_away_from_every_sealing_key_is_refused() -> None:
    core = _core()
    core.handle(T.accounts, account(ALICE))
    new = party("no-sealing")
    me = party(ALICE)
    rotation = me.rotate_to(new, core.ctx.market, 2).model_dump_json().encode()
    out = core.handle(T.accounts, rotation)
    assert (out.status, out.reason) == ("rejected", "encryption_required")
