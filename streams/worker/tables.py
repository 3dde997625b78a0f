"""The core's stores as Faust tables, written back once per batch straight to their changelogs.

The core may update the same key many times in a batch (a stream's record on every value, a
value's release state on every purchase of the stream); :class:`WriteBackTable` keeps only the
last value of each key and, when the batch is flushed, writes the table's store and sends the
changelog record directly with the producer, in the partition of the event that last touched the
key. Awaiting those sends is what makes the batch's state durable. (Faust's own
``table[key] = value`` routes every changelog record through a one-at-a-time buffer, which cost
half of a busy worker's time; we keep its bookkeeping: the RocksDB persisted offsets and the
memory store's key → partition map used to drop revoked partitions, written through
:mod:`streams.worker.faust_internals`, which lists the upstream code this bypasses.)

Every changelog record carries the market's authenticator (:mod:`streams.worker.state_mac`),
deletions included, and recovery applies a record only if it verifies (:meth:`WriteBackTable.
recovered`): a record someone else appended to a changelog is counted, logged and ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from faust.streams import current_event

from ..core.codecs import CODECS
from .faust_internals import (
    rebuild_changelog_topic,
    register_codec,
    store_write,
    verify_changelog,
)
from .state_mac import StateGuard

__all__ = ["Record", "WriteBackTable", "register_codecs"]

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


def codec_name(store: str) -> str:
    return f"em_{store}"


def register_codecs() -> None:
    """Register the key codec and one value codec per store with Faust (by name)."""
    register_codec("em_str", lambda s: s.encode("utf-8"), lambda b: b.decode("utf-8"))
    for store, (dumps, loads) in CODECS.items():
        register_codec(codec_name(store), dumps, loads)


class WriteBackTable(MutableMapping[str, Any]):
    """A Faust table seen through a per-batch write-back cache (see the module docstring)."""

    _DELETED = object()

    def __init__(self, table: Any, store: str, guard: StateGuard) -> None:
        self.table = table
        self._dumps, self._loads = CODECS[store]
        self.name = store
        self.guard = guard
        self._pending: dict[str, tuple[Any, Any]] = {}

    @classmethod
    def create(cls, app: Any, store: str, partitions: int, guard: StateGuard) -> WriteBackTable:
        """A table of ``app`` for the core store ``store``, with our codecs, whose changelog
        records carry ``guard``'s authenticator and are recovered only through it."""
        tbl: Any = app.Table(store, partitions=partitions)
        # Faust derives serializers from key/value *types*, ours are codecs by name. The store
        # is created lazily (after this), but registering the table already built a JSON
        # changelog topic, which recovery would decode with: rebuild it (reading raw bytes,
        # which recovered() verifies, then decodes).
        tbl.key_serializer, tbl.value_serializer = "em_str", codec_name(store)
        rebuild_changelog_topic(tbl)
        made = cls(tbl, store, guard)
        verify_changelog(tbl, made.recovered)
        return made

    def recovered(self, message: Any) -> tuple[str, Any] | None:
        """The (key, value) a changelog record restores, or None if it is not the market's.

        A record whose authenticator does not verify is refused (:class:`StateGuard`: counted,
        logged) and never decoded; the store keeps what it had for that key.
        """
        where = (message.topic, message.partition, message.offset)
        key, value = message.key, message.value
        if not self.guard.admit(self.name, key, value, message.headers, where=where,
                                reader="table recovery"):  # fmt: skip
            return None
        try:
            return key.decode("utf-8"), None if value is None else self._loads(value)
        except Exception:  # the market's own record, yet unreadable: a bug, never skipped quietly
            log.exception("cannot decode the market's own %s record at %s[%s]@%s; not restored",
                          self.name, *where)  # fmt: skip
            return None

    def __getitem__(self, key: str) -> Any:
        hit = self._pending.get(key)
        if hit is not None:
            if hit[1] is self._DELETED:
                raise KeyError(key)
            return hit[1]
        return self.table[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._pending[key] = (current_event(), value)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._pending[key] = (current_event(), self._DELETED)

    def __iter__(self) -> Iterator[str]:
        deleted = {k for k, (_, v) in self._pending.items() if v is self._DELETED}
        keys = set(self.table.keys()) | set(self._pending)
        return iter(keys - deleted)

    def __len__(self) -> int:
        if not self._pending:  # between batches (the gauges' case): the store's own count
            return len(self.table)
        return sum(1 for _ in self)

    def drain(self) -> list[Record]:
        """Apply the batch's writes to the store; return the changelog records to send."""
        topic = self.table.changelog_topic.get_topic_name()
        records = []
        for key, (event, value) in self._pending.items():
            deleted = value is self._DELETED
            store_write(self.table, key, value, event, delete=deleted)
            payload = None if deleted else self._dumps(value)
            raw = key.encode()
            headers = self.guard.mac.headers(self.name, raw, payload)
            records.append(Record(topic, raw, payload, event.message.partition, self, headers))
        self._pending.clear()
        return records

    def persisted(self, metadata: Any) -> None:
        """Record a changelog offset as persisted (RocksDB resumes recovery after it)."""
        self.table.data.set_persisted_offset(metadata.topic_partition, metadata.offset)
