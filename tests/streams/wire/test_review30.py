"""Review #30: answers and refusals attacked by someone who can write every topic.

A refusal of a copy of the victim's bytes, written by a stranger to another topic, is a genuine
market-signed refusal keyed by the victim's digest: a client must not take it for the refusal
of the event it sent. A header without a value (Kafka allows a null header value) must be a
forgery like any other, not a crash of the client reading the inbox.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from streams.clients.client import MarketClient, _Watch
from streams.clients.inbox_reader import InboxReader
from streams.wire.answers import HEADER, AnswerError, answer_header, verify_answer
from streams.wire.events import CatalogEntry, Refusal
from streams.wire.topics import Topics

from .. import helpers
from ..helpers import TEST_KEYS, market_core, purchase, registration

PUB = TEST_KEYS.signing_key.public_key()
T = Topics(helpers.MARKET)


class _Reader:
    """A refusals reader that hands out the records given once."""

    def __init__(self, records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]) -> None:
        self.records = records

    async def poll_records(self, timeout: float = 0.5) -> list[Any]:
        out, self.records = self.records, []
        return out

    async def stop(self) -> None:
        return None


def _client() -> MarketClient:
    """A client that only reads (no producer: nothing is sent)."""
    client = MarketClient.__new__(MarketClient)
    client.topics, client.on_warning = T, lambda _: None
    return client


def _watch_refusals(sent_to: str, raw: bytes, records: list[Any]) -> _Watch:
    async def go() -> _Watch:
        client = _client()
        watch = _Watch(client, PUB, T.inbox("buyer1"), (sent_to, raw), "p1", _Reader(records))  # type: ignore[arg-type]
        watch.sent.add((0, 7 if sent_to == T.values else 3))
        await watch._refusal()
        return watch

    return asyncio.run(go())


def _refusal_records(outputs: Any) -> list[Any]:
    return [(o.key, o.value, list(o.headers)) for o in outputs if o.topic == T.refusals]


def test_a_copy_of_the_bytes_refused_on_another_topic_is_not_the_senders_refusal() -> None:
    core = market_core("seller1", "buyer1")
    core.handle(T.registrations, registration())
    raw = purchase("temp", "buyer1", "p1", target_level=0.5)
    # a stranger reads the purchase off the broker and writes the same bytes to the values topic
    copied = core.handle(T.values, raw, partition=0, offset=7)
    assert copied.status == "rejected"
    assert not [o for o in copied.outputs if T.is_inbox(o.topic)]
    records = _refusal_records(copied.outputs)
    assert records and records[0][0] == hashlib.sha256(raw).hexdigest().encode()
    # genuine and signed for the victim's digest, but it names where the refused copy was read
    refusal = Refusal.model_validate_json(records[0][1])
    assert refusal.source_topic == T.values
    watch = _watch_refusals(T.purchases, raw, records)
    assert watch.refused is None  # the buyer's client does not give up on its purchase
    # the market fulfils the purchase it was sent
    assert core.handle(T.purchases, raw, partition=0, offset=1).status in {"fulfilled", "rejected"}


def test_a_refusal_on_the_topic_and_partition_sent_to_is_taken() -> None:
    core = market_core("seller1")
    core.handle(T.registrations, registration())
    raw = purchase("temp", "nobody", "p1")
    out = core.handle(T.purchases, raw, partition=0, offset=3)
    assert out.reason == "unknown_account"
    records = _refusal_records(out.outputs)
    refusal = Refusal.model_validate_json(records[0][1])
    assert (refusal.source_topic, refusal.source_partition, refusal.source_offset) == (
        T.purchases,
        0,
        3,
    )
    watch = _watch_refusals(T.purchases, raw, records)
    assert watch.refused is not None and watch.refused[1].reason == "unknown_account"

    # the refusal of the same bytes written again by someone else (another offset), or read from
    # another partition, is not this send's
    async def sent_at(partition: int, offset: int) -> _Watch:
        w = _Watch(_client(), PUB, T.inbox("nobody"), (T.purchases, raw), "p1", _Reader(records))  # type: ignore[arg-type]
        w.sent.add((partition, offset))
        await w._refusal()
        return w

    assert asyncio.run(sent_at(0, 4)).refused is None  # the same bytes, another offset
    assert asyncio.run(sent_at(1, 3)).refused is None  # another partition


@pytest.mark.parametrize("bad", [None, b"", b"\x01", 5])
def test_a_header_without_bytes_is_a_forgery_not_a_crash(bad: Any) -> None:
    value = b'{"type":"rejection"}'
    with pytest.raises(AnswerError):
        verify_answer(PUB, "t", "t.inbox.alice", value, [(HEADER, bad)])
    _, head = answer_header(TEST_KEYS.signing_key, "t", "t.inbox.alice", None, value)
    # a null-valued duplicate still makes two headers
    with pytest.raises(AnswerError, match="more than one"):
        verify_answer(PUB, "t", "t.inbox.alice", value, [(HEADER, head), (HEADER, bad)])


def test_only_the_catalog_entries_the_market_signed_name_the_sealing_key() -> None:
    """A stranger copies a seller's registration into a catalog entry naming its own sealing
    key: a client that took it would seal the seller's numbers to the stranger."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from streams.core import MarketCore, Stores
    from streams.core.keys import MarketKeys

    core = market_core("seller1")
    reg = registration()
    out = core.handle(T.registrations, reg, partition=0, offset=0)
    [genuine] = [o for o in out.outputs if o.topic == T.catalog]
    digest = hashlib.sha256(reg).hexdigest()
    assert verify_answer(PUB, T.prefix, T.catalog, genuine.value, list(genuine.headers)) == digest
    # the stranger's market: same code, its own keys, its entry copied onto the real catalog
    evil = MarketKeys(Ed25519PrivateKey.from_private_bytes(b"e" * 32), b"x" * 32)
    other = MarketCore(Stores(), evil, T, clock=lambda: 1_000)
    helpers.open_accounts(other, "seller1")
    copied = registration(market=other.ctx.market)  # signed for it: reg itself is refused there
    assert other.handle(T.registrations, reg).reason == "bad_signature"
    [forged] = [o for o in other.handle(T.registrations, copied).outputs if o.topic == T.catalog]
    unsigned = (b"temp", forged.value, [])
    resigned = (b"temp", forged.value, list(forged.headers))  # signed, by another key
    client = _client()
    got = client.market_entries(
        [unsigned, resigned, (b"temp", genuine.value, list(genuine.headers))], PUB
    )
    assert len(got) == 1 and got[0].market_sealing_key != (
        CatalogEntry.model_validate_json(forged.value).market_sealing_key
    )
    assert got[0] == CatalogEntry.model_validate_json(genuine.value)


def test_the_earlier_answer_to_an_id_is_of_the_same_stream() -> None:
    """A purchase id used again on another stream is another purchase: when the market says a
    resend was ``already_answered``, the earlier answer is the one of this stream's purchase."""
    from streams.wire.events import PurchaseFulfilled, Rejection

    core = market_core("seller1", "buyer1")
    for stream in ("temp", "hum"):
        core.handle(T.registrations, registration(stream))
        core.handle(T.values, helpers.value(stream, "v1", [1.0, 2.0, 3.0]))
    first = purchase("hum", "buyer1", "p1", target_level=0.5)
    inbox = [o for o in core.handle(T.purchases, first).outputs if T.is_inbox(o.topic)]
    other = purchase("temp", "buyer1", "p1", target_level=0.5)  # the same id, another stream
    inbox += [o for o in core.handle(T.purchases, other).outputs if T.is_inbox(o.topic)]
    again = purchase("hum", "buyer1", "p1", target_level=0.5, requested_at_ms=1_001)
    notice = [o for o in core.handle(T.purchases, again).outputs if T.is_inbox(o.topic)]
    assert Rejection.model_validate_json(notice[0].value).reason == "already_answered"
    records = [(o.key, o.value, list(o.headers)) for o in inbox + notice]

    async def go() -> list[Any]:
        client = _client()
        w = _Watch(client, PUB, T.inbox("buyer1"), (T.purchases, again), "p1", None, "hum")
        w.reader = InboxReader(
            lambda _t, _p: _Reader(records),
            client.believe,
            T,
            T.inbox("buyer1"),
            PUB,
            None,
            None,
            lambda _: None,
        )
        return await w._inbox(0.0)

    got = asyncio.run(go())
    [answer] = [e for e in got if isinstance(e, PurchaseFulfilled)]
    assert answer.stream_id == "hum"
