"""Reading the market's history back: which state records count, and which are refused.

Both readers of the changelogs — table recovery (:mod:`streams.worker.tables`) and the account
replica (:mod:`streams.worker.directory`) — open every record through :class:`StateReader` and
judge its version with :func:`judge` against the partition's checkpoint
(:mod:`streams.worker.checkpoints`) and the version the reader already holds for the key:

=============  ==========================================================================
``apply``      committed, and newer than what the reader holds: applied
``older``      committed, but older than what the reader holds: a genuine record appended
               again after newer ones (a rollback): refused, counted, alerted
``copy``       the very version the reader holds (a producer's retry wrote it twice, or
               someone appended it again): changes nothing, counted apart
``pending``    not committed by the checkpoint read so far, but a later checkpoint may
               commit it (the live replica keeps it until one does)
``void``       never committed and never will be: a batch lost before its checkpoint
=============  ==========================================================================

A record whose seal does not verify is refused before anything of it is read (``forged``), and
so is one found on another partition than its stamp names (``moved``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, TopicPartition

from .checkpoints import Checkpoint
from .state_records import Opened, StateSeal, Version

__all__ = ["PROGRESS", "CheckpointBook", "StateReader", "Verdict", "judge", "read_checkpoints"]

log = logging.getLogger("emarket.state")

PROGRESS = "progress"
"""The store name of checkpoints (their records are sealed like any other state record)."""

Verdict = Literal["apply", "older", "copy", "pending", "void"]


def judge(cp: Checkpoint, version: Version, held: Version | None, *, final: bool) -> Verdict:
    """What a reader does with a record of ``version`` for a key it holds at ``held`` (None:
    not held), given its partition's newest checkpoint ``cp``; ``final`` when no later
    checkpoint will be read (table recovery: ``pending`` is then ``void``)."""
    if not cp.commits(version):
        later = version.epoch > cp.version.epoch or (
            version.epoch == cp.version.epoch and version.n > cp.version.n
        )
        return "pending" if later and not final else "void"
    if held is None or version > held:
        return "apply"
    return "copy" if version == held else "older"


class StateReader:
    """Opens state records read back, and counts and logs every one that is refused.

    Counters (prometheus, or None in tests): ``refused`` labelled by store and reason
    (``forged``, ``moved``, ``older``, ``checkpoint``: alert ``MarketStateForged``),
    ``copies`` and ``uncommitted`` labelled by store (information: a producer's retry, a batch
    lost before its checkpoint)."""

    def __init__(
        self, seal: StateSeal, refused: Any = None, copies: Any = None, uncommitted: Any = None
    ) -> None:
        self.seal = seal
        self.refused, self.copies, self.uncommitted = refused, copies, uncommitted

    def open(
        self,
        store: str,
        key: bytes | None,
        value: bytes | None,
        headers: Any,
        *,
        where: tuple[str, int, int],
        reader: str,
    ) -> Opened | None:
        """The record's stamp and plaintext if the market sealed it for this place, else None
        (counted and logged as ``forged`` or ``moved``)."""
        opened = self.seal.open(store, key, value, headers)
        if isinstance(opened, str):
            self.refuse(store, "forged", opened, key, where, reader)
            return None
        if opened.stamp.partition != where[1]:
            self.refuse(
                store,
                "moved",
                f"stamped for partition {opened.stamp.partition}",
                key,
                where,
                reader,
            )
            return None
        return opened

    def refuse(
        self,
        store: str,
        reason: str,
        why: str,
        key: bytes | None,
        where: tuple[str, int, int],
        reader: str,
    ) -> None:
        """Count and log a refused record (never applied: the reader keeps what it had)."""
        if self.refused is not None:
            self.refused.labels(store, reason).inc()
        topic, partition, offset = where
        log.error(
            "refused a record of the %s store (%s: %s) at %s[%s]@%s, key %.80r: the %s "
            "does not apply it and keeps what it had",
            store,
            reason,
            why,
            topic,
            partition,
            offset,
            key,
            reader,
        )

    def noted(
        self,
        store: str,
        verdict: Verdict,
        key: bytes | None,
        where: tuple[str, int, int],
        reader: str,
        held: Version | None,
        version: Version,
    ) -> None:
        """Count what a verdict other than ``apply`` or ``pending`` did to a record."""
        if verdict == "older":
            self.refuse(
                store,
                "older",
                f"version {tuple(version)} after {tuple(held or ())}",
                key,
                where,
                reader,
            )
        elif verdict == "copy" and self.copies is not None:
            self.copies.labels(store).inc()
        elif verdict == "void":
            if self.uncommitted is not None:
                self.uncommitted.labels(store).inc()
            log.info(
                "%s: a record of the %s store at %s[%s]@%s (key %.80r, version %s) was "
                "never committed (its batch was lost); not applied",
                reader,
                store,
                *where,
                key,
                tuple(version),
            )


class CheckpointBook:
    """The newest checkpoint read of each partition; older ones (or other bytes under the same
    version) are refused through the reader as ``checkpoint``."""

    def __init__(self, reader: StateReader) -> None:
        self.reader = reader
        self.latest: dict[int, Checkpoint] = {}

    def get(self, partition: int) -> Checkpoint:
        return self.latest.get(partition) or Checkpoint.empty(partition)

    def receive(self, rec: Any, who: str) -> Checkpoint | None:
        """Read one record of the progress changelog; return the checkpoint if it is newer
        than the partition's newest, None otherwise (refused, or a copy)."""
        where = (rec.topic, rec.partition, rec.offset)
        opened = self.reader.open(
            PROGRESS, rec.key, rec.value, rec.headers, where=where, reader=who
        )
        if opened is None or opened.plaintext is None:
            if opened is not None:
                self.reader.refuse(PROGRESS, "forged", "a deletion", rec.key, where, who)
            return None
        try:
            cp = Checkpoint.from_bytes(opened.plaintext)
        except (ValueError, KeyError, TypeError):
            log.exception("unreadable checkpoint at %s[%s]@%s", *where)
            return None
        if cp.partition != rec.partition or cp.version != opened.stamp.version:
            self.reader.refuse(
                PROGRESS, "forged", "checkpoint does not match its stamp", rec.key, where, who
            )
            return None
        held = self.latest.get(rec.partition)
        if held is not None and cp.version <= held.version:
            if cp.version < held.version:
                self.reader.refuse(
                    PROGRESS,
                    "checkpoint",
                    f"version {tuple(cp.version)} after {tuple(held.version)}",
                    rec.key,
                    where,
                    who,
                )
            elif self.reader.copies is not None:
                self.reader.copies.labels(PROGRESS).inc()
            return None
        self.latest[rec.partition] = cp
        return cp


async def read_checkpoints(
    settings: dict[str, Any],
    topic: str,
    partitions: Iterable[int],
    book: CheckpointBook,
    *,
    who: str = "table recovery",
    timeout: float = 120.0,
) -> None:
    """Read every record of ``partitions`` of the progress changelog into ``book``, to the
    end (the high watermark of a fetch response: right on every broker, unlike Tansu's
    ListOffsets). Raises TimeoutError if the broker does not answer in ``timeout``."""
    tps = [TopicPartition(topic, p) for p in partitions]
    if not tps:
        return
    consumer = AIOKafkaConsumer(**settings, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(tps)
        deadline = time.monotonic() + timeout
        await asyncio.wait_for(consumer.seek_to_beginning(*tps), timeout)
        left = set(tps)
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"could not read {topic} {sorted(t.partition for t in left)} within {timeout}s"
                )
            batch = await consumer.getmany(*left, timeout_ms=200)
            for records in batch.values():
                for rec in records:
                    book.receive(rec, who)
            for tp in list(left):
                hw = consumer.highwater(tp)
                if hw is not None and await consumer.position(tp) >= hw:
                    left.discard(tp)
            await asyncio.sleep(0)
    finally:
        await consumer.stop()
