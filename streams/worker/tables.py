"""The core's stores as Faust tables, written back once per batch straight to their changelogs.

The core may update the same key many times in a batch (a stream's record on every value, a
value's release state on every purchase of the stream); :class:`WriteBackTable` keeps only the
last value of each key and, when the batch is flushed, writes the table's store and sends the
changelog record directly with the producer, in the partition of the event that last touched the
key. Awaiting those sends is what makes the batch's state durable. (Faust's own
``table[key] = value`` routes every changelog record through a one-at-a-time buffer, which cost
half of a busy worker's time; we keep its bookkeeping: the RocksDB persisted offsets and the
memory store's key → partition map used to drop revoked partitions.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from faust.serializers import codecs
from faust.streams import current_event

from ..core.codecs import CODECS
from .compat import set_current_event

__all__ = ["Record", "WriteBackTable", "register_codecs"]


@dataclass(frozen=True)
class Record:
    """One message to produce; ``table`` is set for changelog records."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    table: WriteBackTable | None = None


class _Codec(codecs.Codec):
    def __init__(self, dumps: Callable[[Any], bytes], loads: Callable[[bytes], Any]) -> None:
        super().__init__()
        self._d, self._l = dumps, loads

    def _dumps(self, obj: Any) -> bytes:
        return bytes(self._d(obj))

    def _loads(self, data: bytes) -> Any:
        return self._l(data)


def codec_name(store: str) -> str:
    return f"em_{store}"


def register_codecs() -> None:
    """Register the key codec and one value codec per store with Faust (by name)."""
    codecs.register("em_str", _Codec(lambda s: s.encode("utf-8"), lambda b: b.decode("utf-8")))
    for store, (dumps, loads) in CODECS.items():
        codecs.register(codec_name(store), _Codec(dumps, loads))


class WriteBackTable(MutableMapping[str, Any]):
    """A Faust table seen through a per-batch write-back cache (see the module docstring)."""

    _DELETED = object()

    def __init__(self, table: Any, dumps: Callable[[Any], bytes], name: str = "") -> None:
        self.table = table
        self._dumps = dumps
        self.name = name
        self._pending: dict[str, tuple[Any, Any]] = {}

    @classmethod
    def create(cls, app: Any, store: str, partitions: int) -> WriteBackTable:
        """A table of ``app`` for the core store ``store``, with our codecs."""
        tbl: Any = app.Table(store, partitions=partitions)
        # Faust derives serializers from key/value *types*, ours are codecs by name. The store
        # is created lazily (after this), but registering the table already built a JSON
        # changelog topic, which recovery would decode with: rebuild it.
        tbl.key_serializer, tbl.value_serializer = "em_str", codec_name(store)
        tbl.changelog_topic = tbl._new_changelog_topic()
        return cls(tbl, CODECS[store][0], store)

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
        store = self.table.data
        key_partition = getattr(store, "_key_partition", None)
        topic = self.table.changelog_topic.get_topic_name()
        records = []
        for key, (event, value) in self._pending.items():
            set_current_event(event)  # the RocksDB store picks its partition from it
            partition = event.message.partition
            if value is self._DELETED:
                store.pop(key, None)
                payload = None
            else:
                store[key] = value
                payload = self._dumps(value)
            if key_partition is not None:  # the memory store drops revoked partitions by it
                if payload is None:
                    key_partition.pop(key, None)
                else:
                    key_partition[key] = partition
            records.append(Record(topic, key.encode(), payload, partition, self))
        self._pending.clear()
        return records

    def persisted(self, metadata: Any) -> None:
        """Record a changelog offset as persisted (RocksDB resumes recovery after it)."""
        self.table.data.set_persisted_offset(metadata.topic_partition, metadata.offset)
