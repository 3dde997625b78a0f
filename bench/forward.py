"""The transport floor of bench/service.py: plain aiokafka forwarding records unchanged.

No framework and no market logic: one consumer reads every partition of the source topic
(assigned, from the beginning: no group to join), one producer writes each record's key and
value to the sink, and every fetched batch is acknowledged by the broker (``acks=all``) before
the next is fetched, so nothing is lost and nothing waits on a timer. What a market worker
cannot spend less on: consuming a record and producing one. Its CPU per record, measured in
the same run as the market's worker, is the **transport floor** that ``bench.service``
states the worker's goals beside (issue #42), in place of the Faust pass-through's
(:mod:`bench.passthrough`, kept as a row), which measured Faust's per-record delivery, about
ten times this floor.

    python -m bench.forward --bootstrap 127.0.0.1:PORT --source a --sink b
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streams.broker.kafka_internals import fresh_metadata


async def forward(bootstrap: str, source: str, sink: str, fetch_max_wait_ms: int) -> None:
    """Forward ``source`` to ``sink`` until the task is cancelled."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=fetch_max_wait_ms
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await consumer.start()
    await producer.start()
    try:
        parts: set[int] | None = None
        while not parts:
            parts = (await fresh_metadata(consumer)).partitions_for_topic(source)
            if not parts:
                await asyncio.sleep(0.1)
        tps = [TopicPartition(source, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while True:
            batches = await consumer.getmany(timeout_ms=1000)
            acks = [
                await producer.send(sink, record.value, key=record.key)
                for records in batches.values()
                for record in records
            ]
            await asyncio.gather(*acks)
    finally:
        await producer.stop()
        await consumer.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--sink", required=True)
    p.add_argument("--fetch-max-wait-ms", type=int, default=20)
    args = p.parse_args()

    async def run() -> None:
        task = asyncio.create_task(
            forward(args.bootstrap, args.source, args.sink, args.fetch_max_wait_ms)
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):  # SIGTERM: the benchmark is done
            await task

    asyncio.run(run())


if __name__ == "__main__":
    main()
