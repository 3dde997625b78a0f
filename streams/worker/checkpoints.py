"""Checkpoints: what a partition's state is, committed, and where its inputs resume.

A batch's state records for a partition (every store's) are written first; once the broker has
acknowledged them all, one **checkpoint** for that partition is written to the progress
changelog (``<app>-progress-changelog``, keyed by the partition; ``docs/protocol.md`` §3.3). The
checkpoint is the batch's commit: a record whose version no checkpoint commits is from a batch
that was lost before its end, and is never applied (:mod:`streams.worker.recovery`). So on
recovery a batch counts wholly or not at all, whichever of its records a crash let through.

A checkpoint carries

* the partition and the **version** it commits (:class:`~.state_records.Version`): records of
  that partition with a version it commits are the market's state, others are not;
* the **input positions** of the partition (per input topic, the next offset to read): the
  worker that takes the partition on resumes there, whatever the consumer group's committed
  offsets say (someone else may have committed them);
* for each store, the number of keys the partition holds, the sum of their entry digests
  (:func:`~.state_records.entry_digest`) and the end of what the market wrote to the store's
  changelog partition: a reader compares what it rebuilt with these, so a record missing,
  rolled back to an older copy, or extra, is noticed;
* the epochs before the current one and the last batch each committed (:attr:`ended`), so a
  record of a batch lost at the end of an earlier epoch is known not to count.

Versions only grow: a checkpoint older than (or equal to, with other bytes) one already read is
refused and counted, like a record older than its key's newest.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from .state_records import Version

__all__ = ["MAX_ENDED", "MAX_N", "Checkpoint", "StoreSum", "new_epoch"]

MAX_ENDED = 64
"""Earlier epochs a checkpoint names with their last batch; an epoch older than all of them is
taken as committed (the partition's digests then tell whether it was)."""

MAX_N = (1 << 32) - 1
"""The last batch number of an epoch (the stamp's ``n`` is 32 bits): a worker that reaches it
starts a new epoch, as if it had just taken the partition on."""


def new_epoch(after: int) -> int:
    """An epoch greater than ``after``: a count one past its count, and a random incarnation
    id (so two workers that both took the partition on from the same state never write the
    same versions)."""
    count = (after >> 32) + 1
    return count << 32 | (secrets.randbits(32) or 1)


@dataclass(slots=True)
class StoreSum:
    """What one store holds in a partition: how many keys, the sum of their entry digests
    (modulo 2²⁵⁶), and the next offset after the market's last record in the store's changelog
    partition (0: none yet)."""

    count: int = 0
    digest: int = 0
    end: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "digest": f"{self.digest:064x}", "end": self.end}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StoreSum:
        return cls(int(d["count"]), int(d["digest"], 16), int(d["end"]))


@dataclass(slots=True)
class Checkpoint:
    """One partition's committed state and input positions (see the module docstring)."""

    partition: int
    version: Version
    written_at_ms: int = 0
    positions: dict[str, int] = field(default_factory=dict)
    stores: dict[str, StoreSum] = field(default_factory=dict)
    ended: dict[int, int] = field(default_factory=dict)
    floor: int = -1

    def commits(self, version: Version) -> bool:
        """Whether a record of this partition with ``version`` is committed state."""
        epoch, n = version
        if epoch == self.version.epoch:
            return n <= self.version.n
        last = self.ended.get(epoch)
        if last is not None:
            return n <= last
        return epoch <= self.floor

    def explains(self, version: Version) -> bool:
        """Whether a record of ``version`` that this checkpoint does not commit is one a worker
        could have left without any checkpoint being lost: the batch after a committed one
        (``n`` one past the last of its epoch), or a claim's rewrites (``n`` = 0) whose
        checkpoint was never written. Anything else newer than this checkpoint means checkpoints
        the changelog lost (deleted, or older ones appended in place of the newest)."""
        epoch, n = version
        if epoch == self.version.epoch:
            return n == self.version.n + 1
        last = self.ended.get(epoch)
        if last is not None:
            return n == last + 1
        return n == 0 or epoch <= self.floor

    def claimed(self, after: int, now_ms: int) -> Checkpoint:
        """This checkpoint continued by a new epoch greater than ``after`` (and than its own):
        what a worker writes when it takes the partition on. The epoch it ends is kept in
        :attr:`ended` with its last batch, the oldest beyond :data:`MAX_ENDED` dropped below
        :attr:`floor`."""
        ended = dict(self.ended)
        if self.version.epoch:
            ended[self.version.epoch] = self.version.n
        floor = self.floor
        while len(ended) > MAX_ENDED:
            oldest = min(ended)
            floor = max(floor, oldest)
            del ended[oldest]
        epoch = new_epoch(max(after, self.version.epoch, floor))
        stores = {s: replace(v) for s, v in self.stores.items()}
        return replace(
            self,
            version=Version(epoch, 0),
            written_at_ms=now_ms,
            ended=ended,
            floor=floor,
            stores=stores,
        )

    def successor(self, now_ms: int) -> Checkpoint:
        """The next version of this checkpoint (its sums copied, to change): the next batch of
        the epoch, or a new epoch once its batch numbers run out (:data:`MAX_N`)."""
        if self.version.n >= MAX_N:
            return self.claimed(self.version.epoch, now_ms)
        stores = {s: replace(v) for s, v in self.stores.items()}
        return replace(self, version=Version(self.version.epoch, self.version.n + 1), stores=stores)

    def to_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, no spaces; ``docs/protocol.md`` §3.3)."""
        body = {
            "partition": self.partition,
            "epoch": str(self.version.epoch),
            "n": self.version.n,
            "written_at_ms": self.written_at_ms,
            "positions": self.positions,
            "stores": {s: v.to_json() for s, v in self.stores.items()},
            "ended": {str(e): n for e, n in self.ended.items()},
            "floor": str(self.floor),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Checkpoint:
        d = json.loads(data)
        return cls(
            partition=int(d["partition"]),
            version=Version(int(d["epoch"]), int(d["n"])),  # the epoch as a string: > 2**53
            written_at_ms=int(d["written_at_ms"]),
            positions={str(k): int(v) for k, v in d["positions"].items()},
            stores={str(k): StoreSum.from_json(v) for k, v in d["stores"].items()},
            ended={int(e): int(n) for e, n in d["ended"].items()},
            floor=int(d["floor"]),
        )

    @classmethod
    def empty(cls, partition: int) -> Checkpoint:
        """The state of a partition nothing was ever committed to: no keys, inputs from their
        first offset, epoch 0 (no record has it)."""
        return cls(partition, Version(0, 0))
