"""The market's proof that a state record is its own: an HMAC on every changelog record.

Workers rebuild their tables, and every worker its account replica, from the tables' changelog
topics, which anyone allowed to write to the broker can append to. Every record the market
writes to a changelog therefore carries, in the record header :data:`HEADER`, a tag under a key
derived from the market's noise secret (:func:`streams.worker.secrets.state_mac_key`), and
every record read back is applied only if its tag verifies (:class:`StateGuard`): table
recovery (:mod:`streams.worker.tables`) and the account replica
(:mod:`streams.worker.directory`) both go through it. The tag covers the store's name, the key
and the value (or the fact that the record is a deletion), each length-prefixed, and not the
topic: a record cannot be moved to another key or another store, and a deletion (a Kafka
tombstone, which keeps its headers) cannot be forged either. The format is
``docs/protocol.md`` §3; this module is its one implementation.

What a tag does not prove is *when* the record was written: a record the market once wrote for
a key can be appended again later (docs/operations.md, "Security").
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..core.state import Stores

__all__ = ["DOMAIN", "HEADER", "STORES", "VERSION", "StateGuard", "StateMac", "covered"]

log = logging.getLogger("emarket.state")

HEADER = "emarket-state"
"""Name of the record header that carries a state record's tag."""

VERSION = 1
"""First byte of the header's value: the state-record format (``docs/protocol.md`` §3)."""

DOMAIN = b"emarket-state-v1"
"""First bytes of what a tag covers: no other message of the market MACs the same bytes."""

STORES = Stores.NAMES
"""The stores whose changelog records carry tags (labels of the refusal counter)."""

_TAG_BYTES = 32


def covered(store: str, key: bytes, value: bytes | None) -> list[bytes]:
    """The bytes a tag covers, in order (``docs/protocol.md`` §3.1).

    ``DOMAIN ‖ u8(len store) ‖ store ‖ u32be(len key) ‖ key`` then ``00`` for a deletion or
    ``01 ‖ u32be(len value) ‖ value``. Every part is length-prefixed, so two different
    (store, key, value) triples never give the same bytes. Returned as pieces, each of the
    format's fields apart, so that its readers can check them one by one.
    """
    name = store.encode("utf-8")
    if len(name) > 255:
        raise ValueError(f"store name too long: {store!r}")
    head = DOMAIN + bytes([len(name)]) + name + len(key).to_bytes(4, "big")
    if value is None:
        return [head, key, b"\x00"]
    return [head, key, b"\x01" + len(value).to_bytes(4, "big"), value]


@dataclass(frozen=True)
class StateMac:
    """Tags of state records under the market's state key (never printed: see ``repr``)."""

    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.key) < 16:
            raise ValueError("a state MAC key is at least 16 bytes")

    def tag(self, store: str, key: bytes, value: bytes | None) -> bytes:
        """The header value of a record: ``u8(VERSION) ‖ HMAC-SHA256(key, covered(...))``."""
        # one-shot HMAC (OpenSSL, no object per record): joining the pieces costs less than
        # feeding them to an hmac object one by one, even for a value of a few kilobytes
        return bytes([VERSION]) + hmac.digest(self.key, b"".join(covered(store, key, value)),
                                              "sha256")  # fmt: skip

    def headers(self, store: str, key: bytes, value: bytes | None) -> list[tuple[str, bytes]]:
        """The headers the market writes with a record of ``store``."""
        return [(HEADER, self.tag(store, key, value))]

    def refusal(
        self, store: str, key: bytes | None, value: bytes | None, headers: Any
    ) -> str | None:
        """Why a record read back is not the market's, or None when its tag verifies."""
        if key is None:
            return "no key"
        tags = [v for k, v in _pairs(headers) if k == HEADER]
        if not tags:
            return "no tag"
        if len(tags) > 1:
            return "more than one tag"
        (got,) = tags
        if not isinstance(got, bytes | bytearray) or len(got) != 1 + _TAG_BYTES:
            return "malformed tag"
        if got[0] != VERSION:
            return f"tag of unknown format {got[0]}"
        if not hmac.compare_digest(bytes(got), self.tag(store, key, value)):
            return "bad tag"
        return None


def _pairs(headers: Any) -> Iterable[tuple[str, Any]]:
    """A record's headers as (name, value) pairs, whatever the client gave (None, a tuple of
    pairs, a list, a mapping)."""
    if not headers:
        return ()
    if isinstance(headers, dict):
        return list(headers.items())
    return [(str(k), v) for k, v in headers]


class StateGuard:
    """Admits a state record read back only if the market wrote it; refuses others loudly.

    A refused record is counted (``emarket_state_records_refused_total{store}``, alert
    ``MarketStateForged``), logged with where it was read, and never applied: the reader keeps
    what it had for that key, a refused deletion included.
    """

    def __init__(self, mac: StateMac, refused: Any = None) -> None:
        self.mac = mac
        self.refused = refused  # a prometheus Counter labelled by store, or None (tests)

    def admit(
        self,
        store: str,
        key: bytes | None,
        value: bytes | None,
        headers: Any,
        *,
        where: tuple[str, int | None, int | None],
        reader: str,
    ) -> bool:
        """True if the record's tag verifies; else count, log and return False.

        ``where`` is the record's (topic, partition, offset); ``reader`` names what read it
        (table recovery or the account replica) for the log line.
        """
        why = self.mac.refusal(store, key, value, headers)
        if why is None:
            return True
        if self.refused is not None:
            self.refused.labels(store).inc()
        topic, partition, offset = where
        log.error(
            "refused a record of the %s store that the market did not write (%s) at "
            "%s[%s]@%s, key %.80r, %s: the %s does not apply it and keeps what it had",
            store, why, topic, partition, offset, key,
            "a deletion" if value is None else f"{len(value)} bytes", reader,
        )  # fmt: skip
        return False
