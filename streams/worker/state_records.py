"""The market's state records on a changelog, format 2: sealed, stamped with where they come in
the market's history, and authenticated (``docs/protocol.md`` §3; this module is its one
implementation).

Workers rebuild their tables, and every worker its account replica, from changelog topics that
anyone allowed to write to the broker can read and append to. So every record the market writes
there says three things a reader can check without trusting the broker:

* **who wrote it**: it is sealed (XChaCha20-Poly1305) under a key derived from the market's noise
  secret (:func:`streams.worker.secrets.state_keys`), so only the market could have made it;
* **when**: its *stamp* (:class:`Stamp`, the record header :data:`HEADER`, covered by the seal)
  names the partition, the version of the partition's history that wrote it (an epoch and a
  batch number, :class:`Version`: versions only grow, :mod:`streams.worker.checkpoints`) and the
  input position (topic, offset) of the event that last changed it; a reader keeps, for every
  key, the newest version it has verified, and refuses an older one
  (:mod:`streams.worker.recovery`);
* **nothing else**: a value is readable only by the market (a reader of the changelogs learns a
  record's store, key, size and stamp, never a seller's numbers nor any unkeyed function of
  them).

A deletion stays a Kafka tombstone (no value, which compaction removes in time): its seal (the
nonce and the authentication tag of an empty plaintext) rides in the header after the stamp.
The seal's associated data binds the store, the key, the stamp and whether the record is a
deletion, so a record cannot be moved to another key, store, partition or version, nor a value
presented as a deletion.

Every live key also counts in its partition's *digest* (:func:`entry_digest`): a keyed hash of
(store, key, version), summed modulo 2²⁵⁶ over the keys a partition holds. Each checkpoint
carries the sums, so a reader can tell that what it rebuilt is exactly what the market had: no
record missing, none rolled back, none extra (:mod:`streams.worker.checkpoints`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nacl.bindings import (
    crypto_aead_xchacha20poly1305_ietf_decrypt,
    crypto_aead_xchacha20poly1305_ietf_encrypt,
)
from nacl.exceptions import CryptoError

__all__ = [
    "DIGEST_MODULUS",
    "DOMAIN",
    "FORMAT",
    "HEADER",
    "NO_OFFSET",
    "NO_TOPIC",
    "Opened",
    "Stamp",
    "StateSeal",
    "Version",
    "associated_data",
    "entry_digest",
    "header_pairs",
]

log = logging.getLogger("emarket.state")

HEADER = "emarket-state"
"""Name of the record header that carries a state record's stamp (and a deletion's seal)."""

FORMAT = 2
"""First byte of the header: the state-record format (``docs/protocol.md`` §3)."""

DOMAIN = b"emarket-state-v2"
"""First bytes of what a seal binds: no other message of the market seals under the same AAD."""

NO_TOPIC = 0xFF
"""The topic index of a record no input event wrote (a checkpoint)."""
NO_OFFSET = 0xFFFFFFFFFFFFFFFF
"""Its offset."""

DIGEST_MODULUS = 1 << 256
"""Partition digests are sums of entry digests modulo this."""

_STAMP = struct.Struct(">BIQIBQ")  # format, partition, epoch, n, topic, offset: 26 bytes
_NONCE = 24
_TAG = 16


class Version(NamedTuple):
    """A version of a partition's history: ``(epoch, n)``, ordered as a tuple.

    ``epoch`` names one worker incarnation's tenure of the partition (it grows every time a
    worker takes the partition on); ``n`` counts the batches committed within it. A worker
    never writes a version it did not first make greater than every version it read.
    """

    epoch: int
    n: int


@dataclass(frozen=True, slots=True)
class Stamp:
    """Where a state record comes in the market's history (the header, ``docs/protocol.md``
    §3.1): its partition, the version that wrote it, and the input topic (an index into the
    market's input topics) and offset of the event that last changed its key."""

    partition: int
    version: Version
    topic: int = NO_TOPIC
    offset: int = NO_OFFSET

    def to_bytes(self) -> bytes:
        return _STAMP.pack(
            FORMAT, self.partition, self.version.epoch, self.version.n, self.topic, self.offset
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Stamp:
        fmt, partition, epoch, n, topic, offset = _STAMP.unpack(data[: _STAMP.size])
        if fmt != FORMAT:
            raise ValueError(f"state record of format {fmt}")
        return cls(partition, Version(epoch, n), topic, offset)

    SIZE = _STAMP.size


def associated_data(store: str, key: bytes, stamp: bytes, deletion: bool) -> bytes:
    """What a record's seal binds (``docs/protocol.md`` §3.1):
    ``DOMAIN ‖ u8(len S) ‖ S ‖ u32be(len K) ‖ K ‖ stamp ‖ (00 a deletion | 01 a value)``."""
    name = store.encode("ascii")
    if not 0 < len(name) < 256:
        raise ValueError(f"bad store name: {store!r}")
    return b"".join(
        (
            DOMAIN,
            bytes([len(name)]),
            name,
            len(key).to_bytes(4, "big"),
            key,
            stamp,
            b"\x00" if deletion else b"\x01",
        )
    )


class Opened(NamedTuple):
    """A record whose seal verified: its stamp and its plaintext (None: a deletion)."""

    stamp: Stamp
    plaintext: bytes | None


def header_pairs(headers: Any) -> list[tuple[str, Any]]:
    """A record's headers as (name, value) pairs, whatever the client gave (None, a tuple of
    pairs, a list, a mapping)."""
    if not headers:
        return []
    if isinstance(headers, dict):
        return list(headers.items())
    return [(str(k), v) for k, v in headers]


@dataclass(frozen=True)
class StateSeal:
    """Seals and opens state records under the market's state key, and digests entries under
    its digest key (both never printed: see ``repr``)."""

    key: bytes = field(repr=False)
    digest_key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.key) != 32 or len(self.digest_key) < 16:
            raise ValueError("a state key is 32 bytes and a digest key at least 16")

    def seal(
        self,
        store: str,
        key: bytes,
        plaintext: bytes | None,
        stamp: Stamp,
        nonce: bytes | None = None,
    ) -> tuple[list[tuple[str, bytes]], bytes | None]:
        """The headers and value of a record: ``(headers, sealed value)``, or for a deletion
        ``(headers with the seal, None)``. ``nonce`` is for test vectors only (random
        otherwise: 24 bytes, so never repeated under one key)."""
        head = stamp.to_bytes()
        nonce = os.urandom(_NONCE) if nonce is None else nonce
        aad = associated_data(store, key, head, plaintext is None)
        sealed = crypto_aead_xchacha20poly1305_ietf_encrypt(plaintext or b"", aad, nonce, self.key)
        if plaintext is None:
            return [(HEADER, head + nonce + sealed)], None
        return [(HEADER, head)], nonce + sealed

    def open(
        self, store: str, key: bytes | None, value: bytes | None, headers: Any
    ) -> Opened | str:
        """The record's stamp and plaintext, or why it is not the market's (a string)."""
        if key is None:
            return "no key"
        heads = [v for k, v in header_pairs(headers) if k == HEADER]
        if len(heads) != 1:
            return "no stamp" if not heads else "more than one stamp"
        head = heads[0]
        if not isinstance(head, bytes | bytearray) or len(head) < 1:
            return "malformed stamp"
        if head[0] != FORMAT:
            return f"stamp of format {head[0]}"
        deletion = value is None
        want = Stamp.SIZE + (_NONCE + _TAG if deletion else 0)
        if len(head) != want or (not deletion and len(value or b"") < _NONCE + _TAG):
            return "malformed record"
        stamp_bytes = bytes(head[: Stamp.SIZE])
        sealed = bytes(head[Stamp.SIZE :]) if deletion else bytes(value or b"")
        aad = associated_data(store, bytes(key), stamp_bytes, deletion)
        try:
            plain = crypto_aead_xchacha20poly1305_ietf_decrypt(
                sealed[_NONCE:], aad, sealed[:_NONCE], self.key
            )
        except CryptoError:
            return "bad seal"
        return Opened(Stamp.from_bytes(stamp_bytes), None if deletion else plain)

    def digest(self, store: str, key: str, version: Version) -> int:
        """:func:`entry_digest` under this market's digest key."""
        return entry_digest(self.digest_key, store, key, version)


def entry_digest(digest_key: bytes, store: str, key: str, version: Version) -> int:
    """One live key's share of its partition's digest: BLAKE2b-256 keyed with the digest key
    over ``u8(len S) ‖ S ‖ u32be(len K) ‖ K ‖ u64be(epoch) ‖ u32be(n)``, read as a big-endian
    integer (``docs/protocol.md`` §3.4).

    Keyed, so that nobody without the market's secret can compute what a set of records sums
    to (an attacker choosing which old copy of each key survives compaction must hit the sum a
    checkpoint carries blind: one chance in 2²⁵⁶ per try)."""
    name, k = store.encode("ascii"), key.encode("utf-8")
    data = b"".join(
        (
            bytes([len(name)]),
            name,
            len(k).to_bytes(4, "big"),
            k,
            struct.pack(">QI", version.epoch, version.n),
        )
    )
    return int.from_bytes(hashlib.blake2b(data, key=digest_key, digest_size=32).digest(), "big")


def digest_sum(parts: Iterable[int]) -> int:
    """The sum of entry digests modulo :data:`DIGEST_MODULUS`."""
    return sum(parts) % DIGEST_MODULUS
