"""The account replica alone, catching up from the start of a market's changelogs, in a
process of its own (:mod:`bench.accounts_open` runs it): ``python -m bench.accounts_replica
BOOTSTRAP APP_ID DATA_DIR N PARTITIONS`` prints one JSON line: the seconds until it holds
``N`` accounts and the RSS it grew by, per account.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from pathlib import Path

from streams.worker.directory import AccountReplica
from streams.worker.history import StateReader
from streams.worker.progress import progress_topic
from streams.worker.secrets import load_or_create_keys, state_keys
from streams.worker.state_records import StateSeal

TIMEOUT_S = 3600.0


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def catch_up(bootstrap: str, app_id: str, data_dir: Path, n: int, partitions: int) -> None:
    seal = StateSeal(*state_keys(load_or_create_keys(data_dir).noise_secret))
    replica = AccountReplica(
        {"bootstrap_servers": bootstrap, "fetch_max_wait_ms": 20},
        f"{app_id}-accounts-changelog",
        progress_topic(app_id),
        StateReader(seal),
    )
    gc.collect()
    rss0, t0 = _rss(), time.perf_counter()
    await replica.start(partitions)
    try:
        while len(replica) < n or replica.unverified:
            if time.perf_counter() - t0 > TIMEOUT_S:
                raise SystemExit(f"the replica holds {len(replica)} of {n} accounts")
            await asyncio.sleep(0.1)
        took = time.perf_counter() - t0
        gc.collect()
        grown = _rss() - rss0
    finally:
        await replica.stop()
    print(json.dumps({"catch_up_s": took, "replica_rss_per_account": grown / n}))


if __name__ == "__main__":
    bootstrap, app_id, data_dir, n, partitions = sys.argv[1:6]
    asyncio.run(catch_up(bootstrap, app_id, Path(data_dir), int(n), int(partitions)))
