"""The account replica's memory per account (issue #45): ``python -m bench.accounts``.

Every worker keeps every account (:mod:`streams.worker.directory`). This measures, at 1,000,
10,000 and 100,000 accounts (``--sizes``), the heap (tracemalloc) and the RSS each account takes
in the replica, in two layouts measured in the same run, interleaved, each size and layout in a
fresh process: ``objects`` (each account an :class:`~streams.wire.events.AccountState` with
its key id as text, the layout before #45) and ``packed`` (the replica as it is,
:mod:`streams.worker.account_pack`). Both are fed the same sealed changelog records as a worker
writes them, with real Ed25519 and X25519 keys derived from deterministic seeds (nothing is
cached), and the checkpoints that commit them; the packed replica is the real
:class:`~streams.worker.directory.AccountReplica`, fed through its ``receive``. Also printed: the
time one lookup takes in each layout (the packed one decodes the account).

``--open N`` instead opens N accounts on the embedded broker through the operators' invitation
path (:mod:`bench.accounts_open`); ``--changelog N`` starts a worker on a market of N accounts
(:mod:`bench.accounts_changelog`).
"""

from __future__ import annotations

import argparse
import base64
import gc
import hashlib
import json
import os
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any

from aiokafka.structs import ConsumerRecord
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from bench.machine import Machine
from streams.wire.events import AccountState
from streams.wire.signing import key_id_of
from streams.wire.topics import Topics
from streams.worker.checkpoints import Checkpoint, StoreSum
from streams.worker.directory import AccountReplica
from streams.worker.history import StateReader
from streams.worker.state_records import Stamp, StateSeal, Version

PARTITIONS = 4
EPOCH = 1 << 32
CHANGELOG, PROGRESS = "b-accounts-changelog", "b-progress"
SEAL = StateSeal(bytes(range(32)), bytes(range(32, 64)))


def account_state(i: int) -> AccountState:
    """Account ``i``: a buyer (signing and sealing keys) whose keys derive from seed SHA-256(i),
    as the core stores an opening (:mod:`streams.core.accounts`)."""
    seed = hashlib.sha256(b"bench-account-%d" % i).digest()
    signing = SigningKey(seed).verify_key.encode()
    sealing = PrivateKey(seed).public_key.encode()
    key = base64.b64encode(signing).decode()
    return AccountState(
        account_id=f"buyer-{i:06d}",
        version=1,
        signing_key=key,
        sealing_key=base64.b64encode(sealing).decode(),
        key_id=key_id_of(key),
        opened_at_ms=1_780_000_000_000 + i,
        updated_at_ms=1_780_000_000_000 + i,
    )


@dataclass(frozen=True)
class Changelogs:
    """Where and how a market's account records are written: its seal, the accounts changelog
    and the progress changelog, and the epoch its versions are stamped with."""

    seal: StateSeal = SEAL
    accounts: str = CHANGELOG
    progress: str = PROGRESS
    epoch: int = EPOCH

    def record(self, topic: str, p: int, offset: int, key: bytes, plain: bytes, n: int) -> Any:
        store = "progress" if topic == self.progress else "accounts"
        head, sealed = self.seal.seal(store, key, plain, Stamp(p, Version(self.epoch, n)))
        return ConsumerRecord(
            topic, p, offset, 0, 0, key, sealed, None, len(key), len(sealed or b""), tuple(head)
        )


def changelog(n: int, batch: int = 100, where: Changelogs = Changelogs()) -> list[Any]:
    """The sealed records of ``n`` opened accounts as a worker writes them: batches of
    ``batch`` openings, each followed by every partition's checkpoint."""
    topics = Topics("b", PARTITIONS)
    sums = [StoreSum() for _ in range(PARTITIONS)]
    out: list[Any] = []
    for first in range(0, n, batch):
        b = first // batch + 1
        for i in range(first, min(n, first + batch)):
            state = account_state(i)
            p = topics.partition_of(state.account_id)
            key, plain = state.account_id.encode(), state.model_dump_json().encode()
            out.append(where.record(where.accounts, p, sums[p].end, key, plain, b))
            digest = where.seal.digest("accounts", state.account_id, Version(where.epoch, b))
            sums[p] = StoreSum(
                sums[p].count + 1, (sums[p].digest + digest) % 2**256, sums[p].end + 1
            )
        for p in range(PARTITIONS):
            cp = Checkpoint(p, Version(where.epoch, b), stores={"accounts": sums[p]})
            out.append(where.record(where.progress, p, b - 1, str(p).encode(), cp.to_bytes(), b))
    return out


@dataclass(slots=True)
class _Object:
    version: Version
    partition: int
    state: AccountState


class ObjectLayout:
    """The layout before #45: each account an object, its key id as text (the same opening and
    validation of each record as the replica's)."""

    def __init__(self) -> None:
        self.reader = StateReader(SEAL)
        self.accounts: dict[str, _Object] = {}
        self.by_key: dict[str, str] = {}

    def receive(self, rec: Any) -> None:
        if rec.topic == PROGRESS:
            return
        where = (rec.topic, rec.partition, rec.offset)
        opened = self.reader.open(
            "accounts", rec.key, rec.value, rec.headers, where=where, reader="bench"
        )
        assert opened is not None and opened.plaintext is not None
        state = AccountState.model_validate_json(opened.plaintext)
        account_id = rec.key.decode()
        self.accounts[account_id] = _Object(opened.stamp.version, rec.partition, state)
        self.by_key[state.key_id] = account_id

    def get(self, account_id: str) -> AccountState | None:
        held = self.accounts.get(account_id)
        return None if held is None else held.state


def _replica() -> AccountReplica:
    return AccountReplica({}, CHANGELOG, PROGRESS, StateReader(SEAL))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_one(layout: str, n: int, heap: bool) -> dict[str, float]:
    """One layout at ``n`` accounts, in this process: heap (tracemalloc) or RSS bytes retained
    per account, and µs per lookup."""
    records = changelog(n)
    gc.collect()
    if heap:
        tracemalloc.start()
    rss0 = _rss()
    held: Any = ObjectLayout() if layout == "objects" else _replica()
    for rec in records:
        held.receive(rec)
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] if heap else _rss() - rss0
    if heap:
        tracemalloc.stop()
    assert isinstance(held, ObjectLayout) or (len(held) == n and not held.unverified)
    ids = [f"buyer-{i:06d}" for i in range(0, n, max(1, n // 1000))]
    t0 = time.perf_counter()
    for account_id in ids:
        assert held.get(account_id) is not None
    lookup_us = (time.perf_counter() - t0) / len(ids) * 1e6
    return {"per_account": retained / n, "lookup_us": lookup_us}


def _child(layout: str, n: int, heap: bool) -> dict[str, float]:
    argv = [sys.executable, "-m", "bench.accounts", "--child", layout, str(n)]
    out = subprocess.run(
        [*argv, "heap" if heap else "rss"], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def run(sizes: list[int]) -> None:
    machine = Machine.now()
    print("accounts | layout  | heap B/account | RSS B/account | lookup µs")
    print("---|---|---|---|---")
    for n in sizes:
        for layout in ("objects", "packed"):
            heap, rss = _child(layout, n, True), _child(layout, n, False)
            print(
                f"{n:,} | {layout} | {heap['per_account']:,.0f} | {rss['per_account']:,.0f} | "
                f"{rss['lookup_us']:.2f}",
                flush=True,
            )
    print(machine.line())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="account counts, comma-separated")
    ap.add_argument("--child", nargs=3, metavar=("LAYOUT", "N", "WHAT"), help=argparse.SUPPRESS)
    ap.add_argument("--open", type=int, metavar="N", help="open N accounts on the embedded broker")
    ap.add_argument(
        "--changelog",
        type=int,
        metavar="N",
        help="a worker starting on a market of N accounts (embedded broker)",
    )
    ap.add_argument(
        "--inboxes", choices=("v1", "v2"), default="v1", help="the market's inboxes (with --open)"
    )
    args = ap.parse_args()
    if args.child:
        layout, n, what = args.child
        print(json.dumps(measure_one(layout, int(n), what == "heap")))
    elif args.changelog:
        from bench.accounts_changelog import run_changelog

        run_changelog(args.changelog)
    elif args.open:
        from bench.accounts_open import run_open

        run_open(args.open, args.inboxes)
    else:
        run([int(s) for s in args.sizes.split(",")])


if __name__ == "__main__":
    main()
