"""Every account of the market on every worker: a replica of the accounts table's changelog.

Account events are processed by the worker owning the account's partition; a purchase or a
value batch may land on any other worker, which needs the account's current key to check the
signature. Each worker therefore tails the accounts changelog (all partitions, from the start,
no consumer group) into memory. The replica is bounded by ``EMARKET_MAX_ACCOUNTS``.

An event may arrive right after its account was opened, before the replica has read it. The
core then *defers* the event; :meth:`AccountReplica.caught_up_after` asks the broker for the
end of every partition (one ListOffsets round trip, sent after the batch started, so after the
account record the event depends on was acknowledged) and waits until the replica has read that
far; then the event is handled again. Once per batch at most, so a flood of unknown accounts
costs one round trip per batch, not per event (``bench/flood.py``).

Every record is applied only if it carries the market's authenticator
(:class:`~streams.worker.state_mac.StateGuard`): a record someone else appended to the changelog,
a deletion included, is counted, logged and ignored, and the replica keeps what it had.

Tansu answers ListOffsets(latest) with the base offset of the newest record batch + 1 rather
than the high watermark; since a consumer receives whole record batches, having read past that
offset still means having read the whole newest batch, so the rule holds on both brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from ..wire.events import AccountState
from .state_mac import StateGuard

__all__ = ["AccountReplica"]

log = logging.getLogger("emarket.directory")


class AccountReplica:
    """Accounts by id and by key id, read from ``topic`` (the accounts changelog)."""

    def __init__(
        self, bootstrap: str, topic: str, guard: StateGuard, *, fetch_wait_ms: int = 20,
        **auth: Any,
    ) -> None:  # fmt: skip
        self.topic = topic
        self.guard = guard
        self._accounts: dict[str, AccountState] = {}
        self._by_key: dict[str, str] = {}
        self._settings: dict[str, Any] = dict(
            bootstrap_servers=bootstrap, enable_auto_commit=False,
            fetch_max_wait_ms=fetch_wait_ms, **auth,
        )  # fmt: skip
        self._consumer: Any = None  # made in start(): aiokafka needs the running loop
        self._task: asyncio.Task[None] | None = None
        self._tps: list[TopicPartition] = []
        self._progress = asyncio.Event()

    # -- lookups (DirectoryReplica) -------------------------------------------------------------
    def get(self, account_id: str) -> AccountState | None:
        return self._accounts.get(account_id)

    def owner_of_key(self, key_id: str) -> str | None:
        return self._by_key.get(key_id)

    def __len__(self) -> int:
        return len(self._accounts)

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self, partitions: int) -> None:
        self._consumer = AIOKafkaConsumer(**self._settings)
        await self._consumer.start()
        self._tps = [TopicPartition(self.topic, p) for p in range(partitions)]
        self._consumer.assign(self._tps)
        await self._consumer.seek_to_beginning(*self._tps)
        self._task = asyncio.create_task(self._run(self._tps), name="account-replica")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()

    async def caught_up_after(self, started: float, warn_every: float = 5.0) -> None:
        """Wait until the replica has read everything written before ``started``.

        There is no deadline: deciding "unknown account" on a replica that is behind would
        refuse a valid event because the machine was busy. A replica that cannot read (broker
        outage) holds the batch like any other send would; it is logged, /health turns
        "stalled", and SIGTERM still stops the worker.
        """
        t0 = time.monotonic()  # ≥ started: the end offsets asked for now cover it
        ends = await self._end_offsets(warn_every)
        warned = 0
        while not await self._has_read(ends):
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), warn_every)
            waited = time.monotonic() - t0
            if waited > (warned + 1) * warn_every:
                warned += 1
                log.warning("account directory has not caught up after %.0fs; waiting", waited)

    async def _end_offsets(self, warn_every: float) -> dict[TopicPartition, int]:
        while True:
            try:
                ends: dict[TopicPartition, int] = await self._consumer.end_offsets(self._tps)
                return ends
            except Exception as exc:  # broker outage: keep asking
                log.warning("account directory cannot read end offsets (%r); retrying", exc)
                await asyncio.sleep(min(warn_every, 0.5))

    async def _has_read(self, ends: dict[TopicPartition, int]) -> bool:
        return all([await self._consumer.position(tp) >= end for tp, end in ends.items()])

    async def _run(self, tps: list[TopicPartition]) -> None:
        while True:
            try:
                batch = await self._consumer.getmany(*tps, timeout_ms=100)
            except Exception as exc:  # broker outage: keep trying, lookups use what we have
                log.debug("account replica fetch failed: %r", exc)
                await asyncio.sleep(0.5)
                continue
            for records in batch.values():
                for rec in records:
                    self.receive(rec)
            self._progress.set()

    def receive(self, rec: Any) -> None:
        """Apply one record of the changelog (an aiokafka ``ConsumerRecord``) if the market
        wrote it; refuse it otherwise (:class:`StateGuard`)."""
        where = (rec.topic, rec.partition, rec.offset)
        if not self.guard.admit("accounts", rec.key, rec.value, rec.headers, where=where,
                                reader="account replica"):  # fmt: skip
            return
        try:
            self._apply(rec.key, rec.value)
        except ValueError:  # the market's own record, unreadable: never stop the replica for it
            log.exception("unreadable account record at %s[%s]@%s", *where)

    def _apply(self, key: bytes, value: bytes | None) -> None:
        account_id = key.decode()
        old = self._accounts.pop(account_id, None)
        if old is not None:
            self._by_key.pop(old.key_id, None)
        if value is not None:
            state = AccountState.model_validate_json(value)
            self._accounts[account_id] = state
            self._by_key[state.key_id] = account_id
