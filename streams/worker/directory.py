"""Every account of the market on every worker: a replica of the accounts table's changelog, as
its partitions' checkpoints commit it.

Account events are processed by the worker owning the account's partition; a purchase or a
value batch may land on any other worker, which needs the account's current key to check the
signature. Each worker therefore tails the accounts changelog and the progress changelog (all
partitions, from the start, no consumer group) into memory. The replica is bounded by
``EMARKET_MAX_ACCOUNTS``; it keeps each account packed in one bytes object
(:mod:`streams.worker.account_pack`: ~350 B with its indexes, where an object took ~1,800 B)
and decodes it when an event asks for it.

A record counts only as the market's history says (:mod:`streams.worker.history`): sealed by the
market for its partition, committed by a checkpoint of that partition (a record read before its
checkpoint waits for it; one of a batch lost before its checkpoint never counts), and newer than
the version the replica holds for the account — an older record appended again (a rotated-out
key restored, say) is refused, counted and alerted. Once the replica has read a partition as
far as its newest checkpoint says the market wrote, it compares what it holds there with the
checkpoint's count and digest sum of the accounts store: a partition that does not match (a
record deleted, or rolled back by compaction) is *unverified*, its accounts are not used (their
events are refused as from an unknown account) and ``/health`` says so.

An event may arrive right after its account was opened, before the replica has read it. The
core then *defers* the event; :meth:`AccountReplica.caught_up_after` asks the broker for the
end of every partition of both changelogs (one ListOffsets round trip, sent after the batch
started, so after the account's record and checkpoint were acknowledged) and waits until the
replica has read that far; then the event is handled again. Once per batch at most, so a flood
of unknown accounts costs one round trip per batch, not per event (``bench/flood.py``).

Tansu answers ListOffsets(latest) with the base offset of the newest record batch + 1 rather
than the high watermark; since a consumer receives whole record batches, having read past that
offset still means having read the whole newest batch, so the rule holds on both brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from ..wire.events import AccountState
from .account_pack import head, key_index, key_of, pack, raw_head, unpack
from .checkpoints import Checkpoint, StoreSum
from .history import CheckpointBook, StateReader, judge
from .state_records import DIGEST_MODULUS, Version

__all__ = ["DECODED", "MAX_PENDING", "REREAD_CHECK_S", "AccountReplica"]

log = logging.getLogger("emarket.directory")

STORE = "accounts"
REREAD_CHECK_S = 1.0
"""Seconds between two looks for a changelog made again under the replica."""
MAX_PENDING = 10_000
"""Records a partition may hold waiting for their checkpoint; beyond, the oldest are dropped
(a worker writes a batch's checkpoint right after its records, so more means a flood)."""
DECODED = 1024
"""Accounts kept decoded, the last asked for: the accounts active now skip the few µs of
decoding (:mod:`.account_pack`), at a constant ~1.5 MB."""


@dataclass(slots=True)
class _Held:
    """An account kept as its object: one :func:`~.account_pack.pack` cannot give back
    exactly (rare: a key in non-canonical base64)."""

    version: Version
    partition: int
    state: AccountState


def _where(held: bytes | _Held) -> tuple[Version, int]:
    """The version that wrote a held account, and its partition."""
    return head(held) if isinstance(held, bytes) else (held.version, held.partition)


def _index(key_id: str) -> int:
    """The index of a validated state's key id (always one: the wire model's pattern)."""
    index = key_index(key_id)
    if index is None:
        raise ValueError(f"not a key id: {key_id!r}")
    return index


class AccountReplica:
    """Accounts by id and by key id, read from ``topic`` (the accounts changelog) as
    ``progress_topic``'s checkpoints commit them (see the module docstring)."""

    def __init__(
        self, settings: dict[str, Any], topic: str, progress_topic: str, reader: StateReader
    ) -> None:
        self.topic = topic
        self.progress_topic = progress_topic
        self.reader = reader
        self.book = CheckpointBook(reader)
        self.unverified: dict[int, str] = {}
        self._accounts: dict[str, bytes | _Held] = {}  # packed (streams.worker.account_pack)
        self._by_key: dict[int, str] = {}  # key id as an integer (account_pack.key_index)
        self._decoded: dict[str, AccountState] = {}  # the last DECODED accounts get() decoded
        self._pending: dict[int, list[tuple[Any, Version, AccountState | None]]] = {}
        self._newest: dict[str, Version] = {}  # per account, the newest version read, pending
        self._sums: dict[int, StoreSum] = {}
        self._read_to: dict[int, int] = {}
        self._checked: dict[int, Version] = {}
        self._settings = {**settings, "enable_auto_commit": False}
        self._consumer: Any = None  # made in start(): aiokafka needs the running loop
        self._task: asyncio.Task[None] | None = None
        self._tps: list[TopicPartition] = []
        self._progress = asyncio.Event()
        self._first: dict[TopicPartition, int] = {}  # checkpoints to read before the accounts
        self.on_checkpoint: Callable[[Checkpoint], None] | None = None
        """Called with every checkpoint newer than the last read of its partition (the worker
        fences itself when another worker takes a partition it serves over)."""

    # -- lookups (DirectoryReplica) -------------------------------------------------------------
    def get(self, account_id: str) -> AccountState | None:
        """The account as committed; None while a newer record of it waits for its checkpoint
        (a key rotation in flight: its old key must not pass meanwhile), and for a partition
        whose accounts do not verify."""
        held = self._usable(account_id)
        if held is None or isinstance(held, _Held):
            return held if held is None else held.state
        state = self._decoded.get(account_id)
        if state is None:
            state = unpack(account_id, held)
            if len(self._decoded) >= DECODED:
                del self._decoded[next(iter(self._decoded))]
            self._decoded[account_id] = state
        return state

    def owner_of_key(self, key_id: str) -> str | None:
        index = key_index(key_id)
        owner = None if index is None else self._by_key.get(index)
        return owner if owner is not None and self._usable(owner) is not None else None

    def _usable(self, account_id: str) -> bytes | _Held | None:
        """The account as held, if :meth:`get` may answer with it (its docstring)."""
        held = self._accounts.get(account_id)
        if held is None:
            return None
        if isinstance(held, bytes):
            epoch, n, partition = raw_head(held)
            version: tuple[int, int] = (epoch, n)
        else:
            version, partition = held.version, held.partition
        if partition in self.unverified:
            return None
        newer = self._newest.get(account_id)
        return None if newer is not None and newer > version else held

    def __len__(self) -> int:
        return len(self._accounts)

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self, partitions: int) -> None:
        self._consumer = AIOKafkaConsumer(**self._settings)
        await self._consumer.start()
        self._tps = [
            TopicPartition(t, p)
            for t in (self.progress_topic, self.topic)
            for p in range(partitions)
        ]
        self._consumer.assign(self._tps)
        await self._consumer.seek_to_beginning(*self._tps)
        await self._checkpoints_first()
        self._task = asyncio.create_task(self._run(self._tps), name="account-replica")

    async def _checkpoints_first(self) -> None:
        """Read the checkpoints written so far before any account record: a record read
        before its checkpoint waits for it, and at most :data:`MAX_PENDING` may wait, so a
        replica that read a market's accounts ahead of its checkpoints from the start (a fetch
        returns the topics in any order) would drop all but the last 10,000 of a partition and
        distrust it (100,000 accounts, ``bench.accounts --changelog``)."""
        progress = [tp for tp in self._tps if tp.topic == self.progress_topic]
        try:
            ends: dict[TopicPartition, int] = await self._consumer.end_offsets(progress)
        except Exception as exc:  # broker outage: read both as they come
            log.warning("account replica: no end offsets of the checkpoints (%r)", exc)
            return
        if any(ends.values()):
            self._first = ends
            self._consumer.pause(*[tp for tp in self._tps if tp.topic == self.topic])

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
        looked = time.monotonic()
        while True:
            try:
                batch = await self._consumer.getmany(*tps, timeout_ms=100)
                if time.monotonic() - looked > REREAD_CHECK_S:
                    looked = time.monotonic()
                    await self._made_again(tps)
            except Exception as exc:  # broker outage: keep trying, lookups use what we have
                log.debug("account replica fetch failed: %r", exc)
                await asyncio.sleep(0.5)
                continue
            for records in batch.values():
                for rec in records:
                    self.receive(rec)
            await self._resume_after_checkpoints(tps)
            self._progress.set()

    async def _resume_after_checkpoints(self, tps: list[TopicPartition]) -> None:
        """Read the accounts once the checkpoints written before the start are read."""
        try:
            if not self._first or not await self._has_read(self._first):
                return
        except Exception as exc:  # broker outage: ask again after the next fetch
            log.debug("account replica: checkpoints read? %r", exc)
            return
        self._first = {}
        self._consumer.resume(*[tp for tp in tps if tp.topic == self.topic])

    async def _made_again(self, tps: list[TopicPartition]) -> None:
        """Read again from the start each partition whose end is now below this replica's
        position: its topic was deleted and made again (a broker gives a reader no error then,
        and it would wait for ever past the new records)."""
        for tp in tps:
            end = self._consumer.highwater(tp)
            if end is None or end >= await self._consumer.position(tp):
                continue
            log.warning(
                "account replica: %s[%d] ends at %d, below what it had read: the topic "
                "was made again; reading it again from the start",
                tp.topic,
                tp.partition,
                end,
            )
            self._forget(tp)
            self._consumer.seek(tp, 0)

    def _forget(self, tp: TopicPartition) -> None:
        """Forget what was read of ``tp``: its checkpoints, or its accounts."""
        p = tp.partition
        self._checked.pop(p, None)
        if tp.topic == self.progress_topic:
            self.book.latest.pop(p, None)
            if self._first:  # the checkpoints to read first are gone: read everything as it comes
                self._first = {}
                self._consumer.resume(*[t for t in self._tps if t.topic == self.topic])
            return
        for account_id, held in list(self._accounts.items()):
            version, partition = _where(held)
            if partition == p:
                self._set(account_id, p, version, None)
        for rec, _, _ in self._pending.pop(p, []):
            self._newest.pop(rec.key.decode("utf-8"), None)
        for known in (self._sums, self._read_to):
            known.pop(p, None)

    # -- records ----------------------------------------------------------------------------------
    def receive(self, rec: Any) -> None:
        """Apply one record of either changelog (an aiokafka ``ConsumerRecord``) as the market's
        history says (the module docstring)."""
        p = rec.partition
        if rec.topic == self.progress_topic:
            cp = self.book.receive(rec, "account replica")
            if cp is not None:
                self._promote(p)
                if self.on_checkpoint is not None:
                    self.on_checkpoint(cp)
        else:
            self._account(rec)
            self._read_to[p] = rec.offset + 1
        self._check(p)

    def _account(self, rec: Any) -> None:
        where = (rec.topic, rec.partition, rec.offset)
        opened = self.reader.open(
            STORE, rec.key, rec.value, rec.headers, where=where, reader="account replica"
        )
        if opened is None:
            return
        try:
            state = (
                None
                if opened.plaintext is None
                else AccountState.model_validate_json(opened.plaintext)
            )
        except ValueError:  # the market's own record, unreadable: never stop the replica for it
            log.exception("unreadable account record at %s[%s]@%s", *where)
            return
        self._judge(rec, opened.stamp.version, state, where)

    def _judge(
        self, rec: Any, version: Version, state: AccountState | None, where: tuple[str, int, int]
    ) -> None:
        p, account_id = rec.partition, rec.key.decode("utf-8")
        held = self._accounts.get(account_id)
        before = None if held is None else _where(held)[0]
        newest = self._newest.get(account_id)  # one waiting for its checkpoint, if newer
        if newest is not None and (before is None or newest > before) and version < newest:
            before = newest  # an older record than one read already: judged against that one
        verdict = judge(self.book.get(p), version, before, final=False)
        if verdict == "apply":
            self._set(account_id, p, version, state)
        elif verdict == "pending":
            self._newest[account_id] = max(version, newest or version)
            waiting = self._pending.setdefault(p, [])
            waiting.append((rec, version, state))
            if len(waiting) > MAX_PENDING:
                del waiting[0]
        else:
            self.reader.noted(STORE, verdict, rec.key, where, "account replica", before, version)

    def _promote(self, p: int) -> None:
        """A new checkpoint of ``p``: judge again what waited for one."""
        waiting = self._pending.pop(p, [])
        for rec, _, _ in waiting:
            self._newest.pop(rec.key.decode("utf-8"), None)
        for rec, version, state in waiting:
            self._judge(rec, version, state, (rec.topic, rec.partition, rec.offset))

    def _set(self, account_id: str, p: int, version: Version, state: AccountState | None) -> None:
        sums = self._sums.setdefault(p, StoreSum())
        self._decoded.pop(account_id, None)
        old = self._accounts.pop(account_id, None)
        if old is not None:
            old_version, _ = _where(old)
            old_key = key_of(old) if isinstance(old, bytes) else _index(old.state.key_id)
            self._by_key.pop(old_key, None)
            sums.count -= 1
            sums.digest -= self.reader.seal.digest(STORE, account_id, old_version)
        if state is not None:
            self._accounts[account_id] = pack(version, p, state) or _Held(version, p, state)
            self._by_key[_index(state.key_id)] = account_id
            sums.count += 1
            sums.digest += self.reader.seal.digest(STORE, account_id, version)
        sums.digest %= DIGEST_MODULUS

    def _check(self, p: int) -> None:
        """Once ``p`` is read as far as its newest checkpoint says the market wrote, compare
        what the replica holds there with the checkpoint's sums (once per checkpoint)."""
        cp = self.book.latest.get(p)
        if cp is None or self._checked.get(p) == cp.version:
            return
        want = cp.stores.get(STORE) or StoreSum()
        if self._read_to.get(p, 0) < want.end:
            return
        self._checked[p] = cp.version
        got = self._sums.get(p) or StoreSum()
        if (got.count, got.digest) == (want.count, want.digest):
            if self.unverified.pop(p, None) is not None:
                log.warning(
                    "accounts of partition %d verify again (checkpoint %s)", p, tuple(cp.version)
                )
            return
        self.unverified[p] = f"accounts: {got.count} held, {want.count} committed" + (
            "" if got.count != want.count else ", other versions"
        )
        log.critical(
            "account replica: partition %d's accounts are not what its checkpoint %s "
            "commits (%s): a changelog record was deleted or rolled back; its accounts "
            "are not used",
            p,
            tuple(cp.version),
            self.unverified[p],
        )
