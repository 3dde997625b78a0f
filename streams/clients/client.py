"""A small asyncio client for sellers and buyers (used by the CLI, the demo and the tests).

It speaks only the public wire format (:mod:`streams.wire`) over aiokafka, so it doubles as a
reference for clients in other languages. A client acts as one :class:`~.keys.Party`: every
event it sends is signed with the party's key for one market, named by its prefix and its key's
id (:attr:`MarketClient.market`: the client reads the market's key before it signs anything),
and the market answers in the party's inbox
topic, which the client reads from the beginning (no consumer group) matching answers by
request id — that also works on the embedded broker, whose "latest offset" answer is unreliable.

A value batch's numbers are **sealed to the market's key** before they are sent
(:func:`streams.wire.sealing.seal_values`): the key is ``market_sealing_key`` of the stream's
catalog entry, or the one the client is given (``market_sealing_key``: pin it where whoever
may write the catalog topic is not only the market).

The client **believes only what the market signed**: every message the market writes to an
inbox, and every refusal, carries its Ed25519 signature over the topic, the SHA-256 of the
event answered and the message's bytes (:mod:`streams.wire.answers`). An answer counts only if
it verifies under the market's key (``market_public_key``, or the one the market's identity
record ``<p>.market`` publishes, pinned for the client's life) *and* answers the exact bytes
this client sent; anything else in the inbox is skipped, a forgery with a warning
(``on_warning``). After sending, the client also watches ``<p>.refusals`` for those bytes, so a
refusal of an event the market could not attribute (no account, a bad signature) is reported at
once rather than after the timeout.

Requests are **retried by resending the same event** (same id, same timestamps, same
signature) when no answer arrives in time: the market treats the id as an idempotency key, so a
resend can never charge twice or draw new noise, and it repairs the rare case of a worker
skipping an event during a consumer-group rebalance.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from market.envelope import EnvelopeError
from market.errors import ReceiptError
from market.receipts import key_id, parse_public_key

from ..broker.admin import ensure_topics
from ..broker.auth import env_auth
from ..broker.first_record import first_record
from ..broker.kafka_internals import fresh_metadata
from ..wire.answers import AnswerError, describe, verify_answer
from ..wire.events import (
    INBOX_EVENT,
    AccountState,
    CatalogEntry,
    InboxPayload,
    Invitation,
    PurchaseFulfilled,
    PurchaseRequest,
    QuoteAnswer,
    QuoteRequest,
    Refusal,
    Rejection,
    Reservation,
    ReserveRequest,
    Sale,
    Sales,
    StreamRegistration,
    ValueBatch,
    ValueOutcome,
    ValuesAccepted,
)
from ..wire.inbox_v2 import partition_of
from ..wire.root import RootError, read_root, trusted_key
from ..wire.sealing import seal_values
from ..wire.signing import MarketRef
from ..wire.topics import Topics
from ..wire.work import DEFAULT_BITS as DEFAULT_WORK_BITS
from ..wire.work import solve
from .batching import DEFAULT_MAX_DELAY, DEFAULT_MAX_VALUES, Answered, ValueBatcher
from .inbox_reader import InboxReader, routes_of
from .keys import Party
from .numbering import Numbering
from .opening import InboxOpener, Unopened

__all__ = [
    "InboxEvent",
    "MarketClient",
    "MarketKeyError",
    "MarketRootError",
    "SentValues",
    "TopicReader",
    "ValueData",
    "now_ms",
]

ValueData = Sequence[float] | Mapping[str, float] | Mapping[int, float]
"""A value's numbers; on a histogram stream, its counts by key (a key not listed counts 0)."""

InboxEvent = InboxPayload
Message = tuple[bytes | None, bytes, list[tuple[str, bytes]]]
"""A record as read: key, value and headers."""

log = logging.getLogger("emarket.client")

REFUSAL_GRACE = 1.0
"""Seconds a refusal waits for the inbox's rejection of the same bytes, which says more."""
MAX_CLIENT_WORK_BITS = DEFAULT_WORK_BITS + 4
"""The most proof of work an opening of this client does (16 times the default's)."""


class MarketKeyError(ValueError):
    """The market's signing key is not known: nothing the market says can be checked."""


class MarketRootError(MarketKeyError):
    """The market's trust root (the first record of ``<p>.market``) cannot be trusted:
    ``reason`` is ``tombstone``, ``malformed`` or ``foreign`` (docs/protocol.md §12.1.1)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _parse_market_key(text: str) -> Ed25519PublicKey:
    try:
        return parse_public_key(text)
    except ReceiptError as exc:
        raise MarketKeyError(f"the market's key: {exc.message}") from None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class TopicReader:
    """Reads every partition of one or more topics from the beginning, without a group."""

    def __init__(
        self,
        bootstrap: str,
        topic: str | Sequence[str],
        *,
        fetch_max_wait_ms: int = 20,
        partitions: set[int] | None = None,
        **auth: Any,
    ) -> None:
        """``partitions``: read only these (of every topic); None: all."""
        self.topics = [topic] if isinstance(topic, str) else list(topic)
        self.only = partitions
        self._consumer = AIOKafkaConsumer(
            **auth,
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=fetch_max_wait_ms,
            max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )
        self._next: dict[TopicPartition, int] = {}

    async def start(self, wait: float = 5.0, *, from_end: bool = False) -> None:
        """Assign every partition and seek to its beginning (``from_end``: to the newest
        record, one back: the embedded broker may answer an end one record too far)."""
        try:
            await self._consumer.start()
        except BaseException:
            await self._consumer.stop()
            raise
        tps: list[TopicPartition] = []
        for topic in self.topics:
            parts: set[int] | None = None
            for _ in range(max(1, int(wait / 0.1))):
                # consumer.partitions_for_topic reads cached metadata: ask the broker afresh
                cluster = await fresh_metadata(self._consumer)
                parts = cluster.partitions_for_topic(topic)
                if parts:
                    break
                await asyncio.sleep(0.1)
            if not parts:
                await self._consumer.stop()
                raise LookupError(f"topic {topic} does not exist")
            tps += [
                TopicPartition(topic, p)
                for p in sorted(parts)
                if self.only is None or p in self.only
            ]
        self._consumer.assign(tps)
        if not from_end:
            await self._consumer.seek_to_beginning(*tps)
            return
        ends = await self._consumer.end_offsets(tps)
        for tp in tps:
            self._consumer.seek(tp, max(0, ends[tp] - 1))

    async def stop(self) -> None:
        await self._consumer.stop()

    async def poll(self, timeout: float = 0.5) -> list[tuple[bytes | None, bytes]]:
        return [(k, v) for k, v, _ in await self.poll_records(timeout)]

    async def poll_records(self, timeout: float = 0.5) -> list[Message]:
        """Like :meth:`poll`, with each record's headers (what carries the market's
        signature of an answer).

        A partition whose high watermark falls below the next offset to read was deleted and
        made again under the reader (anyone may delete a topic on the embedded broker, and the
        market makes a lost inbox again): it is read again from its beginning, where the new
        topic's records are, instead of waiting past them."""
        batch = await self._consumer.getmany(timeout_ms=int(timeout * 1000))
        for tp, recs in batch.items():
            if recs:
                self._next[tp] = recs[-1].offset + 1
        for tp, next_offset in list(self._next.items()):
            high = self._consumer.highwater(tp)
            if high is not None and high < next_offset:
                self._next[tp] = 0
                self._consumer.seek(tp, 0)
        return [
            (r.key, r.value, list(r.headers or ()))
            for recs in batch.values()
            for r in recs
            if r.value is not None
        ]


class MarketClient:
    """Producer plus on-demand topic readers against one broker, acting as one party."""

    def __init__(
        self,
        bootstrap: str,
        topics: Topics | None = None,
        *,
        party: Party | None = None,
        auth: dict[str, Any] | None = None,
        market_sealing_key: str | None = None,
        seal_values: bool = True,
        market_public_key: str | None = None,
        on_warning: Callable[[str], None] | None = None,
        batch_values: int = DEFAULT_MAX_VALUES,
        batch_delay: float = DEFAULT_MAX_DELAY,
    ) -> None:
        """``auth``: aiokafka SASL keyword arguments (see :func:`streams.broker.auth.kafka_auth`);
        defaults to ``EMARKET_KAFKA_USER``/``EMARKET_KAFKA_PASSWORD`` if set.
        ``market_sealing_key``: the market's X25519 key to seal values to (default: read from
        the catalog); ``seal_values`` False sends clear numbers (a market refuses them unless
        its operators accept them while clients migrate). ``market_public_key``: the market's
        Ed25519 key (base64) that answers must be signed with, pinned: a market whose identity
        record names another is refused (default: the one ``<p>.market`` publishes, trusted on
        first use with a warning; docs/protocol.md §12.1.1); ``on_warning`` is told of every
        message skipped as not the market's, and of a key trusted on first use.
        ``batch_values`` and ``batch_delay``: what :meth:`publish` and :meth:`batcher` gather
        a stream's values into, at most so many values per batch, each value waiting at most so
        many seconds for others (:mod:`streams.clients.batching`; 1 value, or 0 s, sends each
        value alone)."""
        self.bootstrap = bootstrap
        self.market_public_key = market_public_key or None
        self._market_key: Ed25519PublicKey | None = None
        self.on_warning = on_warning or log.warning
        self.market_sealing_key = market_sealing_key
        self.seal_values = seal_values
        self.topics = topics or Topics()
        self.party = party
        self.auth = auth if auth is not None else env_auth()
        self._published: dict[tuple[str, str], int] = {}
        self._sealing_keys: dict[str, str] = {}
        self._registrations: dict[str, StreamRegistration] = {}
        self._requested: dict[tuple[str, str], int] = {}
        self._work_bits = 0  # the proof of work this client's openings carry (more_work: more)
        self.batch_values, self.batch_delay = batch_values, batch_delay
        self._batchers: dict[tuple[str, bool, float], ValueBatcher] = {}
        self.numbering = Numbering()
        """The numbers of this process's value batches, per stream (docs/protocol.md §6.4.1)."""
        self._sent_values: dict[str, SentValues] = {}
        self._parties: dict[str, Party] = {}  # the keys each account's inbox is read with
        self._inbox_sealing_key: str | None = None  # the identity's, in a v2 market
        self._producer = AIOKafkaProducer(
            **self.auth,
            bootstrap_servers=bootstrap,
            linger_ms=2,
            max_request_size=16 * 1024 * 1024,
            acks="all",
        )

    async def __aenter__(self) -> MarketClient:
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()  # release its connections and warnings
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            for batcher in self._batchers.values():  # the values published and not sent yet
                await batcher.close()
            for sent in self._sent_values.values():
                await sent.stop()
        finally:
            await self._producer.stop()

    @property
    def market(self) -> MarketRef:
        """What signatures name as the market: its topic prefix and its key's id (§2). Known
        once :meth:`signing_market` (or any request) has read the market's key, or at once
        when the client was given ``market_public_key``.

        Raises
        ------
        MarketKeyError
            The market's key has not been read yet.
        """
        if self._market_key is not None:
            return MarketRef(self.topics.prefix, key_id(self._market_key))
        if self.market_public_key is not None:
            try:
                return MarketRef.of(self.topics.prefix, self.market_public_key)
            except ValueError:
                raise MarketKeyError("market_public_key is not an Ed25519 key in base64") from None
        raise MarketKeyError(
            "signatures name the market's key, which this client has not read yet: await "
            "client.signing_market() first (or pass market_public_key)"
        )

    async def signing_market(self, *, wait: float = 30.0) -> MarketRef:
        """What signatures name as the market, reading its key first if need be
        (:meth:`market_key`): a party signs nothing before it knows which market it signs for."""
        await self.market_key(wait=wait)
        return self.market

    def _me(self, party: Party | None) -> Party:
        me = party or self.party
        if me is None:
            raise ValueError("this request is signed: give the client a Party (keys)")
        self._parties[me.account_id] = me
        return me

    async def send(self, topic: str, key: str, payload: bytes) -> tuple[int, int]:
        """Send ``payload`` keyed by ``key``; the partition and offset it was written at."""
        meta = await self._producer.send_and_wait(topic, payload, key=key.encode())
        return int(meta.partition), int(meta.offset)

    async def market_key(self, *, wait: float = 30.0) -> Ed25519PublicKey:
        """The key every answer must be signed with, read once and kept: the market's trust
        root (the first record of partition 0 of ``<p>.market``, whatever it is: the record
        every worker of the market checks its secrets against, docs/protocol.md §12.1.1) must
        be a valid market identity; its key must be the one given (``market_public_key``,
        pinned), else it is trusted on first use, with a warning naming it and how to pin it.
        Waits up to ``wait`` seconds for a market whose first worker has not started yet.

        Raises
        ------
        MarketRootError
            The root is a tombstone, not a market identity, or names another key than the
            pinned one: the market's trust root is spoiled (its ``reason`` says which).
        MarketKeyError
            The pinned key is not a key, or the root publishes none (a market made before
            answers were signed) and none is pinned.
        TimeoutError
            No record within ``wait``: no worker of this market has ever started.
        """
        if self._market_key is None:
            pinned = self.market_public_key
            if pinned is not None:
                _parse_market_key(pinned)
            text = await self._published_key(wait)  # and the inbox layout it records
            self._market_key = _parse_market_key(text)
            if pinned is None:
                self.on_warning(
                    f"warning: trusting the market key {self._key_id(text)} ({text}) that "
                    f"{self.topics.identity} names, on first use: nothing proves it is the "
                    f"market's. Pin it: --market-key {text} (EMARKET_MARKET_KEY, "
                    "market_public_key=; its operators publish it, `epsilon-market serve` prints "
                    "it)"
                )
        return self._market_key

    async def _published_key(self, wait: float) -> str:
        """The market key the root of ``<p>.market`` vouches for (the pinned one if given and
        the root agrees); raises as :meth:`market_key`."""
        topic = self.topics.identity
        try:
            first = await first_record(
                self.bootstrap, topic, timeout=wait, wait_for_one=True, **self.auth
            )
        except TimeoutError:
            raise TimeoutError(
                f"no market identity on {topic} within {wait}s: has a worker "
                "of this market started?"
            ) from None
        assert first is not None  # waited for one
        try:
            root = read_root(topic, *first)
            text = trusted_key(topic, root, self.market_public_key)
        except RootError as exc:
            if exc.reason == "no_key":
                raise MarketKeyError(exc.message) from None
            raise MarketRootError(exc.reason, exc.message) from None
        if root.inbox_partitions is not None:  # v2: the identity has all three (§8.5.1)
            self.topics = replace(self.topics, inboxes=2, inbox_partitions=root.inbox_partitions)
            self._inbox_sealing_key = root.market_sealing_key
        return text

    def inbox_reader(self, topic: str) -> InboxReader:
        """A reader of the inbox named ``topic`` (v1's name of the account's inbox), once the
        market's key and layout are read (:meth:`market_key`): in a v2 market, the
        partitions of the account's routes, computed with the keys it last acted with."""
        if self._market_key is None:
            raise RuntimeError("read the market's key first (market_key)")
        account = self.topics.inbox_account(topic) or ""
        return InboxReader(
            lambda t, parts: TopicReader(self.bootstrap, t, partitions=parts, **self.auth),
            self.believe,
            self.topics,
            topic,
            self._market_key,
            self._parties.get(account) or (self.party if self.party is not None else None),
            self._inbox_sealing_key,
            self.on_warning,
        )

    def inbox_of(self, party: Party) -> str:
        """Where ``party``'s inbox is, for a person: its topic (v1), or the partition of
        ``<p>.inbox`` and the route its records are keyed by (v2, once the market's identity
        is read)."""
        if self.topics.inboxes != 2 or self._inbox_sealing_key is None:
            return self.topics.inbox(party.account_id)
        (route, *_) = routes_of(party, self.topics, self._inbox_sealing_key)
        p = partition_of(route, self.topics.inbox_partitions)
        return f"{self.topics.shared_inbox} partition {p}, records keyed {route}"

    @staticmethod
    def _key_id(text: str) -> str:
        return hashlib.sha256(base64.b64decode(text)).hexdigest()[:16]

    def believe(
        self, topic: str, value: bytes, headers: list[tuple[str, bytes]], key: Ed25519PublicKey
    ) -> tuple[str | None, InboxEvent | Refusal] | None:
        """(the SHA-256 of the event it answers, the message) if the market signed ``value``
        for ``topic``; else None, with a warning."""
        try:
            request = verify_answer(key, self.topics.prefix, topic, value, headers)
        except AnswerError as exc:
            self.on_warning(
                f"warning: ignored {describe(value)} in {topic}: {exc}; it was "
                "written by someone else (forged?)"
            )
            return None
        try:
            if topic == self.topics.refusals:
                return request, Refusal.model_validate_json(value)
            return request, INBOX_EVENT.validate_json(value)
        except ValueError:  # signed, of a type this client does not know
            return None

    # -- accounts -------------------------------------------------------------------------------
    async def open_account(
        self,
        party: Party | None = None,
        *,
        timeout: float = 30.0,
        invitation: Invitation | None = None,
    ) -> AccountState | Rejection:
        """Open the party's account (pin its keys) and wait until the market confirms it; a
        market that opens accounts by invitation wants the operators' ``invitation``.

        Raises
        ------
        ValueError
            The market's answer pins other keys than the party's (never the case for a
            genuine answer to this request: the account belongs to another key).
        """
        me = self._me(party)
        while True:
            bits = self._work_bits
            work = (
                None
                if bits == 0
                else await asyncio.to_thread(
                    solve, self.topics.prefix, me.account_id, me.public_key, bits
                )
            )
            event = me.open_account(await self.signing_market(), invitation=invitation, work=work)
            got = await self._request(
                self.topics.accounts,
                me.account_id,
                event.model_dump_json().encode(),
                lambda ev: isinstance(ev, AccountState | Rejection),
                inbox=me.account_id,
                timeout=timeout,
                create_inbox=False,
            )
            assert isinstance(got, AccountState | Rejection)
            if not (
                isinstance(got, Rejection)
                and got.reason == "more_work"
                and bits < MAX_CLIENT_WORK_BITS
            ):
                break
            # an open market asks proof of work (docs/protocol.md §6.1.2): its default, then more
            self._work_bits = DEFAULT_WORK_BITS if bits < DEFAULT_WORK_BITS else bits + 2
        if isinstance(got, AccountState) and (got.signing_key, got.sealing_key) != (
            me.public_key,
            me.sealing_public_key,
        ):
            raise ValueError(f"account {me.account_id!r} belongs to another key ({got.key_id})")
        return got

    async def rotate_keys(
        self, new: Party, version: int, *, party: Party | None = None, timeout: float = 30.0
    ) -> AccountState | Rejection:
        """Replace the party's keys by ``new``'s at ``version`` (the account's version + 1),
        signed by both, and wait for the market's answer to these bytes: the account's new
        state, or its refusal (``stale_key_version``: not the account's version + 1)."""
        me = self._me(party)
        market = await self.signing_market()
        payload = me.rotate_to(new, market, version).model_dump_json().encode()
        self._parties[me.account_id] = new.holding([me])  # the answer is sealed to the new key
        got = await self._request(
            self.topics.accounts,
            me.account_id,
            payload,
            lambda ev: isinstance(ev, AccountState | Rejection),
            inbox=me.account_id,
            timeout=timeout,
            create_inbox=False,
            resend_every=timeout,
        )
        assert isinstance(got, AccountState | Rejection)
        return got

    # -- sellers ----------------------------------------------------------------------------------
    async def register(
        self, fields: dict[str, Any], *, party: Party | None = None, timeout: float = 30.0
    ) -> CatalogEntry | Rejection:
        """Register a stream (``fields`` of a registration, signed here) and wait for the catalog
        entry or the rejection."""
        me = self._me(party)
        market = await self.signing_market()
        reg = me.sign(StreamRegistration, market, **{"seller_id": me.account_id, **fields})
        payload = reg.model_dump_json().encode()
        # from its end, started before the send: the entry is newer, and reading every
        # stream's entry again would make each registration cost more than the last
        catalog = TopicReader(self.bootstrap, self.topics.catalog, **self.auth)
        await catalog.start(from_end=True)
        watch = await self._watch(
            self.topics.inbox(me.account_id), self.topics.registrations, payload, None, wait=timeout
        )
        try:
            watch.sent.add(await self.send(self.topics.registrations, reg.stream_id, payload))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for _, raw, headers in await catalog.poll_records(0.2):
                    # the acceptance, if the market signed it (§12): a stranger can copy the
                    # registration into an entry naming its own sealing key
                    if not self.believe_catalog(raw, headers, watch.key):
                        continue
                    entry = CatalogEntry.model_validate_json(raw)
                    if entry.registration == reg:
                        self._registrations[reg.stream_id] = reg
                        if entry.market_sealing_key is not None:
                            self._sealing_keys[reg.stream_id] = entry.market_sealing_key
                        return entry
                for ev in await watch.poll(0.05):
                    if isinstance(ev, Rejection):
                        return ev
            raise TimeoutError(f"no catalog entry for {reg.stream_id} in {timeout}s")
        finally:
            await catalog.stop()
            await watch.stop()

    def value_batch(
        self,
        stream_id: str,
        items: Sequence[tuple[str | None, ValueData, int | None]],
        *,
        party: Party | None = None,
    ) -> ValueBatch:
        """A signed batch of (value id, numbers, publication time) — ids and times remembered so
        a resend of the same id carries its original time. On a histogram stream a value's
        numbers are a mapping from keys (text, or whole numbers) to counts. Signed for
        :attr:`market`: the market's key must have been read (:meth:`signing_market`)."""
        me = self._me(party)
        market = self.market
        rows = []
        for given, values, stamp in items:
            vid = given or uuid.uuid4().hex[:16]
            first = stamp or self._published.get((stream_id, vid)) or now_ms()
            self._published[(stream_id, vid)] = first
            row: dict[str, Any] = {"value_id": vid, "published_at_ms": first}
            if isinstance(values, Mapping):
                row["keys"] = [str(k) for k in values]
                row["values"] = [float(v) for v in values.values()]
            else:
                row["values"] = list(values)
            rows.append(row)
        return me.sign(
            ValueBatch,
            market,
            stream_id=stream_id,
            seller_id=me.account_id,
            items=rows,
            batch_seq=self.numbering.take(stream_id),
        )

    async def renumbered(self, batch: ValueBatch, *, party: Party | None = None) -> ValueBatch:
        """``batch`` (as signed, before sealing) with the next free number of its stream,
        signed again: for a batch whose number the market did not take."""
        fields = batch.model_dump(exclude={"key_id", "signature", "batch_seq"})
        n = self.numbering.take(batch.stream_id)
        return self._me(party).sign(ValueBatch, await self.signing_market(), **fields, batch_seq=n)

    async def publish_batch(
        self,
        batch: ValueBatch,
        *,
        wait: bool = True,
        timeout: float = 60.0,
        party: Party | None = None,
        renumber: bool = True,
    ) -> ValuesAccepted | Rejection | None:
        """Send a batch; with ``wait``, return the market's answer (one line per value).

        A stream takes at most so many values per batch (more holders, fewer values): if the
        market answers ``batch_too_large``, the batch is split as it says, re-signed and sent
        again, and the answers are merged into one. A batch numbered too far ahead
        (``batch_seq_out_of_window``: batches of an earlier process were lost) is numbered
        again as the market says (``renumber``) and sent again, once; so is one a market of an
        earlier version refused for its number, unnumbered.
        """
        sent = await self.sealed(batch, party=party)
        payload = sent.model_dump_json().encode()
        if not wait:
            await self.send(self.topics.values, batch.stream_id, payload)
            self.numbering.settle(batch.stream_id, batch.batch_seq, None)
            return None
        try:
            got = await self._publish_once(sent, payload, timeout)
        except BaseException:
            self.numbering.settle(batch.stream_id, batch.batch_seq, None)
            raise
        if self.numbering.settle(batch.stream_id, batch.batch_seq, got) and renumber:
            again = await self.renumbered(batch, party=party)
            return await self.publish_batch(again, timeout=timeout, party=party, renumber=False)
        if isinstance(got, Rejection) and got.reason == "batch_too_large":
            size = int(got.details.get("max_values", 1))
            if 0 < size < len(batch.items) and batch.sealed is None:
                return await self._publish_split(batch, size, timeout, party)
        return got

    async def sealed(self, batch: ValueBatch, *, party: Party | None = None) -> ValueBatch:
        """``batch`` with its numbers sealed to the market's key and signed again (unchanged if
        it is sealed already, or if this client sends clear numbers)."""
        if batch.sealed is not None or not self.seal_values:
            return batch
        key = self.market_sealing_key or await self.sealing_key_of(batch.stream_id)
        fields = seal_values(batch, self.topics.prefix, key).model_dump(
            exclude={"key_id", "signature"}
        )
        return self._me(party).sign(ValueBatch, await self.signing_market(), **fields)

    async def sealing_key_of(self, stream_id: str) -> str:
        """The market's sealing key as the catalog lists it (cached per stream).

        The key is the market's, not the stream's: every entry of one market names the same, so
        a stream not in the catalog (yet), or registered before markets sealed values, takes the
        one the other entries name.

        Raises
        ------
        LookupError
            No catalog entry names a sealing key.
        ValueError
            The catalog names more than one sealing key: someone other than the market wrote
            to it; pass ``market_sealing_key`` obtained from the market's operators.
        """
        if stream_id in self._sealing_keys:
            return self._sealing_keys[stream_id]
        # only the entries the market signed: anyone may write to the catalog, and a forged
        # entry naming another sealing key would have sellers seal their numbers to its writer
        entries, _ = await self.catalog_records()
        keys = {e.market_sealing_key for e in entries if e.market_sealing_key}
        if len(keys) > 1:
            raise ValueError(
                "the catalog names more than one market sealing key, so someone other than the "
                "market wrote to it: pass the key obtained from the market's operators"
            )
        if not keys:
            raise LookupError(
                "no catalog entry signed by the market names its sealing key "
                "(a market made before catalog entries were signed: pass "
                "market_sealing_key)"
            )
        self._sealing_keys[stream_id] = key = keys.pop()
        return key

    async def _publish_once(
        self, batch: ValueBatch, payload: bytes, timeout: float
    ) -> ValuesAccepted | Rejection:
        digest = hashlib.sha256(payload).hexdigest()
        got = await self._request(
            self.topics.values,
            batch.stream_id,
            payload,
            lambda ev: _answers_batch(ev, batch, digest),
            inbox=batch.seller_id,
            timeout=timeout,
        )
        assert isinstance(got, ValuesAccepted | Rejection)
        return got

    async def _publish_split(
        self, batch: ValueBatch, size: int, timeout: float, party: Party | None
    ) -> ValuesAccepted | Rejection:
        me = self._me(party)
        lines: list[ValueOutcome] = []
        for start in range(0, len(batch.items), size):
            rows = [i.model_dump() for i in batch.items[start : start + size]]
            part = me.sign(
                ValueBatch,
                await self.signing_market(),
                stream_id=batch.stream_id,
                seller_id=batch.seller_id,
                items=rows,
                batch_seq=self.numbering.take(batch.stream_id),
            )
            got = await self.publish_batch(part, timeout=timeout, party=party)
            assert got is not None  # waited for
            if isinstance(got, Rejection):
                return got
            lines += got.outcomes
        return ValuesAccepted(stream_id=batch.stream_id, seller_id=batch.seller_id, outcomes=lines)

    async def publish(
        self,
        stream_id: str,
        values: ValueData,
        *,
        value_id: str | None = None,
        published_at_ms: int | None = None,
        wait: bool = True,
        timeout: float = 60.0,
    ) -> str:
        """Publish one value (numbers, or on a histogram stream a mapping key → count); return
        its id. A resend keeps its identity (the id's first publication time). With ``wait``,
        raise :class:`ValueError` if the market refused it; without, return once it is queued
        (it is sent within ``batch_delay`` seconds, and at the latest when the client closes).

        Values published at once by several tasks share batches (``batch_values``,
        ``batch_delay``): a value waits up to ``batch_delay`` for others."""
        key = (stream_id, wait, timeout)
        if key not in self._batchers:
            self._batchers[key] = self.batcher(stream_id, wait=wait, timeout=timeout)
        vid = value_id or uuid.uuid4().hex[:16]
        line = await self._batchers[key].add(values, value_id=vid, published_at_ms=published_at_ms)
        if not wait:
            return vid
        got = await line
        if got is not None and got.status == "rejected":
            raise ValueError(f"value {vid} refused: {got.reason}: {got.message}")
        return vid

    def batcher(
        self,
        stream_id: str,
        *,
        max_values: int | None = None,
        max_delay: float | None = None,
        wait: bool = True,
        timeout: float = 60.0,
        on_answer: Answered | None = None,
    ) -> ValueBatcher:
        """A :class:`~streams.clients.batching.ValueBatcher` of ``stream_id`` signed as this
        client's party: values added to it go out in batches of up to ``max_values`` (default
        ``batch_values``), each value waiting at most ``max_delay`` seconds (default
        ``batch_delay``), and each gets its own line of the market's answer."""
        return ValueBatcher(
            self,
            stream_id,
            max_values=self.batch_values if max_values is None else max_values,
            max_delay=self.batch_delay if max_delay is None else max_delay,
            wait=wait,
            timeout=timeout,
            on_answer=on_answer,
        )

    def published_at(self, stream_id: str, value_id: str) -> int | None:
        """When this client first published ``value_id`` (what a resend must carry)."""
        return self._published.get((stream_id, value_id))

    async def catalog(self, *, settle: float = 0.5) -> dict[str, CatalogEntry]:
        """The newest catalog entry of every stream."""
        entries, _ = await self.catalog_records(settle=settle)
        return {e.registration.stream_id: e for e in entries}

    def market_entries(
        self, records: Sequence[Message], key: Ed25519PublicKey
    ) -> list[CatalogEntry]:
        """The catalog entries of ``records`` the market signed (docs/protocol.md §12), oldest
        first; any other record is skipped with a warning."""
        return [
            CatalogEntry.model_validate_json(raw)
            for _, raw, headers in records
            if self.believe_catalog(raw, headers, key)
        ]

    def believe_catalog(self, value: bytes, headers: Any, key: Ed25519PublicKey) -> bool:
        """Whether ``value`` is a catalog entry the market signed for its catalog topic."""
        try:
            verify_answer(key, self.topics.prefix, self.topics.catalog, value, headers)
            CatalogEntry.model_validate_json(value)
        except AnswerError as exc:
            self.on_warning(
                f"warning: ignored {describe(value)} in {self.topics.catalog}: {exc}; "
                "it was written by someone else (forged?)"
            )
            return False
        except ValueError:
            return False
        return True

    async def catalog_records(self, *, settle: float = 0.5) -> tuple[list[CatalogEntry], int]:
        """Every entry the market signed on the catalog topic, oldest first, and how many
        records were not such entries.

        A record that is not one (junk, or an entry written by someone other than the market,
        possible on a broker without ACLs: its terms, prices or keys would mislead whoever
        reads them) is skipped and counted, never fatal: one bad record must not hide the
        catalog from every buyer.
        """
        signer = await self.market_key()
        reader = TopicReader(self.bootstrap, self.topics.catalog, **self.auth)
        await reader.start()
        records: list[Message] = []
        try:
            while batch := await reader.poll_records(settle):
                records.extend(batch)
        finally:
            await reader.stop()
        entries = self.market_entries(records, signer)
        self._registrations.update((e.registration.stream_id, e.registration) for e in entries)
        return entries, len(records) - len(entries)

    def registration_of(self, stream_id: str) -> StreamRegistration | None:
        """The stream's registration as the market's signed catalog last showed it to this
        client (``None`` if this client has not read it there): what a client may check a
        value against before sending it, e.g. counts (:mod:`streams.wire.counts`)."""
        return self._registrations.get(stream_id)

    # -- buyers -----------------------------------------------------------------------------------
    async def buy(
        self,
        stream_id: str,
        *,
        target_level: float | None = None,
        accuracy: dict[str, float] | None = None,
        most_accurate: bool = False,
        max_price_minor: int,
        currency: str = "EUR",
        purchase_id: str | None = None,
        reservation_id: str | None = None,
        timeout: float = 60.0,
        resend_every: float = 15.0,
        requested_at_ms: int | None = None,
        party: Party | None = None,
    ) -> PurchaseFulfilled | Rejection:
        """Buy and wait for the outcome, resending the same request until it arrives.

        What to buy: the next step (default), ``target_level``, an ``accuracy`` (``{"rmse":
        r}`` or ``{"half_width": t, "confidence": c}``: the cheapest level that meets it), or
        ``most_accurate`` (the most accurate level ``max_price_minor`` buys). With
        ``reservation_id`` (a live reservation of the party's, :meth:`reserve`) it buys that
        reservation's level at its price, in the room it holds.

        Sealed releases are returned opened with the party's sealing key (the event keeps the
        envelope, which the receipt binds). A purchase id keeps its identity: its request time
        is ``requested_at_ms`` if given, else the time this client first sent that id.
        """
        me = self._me(party)
        pid = purchase_id or uuid.uuid4().hex[:20]
        stamp = requested_at_ms or self._requested.setdefault((me.account_id, pid), now_ms())
        req = me.sign(
            PurchaseRequest,
            await self.signing_market(),
            purchase_id=pid,
            buyer_id=me.account_id,
            stream_id=stream_id,
            target_level=target_level,
            accuracy=accuracy,
            most_accurate=most_accurate,
            max_price_minor=max_price_minor,
            currency=currency,
            requested_at_ms=stamp,
            reservation_id=reservation_id,
        )
        got = await self._request(
            self.topics.purchases,
            stream_id,
            req.model_dump_json().encode(),
            lambda ev: _answers(ev, pid),
            inbox=me.account_id,
            opener=me,
            timeout=timeout,
            resend_every=resend_every,
            request_id=pid,
        )
        assert isinstance(got, PurchaseFulfilled | Rejection)
        return got

    async def quote(
        self,
        stream_id: str,
        *,
        target_level: float | None = None,
        accuracy: dict[str, float] | None = None,
        timeout: float = 30.0,
        party: Party | None = None,
    ) -> QuoteAnswer | Rejection:
        """What a purchase would buy and cost, with every level for sale (``offers``: level,
        RMS error, 95 % half-width, price from the level held)."""
        me = self._me(party)
        qid = uuid.uuid4().hex[:20]
        req = me.sign(
            QuoteRequest,
            await self.signing_market(),
            quote_id=qid,
            buyer_id=me.account_id,
            stream_id=stream_id,
            target_level=target_level,
            accuracy=accuracy,
            requested_at_ms=now_ms(),
        )
        got = await self._request(
            self.topics.purchases,
            stream_id,
            req.model_dump_json().encode(),
            lambda ev: _answers(ev, qid),
            inbox=me.account_id,
            timeout=timeout,
            resend_every=timeout,
            request_id=qid,
        )
        assert isinstance(got, QuoteAnswer | Rejection)
        return got

    async def reserve(
        self,
        stream_id: str,
        *,
        hold_ms: int,
        target_level: float | None = None,
        accuracy: dict[str, float] | None = None,
        reservation_id: str | None = None,
        timeout: float = 30.0,
        party: Party | None = None,
    ) -> Reservation | Rejection:
        """Hold a purchase's terms (level, price, privacy room) for ``hold_ms`` (at most
        120,000): the answer is the market-signed reservation, whose id a purchase names
        (:meth:`buy` with ``reservation_id``) before its ``expires_at_ms``."""
        me = self._me(party)
        rid = reservation_id or uuid.uuid4().hex[:20]
        req = me.sign(
            ReserveRequest,
            await self.signing_market(),
            reservation_id=rid,
            buyer_id=me.account_id,
            stream_id=stream_id,
            target_level=target_level,
            accuracy=accuracy,
            hold_ms=hold_ms,
            requested_at_ms=now_ms(),
        )
        got = await self._request(
            self.topics.purchases,
            stream_id,
            req.model_dump_json().encode(),
            lambda ev: _answers(ev, rid),
            inbox=me.account_id,
            timeout=timeout,
            resend_every=timeout,
            request_id=rid,
        )
        assert isinstance(got, Reservation | Rejection)
        return got

    async def tail(
        self,
        *,
        idle_timeout: float | None = None,
        party: Party | None = None,
        on_unopened: Callable[[Unopened], None] | None = None,
    ) -> AsyncIterator[InboxEvent]:
        """Every event in the party's inbox from the beginning; stops after ``idle_timeout``
        seconds without events.

        Sealed releases are opened with every sealing key the party holds: its current one and
        the retired ones of its key file (``previous``; :meth:`Party.holding` adds those of
        older key files), so the whole history reads after a rotation. A record none of them
        opens is yielded as it came (sealed, no releases) after ``on_unopened`` (default: the
        client's ``on_warning``) is told which key version it was sealed under
        (:class:`~streams.clients.opening.Unopened`).
        """
        me = self._me(party)
        await self.market_key()
        reader = await self._inbox(me.account_id)
        opener = InboxOpener(me.sealing_keys)
        told = on_unopened or (lambda u: self.on_warning(f"{u.event.type}: {u.reason}"))
        try:
            async for ev in self._believed(reader, idle_timeout):
                if isinstance(ev, Refusal):
                    continue
                got = opener.open(ev)
                if isinstance(got, Unopened):
                    told(got)
                    yield got.event
                else:
                    yield got
        finally:
            with contextlib.suppress(Exception):
                await reader.stop()

    # -- sellers ----------------------------------------------------------------------------------
    async def sales(
        self,
        *,
        stream_id: str | None = None,
        idle_timeout: float | None = 2.0,
        party: Party | None = None,
    ) -> AsyncIterator[Sale]:
        """Every sale of the party's streams (of ``stream_id``, if given) that the market signed
        in the party's inbox, oldest first, each once; stops after ``idle_timeout`` seconds
        without a record (None: follows the inbox).

        A notice answers no request of the seller's, so only its signature for this inbox is
        checked (docs/protocol.md §8.4). A ``sales`` notice lists a batch's sales, an older
        ``sale`` one; each sale is counted once per ``receipt_sha256``, its id: a batch
        replayed after a worker died tells its sales again, and anyone may copy a genuine
        notice into the inbox again.

        Raises
        ------
        LookupError
            The party has no inbox (its account was never opened).
        """
        me = self._me(party)
        await self.market_key()
        reader = self.inbox_reader(self.topics.inbox(me.account_id))
        await reader.start()
        seen: set[str] = set()
        try:
            async for ev in self._believed(reader, idle_timeout):
                for sale in _sales_in(ev, me.account_id):
                    if sale.receipt_sha256 in seen:
                        continue
                    seen.add(sale.receipt_sha256)
                    if stream_id is None or sale.stream_id == stream_id:
                        yield sale
        finally:
            with contextlib.suppress(Exception):
                await reader.stop()

    # -- plumbing ---------------------------------------------------------------------------------
    async def _believed(
        self, reader: InboxReader, idle_timeout: float | None
    ) -> AsyncIterator[InboxEvent | Refusal]:
        """Every message of the inbox the market signed, as ``reader`` polls it, until
        ``idle_timeout`` seconds pass without one (None: for ever); the caller stops the
        reader."""
        idle_since = time.monotonic()
        while idle_timeout is None or time.monotonic() - idle_since < idle_timeout:
            batch = await reader.poll(0.3)
            if batch:
                idle_since = time.monotonic()
            for _, got in batch:
                yield got[1]

    async def _inbox(self, account_id: str) -> InboxReader:
        await self.market_key()
        await self._ensure_inbox(self.topics.inbox(account_id))
        reader = self.inbox_reader(self.topics.inbox(account_id))
        await reader.start()
        return reader

    @staticmethod
    def _open(ev: InboxEvent, me: Party) -> InboxEvent:
        """``ev`` opened with the party's current sealing key or a retired one (an earlier
        outcome answered again after a rotation is sealed to the key of its time).

        Raises :class:`market.envelope.EnvelopeError` if none opens it."""
        if me.sealing_key is None:
            return ev
        got = InboxOpener(me.sealing_keys).open(ev)
        if isinstance(got, Unopened):
            raise EnvelopeError(f"the answer cannot be opened with this key file: {got.reason}")
        return got

    async def _watch(
        self,
        inbox: str,
        sent_to: str,
        payload: bytes,
        request_id: str | None,
        *,
        create_inbox: bool = True,
        wait: float = 30.0,
        stream_id: str | None = None,
    ) -> _Watch:
        """Start watching for the answer to ``payload`` (to be sent to ``sent_to``): ``inbox``
        from its beginning and the refusals from their end (before it is sent, so no answer can
        be missed)."""
        key = await self.market_key(wait=wait)
        refusals = await self._refusals_from_end()
        if create_inbox:
            await self._ensure_inbox(inbox)
        return _Watch(self, key, inbox, (sent_to, payload), request_id, refusals, stream_id)

    async def _refusals_from_end(self) -> TopicReader | None:
        """A reader of the refusals from their end (None on a market made before refusals were
        recorded): started before a send, it misses no refusal of what is sent."""
        refusals = TopicReader(self.bootstrap, self.topics.refusals, **self.auth)
        try:
            await refusals.start(wait=1.0, from_end=True)
        except LookupError:
            return None
        return refusals

    async def _ensure_inbox(self, inbox: str) -> None:
        if self.topics.inboxes == 2:  # <p>.inbox is made with the market
            return
        with contextlib.suppress(Exception):  # parties may lack the right to create topics
            await ensure_topics(self.bootstrap, [self.topics.inbox_topic_spec(inbox)], **self.auth)

    async def sent_values(self, *, party: Party | None = None, wait: float = 30.0) -> SentValues:
        """What sends the party's value batches and hands over their answers, several in
        flight (what every :class:`~streams.clients.batching.ValueBatcher` of this client
        sends with): one per party, stopped when the client closes."""
        me = self._me(party)
        if me.account_id not in self._sent_values:
            key = await self.market_key(wait=wait)
            inbox = self.topics.inbox(me.account_id)
            refusals = await self._refusals_from_end()
            await self._ensure_inbox(inbox)
            if me.account_id not in self._sent_values:  # another task made it meanwhile
                self._sent_values[me.account_id] = SentValues(self, key, inbox, refusals)
            elif refusals is not None:
                await refusals.stop()
        return self._sent_values[me.account_id]

    async def _request(
        self,
        topic: str,
        key: str,
        payload: bytes,
        answers: Callable[[InboxEvent], bool],
        *,
        inbox: str,
        opener: Party | None = None,
        timeout: float,
        resend_every: float = 15.0,
        create_inbox: bool = True,
        request_id: str | None = None,
    ) -> InboxEvent:
        """Send ``payload`` (again every ``resend_every`` s) until the market answers it: in
        ``inbox`` (an answer to these bytes that ``answers`` accepts) or with a refusal."""
        # a purchase or quote (the requests with an id) is keyed by its stream
        stream = key if request_id is not None else None
        watch = await self._watch(
            self.topics.inbox(inbox),
            topic,
            payload,
            request_id,
            stream_id=stream,
            create_inbox=create_inbox,
            wait=timeout,
        )
        try:
            deadline = time.monotonic() + timeout
            next_send = 0.0
            while time.monotonic() < deadline:
                if time.monotonic() >= next_send:
                    watch.sent.add(await self.send(topic, key, payload))
                    next_send = time.monotonic() + resend_every
                for ev in await watch.poll(0.2):
                    if answers(ev):
                        return ev if opener is None else self._open(ev, opener)
            raise TimeoutError(f"no answer on {self.topics.inbox(inbox)} within {timeout}s")
        finally:
            await watch.stop()


class _Watch:
    """Where the answer to one sent event can appear, read with the market's key: the
    sender's inbox (answers to these exact bytes only) and the refusals (the record keyed by
    their SHA-256, as a :class:`Rejection`). A refusal is taken only if the inbox brings no
    rejection within :data:`REFUSAL_GRACE` seconds: a proven sender's rejection, sent with it,
    says more (its message names the field or bound at fault).

    An answer to other bytes is not this event's, except in one case the market vouches for:
    a resend of a request id with the same terms but another send time (a new process) is told
    ``already_answered``, bound to these bytes, and then the market's earlier answer to that id
    that the notice names (:func:`_named_by`) is the answer; an answer to another request that
    used the id (refused ``idempotency_key_reused``) never is.
    """

    def __init__(
        self,
        client: MarketClient,
        key: Ed25519PublicKey,
        inbox: str,
        sent: tuple[str, bytes],
        request_id: str | None,
        refusals: TopicReader | None,
        stream_id: str | None = None,
    ) -> None:
        self.client, self.key, self.inbox = client, key, inbox
        self.sent_to, self.payload = sent
        self.digest = hashlib.sha256(self.payload).hexdigest()
        self.request_id, self.refusals, self.stream_id = request_id, refusals, stream_id
        self.reader: InboxReader | None = None
        self.earlier: list[tuple[str, InboxEvent]] = []
        """The market's answers to earlier sends of this id: (SHA-256 of the value, answer)."""
        self.refused: tuple[float, Rejection] | None = None
        self.sent: set[tuple[int, int]] = set()
        """Where in ``sent_to`` this client wrote the bytes: (partition, offset) of each send."""

    async def poll(self, timeout: float) -> list[InboxEvent]:
        """What arrived for this event: the inbox's answers to it, else its refusal."""
        out = await self._inbox(timeout)
        if self.refusals is not None and not out:
            await self._refusal()
        return out or self.refusal_due()

    async def _inbox(self, timeout: float) -> list[InboxEvent]:
        out: list[InboxEvent] = []
        if self.reader is None:  # the inbox of an account being opened appears with it
            with contextlib.suppress(LookupError):  # (v2: a party without a sealing key)
                reader = self.client.inbox_reader(self.inbox)
                await reader.start(wait=timeout)
                self.reader = reader
        if self.reader is None:
            return out
        for raw, got in await self.reader.poll(timeout):
            out += self.take(got, raw)
        return out

    def take(self, got: tuple[str | None, InboxEvent | Refusal], raw: bytes) -> list[InboxEvent]:
        """What ``got`` (a message of the inbox the market signed, :meth:`MarketClient.believe`,
        whose bytes are ``raw``) says of this event: its answers, if any."""
        digest, ev = got
        if isinstance(ev, Refusal):
            return []
        if digest == self.digest:
            if isinstance(ev, Rejection) and ev.source_topic != self.sent_to:
                return []  # a copy of these bytes someone wrote to another topic, refused
            return [ev, *self._earlier(ev)] if _notice(ev) else [ev]
        if self.request_id is not None and _answers(ev, self.request_id, self.stream_id):
            # the market's answer to an earlier send of this id
            self.earlier.append((hashlib.sha256(raw).hexdigest(), ev))
        return []

    def _earlier(self, notice: InboxEvent) -> list[InboxEvent]:
        """The earlier answer ``notice`` (an ``already_answered`` bound to these bytes) stands
        for; none if the inbox holds none of those it names."""
        assert isinstance(notice, Rejection)
        found = named_answer(notice, self.earlier)
        return [] if found is None else [found]

    async def _refusal(self) -> None:
        assert self.refusals is not None
        for key, raw, headers in await self.refusals.poll_records(0.05):
            if key == self.digest.encode():
                self.take_refusal(raw, headers)

    def take_refusal(self, raw: bytes, headers: list[tuple[str, bytes]]) -> None:
        """Note the refusal record ``raw`` (keyed by this event's digest) if the market signed
        it and it refuses a record this client wrote: anyone can copy the bytes to another
        topic, or write them again, where the market refuses them under the same key."""
        got = self.client.believe(self.client.topics.refusals, raw, headers, self.key)
        if got is None or got[0] != self.digest or not isinstance(got[1], Refusal):
            return
        ref = got[1]
        if (
            ref.source_topic == self.sent_to
            and (ref.source_partition, ref.source_offset) in self.sent
        ):
            self.refused = (time.monotonic() + REFUSAL_GRACE, self._rejection(ref))

    def refusal_due(self) -> list[InboxEvent]:
        """The refusal noted, once the inbox had its grace to bring a rejection that says more."""
        if self.refused is not None and time.monotonic() >= self.refused[0]:
            return [self.refused[1]]
        return []

    def _rejection(self, refusal: Refusal) -> Rejection:
        """A refusal as the rejection it summarises (nothing of the event is in it)."""
        return Rejection(
            reason=refusal.reason,
            message=refusal.message,
            source_topic=self.sent_to,
            request_id=self.request_id,
            payload="",
            payload_bytes=len(self.payload),
            payload_sha256=self.digest,
            details={"from": self.client.topics.refusals},
        )

    async def stop(self) -> None:
        for reader in (self.reader, self.refusals):
            if reader is not None:
                with contextlib.suppress(Exception):
                    await reader.stop()


class SentValues:
    """Value batches one seller sends, and the market's answers to them, read with one inbox
    reader and one refusals reader however many batches of however many streams are in flight
    (a watch of its own per batch would read the inbox from its beginning once per batch).
    Each answer is handed to the ``done`` given with its batch, from a task that runs while
    batches are in flight. A batch with no answer is sent again, the same bytes, every
    ``resend_every`` seconds, and given up after its ``timeout``."""

    def __init__(
        self,
        client: MarketClient,
        key: Ed25519PublicKey,
        inbox: str,
        refusals: TopicReader | None,
        *,
        resend_every: float = 15.0,
    ) -> None:
        self.client, self.key, self.inbox, self.refusals = client, key, inbox, refusals
        self.resend_every = resend_every
        self.reader: InboxReader | None = None
        self.flight: dict[str, _InFlight] = {}
        """The batches sent and not answered yet, by the SHA-256 of their bytes."""
        self._task: asyncio.Task[None] | None = None

    async def send(self, batch: ValueBatch, done: Done, *, timeout: float = 60.0) -> None:
        """Send ``batch`` (sealed and signed); ``done`` is called once with the market's answer
        to it, or a :class:`TimeoutError` after ``timeout`` seconds without one, or the error
        that stopped the inbox being read."""
        payload = batch.model_dump_json().encode()
        values = self.client.topics.values
        watch = _Watch(self.client, self.key, self.inbox, (values, payload), None, None)
        now = time.monotonic()
        self.flight[watch.digest] = _InFlight(
            watch, batch, done, now + self.resend_every, now + timeout
        )
        try:
            watch.sent.add(await self.client.send(values, batch.stream_id, payload))
        except BaseException:
            del self.flight[watch.digest]
            raise
        if self._task is None:
            self._task = asyncio.ensure_future(self._receive())

    async def _receive(self) -> None:
        """Poll while batches are in flight, handing each answer to its batch's ``done``."""
        try:
            while self.flight:
                try:
                    answered = await self.poll(0.2)
                except Exception as exc:  # the inbox cannot be read: no answer will come
                    answered = [(d, exc) for d in self.flight]
                for digest, answer in answered:
                    fly = self.flight.pop(digest)
                    try:
                        fly.done(answer)
                    except Exception:  # one caller's bug must not starve the others
                        log.exception("a value batch's answer could not be handed over")
        finally:
            self._task = None

    async def poll(
        self, timeout: float
    ) -> list[tuple[str, ValuesAccepted | Rejection | Exception]]:
        """The batches answered (or given up) since the last call, by digest, with the answer;
        sends again those whose answer is late. (The batches stay in :attr:`flight`: the
        caller hands the answers over.)"""
        if self.reader is None:  # the inbox of a party that never had an answer appears later
            with contextlib.suppress(LookupError):  # (v2: a party without a sealing key)
                reader = self.client.inbox_reader(self.inbox)
                await reader.start(wait=timeout)
                self.reader = reader
        heard: dict[str, list[InboxEvent]] = {}
        for raw, got in [] if self.reader is None else await self.reader.poll(timeout):
            fly = None if got[0] is None else self.flight.get(got[0])
            if fly is not None:
                heard.setdefault(fly.watch.digest, []).extend(fly.watch.take(got, raw))
        if self.refusals is not None:
            for key, raw, headers in await self.refusals.poll_records(0.05):
                fly = self.flight.get(key.decode(errors="replace")) if key else None
                if fly is not None:
                    fly.watch.take_refusal(raw, headers)
        out: list[tuple[str, ValuesAccepted | Rejection | Exception]] = []
        now = time.monotonic()
        for digest, fly in list(self.flight.items()):
            answers = [
                ev
                for ev in heard.get(digest) or fly.watch.refusal_due()
                if _answers_batch(ev, fly.batch, digest)
            ]
            if answers:
                answer = answers[0]
                assert isinstance(answer, ValuesAccepted | Rejection)
                out.append((digest, answer))
            elif now >= fly.deadline:
                out.append((digest, TimeoutError(f"no answer on {self.inbox} in time")))
            elif now >= fly.resend_at:  # the same bytes: the ids make it safe
                fly.resend_at = now + self.resend_every
                values, payload = self.client.topics.values, fly.watch.payload
                fly.watch.sent.add(await self.client.send(values, fly.batch.stream_id, payload))
        return out

    async def stop(self) -> None:
        """Stop reading; the answers of batches still in flight are not waited for (a batcher
        waits for its own before it closes)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for reader in (self.reader, self.refusals):
            if reader is not None:
                with contextlib.suppress(Exception):
                    await reader.stop()


Done = Callable[[ValuesAccepted | Rejection | Exception], None]
"""What is told the market's answer to a batch :class:`SentValues` sent, or why none came."""


class _InFlight:
    """A batch sent by :class:`SentValues`: its watch, and when to resend it or give up."""

    def __init__(
        self, watch: _Watch, batch: ValueBatch, done: Done, resend_at: float, deadline: float
    ) -> None:
        self.watch, self.batch, self.done = watch, batch, done
        self.resend_at, self.deadline = resend_at, deadline


def _sales_in(ev: InboxEvent | Refusal, seller_id: str) -> list[Sale]:
    """The sales of ``seller_id`` an inbox message tells: those a ``sales`` notice lists, or
    an older one-sale ``sale`` message's; none from any other message."""
    if isinstance(ev, Sales):
        return ev.each() if ev.seller_id == seller_id else []
    return [ev] if isinstance(ev, Sale) and ev.seller_id == seller_id else []


def _answers_batch(ev: InboxEvent, batch: ValueBatch, digest: str) -> bool:
    """Whether ``ev`` (bound to the bytes of ``batch``, whose SHA-256 is ``digest``) is the
    market's answer to it: one line for each of its values, or the refusal of these bytes (an
    older rejection of the stream is not its answer)."""
    if isinstance(ev, ValuesAccepted):
        ids = {i.value_id for i in batch.items}
        return ev.stream_id == batch.stream_id and {o.value_id for o in ev.outcomes} == ids
    return isinstance(ev, Rejection) and ev.payload_sha256 == digest


def _notice(ev: InboxEvent) -> bool:
    """Whether ``ev`` says the request was answered before (not the answer itself)."""
    return isinstance(ev, Rejection) and ev.reason == "already_answered"


def named_answer(notice: Rejection, earlier: list[tuple[str, InboxEvent]]) -> InboxEvent | None:
    """The answer an ``already_answered`` ``notice`` stands for among ``earlier`` (the market's
    answers to that request id and stream in the inbox, oldest first, each with the SHA-256 of
    its value): the newest it names (docs/protocol.md §12.4's resend rule), or None."""
    for digest, ev in reversed(earlier):
        if _named_by(notice, digest, ev):
            return ev
    return None


def _named_by(notice: Rejection, digest: str, ev: InboxEvent) -> bool:
    """Whether ``ev`` (an earlier answer to the notice's request id, whose value has SHA-256
    ``digest``) is the decision ``notice`` says the request had (docs/protocol.md §12.4): the
    fulfilment with the digest it names, or a rejection with the code it names. A market that
    names neither (made before the rule) is taken at its newest answer that is not the refusal
    of another request that used the id."""
    named, code = notice.details.get("answer_sha256"), notice.details.get("answer_reason")
    if isinstance(named, str):
        return digest == named
    if isinstance(code, str):
        return isinstance(ev, Rejection) and ev.reason == code
    return not (isinstance(ev, Rejection) and ev.reason == "idempotency_key_reused")


def _answers(ev: InboxEvent, request_id: str, stream_id: str | None = None) -> bool:
    """Whether ``ev`` answers the request ``request_id`` (of ``stream_id``, if given: an id
    may be used again on another stream, where it is another purchase)."""
    if stream_id is not None and getattr(ev, "stream_id", None) != stream_id:
        return False
    if isinstance(ev, PurchaseFulfilled):
        return ev.purchase_id == request_id
    if isinstance(ev, QuoteAnswer):
        return ev.quote_id == request_id
    if isinstance(ev, Reservation):
        return ev.reservation_id == request_id
    # `already_answered`: a resend met an outcome sent before (the inbox, read from its start,
    # holds it) — not the answer itself; keep waiting
    return (
        isinstance(ev, Rejection)
        and ev.request_id == request_id
        and ev.reason != "already_answered"
    )
