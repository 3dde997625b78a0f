"""The core's stores as Faust tables, written back once per batch straight to their changelogs.

The core may update the same key many times in a batch (a stream's record on every value, a
value's release state on every purchase of the stream); :class:`WriteBackTable` keeps only the
last value of each key and, when the batch is written, seals one changelog record per key
(:mod:`streams.worker.state_records`) in the partition of the event that last touched it,
stamped with the version of that partition's next checkpoint. The store itself is written only
once the batch's checkpoint is acknowledged (:meth:`WriteBackTable.commit`): what a store holds
is always committed state, so a worker that dies mid-batch leaves nothing behind that a
checkpoint does not vouch for, on a local RocksDB store as in memory.

Each key is held with its version: in memory as ``(version, value)``, in RocksDB as the sealed
record itself (its stamp, then its sealed value), so that what a worker's disk holds reveals no
more than the changelog does. (Faust's own ``table[key] = value`` routes every changelog record
through a one-at-a-time buffer, which cost half of a busy worker's time; the bookkeeping Faust's
stores rely on — the memory store's key → partition map, RocksDB's key index and persisted
offsets — is kept through :mod:`streams.worker.faust_internals`.)

Recovery applies a record only if it is the market's, committed, and newer than what the store
holds for its key (:meth:`WriteBackTable.recovered`, :mod:`streams.worker.history`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from faust.streams import current_event

from ..core.codecs import CODECS
from .checkpoints import Checkpoint
from .faust_internals import (
    RecoveredEvent,
    partition_items,
    persisted_offset,
    rebuild_changelog_topic,
    register_codec,
    set_persisted_offset,
    store_get,
    store_is_serialized,
    store_keys,
    store_put,
    store_size,
    verify_changelog,
)
from .history import CheckpointBook, StateReader, judge
from .state_records import Stamp, StateSeal, Version

__all__ = ["Record", "StateContext", "WriteBackTable", "register_codecs"]

log = logging.getLogger("emarket.state")


@dataclass(frozen=True)
class Record:
    """One message to produce; ``table`` is set for changelog records."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    table: WriteBackTable | None = None
    headers: list[tuple[str, bytes]] | None = None


def register_codecs() -> None:
    """Register the key codec with Faust (values are read and written as raw bytes here)."""
    register_codec("em_str", lambda s: s.encode("utf-8"), lambda b: b.decode("utf-8"))


@dataclass
class StateContext:
    """What every table shares: the seal, the reader that refuses and counts, the checkpoints
    recovery judges by, where each input topic sits in a stamp, and the batch's versions.

    ``version_for``, ``account`` and ``serving`` are :class:`~streams.worker.progress.Progress`'s
    (set by the worker): a partition it serves is this worker's to write, and recovery passes
    over what it wrote there itself (Faust's recovery reads a partition it keeps again after
    every rebalance); ``stale`` collects, per partition, the keys recovery found a record of
    that was never committed (rewritten when the partition is claimed:
    :mod:`streams.worker.recovery`); ``epochs`` the greatest epoch recovery saw per partition;
    ``unexplained``, per partition, a record newer than its checkpoint that no lost batch
    explains (the changelog lost checkpoints: the partition does not verify); ``local``, per
    partition, the version of the newest checkpoint this worker's disk holds
    (:mod:`streams.worker.local_checkpoints`).
    """

    seal: StateSeal
    reader: StateReader
    book: CheckpointBook
    inputs: tuple[str, ...] = ()
    version_for: Callable[[int], Version] | None = None
    account: Callable[[int, str, str, Version | None, Version | None], None] | None = None
    serving: Callable[[int], Checkpoint | None] = lambda partition: None
    stale: dict[int, set[tuple[str, str]]] = field(default_factory=dict)
    epochs: dict[int, int] = field(default_factory=dict)
    unexplained: dict[int, str] = field(default_factory=dict)
    local: dict[int, Version] = field(default_factory=dict)

    def topic_index(self, topic: str) -> int:
        try:
            return self.inputs.index(topic)
        except ValueError:
            return 0xFF


_DELETED = object()


@dataclass(slots=True)
class _Sealed:
    """A key written by the batch: sent, not yet in the store (until the checkpoint)."""

    partition: int
    version: Version
    value: Any  # _DELETED for a deletion
    raw: bytes | None  # the RocksDB form: stamp ‖ sealed value (None: a deletion)


class WriteBackTable(MutableMapping[str, Any]):
    """A Faust table seen through a per-batch write-back cache (see the module docstring)."""

    def __init__(self, table: Any, store: str, ctx: StateContext) -> None:
        self.table = table
        self._dumps, self._loads = CODECS[store]
        self.name = store
        self.ctx = ctx
        self.serialized = store_is_serialized(table)
        self._pending: dict[str, tuple[Any, Any]] = {}
        self._sealed: dict[str, _Sealed] = {}
        self._deleted: dict[str, Version] = {}  # deletions recovery read (this tenure)
        self._resumed: dict[int, bool] = {}  # partitions recovery resumed after a stored offset
        self._ends: dict[int, int] = {}

    @classmethod
    def create(cls, app: Any, store: str, partitions: int, ctx: StateContext) -> WriteBackTable:
        """A table of ``app`` for the core store ``store``, whose changelog records are sealed
        and recovered only through ``ctx``."""
        tbl: Any = app.Table(store, partitions=partitions)
        tbl.key_serializer, tbl.value_serializer = "em_str", "raw"
        rebuild_changelog_topic(tbl)
        made = cls(tbl, store, ctx)
        verify_changelog(tbl, made.recovered)
        return made

    # -- what the store holds --------------------------------------------------------------------
    def held(self, key: str, partition: int | None = None) -> tuple[Version, Any] | None:
        """The committed version and value of ``key`` (None if the store has none)."""
        stored = store_get(self.table, key, partition)
        if stored is None:
            return None
        if not self.serialized:
            return stored  # type: ignore[no-any-return]
        return self.unsealed(key, stored)

    def held_version(self, key: str, partition: int | None = None) -> Version | None:
        """Only the version of ``key`` (no decryption: a RocksDB record's stamp is clear)."""
        stored = store_get(self.table, key, partition)
        if stored is None:
            return None
        return Stamp.from_bytes(stored).version if self.serialized else stored[0]

    def unsealed(self, key: str, raw: bytes) -> tuple[Version, Any]:
        stamp, sealed = raw[: Stamp.SIZE], raw[Stamp.SIZE :]
        opened = self.ctx.seal.open(self.name, key.encode(), sealed, [("emarket-state", stamp)])
        if isinstance(opened, str) or opened.plaintext is None:
            raise RuntimeError(
                f"the local store holds a {self.name} record for {key!r} that "
                f"does not open ({opened if isinstance(opened, str) else 'empty'})"
            )
        return opened.stamp.version, self._loads(opened.plaintext)

    # -- the mapping the core sees -------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        hit = self._pending.get(key)
        if hit is not None:
            if hit[1] is _DELETED:
                raise KeyError(key)
            return hit[1]
        sealed = self._sealed.get(key)
        if sealed is not None:
            if sealed.value is _DELETED:
                raise KeyError(key)
            return sealed.value
        held = self.held(key)
        if held is None:
            raise KeyError(key)
        return held[1]

    def __setitem__(self, key: str, value: Any) -> None:
        self._pending[key] = (current_event(), value)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._pending[key] = (current_event(), _DELETED)

    def __iter__(self) -> Iterator[str]:
        changed = {
            **{k: s.value for k, s in self._sealed.items()},
            **{k: v for k, (_, v) in self._pending.items()},
        }
        deleted = {k for k, v in changed.items() if v is _DELETED}
        keys = set(store_keys(self.table)) | set(changed)
        return iter(keys - deleted)

    def __len__(self) -> int:
        """The store's size corrected by the batch's changes alone, never a walk of the store:
        every opening checks the accounts bound with it, so a count of every key made each
        opening in a batch cost O(accounts) (100,000 openings slowed 370 → 47 a second)."""
        size = store_size(self.table)
        changed = {
            **{k: s.value for k, s in self._sealed.items()},
            **{k: v for k, (_, v) in self._pending.items()},
        }
        for key, value in changed.items():
            size += (value is not _DELETED) - (store_get(self.table, key) is not None)
        return size

    # -- writing a batch -------------------------------------------------------------------------
    def drain(self) -> list[Record]:
        """Seal the batch's writes as changelog records, stamped with their partition's next
        version and counted in its sums; the store is written by :meth:`commit`."""
        ctx = self.ctx
        assert ctx.version_for is not None and ctx.account is not None
        topic = self.table.changelog_topic.get_topic_name()
        records = []
        for key, (event, value) in self._pending.items():
            msg = event.message
            p = msg.partition
            version = ctx.version_for(p)
            deleted = value is _DELETED
            raw_key = key.encode()
            stamp = Stamp(p, version, ctx.topic_index(msg.topic), msg.offset)
            plain = None if deleted else self._dumps(value)
            headers, payload = ctx.seal.seal(self.name, raw_key, plain, stamp)
            ctx.account(p, self.name, key, self.held_version(key, p), None if deleted else version)
            raw = None if payload is None else stamp.to_bytes() + payload
            self._sealed[key] = _Sealed(p, version, value, raw)
            records.append(Record(topic, raw_key, payload, p, self, headers))
        self._pending.clear()
        return records

    def persisted(self, metadata: Any) -> None:
        """A changelog record was acknowledged: its offset ends what the store wrote there."""
        p, end = metadata.topic_partition.partition, metadata.offset + 1
        self._ends[p] = max(self._ends.get(p, 0), end)

    def ends(self) -> dict[int, int]:
        """Per partition, the offset after the last record of the batch acknowledged so far."""
        return dict(self._ends)

    def commit(self) -> None:
        """The batch's checkpoint is acknowledged: write its keys to the store (and RocksDB's
        persisted offsets, so that recovery resumes after them)."""
        for key, s in self._sealed.items():
            deleted = s.value is _DELETED
            stored = s.raw if self.serialized else (None if deleted else (s.version, s.value))
            store_put(self.table, key, s.partition, stored)
        if self.serialized:
            topic = self.table.changelog_topic.get_topic_name()
            for p, end in self._ends.items():
                set_persisted_offset(self.table, topic, p, end - 1)
        self._sealed.clear()
        self._ends.clear()

    # -- recovery --------------------------------------------------------------------------------
    def recovered(self, messages: list[Any]) -> list[RecoveredEvent]:
        """The events a batch of changelog records restores, in order: each record the market
        sealed for its partition, committed by the partition's checkpoint and newer than what the
        store holds for its key; the others are refused or passed over
        (:func:`~streams.worker.history.judge`: counted, logged, never applied)."""
        ctx = self.ctx
        held: dict[str, Version] = {}
        kept: list[RecoveredEvent] = []
        for m in messages:
            where = (m.topic, m.partition, m.offset)
            if self.passed_over(m, where):
                continue
            opened = ctx.reader.open(
                self.name, m.key, m.value, m.headers, where=where, reader="table recovery"
            )
            if opened is None:
                continue
            key, version, p = m.key.decode("utf-8"), opened.stamp.version, m.partition
            ctx.epochs[p] = max(ctx.epochs.get(p, 0), version.epoch)
            before = held.get(key) or self.held_version(key, p) or self._deleted.get(key)
            cp = ctx.book.get(p)
            verdict = judge(cp, version, before, final=True)
            if verdict == "apply" and self.behind_disk(p, version):
                verdict, before = "older", ctx.local[p]
            if verdict != "apply":
                ctx.reader.noted(
                    self.name, verdict, m.key, where, "table recovery", before, version
                )
                if verdict == "void":
                    ctx.stale.setdefault(p, set()).add((self.name, key))
                    if not cp.explains(version):
                        ctx.unexplained.setdefault(
                            p, f"{self.name} record {key!r} of version {tuple(version)}"
                        )
                continue
            held[key] = version
            kept.append(self.restored(key, opened.stamp, opened.plaintext, m))
        return kept

    def behind_disk(self, partition: int, version: Version) -> bool:
        """Whether a record read back by a RocksDB store's recovery is no newer than what the
        store held when it last wrote (the newest checkpoint on this worker's disk): recovery
        resumes after the records the store applied, so a record at or below that version is an
        old one appended again (a key deleted since, say, which the store no longer knows)."""
        if not self.serialized or partition not in self.ctx.local:
            return False
        topic = self.table.changelog_topic.get_topic_name()
        resumed = self._resumed.get(partition)
        if resumed is None:
            resumed = self._resumed[partition] = (
                persisted_offset(self.table, topic, partition) is not None
            )
        return resumed and version <= self.ctx.local[partition]

    def passed_over(self, m: Any, where: tuple[str, int, int]) -> bool:
        """Whether ``m`` is of a partition this worker serves: its own record (passed over), or
        one appended after the last it wrote (refused: nobody else writes there)."""
        live = self.ctx.serving(m.partition)
        if live is None:
            return False
        sums = live.stores.get(self.name)
        if m.offset >= (sums.end if sums is not None else 0):
            self.ctx.reader.refuse(
                self.name,
                "foreign",
                "appended to a partition this worker writes",
                m.key,
                where,
                "table recovery",
            )
        return True

    def restored(self, key: str, stamp: Stamp, plaintext: bytes | None, m: Any) -> RecoveredEvent:
        if plaintext is None:
            self._deleted[key] = stamp.version
            return RecoveredEvent(key, None, m, None)
        self._deleted.pop(key, None)
        if self.serialized:
            return RecoveredEvent(key, None, m, stamp.to_bytes() + m.value)
        return RecoveredEvent(key, (stamp.version, self._loads(plaintext)), m, None)

    def recovery_done(self) -> None:
        """Forget the deletions recovery read (they guarded only against older records read in
        the same recovery)."""
        self._deleted.clear()
        self._resumed.clear()

    def partition_entries(self, partitions: set[int]) -> Iterator[tuple[int, str, Version]]:
        """Every key the store holds in ``partitions``, with its partition and version."""
        for p, key, stored in partition_items(self.table, partitions):
            if self.serialized:
                yield p, key, Stamp.from_bytes(stored).version
            else:
                yield p, key, stored[0]

    def rewrite(self, key: str, partition: int, version: Version) -> tuple[Record, Version | None]:
        """A record giving ``key`` of ``partition`` its committed value again (or deleting it if
        the store has none) at ``version``, and the version it had: what a claim writes over a
        record a lost batch left (:mod:`streams.worker.recovery`)."""
        held = self.held(key, partition)
        plain = None if held is None else self._dumps(held[1])
        stamp = Stamp(partition, version)
        headers, payload = self.ctx.seal.seal(self.name, key.encode(), plain, stamp)
        if held is not None:
            raw = stamp.to_bytes() + payload if payload is not None else None
            self._sealed[key] = _Sealed(partition, version, held[1], raw)
        else:
            self._sealed[key] = _Sealed(partition, version, _DELETED, None)
        topic = self.table.changelog_topic.get_topic_name()
        return (
            Record(topic, key.encode(), payload, partition, self, headers),
            None if held is None else held[0],
        )
