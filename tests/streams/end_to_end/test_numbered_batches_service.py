"""A numbered value batch sent again after more values than a stream keeps marks for is
answered, by a live worker, with the bytes of its first answer (docs/protocol.md §6.4.1)."""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

from streams.clients.client import MarketClient, TopicReader
from streams.core.replay.records import Caps
from streams.wire.events import Rejection, ValueBatch, ValuesAccepted

from ..conftest import Market
from ..helpers import party

pytestmark = [pytest.mark.broker, pytest.mark.slow]

FIELDS = {
    "stream_id": "s",
    "mechanism": "laplace",
    "sensitivity": 1.0,
    "dimension": 2,
    "steps": [0.5, 1.0],
    "cap": 1.0,
    "retain_last": 1,
    "pricing": {"kind": "linear_level", "rate_per_level": 100},
    "currency": "EUR",
}
BIG = 1_000
LAST = Caps().marks // BIG + 2
"""The number of the last batch: more values than the stream keeps marks for."""


def test_a_numbered_batch_resent_past_the_marks_gets_its_first_answers_bytes(
    market: Market,
) -> None:
    market.start_worker()
    market.open_accounts("seller1")

    async def go(c: MarketClient) -> ValueBatch:
        assert not isinstance(await c.register(FIELDS), Rejection)
        learn = await c.publish_batch(c.value_batch("s", [("v0", [0.0, 1.0], None)]))
        assert isinstance(learn, ValuesAccepted) and learn.next_batch_seq == 1, learn
        first = await c.sealed(c.value_batch("s", [("a", [1.0, 1.0], None)]))
        assert first.batch_seq == 1
        got = await c.publish_batch(first)
        assert isinstance(got, ValuesAccepted), got
        for k in range(LAST - 1):  # more values than the stream keeps marks for
            rows = [(f"b{k}-{i}", [1.0, float(i)], None) for i in range(BIG)]
            out = await c.publish_batch(c.value_batch("s", rows))
            assert isinstance(out, ValuesAccepted) and out.batch_seq == k + 2, out
            assert {o.status for o in out.outcomes} == {"accepted"}
        return first

    async def restarted(c: MarketClient, first: ValueBatch) -> None:
        """A new process of the seller: learns where the numbering stands, resends the first."""
        await c.signing_market()
        learn = await c.publish_batch(c.value_batch("s", [("new0", [0.0, 1.0], None)]))
        assert isinstance(learn, ValuesAccepted), learn
        assert (learn.next_batch_seq, learn.missing_batch_seqs) == (LAST + 1, [])
        out = await c.publish_batch(c.value_batch("s", [("new1", [0.0, 1.0], None)]))
        assert isinstance(out, ValuesAccepted) and out.batch_seq == LAST + 1, out
        await c.send(c.topics.values, "s", first.model_dump_json().encode())  # the same bytes

    async def run() -> bytes:
        seller = party("seller1")
        async with MarketClient(market.broker.bootstrap, market.topics, party=seller) as c:
            first = await go(c)
        async with MarketClient(market.broker.bootstrap, market.topics, party=seller) as c:
            await restarted(c, first)
        return first.model_dump_json().encode()

    sent = asyncio.run(run())
    answers = asyncio.run(_answers_bound_to(market, hashlib.sha256(sent).digest()))
    assert answers[0] == answers[1]  # value and signature header
    answer = ValuesAccepted.model_validate_json(answers[1][0])
    assert answer.batch_seq == 1 and [o.status for o in answer.outcomes] == ["accepted"]


async def _answers_bound_to(market: Market, r: bytes) -> list[tuple[bytes, bytes]]:
    """The first two of the seller's inbox records bound to the request hash ``r``: (value,
    answer header)."""
    reader = TopicReader(market.broker.bootstrap, market.topics.inbox("seller1"))
    await reader.start(wait=30)
    found: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + 60
    try:
        while len(found) < 2 and time.monotonic() < deadline:
            for _, raw, headers in await reader.poll_records(0.5):
                sig = dict(headers).get("emarket-answer") or b""
                if sig.endswith(r):
                    found.append((raw, sig))
    finally:
        await reader.stop()
    return found
