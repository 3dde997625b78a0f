"""Reading one account's inbox, v1 or v2, as the messages the market signed for it.

A v1 inbox is a topic of its own whose every record is one message, signed in its header
(docs/protocol.md §12.3). A v2 inbox is the account's share of ``<p>.inbox`` (§8.5): the
partitions of its routes (one per sealing key its key file holds), where it skips every record
whose key is not one of its routes before anything else — a comparison, not a decryption — and
opens the others, each a sealed record of several messages signed once. Either way a caller
gets, per message, its value bytes, the SHA-256 of the event it answers (or None) and the
message parsed; what is not the market's is skipped with a warning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from market.envelope import parse_public_key

from ..wire.events import INBOX_EVENT, InboxEvent, Refusal
from ..wire.inbox_v2 import InboxError, RouteKeys, open_record, partition_of, route_keys
from ..wire.topics import Topics
from .keys import Party

__all__ = ["Believed", "InboxReader", "routes_of"]

Believed = tuple[bytes, tuple[str | None, InboxEvent | Refusal]]
"""A message the market signed: its value bytes, and (the SHA-256 it answers, the message)."""


def routes_of(party: Party, topics: Topics, market_sealing_key: str) -> dict[str, RouteKeys]:
    """The routes of every sealing key ``party`` holds (current and retired), by route."""
    market = parse_public_key(market_sealing_key)
    out: dict[str, RouteKeys] = {}
    for held in party.sealing_keys:
        keys = route_keys(held.key, market, topics.prefix, party.account_id, market_side=False)
        out[keys.route] = keys
    return out


class InboxReader:
    """One account's inbox, read from its beginning.

    Parameters
    ----------
    reader_of : callable
        Makes the topic reader: (topic, the partitions to read or None for all).
    believe : callable
        A v1 message's check (:meth:`MarketClient.believe`): (topic, value, headers, key).
    topics : Topics
        The market's layout, as its identity says (v1 or v2, ``N``).
    topic : str
        The account's v1 inbox name (what names the account).
    key : Ed25519PublicKey
        The market's key.
    party : Party or None
        The account's keys (v2: the routes and seal keys come from its sealing keys).
    market_sealing_key : str or None
        The market's X25519 key from its identity (v2).
    warn : callable
        Told of every record under the account's route that is not the market's.

    Raises
    ------
    LookupError
        A v2 market and a party without a sealing key: it has no inbox (the market refuses to
        open such an account, §8.5.2).
    """

    def __init__(
        self,
        reader_of: Callable[[str, set[int] | None], Any],
        believe: Callable[..., tuple[str | None, InboxEvent | Refusal] | None],
        topics: Topics,
        topic: str,
        key: Ed25519PublicKey,
        party: Party | None,
        market_sealing_key: str | None,
        warn: Callable[[str], None],
    ) -> None:
        self.topics, self.topic, self.key, self.warn = topics, topic, key, warn
        self._believe = believe
        self.account = topics.inbox_account(topic) or ""
        self.routes: dict[str, RouteKeys] = {}
        if topics.inboxes == 2:
            if party is None or market_sealing_key is None or not party.sealing_keys:
                raise LookupError(
                    f"no inbox: this market's inboxes (v2) are read with the account's sealing "
                    f"key, and {self.account!r} has none in its key file (epsilon-market keygen "
                    "makes one)"
                )
            self.routes = routes_of(party, topics, market_sealing_key)
            parts = {partition_of(r, topics.inbox_partitions) for r in self.routes}
            self.reader = reader_of(topics.shared_inbox, parts)
        else:
            self.reader = reader_of(topic, None)

    async def start(self, wait: float = 5.0) -> None:
        await self.reader.start(wait)

    async def stop(self) -> None:
        await self.reader.stop()

    async def poll(self, timeout: float = 0.5) -> list[Believed]:
        """The messages the market signed for this account that arrived since the last poll."""
        out: list[Believed] = []
        for record_key, raw, headers in await self.reader.poll_records(timeout):
            if not self.routes:
                got = self._believe(self.topic, raw, headers, self.key)
                if got is not None:
                    out.append((raw, got))
                continue
            keys = self.routes.get(record_key.decode(errors="replace")) if record_key else None
            if keys is not None:  # another account's record: skipped by its key alone
                out += self._opened(keys, raw)
        return out

    def _opened(self, keys: RouteKeys, raw: bytes) -> list[Believed]:
        try:
            messages = open_record(keys, self.key, self.topics.prefix, self.account, raw)
        except InboxError as exc:
            self.warn(
                f"warning: ignored a record of {len(raw)} bytes under {self.account}'s route "
                f"in {self.topics.shared_inbox}: {exc}; it was written by someone else (forged?)"
            )
            return []
        out: list[Believed] = []
        for m in messages:
            try:
                out.append((m.value, (m.request, INBOX_EVENT.validate_json(m.value))))
            except ValueError:  # signed, of a type this client does not know
                continue
        return out
