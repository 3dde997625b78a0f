"""Inbox messages as v2 records: one sealed, signed record per account (docs/protocol.md §8.5).

The handlers build every inbox message as before, to the account's v1 inbox name; in a market
with v2 inboxes :mod:`streams.core.answering` hands them here instead of signing each one, and
gets back, per account, one record on ``<p>.inbox`` keyed by the account's route: every message
for that account in the group, sealed to the account's current sealing key and signed once. A
message is bound to its request by the digest it carries inside the record, and to its account
by the signed bytes, so nothing of it shows outside the seal.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from market.envelope import parse_public_key

from ..wire.inbox_v2 import (
    InboxMessage,
    RouteKeys,
    padded_length,
    partition_of,
    route_keys,
    seal_record,
)
from ..wire.topics import Topics
from .keys import MarketKeys
from .outputs import Output

__all__ = ["InboxRecords"]

log = logging.getLogger("emarket.core")

_CACHED = 65_536
"""Routes kept (an X25519 exchange each, ~50 µs): the accounts a worker answers often."""
_OVERHEAD = 64 + 64 + 1 + 12 + 16
"""A record's bytes besides its messages: signature, the signed bytes' head and ids (at most),
format byte, nonce and tag."""


class InboxRecords:
    """Seals groups of inbox messages into v2 records for one market.

    Parameters
    ----------
    topics : Topics
        The market's prefix, its ``<p>.inbox`` and partition count; which topics are inboxes.
    keys : MarketKeys
        The market's signing key and sealing key.
    sealing_key_of : callable
        The current sealing key (base64) of an account, or None for an account the market does
        not hold (a v2 account always has one: §8.5.2).
    max_message_bytes : int
        The broker's bound: a group that would pass it is split over several records.
    """

    def __init__(
        self,
        topics: Topics,
        keys: MarketKeys,
        sealing_key_of: Callable[[str], str | None],
        max_message_bytes: int,
    ) -> None:
        self.topics = topics
        self.keys = keys
        self.sealing_key_of = sealing_key_of
        self.room = max_message_bytes - 1024
        self._private: X25519PrivateKey | None = None
        self._routes: OrderedDict[tuple[str, str], RouteKeys] = OrderedDict()

    def route(self, account_id: str, sealing_key: str) -> RouteKeys:
        """The route and seal key of ``account_id`` under its ``sealing_key`` (cached)."""
        at = (account_id, sealing_key)
        found = self._routes.get(at)
        if found is not None:
            self._routes.move_to_end(at)
            return found
        if self._private is None:
            self._private = self.keys.sealing_key
        found = route_keys(
            self._private,
            parse_public_key(sealing_key),
            self.topics.prefix,
            account_id,
            market_side=True,
        )
        self._routes[at] = found
        if len(self._routes) > _CACHED:
            self._routes.popitem(last=False)
        return found

    def records(self, messages: Sequence[tuple[Output, str | None]]) -> list[Output]:
        """The records carrying ``messages`` (v1 inbox outputs, each with the hex SHA-256 of
        the event it answers or None), one per account in the order of its first message,
        split where one would pass the bound. A message to an account without a sealing key
        (none can exist in a v2 market) is dropped with a log line."""
        groups: dict[str, list[InboxMessage]] = {}
        for out, request in messages:
            account = self.topics.inbox_account(out.topic)
            if account is None:
                raise ValueError(f"{out.topic!r} is not an inbox of this market")
            groups.setdefault(account, []).append(InboxMessage(request, out.key or b"", out.value))
        records: list[Output] = []
        for account, group in groups.items():
            sealing_key = self.sealing_key_of(account)
            if sealing_key is None:
                log.error("no sealing key for %r: %d inbox messages dropped", account, len(group))
                continue
            keys = self.route(account, sealing_key)
            for part in self._split(group):
                records.append(self._record(keys, account, part))
        return records

    def _record(self, keys: RouteKeys, account: str, part: list[InboxMessage]) -> Output:
        value = seal_record(keys, self.keys.signing_key, self.topics.prefix, account, part)
        partition = partition_of(keys.route, self.topics.inbox_partitions)
        return Output(self.topics.shared_inbox, keys.route.encode(), value, partition)

    def _split(self, group: list[InboxMessage]) -> list[list[InboxMessage]]:
        """``group`` in runs whose record fits :attr:`room` (a message too large alone goes
        alone, to be refused by the broker and dead-lettered as any output too large)."""
        parts: list[list[InboxMessage]] = [[]]
        size = _OVERHEAD
        for m in group:
            more = 76 + len(m.key) + len(m.value)
            if parts[-1] and padded_length(size + more) > self.room:
                parts.append([])
                size = _OVERHEAD
            parts[-1].append(m)
            size += more
        return parts
