"""A seller's values gathered into batches (streams/clients/batching.py), by the library and by
``publish --file``, against a live worker: fewer records, every value answered on its own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from streams.clients.batching import ValueBatcher
from streams.clients.client import MarketClient, TopicReader
from streams.wire.events import MAX_BATCH, Rejection

from ..conftest import Market
from ..helpers import party
from .test_cli import cli

FIELDS = {
    "stream_id": "s",
    "mechanism": "laplace",
    "sensitivity": 1.0,
    "dimension": 2,
    "steps": [0.5, 1.0],
    "cap": 1.0,
    "retain_last": 4,
    "pricing": {"kind": "linear_level", "rate_per_level": 100},
    "currency": "EUR",
}


def test_a_batcher_refuses_sizes_the_protocol_does_not_allow() -> None:
    for size in (0, MAX_BATCH + 1):  # checked before the client is used
        with pytest.raises(ValueError, match=f"max_values must be 1 to {MAX_BATCH}"):
            ValueBatcher(None, "s", max_values=size)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_delay"):
        ValueBatcher(None, "s", max_delay=-1.0)  # type: ignore[arg-type]


async def _records(market: Market, stream: str) -> int:
    """Records on the values topic keyed by ``stream``: one per batch sent."""
    reader = TopicReader(market.broker.bootstrap, market.topics.values)
    await reader.start()
    try:
        count = 0
        while batch := await reader.poll(1.0):
            count += sum(1 for key, _ in batch if key == stream.encode())
        return count
    finally:
        await reader.stop()


@pytest.mark.broker
@pytest.mark.slow
def test_values_go_out_in_batches_each_answered_on_its_own(market: Market, tmp_path: Path) -> None:
    market.start_worker()
    market.open_accounts("seller1")

    async def library(c: MarketClient) -> dict[str, object]:
        for sid in ("s", "d", "w"):
            assert not isinstance(await c.register({**FIELDS, "stream_id": sid}), Rejection)
        # 64 values published at once by as many tasks share batches of 16; the one with the
        # wrong number of numbers is refused alone
        values = [[float(i), 1.0] for i in range(63)] + [[1.0, 2.0, 3.0]]
        got = await asyncio.gather(
            *(c.publish("s", v, value_id=f"v{i}") for i, v in enumerate(values)),
            return_exceptions=True,
        )
        assert got[:63] == [f"v{i}" for i in range(63)]
        assert isinstance(got[63], ValueError) and "wrong_dimension" in str(got[63])
        # a batch waits max_delay for values, not for more: its futures resolve unflushed
        seen: list[int] = []
        async with c.batcher(
            "d", max_values=100, max_delay=0.2, on_answer=lambda b, a: seen.append(len(b.items))
        ) as b:
            lines = [await b.add([1.0, float(i)], value_id=f"d{i}") for i in range(3)]
            done = await asyncio.wait_for(asyncio.gather(*lines), 60)
        assert [line.status for line in done if line] == ["accepted"] * 3 and seen == [3]
        # a batch refused whole: each value learns why
        async with c.batcher("nosuch") as b:
            refused = [await b.add([1.0, 2.0]) for _ in range(2)]
        assert {
            (line.result().status, line.result().reason) for line in refused if line.result()
        } == {("rejected", "unknown_stream")}
        # unwaited values still go out when the batcher closes
        async with c.batcher("w", max_delay=3600, wait=False) as b:
            for i in range(5):
                await b.add([1.0, float(i)])
        return {"s": await _records(market, "s"), "d": await _records(market, "d")}

    async def go() -> dict[str, object]:
        async with MarketClient(
            market.broker.bootstrap, market.topics, party=party("seller1"), batch_values=16
        ) as c:
            return await library(c)

    records = asyncio.run(go())
    assert records == {"s": 4, "d": 1}, records
    market.wait_ingested("s", 63)
    market.wait_ingested("w", 5)

    # the command line: a file of 64 values in batches of 16
    key = tmp_path / "seller1.key"
    party("seller1").save(key)
    lines = tmp_path / "values.jsonl"
    lines.write_text("".join(json.dumps([float(i), 2.0]) + "\n" for i in range(64)))
    acme = ["--key-file", str(key), "--stream", "f"]
    cli(market, "register", *acme, "--dimension", "2", "--steps", "0.5,1")
    r = cli(market, "publish", *acme, "--file", str(lines), "--batch-size", "16")
    assert "published 64/64 values" in r.stdout, r.stdout + r.stderr
    market.wait_ingested("f", 64)
    assert asyncio.run(_records(market, "f")) == 4
    r = cli(market, "publish", *acme, "--file", str(lines), "--batch-size", "0", check=False)
    assert r.returncode == 2 and "--batch-size takes 1 to 1000" in r.stderr
    r = cli(market, "publish", *acme, "--values", "1,2", "--batch-delay", "soon", check=False)
    assert r.returncode == 2 and "--batch-delay takes seconds" in r.stderr
