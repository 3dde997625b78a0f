"""A numbered value batch sent again after more values than a stream keeps marks for is
answered, by a live worker, with the bytes of its first answer (docs/protocol.md §6.4.1)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from streams.clients.client import MarketClient, TopicReader
from streams.core.replay.records import Caps
from streams.wire.events import Rejection, ValuesAccepted

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


def test_a_numbered_batch_resent_past_the_marks_gets_its_first_answers_bytes(
    market: Market,
) -> None:
    market.start_worker()
    market.open_accounts("seller1")

    async def go(c: MarketClient) -> tuple[ValuesAccepted, bytes]:
        assert not isinstance(await c.register(FIELDS), Rejection)
        learn = await c.publish_batch(c.value_batch("s", [("v0", [0.0, 1.0], None)]))
        assert isinstance(learn, ValuesAccepted) and learn.next_batch_seq == 1, learn
        first = await c.sealed(c.value_batch("s", [("a", [1.0, 1.0], None)]))
        assert first.batch_seq == 1
        got = await c.publish_batch(first)
        assert isinstance(got, ValuesAccepted), got
        marks = Caps().marks
        for k in range(marks // BIG + 1):  # more values than the stream keeps marks for
            rows = [(f"b{k}-{i}", [1.0, float(i)], None) for i in range(BIG)]
            out = await c.publish_batch(c.value_batch("s", rows))
            assert isinstance(out, ValuesAccepted) and out.batch_seq == k + 2, out
            assert {o.status for o in out.outcomes} == {"accepted"}
        again = await c.publish_batch(first)  # the same bytes, sealed once
        assert isinstance(again, ValuesAccepted), again
        return again, first.model_dump_json().encode()

    async def run() -> tuple[ValuesAccepted, bytes]:
        async with MarketClient(
            market.broker.bootstrap, market.topics, party=party("seller1")
        ) as c:
            return await go(c)

    again, sent = asyncio.run(run())
    assert again.batch_seq == 1 and [o.status for o in again.outcomes] == ["accepted"]
    r = hashlib.sha256(sent).digest()
    answers = asyncio.run(_answers_bound_to(market, r))
    assert len(answers) == 2 and answers[0] == answers[1]  # value and signature header


async def _answers_bound_to(market: Market, r: bytes) -> list[tuple[bytes, bytes]]:
    """The seller's inbox records bound to the request hash ``r``: (value, answer header)."""
    reader = TopicReader(market.broker.bootstrap, market.topics.inbox("seller1"))
    await reader.start(wait=30)
    found: list[tuple[bytes, bytes]] = []
    try:
        for _ in range(50):
            batch = await reader.poll_records(0.5)
            for _, raw, headers in batch:
                sig = dict(headers).get("emarket-answer") or b""
                if sig.endswith(r):
                    found.append((raw, sig))
            if not batch and found:
                break
    finally:
        await reader.stop()
    return found
