"""A row of bench/service.py: a plain Faust agent forwarding messages unchanged.

It measures Faust's own per-event cost on the same broker with the same consumer tuning as the
market worker (short fetch wait and session timeout on the embedded broker). No longer a goal's
baseline (issue #42): Faust's per-record delivery costs about ten times the transport floor
(:mod:`bench.forward`, plain aiokafka), which the goals are now stated against.

    python -m bench.passthrough --broker kafka://127.0.0.1:PORT --source a --sink b --app-id x
"""

from __future__ import annotations

import argparse
from typing import Any

import faust

from streams.worker.faust_internals import tune_fetch_wait


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--broker", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--sink", required=True)
    p.add_argument("--app-id", required=True)
    p.add_argument("--fetch-max-wait-ms", type=int, default=20)
    p.add_argument("--web-port", type=int, default=0)
    p.add_argument(
        "--data-dir", default=None, help="Faust's data directory (default: one in the cwd)"
    )
    args = p.parse_args()
    from streams.worker.faust_internals import install_tansu_compat

    install_tansu_compat()
    tune_fetch_wait(args.fetch_max_wait_ms)
    app = faust.App(
        args.app_id,
        broker=args.broker,
        store="memory://",
        broker_session_timeout=3.0,
        broker_heartbeat_interval=0.3,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        topic_partitions=4,
        **({"datadir": args.data_dir} if args.data_dir else {}),
    )
    source = app.topic(
        args.source, value_type=bytes, value_serializer="raw", key_type=bytes, key_serializer="raw"
    )
    sink = app.topic(
        args.sink, value_type=bytes, value_serializer="raw", key_type=bytes, key_serializer="raw"
    )

    @app.agent(source)
    async def forward(stream: Any) -> None:
        async for event in stream.events():
            await sink.send(key=event.key, value=event.value)

    faust.Worker(
        app, loglevel="warn", quiet=True, redirect_stdouts=False
    ).execute_from_commandline()


if __name__ == "__main__":
    main()
