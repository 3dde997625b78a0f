"""A replica that starts on a market's whole history reads its checkpoints before its accounts:
read the other way, more records than may wait for a checkpoint would be dropped and the
partition distrusted (a worker starting on 100,000 accounts did so)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.broker.embedded import EmbeddedBroker
from streams.worker import directory
from streams.worker.checkpoints import Checkpoint, StoreSum
from streams.worker.directory import AccountReplica
from streams.worker.history import StateReader
from streams.worker.state_records import Stamp, Version

from .test_state_records import E1, SEAL, account

pytestmark = [pytest.mark.broker]

ACCOUNTS = 60
EARLIER = 5
"""Checkpoints before the one that commits the accounts."""


async def _write(bootstrap: str, accounts: str, progress: str) -> None:
    """``ACCOUNTS`` account records of partition 0 in one batch, and checkpoints: ``EARLIER``
    that commit none of them, then the one that commits them all."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 1, 1) for t in (accounts, progress)])
    finally:
        await admin.close()
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=50)
    await prod.start()
    try:
        version, digest, sent = Version(E1, EARLIER + 1), 0, []
        for i in range(ACCOUNTS):
            name = f"acct{i}"
            text = account(name).model_dump_json().encode()
            head, value = SEAL.seal("accounts", name.encode(), text, Stamp(0, version))
            sent.append(
                await prod.send(accounts, value, key=name.encode(), partition=0, headers=head)
            )
            digest += SEAL.digest("accounts", name, version)
        await asyncio.gather(*sent)
        sums = [StoreSum()] * EARLIER + [StoreSum(ACCOUNTS, digest % 2**256, ACCOUNTS)]
        for n, held in enumerate(sums, 1):
            cp = Checkpoint(0, Version(E1, n), stores={"accounts": held}).to_bytes()
            head, value = SEAL.seal("progress", b"0", cp, Stamp(0, Version(E1, n)))
            await prod.send_and_wait(progress, value, key=b"0", partition=0, headers=head)
    finally:
        await prod.stop()


async def _read(bootstrap: str, accounts: str, progress: str) -> AccountReplica:
    settings = {"bootstrap_servers": bootstrap, "fetch_max_wait_ms": 20}
    replica = AccountReplica(settings, accounts, progress, StateReader(SEAL))
    await replica.start(1)
    try:
        # the accounts wait until the checkpoints written before the start are read (which
        # topic a fetch brings first is the broker's choice: read the accounts first, the
        # partition's 60 records would wait for their checkpoint, six times more than may)
        assert replica._consumer.paused() == {TopicPartition(accounts, 0)}
        deadline = time.monotonic() + 60
        while len(replica) < ACCOUNTS and not replica.unverified and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # whatever else it would read
        assert replica._consumer.paused() == set()
    finally:
        await replica.stop()
    return replica


def test_a_replica_starting_late_reads_the_checkpoints_first(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(directory, "MAX_PENDING", 10)  # 60 records: six times what may wait
    tag = uuid.uuid4().hex[:8]
    accounts, progress = f"c{tag}-accounts-changelog", f"c{tag}-progress-changelog"
    bootstrap = broker.bootstrap
    asyncio.run(_write(bootstrap, accounts, progress))
    replica = asyncio.run(_read(bootstrap, accounts, progress))
    assert replica.unverified == {} and len(replica) == ACCOUNTS
    assert replica.get("acct0") == account("acct0")
