"""The newest checkpoint of each partition, kept on the worker's own disk as well.

The progress changelog is the root of the market's history on the broker, and on a broker
without ACLs anyone may delete it, or delete it and append older checkpoints the market once
wrote: every record would then read as never committed, or the state would roll back to an
older checkpoint, each record of it genuine. A worker therefore also keeps, in its data
directory (``<data dir>/<app id>.checkpoints``), the sealed record of the newest checkpoint it
committed or read for each partition. When it takes a partition on and the changelog's newest
checkpoint is older than the one on its disk, it trusts its disk: recovery judges by that
checkpoint, and the claim writes the partition's history again (:mod:`streams.worker.recovery`).

The file is a slot of :data:`SLOT` bytes per partition (``u32be`` length, the stamp header, the
sealed value), rewritten in place without ``fsync``: it survives the worker's process, not
always the machine. A slot torn by a crash does not open (the seal), and is read as empty. A
worker on another machine, without the file, has only the changelog, and falls back to its
rules (a record no checkpoint explains makes the partition unverified).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .checkpoints import Checkpoint
from .history import PROGRESS
from .state_records import HEADER, StateSeal

__all__ = ["SLOT", "LocalCheckpoints"]

log = logging.getLogger("emarket.state")

SLOT = 8192
"""Bytes per partition: a checkpoint with 64 earlier epochs is under 4 kB."""


class LocalCheckpoints:
    """The data directory's copy of each partition's newest checkpoint (module docstring)."""

    def __init__(self, path: Path, seal: StateSeal) -> None:
        self.path = path
        self.seal = seal
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def save(self, partition: int, headers: list[tuple[str, bytes]], value: bytes) -> None:
        """Keep the sealed checkpoint record of ``partition`` (its header and value)."""
        head = headers[0][1]
        body = len(head).to_bytes(1, "big") + head + value
        if len(body) + 4 > SLOT:
            log.warning("checkpoint of partition %d too large for its local slot", partition)
            return
        os.pwrite(self._fd, len(body).to_bytes(4, "big") + body, partition * SLOT)

    def load(self, partition: int) -> Checkpoint | None:
        """The checkpoint of ``partition`` on this disk, if one opens (the market sealed it,
        for this partition)."""
        raw = os.pread(self._fd, SLOT, partition * SLOT)
        if len(raw) < 5:
            return None
        size = int.from_bytes(raw[:4], "big")
        if not 1 < size <= SLOT - 4:
            return None
        hlen = raw[4]
        head, value = raw[5 : 5 + hlen], raw[5 + hlen : 4 + size]
        opened = self.seal.open(PROGRESS, str(partition).encode(), value, [(HEADER, head)])
        if isinstance(opened, str) or opened.plaintext is None:
            return None
        try:
            cp = Checkpoint.from_bytes(opened.plaintext)
        except (ValueError, KeyError, TypeError):
            return None
        if cp.partition != partition or cp.version != opened.stamp.version:
            return None
        return cp

    def close(self) -> None:
        os.close(self._fd)
